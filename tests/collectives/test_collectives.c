/*
 * test_collectives.c - every collective against a serial reference, under mpirun.
 *
 * Run at 1, 2, 3, 4 and 8 ranks. Each rank's input is a pure function of (rank in
 * the communicator, element index, salt), small integers, so every rank computes
 * the exact expected sum locally: float sums of integers below 2^24 are exact in any
 * order, which makes "equal" the right check for SUM. AVG is checked to 1e-6
 * relative: weft scales the float sum by 1/n, the reference divides in double.
 *
 * Covered: counts 0, 1, odd (1031) and large; in place and out of place; blocking and
 * non-blocking (wait and test); the world, a split with reversed keys and an
 * explicit group in reversed order; grouped ring exchange; send/recv; the errors a
 * caller can cause (mismatched counts across ranks with the check on, a recv size
 * mismatch, bad overlaps, bf16 on host, calls inside a group); the flight recorder
 * (sequence numbers, ops, bytes, states, wrap-around, a concurrent reader thread, and
 * a second thread seeing an allreduce "running" while the main thread waits in MPI);
 * the integer element types (i32, i64, u64) under SUM, MIN and MAX on every operation
 * that reduces or moves data, values beyond 2^53 (so a float or double disguise would
 * lose them), and the status agreement wf_comm_agree; all-to-all with per-peer counts
 * (zeros among them, all zero, offsets with gaps) and with one count, and its count
 * mismatch caught by the check.
 * A failed check on any rank calls MPI_Abort, so the test fails instead of hanging.
 */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wf_collectives.h"

static int world_rank = -1;

static void fail_at(const char *file, int line, const char *what)
{
  fprintf(stderr, "[rank %d] %s:%d: check failed: %s\n", world_rank, file, line, what);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      fail_at(__FILE__, __LINE__, #cond);                                                          \
  } while (0)
#define OK(call) CHECK((call) == WF_OK)

/* Small integers in [-11, 11]: sums over up to 8 ranks stay exact in float. */
static float val(int r, size_t i, int salt)
{
  return (float)((int)(((size_t)r * 131u + i * 7u + (size_t)salt * 13u) % 23u) - 11);
}

static float *alloc_f(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static void fill(float *x, size_t n, int r, size_t first, int salt)
{
  for (size_t i = 0; i < n; i++)
    x[i] = val(r, first + i, salt);
}

/* Expected reduction of element i over all n ranks. */
static double ref_sum(int n, size_t i, int salt)
{
  double s = 0;
  for (int r = 0; r < n; r++)
    s += val(r, i, salt);
  return s;
}

static void check_reduced(const float *x, size_t n_el, size_t first, int n, int salt,
                          wf_comm_redop op)
{
  for (size_t i = 0; i < n_el; i++) {
    double want = ref_sum(n, first + i, salt);
    if (op == WF_COMM_AVG) {
      want /= n;
      CHECK(fabs(x[i] - want) <= 1e-6 * fabs(want) + 1e-7);
    } else {
      CHECK(x[i] == (float)want);
    }
  }
}

/* ---- collectives -------------------------------------------------------------- */

/* mode 0: blocking; 1: non-blocking + wait; 2: non-blocking + test loop. */
static void finish(wf_req *req, int mode)
{
  if (mode == 1) {
    OK(wf_req_wait(&req));
  } else if (mode == 2) {
    bool done = false;
    while (!done)
      OK(wf_req_test(&req, &done));
  }
  CHECK(req == NULL);
}

static void test_allreduce(wf_comm *c, size_t count, bool in_place, wf_comm_redop op, int mode)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), salt = (int)count + op;
  float *x = alloc_f(count), *y = in_place ? x : alloc_f(count);
  wf_req *req = NULL;
  fill(x, count, r, 0, salt);
  if (mode == 0)
    OK(wf_comm_allreduce(c, x, y, count, WF_COMM_F32, op));
  else
    OK(wf_comm_iallreduce(c, x, y, count, WF_COMM_F32, op, &req));
  finish(req, mode);
  check_reduced(y, count, 0, n, salt, op);
  if (!in_place) /* the input is left alone */
    for (size_t i = 0; i < count; i++)
      CHECK(x[i] == val(r, i, salt));
  if (y != x)
    free(y);
  free(x);
}

