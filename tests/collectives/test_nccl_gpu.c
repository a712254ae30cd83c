/*
 * test_nccl_gpu.c - the NCCL path of the collectives, on device buffers.
 *
 * Exits 77 (meson: skipped) on every rank when a rank sees no GPU (no NVIDIA driver,
 * or a driver that reports no device); a rank whose GPU is there but unusable (the
 * module or a CUDA library does not load) fails the test on every rank. With a GPU per
 * rank: NCCL bootstrapped over MPI on the world and on a split, then each collective
 * on device memory against the same serial reference as the MPI test (small integers,
 * so float sums are exact), in place and out of place, float32 and bf16, integer MIN,
 * MAX and SUM, blocking and non-blocking, a grouped ring exchange and an ungrouped
 * one, all-to-all with per-peer counts (zeros among them; float32 and bf16), and the
 * flight recorder marking the operations as device ones. With fewer GPUs
 * than ranks (NCCL refuses duplicate GPUs) the same collectives run host-staged
 * through MPI (collectives/staged.c), which has no grouped point-to-point and, like
 * MPI, no bf16.
 * Also: a split takes its parent's device path; NCCL never makes the host wait (each
 * operation leaves wf_comm_host_syncs unchanged) while staging waits twice (down and up);
 * and, with a GPU per rank, the watchdog's abort (wf_comm_abort_all from another thread)
 * frees a rank whose copy of a result waits for an all-reduce its peer never joined.
 * A failed check on any rank calls MPI_Abort.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_collectives.h"
#include "wf_gpu.h"

static int world_rank = -1;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "[rank %d] %s:%d: check failed: %s\n", world_rank, __FILE__, __LINE__,       \
              #cond);                                                                              \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                \
    }                                                                                              \
  } while (0)
#define OK(call) CHECK((call) == WF_OK)

static float val(int r, size_t i, int salt)
{
  return (float)((int)(((size_t)r * 131u + i * 7u + (size_t)salt * 13u) % 23u) - 11);
}

/* bf16 is the top half of a float32; small integers are exact in it. */
static uint16_t to_bf16(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

typedef struct dev {
  wf_gpu *g;
  void *a, *b; /* device buffers of `cap` bytes */
  size_t cap;
} dev;

static void upload_f(dev *d, void *dst, size_t n, int r, int salt, bool bf16)
{
  size_t es = bf16 ? 2 : 4;
  unsigned char *h = malloc(n * es + 1);
  for (size_t i = 0; i < n; i++) {
    float v = val(r, i, salt);
    if (bf16) {
      uint16_t x = to_bf16(v);
      memcpy(h + 2 * i, &x, 2);
    } else {
      memcpy(h + 4 * i, &v, 4);
    }
  }
  OK(wf_gpu_memcpy_h2d(d->g, dst, h, n * es));
  free(h);
}

static float *download_f(dev *d, const void *src, size_t n, bool bf16)
{
  size_t es = bf16 ? 2 : 4;
  unsigned char *h = malloc(n * es + 1);
  float *out = malloc(n * sizeof(float) + 1);
  OK(wf_gpu_memcpy_d2h(d->g, h, src, n * es));
  for (size_t i = 0; i < n; i++) {
    if (bf16) {
      uint16_t x;
      memcpy(&x, h + 2 * i, 2);
      out[i] = from_bf16(x);
    } else {
      memcpy(&out[i], h + 4 * i, 4);
    }
  }
  free(h);
  return out;
}

static double ref_sum(int n, size_t i, int salt)
{
  double s = 0;
  for (int r = 0; r < n; r++)
    s += val(r, i, salt);
  return s;
}

static void test_allreduce(dev *d, wf_comm *c, size_t count, bool in_place, bool bf16,
                           bool nonblocking)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), salt = (int)count;
  wf_comm_dtype dt = bf16 ? WF_COMM_BF16 : WF_COMM_F32;
  void *out = in_place ? d->a : d->b;
  upload_f(d, d->a, count, r, salt, bf16);
  uint64_t s0 = wf_comm_host_syncs(c);
  if (nonblocking) {
    wf_req *req = NULL;
    OK(wf_comm_iallreduce(c, d->a, out, count, dt, WF_COMM_SUM, &req));
    OK(wf_req_wait(&req));
  } else {
    OK(wf_comm_allreduce(c, d->a, out, count, dt, WF_COMM_SUM));
  }
  /* NCCL orders the compute stream after the operation and never waits on the host;
   * staging waits for its copy down and its copy back. */
  CHECK(wf_comm_host_syncs(c) - s0 == (wf_comm_has_nccl(c) ? 0u : 2u));
  float *y = download_f(d, out, count, bf16);
  for (size_t i = 0; i < count; i++)
    CHECK(y[i] == (float)ref_sum(n, i, salt)); /* |sum| <= 88: exact in bf16 too */
  free(y);
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && e.op == WF_OP_ALLREDUCE && e.state == WF_STATE_DONE &&
        e.dtype == dt);
  CHECK(e.device == wf_comm_has_nccl(c)); /* staged operations are MPI's */
}

