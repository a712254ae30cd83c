/*
 * test_nccl_gpu.c - the NCCL path of the collectives, on device buffers.
 *
 * Exits 77 (meson: skipped) on every rank when there is no GPU, or fewer GPUs than
 * ranks (NCCL wants one device per rank). Otherwise: NCCL bootstrapped over MPI on
 * the world and on a split, then each collective on device memory against the same
 * serial reference as the MPI test (small integers, so float sums are exact), in
 * place and out of place, float32 and bf16, blocking and non-blocking, a grouped
 * ring exchange, and the flight recorder marking the operations as device ones.
 * A failed check on any rank calls MPI_Abort.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  if (nonblocking) {
    wf_req *req = NULL;
    OK(wf_comm_iallreduce(c, d->a, out, count, dt, WF_COMM_SUM, &req));
    OK(wf_req_wait(&req));
  } else {
    OK(wf_comm_allreduce(c, d->a, out, count, dt, WF_COMM_SUM));
  }
  float *y = download_f(d, out, count, bf16);
  for (size_t i = 0; i < count; i++)
    CHECK(y[i] == (float)ref_sum(n, i, salt)); /* |sum| <= 88: exact in bf16 too */
  free(y);
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && e.device && e.op == WF_OP_ALLREDUCE && e.state == WF_STATE_DONE &&
        e.dtype == dt);
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

static void run_on(dev *d, wf_comm *c, wf_gpu *g)
{
  char why[256] = "";
  OK(wf_comm_enable_nccl(c, g, why, sizeof why));
  CHECK(wf_comm_has_nccl(c));
  size_t counts[] = {1, 1031, 1 << 16};
  for (size_t k = 0; k < WF_ARRAY_LEN(counts); k++) {
    for (int ip = 0; ip < 2; ip++) {
      test_allreduce(d, c, counts[k], ip, false, false);
      test_allreduce(d, c, counts[k], ip, true, ip == 1);
      test_allreduce(d, c, counts[k], ip, false, true);
    }
    test_avg_rs_ag_bcast(d, c, counts[k]);
    test_ring(d, c, counts[k]);
  }
  /* Host buffers still go to MPI on an NCCL-enabled communicator. */
  float h[4] = {1, 2, 3, 4};
  OK(wf_comm_allreduce(c, h, h, 4, WF_COMM_F32, WF_COMM_SUM));
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && !e.device);
  CHECK(h[0] == (float)wf_comm_size(c));
}

int main(int argc, char **argv)
{
  int provided, n;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  wf_rt_set_rank(world_rank);
  char why[256] = "";
  wf_gpu *g = NULL;
  int have = wf_gpu_open(&g, why, sizeof why) == WF_OK ? wf_gpu_device_count(g) : 0, least = 0;
  MPI_Allreduce(&have, &least, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (least < n) { /* every rank takes the same decision */
    if (world_rank == 0)
      printf("skipped: %d rank(s), but a rank sees %d GPU(s)%s%s\n", n, least, why[0] ? ": " : "",
             why);
    wf_gpu_close(g);
    MPI_Finalize();
    return 77;
  }
  dev d = {.g = g, .cap = (size_t)(1 << 16) * 4 * (size_t)n};
  OK(wf_gpu_set_device(g, world_rank % have));
  OK(wf_gpu_malloc(g, &d.a, d.cap));
  OK(wf_gpu_malloc(g, &d.b, d.cap));
  wf_comm *world = NULL, *half = NULL;
  OK(wf_comm_world_create(&world));
  run_on(&d, world, g);
  OK(wf_comm_split(world, world_rank % 2, -world_rank, "half", &half));
  run_on(&d, half, g);
  wf_comm_destroy(half);
  wf_comm_destroy(world);
  wf_gpu_free(g, d.a);
  wf_gpu_free(g, d.b);
  wf_gpu_close(g);
  if (world_rank == 0)
    printf("collectives on NCCL: all checks passed on %d ranks\n", n);
  MPI_Finalize();
  return 0;
}