static void test_reduce_scatter(wf_comm *c, size_t count, bool in_place, wf_comm_redop op, int mode)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), salt = 3 + (int)count + op;
  float *x = alloc_f(count * (size_t)n), *y = in_place ? x + count * (size_t)r : alloc_f(count);
  wf_req *req = NULL;
  fill(x, count * (size_t)n, r, 0, salt);
  if (mode == 0)
    OK(wf_comm_reduce_scatter(c, x, y, count, WF_COMM_F32, op));
  else
    OK(wf_comm_ireduce_scatter(c, x, y, count, WF_COMM_F32, op, &req));
  finish(req, mode);
  check_reduced(y, count, count * (size_t)r, n, salt, op);
  if (!in_place)
    free(y);
  free(x);
}

static void test_allgather(wf_comm *c, size_t count, bool in_place, int mode)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), salt = 5 + (int)count;
  float *y = alloc_f(count * (size_t)n), *x = in_place ? y + count * (size_t)r : alloc_f(count);
  wf_req *req = NULL;
  fill(x, count, r, 0, salt);
  if (mode == 0)
    OK(wf_comm_allgather(c, x, y, count, WF_COMM_F32));
  else
    OK(wf_comm_iallgather(c, x, y, count, WF_COMM_F32, &req));
  finish(req, mode);
  for (int b = 0; b < n; b++)
    for (size_t i = 0; i < count; i++)
      CHECK(y[(size_t)b * count + i] == val(b, i, salt));
  if (!in_place)
    free(x);
  free(y);
}

static void test_bcast(wf_comm *c, size_t count, int root, int mode)
{
  int r = wf_comm_rank(c), salt = 7 + (int)count;
  float *x = alloc_f(count);
  wf_req *req = NULL;
  fill(x, count, r, 0, salt);
  if (mode == 0)
    OK(wf_comm_bcast(c, x, count, WF_COMM_F32, root));
  else
    OK(wf_comm_ibcast(c, x, count, WF_COMM_F32, root, &req));
  finish(req, mode);
  for (size_t i = 0; i < count; i++)
    CHECK(x[i] == val(root, i, salt));
  free(x);
}

static void test_collectives_on(wf_comm *c, size_t large)
{
  size_t counts[] = {0, 1, 1031, large};
  for (size_t k = 0; k < WF_ARRAY_LEN(counts); k++) {
    size_t n = counts[k];
    for (int ip = 0; ip < 2; ip++) {
      for (int op = WF_COMM_SUM; op <= WF_COMM_AVG; op++) {
        test_allreduce(c, n, ip, (wf_comm_redop)op, 0);
        test_reduce_scatter(c, n, ip, (wf_comm_redop)op, 0);
      }
      test_allreduce(c, n, ip, WF_COMM_SUM, 1 + ip);
      test_allreduce(c, n, ip, WF_COMM_AVG, 2 - ip);
      test_reduce_scatter(c, n, ip, WF_COMM_AVG, 1 + ip);
      test_allgather(c, n, ip, 0);
      test_allgather(c, n, ip, 1 + ip);
    }
    test_bcast(c, n, 0, 0);
    test_bcast(c, n, wf_comm_size(c) - 1, 0);
    test_bcast(c, n, wf_comm_size(c) / 2, 2);
  }
  OK(wf_comm_barrier(c));
}

/* ---- all-to-all ------------------------------------------------------------------ */

/* Rank r's count for peer p: 0 for some pairs (an expert that gets no tokens), up to
 * `most`; salt changes the pattern. */
static size_t a2a_count(int r, int p, int salt, size_t most)
{
  size_t k = (size_t)(r * 5 + p * 3 + salt) % 4;
  return k == 0 ? 0 : k == 3 ? most : k;
}

/* Variable counts, blocks laid out in reverse peer order with a gap of 3 elements after
 * each (offsets are honoured, not assumed contiguous), against the serial reference:
 * block p of the receive holds rank p's elements meant for this rank. zero: nobody
 * sends anything (every rank still calls). */
static void test_alltoallv(wf_comm *c, int salt, size_t most, bool zero)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  size_t *a = calloc(4 * (size_t)n, sizeof *a), ns = 0, nr = 0;
  size_t *sc = a, *so = a + n, *rc = a + 2 * n, *ro = a + 3 * n;
  for (int p = n - 1; p >= 0; p--) {
    sc[p] = zero ? 0 : a2a_count(r, p, salt, most), so[p] = ns, ns += sc[p] + 3;
    rc[p] = zero ? 0 : a2a_count(p, r, salt, most), ro[p] = nr, nr += rc[p] + 3;
  }
  float *x = alloc_f(ns), *y = alloc_f(nr);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < sc[p]; i++)
      x[so[p] + i] = val(r, (size_t)p * 100003u + i, salt);
  for (size_t i = 0; i < nr; i++)
    y[i] = 1e9f; /* the gaps must stay untouched */
  OK(wf_comm_alltoallv(c, x, sc, so, y, rc, ro, WF_COMM_F32));
  for (int p = 0; p < n; p++) {
    for (size_t i = 0; i < rc[p]; i++)
      CHECK(y[ro[p] + i] == val(p, (size_t)r * 100003u + i, salt));
    for (size_t i = rc[p]; i < rc[p] + 3; i++)
      CHECK(y[ro[p] + i] == 1e9f);
  }
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && e.op == WF_OP_ALLTOALL && e.state == WF_STATE_DONE);
  CHECK(e.count == ns - 3 * (size_t)n && e.bytes == e.count * sizeof(float));
  free(x);
  free(y);
  free(a);
}