/* Integer reductions on device: I32 MIN and MAX, I64 SUM past 2^32. */
static void test_ints(dev *d, wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  int32_t h[3] = {r + 5, -r, 7 * r}, got[3];
  OK(wf_gpu_memcpy_h2d(d->g, d->a, h, sizeof h));
  OK(wf_comm_allreduce(c, d->a, d->a, 3, WF_COMM_I32, WF_COMM_MIN));
  OK(wf_gpu_memcpy_d2h(d->g, got, d->a, sizeof got));
  CHECK(got[0] == 5 && got[1] == -(n - 1) && got[2] == 0);
  OK(wf_gpu_memcpy_h2d(d->g, d->a, h, sizeof h));
  OK(wf_comm_allreduce(c, d->a, d->b, 3, WF_COMM_I32, WF_COMM_MAX));
  OK(wf_gpu_memcpy_d2h(d->g, got, d->b, sizeof got));
  CHECK(got[0] == n + 4 && got[1] == 0 && got[2] == 7 * (n - 1));
  int64_t big = ((int64_t)1 << 40) * (r + 1), sum = 0;
  OK(wf_gpu_memcpy_h2d(d->g, d->a, &big, sizeof big));
  OK(wf_comm_allreduce(c, d->a, d->a, 1, WF_COMM_I64, WF_COMM_SUM));
  OK(wf_gpu_memcpy_d2h(d->g, &sum, d->a, sizeof sum));
  CHECK(sum == ((int64_t)1 << 40) * n * (n + 1) / 2);
}

/* Non-blocking send right and receive left, each with its own request. */
static void test_pair(dev *d, wf_comm *c, size_t count)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  wf_req *rs = NULL, *rr = NULL;
  upload_f(d, d->a, count, r, 17, false);
  if (n == 1 && wf_comm_has_nccl(c)) { /* NCCL pairs a self-send only in a group: refused */
    CHECK(wf_comm_irecv(c, d->b, count, WF_COMM_F32, left, &rr) == WF_EUNSUPPORTED && !rr);
    return; /* test_ring sends to itself in a group */
  }
  OK(wf_comm_irecv(c, d->b, count, WF_COMM_F32, left, &rr));
  OK(wf_comm_isend(c, d->a, count, WF_COMM_F32, right, &rs));
  OK(wf_req_wait(&rr));
  OK(wf_req_wait(&rs));
  float *y = download_f(d, d->b, count, false);
  for (size_t i = 0; i < count; i++)
    CHECK(y[i] == val(left, i, 17));
  free(y);
}

static void test_avg_rs_ag_bcast(dev *d, wf_comm *c, size_t count)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), salt = 3;
  /* reduce-scatter, in place: block r of a holds the average of block r. */
  upload_f(d, d->a, count * (size_t)n, r, salt, false);
  void *mine = (char *)d->a + count * sizeof(float) * (size_t)r;
  OK(wf_comm_reduce_scatter(c, d->a, mine, count, WF_COMM_F32, WF_COMM_AVG));
  float *y = download_f(d, mine, count, false);
  for (size_t i = 0; i < count; i++) {
    double want = ref_sum(n, count * (size_t)r + i, salt) / n;
    CHECK(y[i] > want - 1e-5 && y[i] < want + 1e-5);
  }
  free(y);
  /* allgather, out of place. */
  upload_f(d, d->a, count, r, salt + 1, false);
  OK(wf_comm_allgather(c, d->a, d->b, count, WF_COMM_F32));
  y = download_f(d, d->b, count * (size_t)n, false);
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < count; i++)
      CHECK(y[(size_t)b * count + i] == val(b, i, salt + 1));
  free(y);
  /* bcast from the last rank. */
  upload_f(d, d->a, count, r, salt + 2, false);
  OK(wf_comm_bcast(c, d->a, count, WF_COMM_F32, n - 1));
  y = download_f(d, d->a, count, false);
  for (size_t i = 0; i < count; i++)
    CHECK(y[i] == val(n - 1, i, salt + 2));
  free(y);
}