/* One count for every peer, int64 elements beyond 2^53 (moved, never touched). */
static void test_alltoall_fixed(wf_comm *c, size_t count)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  int64_t *x = calloc(count * (size_t)n + 1, sizeof *x), *y = calloc(count * (size_t)n + 1, 8);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++)
      x[(size_t)p * count + i] = ((int64_t)1 << 60) + r * 1000 + p * 10 + (int64_t)i;
  OK(wf_comm_alltoall(c, x, y, count, WF_COMM_I64));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++)
      CHECK(y[(size_t)p * count + i] == ((int64_t)1 << 60) + p * 1000 + r * 10 + (int64_t)i);
  free(x);
  free(y);
}

static void test_alltoalls(wf_comm *c)
{
  for (int salt = 0; salt < 4; salt++) {
    test_alltoallv(c, salt, 1031, false);
    test_alltoallv(c, salt, 1, false);
  }
  test_alltoallv(c, 0, 5, true);
  test_alltoall_fixed(c, 0);
  test_alltoall_fixed(c, 1);
  test_alltoall_fixed(c, 257);
}

/* ---- point-to-point ------------------------------------------------------------- */

/* Everyone sends to both neighbours and receives from both, in one group. */
static void test_ring(wf_comm *c, size_t count, bool async)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  int right = (r + 1) % n, left = (r + n - 1) % n;
  float *sr = alloc_f(count), *sl = alloc_f(count), *fl = alloc_f(count), *fr = alloc_f(count);
  fill(sr, count, r, 0, 11);
  fill(sl, count, r, 0, 12);
  OK(wf_comm_group_start(c));
  OK(wf_comm_recv(c, fl, count, WF_COMM_F32, left)); /* receives first: order must not matter */
  OK(wf_comm_recv(c, fr, count, WF_COMM_F32, right));
  OK(wf_comm_send(c, sr, count, WF_COMM_F32, right));
  OK(wf_comm_send(c, sl, count, WF_COMM_F32, left));
  wf_trace_entry e;
  CHECK(wf_comm_last_op(c, &e) && e.state == WF_STATE_QUEUED && e.op == WF_OP_SEND &&
        e.peer == left);
  if (async) {
    wf_req *req = NULL;
    OK(wf_comm_group_end_async(c, &req));
    finish(req, 2);
  } else {
    OK(wf_comm_group_end(c));
  }
  CHECK(wf_comm_last_op(c, &e) && e.state == WF_STATE_DONE);
  for (size_t i = 0; i < count; i++) {
    CHECK(fl[i] == val(left, i, 11));
    CHECK(fr[i] == val(right, i, 12));
  }
  free(sr);
  free(sl);
  free(fl);
  free(fr);
}

/* Pairs (0,1), (2,3), ...: blocking one way, non-blocking the other. */
static void test_pairs(wf_comm *c, size_t count)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), peer = r ^ 1;
  if (peer >= n)
    return;
  float *x = alloc_f(count), *y = alloc_f(count);
  fill(x, count, r, 0, 21);
  wf_req *rq[2] = {NULL, NULL};
  if (r % 2 == 0) {
    OK(wf_comm_send(c, x, count, WF_COMM_F32, peer));
    OK(wf_comm_irecv(c, y, count, WF_COMM_F32, peer, &rq[0]));
  } else {
    OK(wf_comm_recv(c, y, count, WF_COMM_F32, peer));
    for (size_t i = 0; i < count; i++)
      CHECK(y[i] == val(peer, i, 21));
    OK(wf_comm_isend(c, x, count, WF_COMM_F32, peer, &rq[1]));
  }
  OK(wf_req_waitall(rq, 2));
  CHECK(rq[0] == NULL && rq[1] == NULL);
  for (size_t i = 0; r % 2 == 0 && i < count; i++)
    CHECK(y[i] == val(peer, i, 21));
  free(x);
  free(y);
}

/* ---- errors ----------------------------------------------------------------------- */

static void test_local_errors(wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  float buf[64] = {0};
  wf_req *req = (wf_req *)buf; /* must come back NULL on failure */
  CHECK(wf_comm_allreduce(c, buf, buf, 4, WF_COMM_BF16, WF_COMM_SUM) == WF_EUNSUPPORTED);
  CHECK(wf_comm_iallreduce(c, buf, buf, 4, WF_COMM_BF16, WF_COMM_SUM, &req) == WF_EUNSUPPORTED);
  CHECK(req == NULL);
  uint64_t seq = wf_comm_next_seq(c); /* refused before anything is sent */
  CHECK(wf_comm_allreduce(c, buf, buf, 4, WF_COMM_F16, WF_COMM_SUM) == WF_EUNSUPPORTED);
  CHECK(wf_comm_reduce_scatter(c, buf, (uint16_t *)buf + r, 1, WF_COMM_F16, WF_COMM_MAX) ==
        WF_EUNSUPPORTED);
  CHECK(wf_comm_next_seq(c) == seq);
  CHECK(wf_comm_allreduce(c, buf, buf + 1, 4, WF_COMM_F32, WF_COMM_SUM) == WF_EINVAL);
  CHECK(wf_comm_allreduce(c, buf, buf, (size_t)1 << 40, WF_COMM_F32, WF_COMM_SUM) == WF_EINVAL);
  CHECK(wf_comm_allreduce(c, NULL, buf, 4, WF_COMM_F32, WF_COMM_SUM) == WF_EINVAL);
  CHECK(wf_comm_allreduce(NULL, buf, buf, 4, WF_COMM_F32, WF_COMM_SUM) == WF_EINVAL);
  CHECK(wf_comm_allreduce(c, buf, buf, 4, (wf_comm_dtype)7, WF_COMM_SUM) == WF_EINVAL);
  CHECK(wf_comm_bcast(c, buf, 4, WF_COMM_F32, n) == WF_EINVAL);
  CHECK(wf_comm_send(c, buf, 4, WF_COMM_F32, -1) == WF_EINVAL);
  /* all-to-all: arrays missing, overlapping sides, a block past MPI's int */
  size_t cnt[64] = {0}, off[64] = {0};
  cnt[0] = 2;
  CHECK(wf_comm_alltoallv(c, buf, NULL, off, buf + 8, cnt, off, WF_COMM_F32) == WF_EINVAL);
  CHECK(wf_comm_alltoallv(c, buf, cnt, off, buf + 1, cnt, off, WF_COMM_F32) == WF_EINVAL);
  off[0] = (size_t)1 << 40;
  CHECK(wf_comm_alltoallv(c, buf, cnt, off, buf + 8, cnt, off, WF_COMM_F32) == WF_EINVAL);
  /* Reduce-scatter: recv inside send but not at block `rank`. */
  if (n > 1) {
    float *wrong = buf + 4 * ((r + 1) % n);
    CHECK(wf_comm_reduce_scatter(c, buf, wrong, 4, WF_COMM_F32, WF_COMM_SUM) == WF_EINVAL);
    CHECK(wf_comm_allgather(c, wrong, buf, 4, WF_COMM_F32) == WF_EINVAL);
  }
  /* Only send and recv may be grouped; group_end needs a start. */
  CHECK(wf_comm_group_end(c) == WF_EINVAL);
  OK(wf_comm_group_start(c));
  CHECK(wf_comm_barrier(c) == WF_EINVAL);
  CHECK(wf_comm_isend(c, buf, 1, WF_COMM_F32, 0, &req) == WF_EINVAL);
  OK(wf_comm_group_end(c)); /* empty group */
  char why[256] = "";
  CHECK(wf_comm_enable_nccl(c, NULL, why, sizeof why) == WF_ENODEV);
  CHECK(why[0] != '\0' && !wf_comm_has_nccl(c));
}