static void test_ring(dev *d, wf_comm *c, size_t count)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  upload_f(d, d->a, count, r, 11, false);
  OK(wf_comm_group_start(c));
  OK(wf_comm_recv(c, d->b, count, WF_COMM_F32, left));
  OK(wf_comm_send(c, d->a, count, WF_COMM_F32, right));
  OK(wf_comm_group_end(c));
  float *y = download_f(d, d->b, count, false);
  for (size_t i = 0; i < count; i++)
    CHECK(y[i] == val(left, i, 11));
  free(y);
}

/* All-to-all with per-peer counts on device buffers: rank r sends (r + 2p) % 3 * count
 * elements to peer p (zero for some pairs), block p at p * 3 * count on both sides; the
 * elements are rank p's values, in bf16 too (moved, never added). */
static void test_alltoallv(dev *d, wf_comm *c, size_t count, bool bf16)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  size_t *a = calloc(4 * (size_t)n, sizeof *a), span = 3 * count;
  for (int p = 0; p < n; p++) {
    a[p] = (size_t)((r + 2 * p) % 3) * count, a[n + p] = (size_t)p * span;
    a[2 * n + p] = (size_t)((p + 2 * r) % 3) * count, a[3 * n + p] = (size_t)p * span;
  }
  upload_f(d, d->a, span * (size_t)n, r, 23, bf16);
  OK(wf_comm_alltoallv(c, d->a, a, a + n, d->b, a + 2 * n, a + 3 * n,
                       bf16 ? WF_COMM_BF16 : WF_COMM_F32));
  float *y = download_f(d, d->b, span * (size_t)n, bf16);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < a[2 * n + p]; i++) /* rank p's elements at its block for r */
      CHECK(y[(size_t)p * span + i] == val(p, (size_t)r * span + i, 23));
  free(y);
  free(a);
}

/* Every collective on c, through NCCL or (staged) host staging. */
static void run_on(dev *d, wf_comm *c, wf_gpu *g, bool staged)
{
  char why[256] = "";
  if (staged) {
    OK(wf_comm_enable_staging(c, g));
    CHECK(wf_comm_is_staged(c) && !wf_comm_has_nccl(c));
  } else {
    OK(wf_comm_enable_nccl(c, g, why, sizeof why));
    CHECK(wf_comm_has_nccl(c));
  }
  size_t counts[] = {1, 1031, 1 << 16};
  for (size_t k = 0; k < WF_ARRAY_LEN(counts); k++) {
    for (int ip = 0; ip < 2; ip++) {
      test_allreduce(d, c, counts[k], ip, false, false);
      if (!staged) /* MPI has no bf16 type; staging runs the MPI path */
        test_allreduce(d, c, counts[k], ip, true, ip == 1);
      test_allreduce(d, c, counts[k], ip, false, true);
    }
    test_avg_rs_ag_bcast(d, c, counts[k]);
    test_alltoallv(d, c, counts[k], false);
    test_alltoallv(d, c, counts[k], !staged || k == 0); /* bf16 moves on both paths */
    test_pair(d, c, counts[k]);
    if (!staged)
      test_ring(d, c, counts[k]);
  }
  test_ints(d, c);
  /* Host buffers still go to MPI on a device-enabled communicator. */
  float h[4] = {1, 2, 3, 4};
  OK(wf_comm_allreduce(c, h, h, 4, WF_COMM_F32, WF_COMM_SUM));
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && !e.device);
  CHECK(h[0] == (float)wf_comm_size(c));
}

static void *abort_later(void *family)
{
  sleep(1);
  wf_comm_abort_all(family, NULL, 0);
  return NULL;
}

/* Rank 1 never joins the all-reduce rank 0 posts on their NCCL pair; rank 0's copy of
 * the result waits for it (the compute stream waits for the communication stream), and
 * would wait forever, until another thread aborts the family (as the watchdog's abort
 * does in the worker). The copy must return within 30 s of the abort (NCCL's abort
 * makes its kernels return; a hang here is the defect). Only with a GPU per rank: NCCL
 * refuses ranks that share one. Run last: the aborted communicators are not used again. */
static void test_abort(dev *d, wf_gpu *g)
{
  wf_comm *w = NULL, *pair = NULL;
  int ranks[2] = {0, 1};
  float x = 0;
  OK(wf_comm_world_create(&w));
  OK(wf_comm_set_device_path(w, g, true, NULL, 0));
  CHECK(wf_comm_has_nccl(w));
  OK(wf_comm_create_group(w, ranks, 2, "pair", &pair));
  CHECK(!pair || wf_comm_has_nccl(pair)); /* inherited */
  if (world_rank == 0) {
    pthread_t t;
    upload_f(d, d->a, 1024, 0, 5, false);
    OK(wf_comm_allreduce(pair, d->a, d->a, 1024, WF_COMM_F32, WF_COMM_SUM)); /* returns */
    CHECK(pthread_create(&t, NULL, abort_later, w) == 0);
    double t0 = MPI_Wtime();
    wf_gpu_memcpy_d2h(g, &x, d->a, sizeof x); /* waits for the all-reduce, until aborted */
    double dt = MPI_Wtime() - t0;
    pthread_join(t, NULL);
    printf("abort: the stuck all-reduce's wait ended %.2f s after it began (abort at 1 s)\n", dt);
    CHECK(dt < 31.0);
    CHECK(wf_comm_allreduce(pair, d->a, d->a, 1, WF_COMM_F32, WF_COMM_SUM) == WF_EABORTED);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  wf_comm_abort_all(w, NULL, 0); /* the peers' too: destroying them must not wait for rank 0 */
  wf_comm_destroy(pair);
  wf_comm_destroy(w);
}

int main(int argc, char **argv)
{
  int provided, n;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  wf_rt_set_rank(world_rank);
  char why[512] = "";
  wf_gpu *g = NULL;
  wf_status st = wf_gpu_open(&g, why, sizeof why);
  int have = st == WF_OK ? wf_gpu_device_count(g) : 0, least = 0;
  int unusable = st != WF_OK && st != WF_ENODEV, any_unusable = 0;
  MPI_Allreduce(&have, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&unusable, &any_unusable, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_unusable) { /* a GPU that weft cannot use is a failure, never a skip */
    if (unusable)
      fprintf(stderr, "[rank %d] FAIL: %s\n", world_rank, why);
    MPI_Finalize();
    return 1;
  }
  if (least == 0) { /* a rank has no GPU: every rank takes the same decision */
    if (world_rank == 0)
      printf("skipped: a rank sees no GPU%s%s\n", why[0] ? ": " : "", why);
    wf_gpu_close(g);
    MPI_Finalize();
    return 77;
  }
  dev d = {.g = g, .cap = (size_t)(1 << 16) * 4 * (size_t)n};
  OK(wf_gpu_set_device(g, world_rank % have));
  OK(wf_gpu_malloc(g, &d.a, d.cap));
  OK(wf_gpu_malloc(g, &d.b, d.cap));
  bool staged = least < n; /* ranks share a GPU: NCCL would refuse it */
  wf_comm *world = NULL, *half = NULL;
  OK(wf_comm_world_create(&world));
  run_on(&d, world, g, staged);
  OK(wf_comm_split(world, world_rank % 2, -world_rank, "half", &half));
  CHECK(!strcmp(wf_comm_device_path(half), staged ? "staged" : "nccl")); /* inherited */
  run_on(&d, half, g, staged);
  wf_comm_destroy(half);
  wf_comm_destroy(world);
  if (!staged && n >= 2)
    test_abort(&d, g);
  else if (world_rank == 0)
    printf("abort of a stuck NCCL operation: not run (%s)\n",
           staged ? "ranks share a GPU: no NCCL" : "needs 2 ranks");
  wf_gpu_free(g, d.a);
  wf_gpu_free(g, d.b);
  wf_gpu_close(g);
  if (world_rank == 0)
    printf("collectives on %s: all checks passed on %d ranks\n",
           staged ? "MPI with host staging (ranks share a GPU)" : "NCCL", n);
  MPI_Finalize();
  return 0;
}