/* Errors that need the other ranks: every rank must see the same failure. */
static void test_mismatch_errors(wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  float buf[64] = {0};
  if (n < 2)
    return;
  wf_comm_set_check(c, true);
  uint64_t seq = wf_comm_next_seq(c);
  CHECK(wf_comm_allreduce(c, buf, buf, 10 + (r == 0), WF_COMM_F32, WF_COMM_SUM) == WF_EINVAL);
  CHECK(wf_comm_bcast(c, buf, 10, WF_COMM_F32, r == n - 1) == WF_EINVAL);
  CHECK(wf_comm_reduce_scatter(c, buf, buf + 32, 3 + (r == 1), WF_COMM_F32, WF_COMM_AVG) ==
        WF_EINVAL);
  /* all-to-all: rank 0 sends rank 1 two floats, rank 1 expects three */
  size_t a[4 * 64] = {0}, *sc = a, *so = a + 64, *rc = a + 128, *ro = a + 192;
  sc[1] = r == 0 ? 2 : 0, rc[0] = r == 1 ? 3 : 0, so[1] = 0, ro[0] = 0;
  CHECK(wf_comm_alltoallv(c, buf, sc, so, buf + 32, rc, ro, WF_COMM_F32) == WF_EINVAL);
  CHECK(wf_comm_next_seq(c) == seq); /* a refused operation never started */
  OK(wf_comm_allreduce(c, buf, buf, 10, WF_COMM_F32, WF_COMM_SUM)); /* still usable */
  wf_comm_set_check(c, false);
  /* A receive of the wrong size: rank 1 expects 6 floats, rank 0 sends 5. */
  if (r == 0)
    OK(wf_comm_send(c, buf, 5, WF_COMM_F32, 1));
  if (r == 1)
    CHECK(wf_comm_recv(c, buf, 6, WF_COMM_F32, 0) == WF_EINVAL);
  OK(wf_comm_barrier(c));
}

/* ---- integers and agreement ------------------------------------------------------- */

/* Element i of rank r: distinct per rank and large, so a trip through float or double
 * would change it (2^60 + ... is not representable in a double). */
static uint64_t uval(int r, size_t i) { return (1ull << 60) + (uint64_t)r * 1000003u + i * 7u; }

static void test_integers(wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  enum { K = 5 };
  uint64_t u[K], all[8 * K];
  int64_t s[K];
  int32_t w[K];
  for (size_t i = 0; i < K; i++) {
    u[i] = uval(r, i);
    s[i] = (r % 2 ? -1 : 1) * (int64_t)uval(r, i) / 4;
    w[i] = (int32_t)(r * 10 + (int)i) * (r % 2 ? -1 : 1);
  }
  OK(wf_comm_allgather(c, u, all, K, WF_COMM_U64));
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < K; i++)
      CHECK(all[(size_t)q * K + i] == uval(q, i));
  uint64_t mx[K], mn[K];
  OK(wf_comm_allreduce(c, u, mx, K, WF_COMM_U64, WF_COMM_MAX));
  OK(wf_comm_allreduce(c, u, mn, K, WF_COMM_U64, WF_COMM_MIN));
  for (size_t i = 0; i < K; i++)
    CHECK(mx[i] == uval(n - 1, i) && mn[i] == uval(0, i));
  int64_t smin[K];
  OK(wf_comm_allreduce(c, s, smin, K, WF_COMM_I64, WF_COMM_MIN));
  int32_t wsum[K];
  OK(wf_comm_allreduce(c, w, wsum, K, WF_COMM_I32, WF_COMM_SUM));
  for (size_t i = 0; i < K; i++) {
    int64_t want_min = INT64_MAX, want_sum = 0;
    for (int q = 0; q < n; q++) {
      int64_t v = (q % 2 ? -1 : 1) * (int64_t)uval(q, i) / 4;
      want_min = v < want_min ? v : want_min;
      want_sum += (int32_t)(q * 10 + (int)i) * (q % 2 ? -1 : 1);
    }
    CHECK(smin[i] == want_min && wsum[i] == want_sum);
  }
  /* bcast and reduce-scatter of uint64, and an int32 message */
  uint64_t b = r == 0 ? uval(7, 7) : 0;
  OK(wf_comm_bcast(c, &b, 1, WF_COMM_U64, 0));
  CHECK(b == uval(7, 7));
  uint64_t blocks[8], mine = 0;
  for (int q = 0; q < n; q++)
    blocks[q] = uval(r, (size_t)q);
  OK(wf_comm_reduce_scatter(c, blocks, &mine, 1, WF_COMM_U64, WF_COMM_MAX));
  CHECK(mine == uval(n - 1, (size_t)r));
  if (n > 1 && r < 2) {
    int32_t msg[3] = {r, -5, 77}, got[3] = {0};
    if (r == 0)
      OK(wf_comm_send(c, msg, 3, WF_COMM_I32, 1));
    else
      OK(wf_comm_recv(c, got, 3, WF_COMM_I32, 0));
    CHECK(r == 0 || (got[0] == 0 && got[1] == -5 && got[2] == 77));
  }
  /* bytes: a broadcast string, and a reduction of bytes is refused */
  char text[16] = "";
  if (r == 0)
    snprintf(text, sizeof text, "manifest %d", n);
  OK(wf_comm_bcast(c, text, sizeof text, WF_COMM_U8, 0));
  char want[16];
  snprintf(want, sizeof want, "manifest %d", n);
  CHECK(!strcmp(text, want));
  CHECK(wf_comm_allreduce(c, text, text, 4, WF_COMM_U8, WF_COMM_MAX) == WF_EINVAL);
  /* an average of integers is refused before anything is sent */
  uint64_t seq = wf_comm_next_seq(c);
  CHECK(wf_comm_allreduce(c, w, wsum, K, WF_COMM_I32, WF_COMM_AVG) == WF_EINVAL);
  CHECK(wf_comm_next_seq(c) == seq);
}

/* 16-bit floats on host buffers (mixed precision's activations and pipeline messages):
 * moved bit for bit by MPI as 2-byte words, every pattern (NaN payloads too). Reducing
 * them is refused (test_local_errors). */
static uint16_t hval(int r, size_t i) { return (uint16_t)(r * 7919 + i * 104729 + 0x7fc1); }

static void test_halves(wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  const wf_comm_dtype types[2] = {WF_COMM_BF16, WF_COMM_F16};
  enum { K = 257 };
  for (int t = 0; t < 2; t++) {
    uint16_t mine[K], all[8 * K], b[K];
    CHECK(wf_comm_dtype_size(types[t]) == 2);
    for (size_t i = 0; i < K; i++)
      mine[i] = hval(r, i), b[i] = r == 0 ? hval(9, i) : 0;
    OK(wf_comm_allgather(c, mine, all, K, types[t]));
    for (int q = 0; q < n; q++)
      for (size_t i = 0; i < K; i++)
        CHECK(all[(size_t)q * K + i] == hval(q, i));
    OK(wf_comm_bcast(c, b, K, types[t], 0));
    for (size_t i = 0; i < K; i++)
      CHECK(b[i] == hval(9, i));
    if (n > 1 && r < 2) {
      uint16_t got[K] = {0};
      if (r == 0)
        OK(wf_comm_send(c, mine, K, types[t], 1));
      else
        OK(wf_comm_recv(c, got, K, types[t], 0));
      for (size_t i = 0; r == 1 && i < K; i++)
        CHECK(got[i] == hval(0, i));
    }
  }
  CHECK(!strcmp(wf_comm_dtype_name(WF_COMM_F16), "f16"));
}

static void test_agree(wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c), bad = 99;
  OK(wf_comm_agree(c, WF_OK, &bad));
  CHECK(bad == -1);
  /* ranks n-1 and (n > 2 ? 1 : n-1) fail with different statuses: the lowest wins */
  int low = n > 2 ? 1 : n - 1;
  wf_status mine = r == n - 1 ? WF_EIO : r == low ? WF_ENOMEM : WF_OK;
  CHECK(wf_comm_agree(c, mine, &bad) == (low == n - 1 ? WF_EIO : WF_ENOMEM));
  CHECK(bad == low);
  CHECK(wf_comm_agree(c, r == 0 ? WF_EUNSUPPORTED : WF_OK, NULL) == WF_EUNSUPPORTED);
  CHECK(wf_comm_agree(NULL, WF_ECONFIG, &bad) == WF_ECONFIG && bad == 0);
}

/* ---- flight recorder ------------------------------------------------------------ */

/* Operation k of the recorder test, and the bytes it records. */
static wf_comm_op pattern_op(uint64_t k)
{
  return (wf_comm_op[]){WF_OP_ALLREDUCE, WF_OP_BCAST, WF_OP_ALLGATHER, WF_OP_BARRIER,
                        WF_OP_REDUCE_SCATTER}[k % 5];
}
static size_t pattern_count(uint64_t k) { return pattern_op(k) == WF_OP_BARRIER ? 0 : k % 7 + 1; }

static void run_pattern(wf_comm *c, uint64_t k, float *a, float *b)
{
  size_t cnt = pattern_count(k);
  switch (pattern_op(k)) {
  case WF_OP_ALLREDUCE: OK(wf_comm_allreduce(c, a, b, cnt, WF_COMM_F32, WF_COMM_SUM)); break;
  case WF_OP_BCAST: OK(wf_comm_bcast(c, a, cnt, WF_COMM_F32, 0)); break;
  case WF_OP_ALLGATHER: OK(wf_comm_allgather(c, a, b, cnt, WF_COMM_F32)); break;
  case WF_OP_BARRIER: OK(wf_comm_barrier(c)); break;
  default: OK(wf_comm_reduce_scatter(c, b, a, cnt, WF_COMM_F32, WF_COMM_SUM)); break;
  }
}

static void check_entry(const wf_comm *c, const wf_trace_entry *e, uint64_t seq)
{
  size_t cnt = pattern_count(seq);
  size_t bytes = cnt * 4 * (pattern_op(seq) == WF_OP_REDUCE_SCATTER ? wf_comm_size(c) : 1);
  CHECK(e->seq == seq && e->op == pattern_op(seq) && e->count == cnt && e->bytes == bytes);
  CHECK(e->state == WF_STATE_DONE && e->start_ns > 0 && e->end_ns >= e->start_ns);
  CHECK(e->peer == (e->op == WF_OP_BCAST ? 0 : -1) && !e->device && e->dtype == WF_COMM_F32);
}

typedef struct reader_arg {
  wf_comm *c;
  atomic_int stop;
  atomic_int snapshots;
} reader_arg;

/* Snapshots taken while the main thread runs operations must be consistent. */
static void *reader(void *p)
{
  reader_arg *a = p;
  wf_trace_entry e[WF_COMM_TRACE_LEN];
  while (!atomic_load(&a->stop)) {
    int got = wf_comm_trace_snapshot(a->c, e, WF_COMM_TRACE_LEN);
    for (int i = 0; i < got; i++) {
      CHECK(e[i].op == pattern_op(e[i].seq) && e[i].count == pattern_count(e[i].seq));
      CHECK(i == 0 || e[i].seq > e[i - 1].seq);
    }
    atomic_fetch_add(&a->snapshots, 1);
  }
  return NULL;
}

typedef struct watch_arg {
  wf_comm *c;
  uint64_t seq;
  atomic_int seen; /* 1 once the operation was seen running */
} watch_arg;

/* The watchdog's view: poll last_op until operation `seq` shows as running. */
static void *watcher(void *p)
{
  watch_arg *a = p;
  wf_trace_entry e;
  double t0 = MPI_Wtime();
  while (!atomic_load(&a->seen) && MPI_Wtime() - t0 < 10.0) {
    if (wf_comm_last_op(a->c, &e) && e.seq == a->seq && e.state == WF_STATE_RUNNING &&
        e.op == WF_OP_ALLREDUCE && e.end_ns == 0)
      atomic_store(&a->seen, 1);
    sched_yield();
  }
  return NULL;
}

/* Rank 0 sits in an allreduce while the last rank is late; a second thread on rank 0
 * must see it there, as the watchdog would while the main thread is stuck in MPI. */
static void test_stuck_visible(wf_comm *c)
{
  int n = wf_comm_size(c), r = wf_comm_rank(c);
  float x[4] = {1, 2, 3, 4};
  if (n < 2)
    return;
  watch_arg wa = {.c = c, .seq = wf_comm_next_seq(c)};
  pthread_t th;
  if (r == 0)
    CHECK(pthread_create(&th, NULL, watcher, &wa) == 0);
  if (r == n - 1) {
    struct timespec ts = {0, 200 * 1000 * 1000}; /* late by 0.2 s */
    nanosleep(&ts, NULL);
  }
  OK(wf_comm_allreduce(c, x, x, 4, WF_COMM_F32, WF_COMM_SUM));
  if (r == 0) {
    CHECK(pthread_join(th, NULL) == 0);
    CHECK(atomic_load(&wa.seen) == 1);
    wf_trace_entry e;
    CHECK(wf_comm_last_op(c, &e) && e.seq == wa.seq && e.state == WF_STATE_DONE &&
          e.end_ns - e.start_ns > 50 * 1000 * 1000); /* it did wait for the late rank */
  }
}

static void test_recorder(wf_comm *world)
{
  wf_comm *c = NULL;
  float a[64] = {0}, b[64 * 8] = {0};
  wf_trace_entry e[2 * WF_COMM_TRACE_LEN];
  OK(wf_comm_split(world, 0, wf_comm_rank(world), "fr", &c));
  CHECK(wf_comm_trace_snapshot(c, e, 8) == 0 && !wf_comm_last_op(c, e));
  for (uint64_t k = 0; k < 5; k++)
    run_pattern(c, k, a, b);
  int got = wf_comm_trace_snapshot(c, e, 2 * WF_COMM_TRACE_LEN);
  CHECK(got == 5);
  for (int i = 0; i < got; i++)
    check_entry(c, &e[i], (uint64_t)i);
  /* Wrap the ring twice and a bit, with a reader thread polling all along. */
  const uint64_t total = 2 * WF_COMM_TRACE_LEN + 7;
  reader_arg ra = {.c = c};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, reader, &ra) == 0);
  for (uint64_t k = 5; k < total; k++)
    run_pattern(c, k, a, b);
  while (atomic_load(&ra.snapshots) < 3) /* one rank alone may finish before it starts */
    sched_yield();
  atomic_store(&ra.stop, 1);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK(wf_comm_next_seq(c) == total);
  got = wf_comm_trace_snapshot(c, e, 2 * WF_COMM_TRACE_LEN);
  CHECK(got == WF_COMM_TRACE_LEN);
  for (int i = 0; i < got; i++)
    check_entry(c, &e[i], total - WF_COMM_TRACE_LEN + (uint64_t)i);
  got = wf_comm_trace_snapshot(c, e, 3); /* the 3 most recent, oldest first */
  CHECK(got == 3 && e[0].seq == total - 3 && e[2].seq == total - 1);
  CHECK(wf_comm_last_op(c, e) && e[0].seq == total - 1);
  /* A non-blocking operation is running until waited for. */
  wf_req *req = NULL;
  OK(wf_comm_iallreduce(c, a, a, 5, WF_COMM_F32, WF_COMM_SUM, &req));
  CHECK(wf_comm_last_op(c, e) && e[0].seq == total && e[0].state == WF_STATE_RUNNING &&
        e[0].end_ns == 0);
  OK(wf_req_wait(&req));
  CHECK(wf_comm_last_op(c, e) && e[0].state == WF_STATE_DONE && e[0].bytes == 20);
  char line[160];
  wf_comm_trace_format(c, &e[0], line, sizeof line);
  CHECK(strstr(line, "fr#") == line && strstr(line, "allreduce 5 x f32 (20 B)") != NULL);
  test_stuck_visible(c);
  wf_comm_destroy(c);
}

/* ---- main --------------------------------------------------------------------- */

static void run_all(wf_comm *world, size_t large)
{
  int n = wf_comm_size(world), r = wf_comm_rank(world);
  wf_comm *half = NULL, *pair = NULL, *none = NULL;
  test_collectives_on(world, large);
  /* Two halves by parity, each ordered by descending world rank. */
  OK(wf_comm_split(world, r % 2, -r, "half", &half));
  CHECK(half && wf_comm_size(half) == (n + 1 - r % 2) / 2);
  CHECK(wf_comm_world_rank(half, wf_comm_rank(half)) == r);
  test_collectives_on(half, large / 4);
  /* Explicit group {n-1, 0} in that order; other ranks get NULL. */
  int ranks[2] = {n - 1, 0};
  OK(wf_comm_create_group(world, ranks, n > 1 ? 2 : 1, "ends", &pair));
  CHECK((pair != NULL) == (r == 0 || r == n - 1));
  if (pair) {
    CHECK(wf_comm_rank(pair) == (r == n - 1 ? 0 : 1) && !strcmp(wf_comm_name(pair), "ends"));
    test_collectives_on(pair, 4099);
    test_ring(pair, 1031, false);
  }
  OK(wf_comm_split(world, -1, 0, "none", &none));
  CHECK(none == NULL);
  for (int async = 0; async < 2; async++) {
    test_ring(world, 0, async);
    test_ring(world, 1031, async);
    test_ring(half, 4096, async);
  }
  test_pairs(world, 1031);
  test_pairs(world, 1);
  test_alltoalls(world);
  test_alltoalls(half);
  test_integers(world);
  test_integers(half);
  test_halves(world);
  test_halves(half);
  test_agree(world);
  test_agree(half);
  /* The expected errors are logged; rank 0's lines show what users would read. */
  int level = wf_log_level();
  wf_log_set_level(r == 0 ? WF_LOG_ERROR : -1);
  test_local_errors(world);
  test_mismatch_errors(world);
  wf_log_set_level(level);
  test_recorder(world);
  wf_comm_destroy(pair);
  wf_comm_destroy(half);
}

int main(int argc, char **argv)
{
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  wf_rt_set_rank(world_rank);
  wf_comm *world = NULL;
  OK(wf_comm_world_create(&world));
  CHECK(wf_comm_rank(world) == world_rank && !strcmp(wf_comm_name(world), "world"));
  /* 4 MiB per buffer on few ranks; less at 8 ranks sharing 2 cores. */
  size_t large = wf_comm_size(world) <= 4 ? (size_t)1 << 20 : (size_t)1 << 18;
  double t0 = MPI_Wtime();
  int n = wf_comm_size(world);
  run_all(world, large);
  wf_comm_destroy(world);
  if (world_rank == 0)
    printf("collectives: all checks passed on %d ranks in %.2f s\n", n, MPI_Wtime() - t0);
  MPI_Finalize();
  return 0;
}
