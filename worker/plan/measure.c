/*
 * measure.c - this machine's profile (worker --profile-hw, and the planner's default):
 * GEMMs at the model's shapes through the device's kernels, the attention kernel,
 * memory bandwidth, and under mpirun the collectives (all-reduce, blocking and as the
 * gradient path issues it, and all-gather) over groups of 2, 4, ... ranks at the job's
 * message size.
 *
 * The GEMMs run on rank 0 alone (the others wait), at one thread and at every core:
 * the time model gives a rank cores / ranks threads, or one thread and a share of a
 * core. A GEMM above MAX_FLOPS is measured on a part of it (its longer side halved until
 * it fits: the vocabulary's columns, or the rows): a large GEMM's rate does not depend on
 * that side's length, and the profile stays a few seconds long.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan_int.h"
#include "wf_collectives.h"
#include "wf_kernels.h"

#define MAX_FLOPS 4e8 /* per measured GEMM */
#define REPS      3   /* best of, after a warm-up */

typedef struct bench {
  wf_dev *dev;
  const wf_kset *k;
  float *buf; /* scratch of n floats */
  size_t n;
} bench;

static double best_of(bench *b, int what, int m, int n, int k)
{
  double best = INFINITY;
  float *x = b->buf, *w = b->buf + (size_t)m * k, *y = w + (size_t)n * k;
  for (int r = 0; r <= REPS; r++) {
    double t = wf_now();
    if (what == 0)
      WF_K(b->k, matmul)->forward(y, x, w, NULL, m, k, n, WF_PREC_NO, NULL);
    else /* attention of one batch row over m heads: qkv (T, 3 hs m) */
      WF_K(b->k, attention)->forward(y, w, x, NULL, 1, n, k * m, m, m, NULL);
    wf_dev_stream_sync(b->dev, NULL);
    t = wf_now() - t;
    if (r > 0 && t < best)
      best = t;
  }
  return best;
}

static void add_gemm(bench *b, wf_hw *hw, int m, int n, int k, int threads)
{
  for (int i = 0; i < hw->n_gemm; i++) /* once per shape and thread count */
    if (hw->gemm[i].m == m && hw->gemm[i].n == n && hw->gemm[i].k == k &&
        hw->gemm[i].threads == threads && !hw->gemm[i].attention)
      return;
  if (hw->n_gemm >= WF_HW_MAX_GEMM || m < 1 || n < 1 || k < 1)
    return;
  int rows = m, cols = n; /* halve the longer side: the vocabulary, or the rows */
  while (2.0 * rows * cols * k > MAX_FLOPS && (rows > 64 || cols > 64)) {
    if (cols >= rows)
      cols /= 2;
    else
      rows /= 2;
  }
  if ((size_t)rows * k + (size_t)cols * k + (size_t)rows * cols > b->n)
    return;
  double t = best_of(b, 0, rows, cols, k);
  hw->gemm[hw->n_gemm++] = (wf_hw_gemm){m, n, k, threads, 2.0 * rows * cols * k / t * 1e-12, false};
}

/* The attention kernel of T positions and head size hs, recorded as the (T,T,hs) GEMM
 * the time model prices it at (4 T^2 hs flops per head: Q.K^T and att.V). */
static void add_attention(bench *b, wf_hw *hw, int T, int hs, int threads)
{
  int heads = 4;
  size_t need = (size_t)T * 3 * hs * heads + (size_t)heads * T * T + (size_t)T * hs * heads;
  if (hw->n_gemm >= WF_HW_MAX_GEMM || need > b->n)
    return;
  double t = best_of(b, 1, heads, T, hs);
  hw->gemm[hw->n_gemm++] =
      (wf_hw_gemm){T, T, hs, threads, 4.0 * heads * T * T * hs / t * 1e-12, true};
}

/* Every GEMM shape of the model's layers (its family's block kernels) and head for
 * micro-batches of T .. N rows and tp sizes 1, 2, 4 ... up to tpmax that divide the
 * heads (and the kv heads and the MLP). */
static void model_shapes(bench *b, wf_hw *hw, const wf_model_dims *dd, int N, int T, int tpmax,
                         int threads)
{
  wf_model_dims d = wf_model_dims_resolve(dd);
  int C = d.C;
  for (int tp = 1; tp <= tpmax && d.NH % tp == 0 && d.KV % tp == 0 && C % tp == 0 && d.F % tp == 0;
       tp *= 2) {
    for (int rows = T; rows <= N; rows *= 4) {
      wf_model_costs k;
      wf_cost_geo g = {.B = rows / T, .T = T, .N = rows, .R = rows, .tp = tp};
      wf_model_costs_get(&d, &g, &k);
      for (int i = 0; i < k.n_block; i++)
        if (k.block[i].kind == WF_COST_GEMM)
          add_gemm(b, hw, (int)k.block[i].m, (int)k.block[i].n, (int)k.block[i].k, threads);
      add_gemm(b, hw, rows, d.Vp / tp, C, threads);
    }
  }
  add_attention(b, hw, T, C / d.NH, threads);
}

/* Bytes per second of a residual add over 64 MiB (two reads and a write). */
static double mem_bandwidth(bench *b)
{
  size_t n = WF_MIN(b->n / 3, (size_t)16 << 20);
  double best = INFINITY;
  for (int r = 0; r <= REPS; r++) {
    double t = wf_now();
    WF_K(b->k, residual)->forward(b->buf, b->buf + n, b->buf + 2 * n, n, NULL);
    wf_dev_stream_sync(b->dev, NULL);
    t = wf_now() - t;
    if (r > 0 && t < best)
      best = t;
  }
  return 12.0 * n / best;
}

/* Seconds of one kernel call on a few floats: what every op costs besides its work. */
static double op_overhead(bench *b)
{
  double t[31];
  for (int r = 0; r < 31; r++) {
    t[r] = wf_now();
    WF_K(b->k, residual)->forward(b->buf, b->buf + 256, b->buf + 512, 256, NULL);
    wf_dev_stream_sync(b->dev, NULL);
    t[r] = wf_now() - t[r];
  }
  for (int i = 1; i < 31; i++)
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      double x = t[j];
      t[j] = t[j - 1], t[j - 1] = x;
    }
  return t[15];
}

/* Best seconds of fn(b) over REPS runs after a warm-up. */
static double best_time(bench *b, void (*fn)(bench *b, int rows, int C), int rows, int C)
{
  double best = INFINITY;
  for (int r = 0; r <= REPS; r++) {
    double t = wf_now();
    fn(b, rows, C);
    wf_dev_stream_sync(b->dev, NULL);
    t = wf_now() - t;
    if (r > 0 && t < best)
      best = t;
  }
  return best;
}

/* The scratch as (rows, C) tensors: x, y, dy, dx, then per-row stats and a weight. */
static void ln_pair(bench *b, int rows, int C)
{
  size_t n = (size_t)rows * C;
  float *x = b->buf, *y = x + n, *dy = y + n, *dx = dy + n, *mean = dx + n, *rstd = mean + rows,
        *w = rstd + rows, *dw = w + C, *db = dw + C;
  WF_K(b->k, layernorm)->forward(y, mean, rstd, x, w, db, rows, C, NULL);
  WF_K(b->k, layernorm)->backward(dx, dw, db, dy, x, w, mean, rstd, rows, C, NULL);
}

static void gelu_pair(bench *b, int rows, int C)
{
  size_t n = (size_t)rows * C;
  WF_K(b->k, gelu)->forward(b->buf + n, b->buf, n, NULL);
  WF_K(b->k, gelu)->backward(b->buf + 2 * n, b->buf, b->buf + n, n, NULL);
}

static void mm_fwd(bench *b, int rows, int C)
{
  float *x = b->buf, *w = x + (size_t)rows * C, *y = w + (size_t)4 * C * C;
  WF_K(b->k, matmul)->forward(y, x, w, NULL, rows, C, 4 * C, WF_PREC_NO, NULL);
}

static void mm_bwd(bench *b, int rows, int C)
{
  float *x = b->buf, *w = x + (size_t)rows * C, *dy = w + (size_t)4 * C * C,
        *dx = dy + (size_t)rows * 4 * C, *dw = dx + (size_t)rows * C, *db = dw + (size_t)4 * C * C;
  WF_K(b->k, matmul)->backward(dx, dw, db, dy, x, w, rows, C, 4 * C, WF_PREC_NO, NULL);
}

/* rows = T positions of one batch row, C = hs: four heads. */
static void att_fwd(bench *b, int T, int hs)
{
  float *qkv = b->buf, *att = qkv + (size_t)T * 12 * hs, *out = att + (size_t)4 * T * T;
  WF_K(b->k, attention)->forward(out, att, qkv, NULL, 1, T, 4 * hs, 4, 4, NULL);
}

static void att_bwd(bench *b, int T, int hs)
{
  float *qkv = b->buf, *att = qkv + (size_t)T * 12 * hs, *dout = att + (size_t)4 * T * T,
        *dqkv = dout + (size_t)T * 4 * hs, *scratch = dqkv + (size_t)T * 12 * hs;
  WF_K(b->k, attention)->backward(dqkv, scratch, dout, qkv, att, NULL, 1, T, 4 * hs, 4, 4, NULL);
}

/* Floats mm_bwd's and att_bwd's buffers take (the forwards take fewer). */
static size_t mm_floats(int rows, int C)
{
  return (size_t)rows * C * 6 + (size_t)C * C * 8 + (size_t)C * 4;
}

static size_t att_floats(const bench *b, int T, int hs)
{
  return (size_t)T * 28 * hs + (size_t)4 * T * T + WF_K(b->k, attention)->scratch(1, T, 4 * hs, 4);
}

/* The model's non-GEMM kernels at one thread, at its width C, head size hs and T. The
 * backward-to-forward ratios are measured at C and T halved until their buffers fit the
 * scratch (Llama 8B's C 4096 and T 8192 do not): a ratio of two runs of the same shape
 * depends little on the shape, and the profile stays seconds long. */
static void kernel_costs(bench *b, wf_hw *hw, int C, int hs, int T)
{
  int rows = 256, Cm = C, Tm = T;
  while (Cm > 64 && mm_floats(rows, Cm) > b->n)
    Cm /= 2;
  while (Tm > 64 && att_floats(b, Tm, hs) > b->n)
    Tm /= 2;
  hw->ln_s = best_time(b, ln_pair, rows, C) / ((double)rows * C);
  hw->gelu_s = best_time(b, gelu_pair, rows, 4 * C) / ((double)rows * 4 * C);
  hw->matmul_bwd = best_time(b, mm_bwd, rows, Cm) / best_time(b, mm_fwd, rows, Cm);
  hw->attn_bwd = best_time(b, att_bwd, Tm, hs) / best_time(b, att_fwd, Tm, hs);
}

static double host_memory(void)
{
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (double)pages * size : 0;
}

wf_status wf__plan_measure(const wf_model_dims *d, int N, int T, int tpmax, wf_hw *hw)
{
  wf_status st = WF_OK;
  bench b = {.dev = wf_dev_cpu(), .n = (size_t)48 << 20};
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN), saved = wf_kernels_threads();
  b.k = wf_dev_kernels(b.dev, WF_DT_F32);
  memset(hw, 0, sizeof *hw);
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  snprintf(hw->name, sizeof hw->name, "cpu %s", host);
  snprintf(hw->source, sizeof hw->source,
           "measured on %s: GEMMs at the model's shapes, the attention kernel, memory bandwidth",
           host);
  WF_TRY(wf_dev_alloc_floats(b.dev, &b.buf, b.n));
  hw->cores = cores > 0 ? cores : 1;
  hw->gpus_per_node = 1 << 16; /* every rank on this one host */
  hw->mem_bytes = host_memory();
  for (int th = 1;; th = hw->cores) {
    wf_kernels_set_threads(th);
    model_shapes(&b, hw, d, WF_MAX(N, T), T, tpmax, th);
    if (th == hw->cores)
      break;
  }
  hw->mem_bw = mem_bandwidth(&b);
  wf_kernels_set_threads(1);
  hw->op_s = op_overhead(&b);
  kernel_costs(&b, hw, d->C, d->C / d->NH, T);
  /* collectives until measured: shared memory, one copy in and out at memory speed */
  hw->intra_alpha_s = hw->inter_alpha_s = 20e-6;
  hw->intra_bw = hw->inter_bw = hw->mem_bw / 4;
fail:
  wf_kernels_set_threads(saved);
  wf_dev_free(b.dev, b.buf);
  return st;
}

#define MIN_MSG ((size_t)1 << 16) /* floats: 256 KiB, where the bytes term dominates alpha */

/* A busy rank's step between collectives: a residual add over n floats. */
static void work(const wf_kset *k, float *buf, size_t n)
{
  WF_K(k, residual)->forward(buf, buf + n, buf + 2 * n, n, NULL);
}

#define BUSY_ITERS 100
#define BIG_ITERS  20    /* of the job's message: ~1-10 ms each here */
#define BUSY_N     65536 /* floats a work step adds: ~50 us alone */
#define BUSY_TRIES 3     /* the median of */
#define MAX_OPS    5     /* collectives measured per group */

typedef enum { OP_NONE, OP_ALLREDUCE, OP_DP_ALLREDUCE, OP_ALLGATHER, OP_ALLTOALL } coll_op;

/* The scratch: the message (big floats), a second one (the all-gather's other side),
 * then a work step's 3 BUSY_N floats. */
typedef struct coll_buf {
  float *buf;
  size_t big;
  int sync; /* small collectives between two world-wide ones: 4 per layer (tp's) */
} coll_buf;

/* One collective over c of a vector of n floats (a piece of n / size each for the
 * all-gather): tp's and HSDP's replica all-reduces blocking, as the job issues them;
 * ZeRO's parameter gathers as one blocking all-gather (the job broadcasts each owner's
 * piece in place: the same bytes); the gradient buckets' reduction as grads.c and zero.c
 * run it, non-blocking and, the CPU having nothing to overlap it with (Open MPI moves it
 * only inside MPI calls), waited for. That costs more than a blocking all-reduce: Open MPI's
 * non-blocking component takes other algorithms, and each call maps its temporary buffer afresh
 * (worker/main.c's malloc threshold): 8 ranks on 2 cores reducing 1.7 MB after a step's
 * GEMMs took 5-9 ms non-blocking against 4.1 ms blocking, and the blocking rate left
 * the planner's 8-rank steps 20% short of the measured ones. */
static wf_status run_op(wf_comm *c, const coll_buf *b, coll_op op, size_t n)
{
  size_t piece = WF_MAX(n / (size_t)wf_comm_size(c), 1);
  float *x = b->buf, *y = b->buf + b->big;
  wf_req *r = NULL;
  switch (op) {
  case OP_NONE: return WF_OK;
  case OP_ALLREDUCE: return wf_comm_allreduce(c, x, x, n, WF_COMM_F32, WF_COMM_SUM);
  case OP_DP_ALLREDUCE: {
    wf_status st = wf_comm_iallreduce(c, x, x, n, WF_COMM_F32, WF_COMM_AVG, &r);
    return st == WF_OK ? wf_req_wait(&r) : st;
  }
  case OP_ALLGATHER: return wf_comm_allgather(c, x, y, piece, WF_COMM_F32);
  case OP_ALLTOALL: return wf_comm_alltoall(c, x, y, piece, WF_COMM_F32); /* ep's tokens */
  }
  return WF_EINVAL;
}

/* Seconds per step of `iters` work steps, each followed by the collective op of n
 * floats over c, and a world barrier after every `sync` of them. */
static wf_status busy_loop(wf_comm *world, wf_comm *c, const coll_buf *b, coll_op op, size_t n,
                           int iters, int sync, double *sec)
{
  wf_status st = WF_OK;
  const wf_kset *k = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  WF_TRY(wf_comm_barrier(world));
  double t0 = wf_now();
  for (int i = 0; i < iters; i++) {
    work(k, b->buf + 2 * b->big, BUSY_N);
    WF_TRY(run_op(c, b, op, n));
    if ((i + 1) % sync == 0 || i == iters - 1)
      WF_TRY(wf_comm_barrier(world));
  }
  *sec = (wf_now() - t0) / iters;
fail:
  return st;
}

static double median3(const double *d)
{
  double lo = fmin(d[0], fmin(d[1], d[2])), hi = fmax(d[0], fmax(d[1], d[2]));
  return d[0] + d[1] + d[2] - lo - hi;
}

/* The median over BUSY_TRIES of what each of the collectives ops[0..n_ops) of n[i]
 * floats adds to a work step, into sec[i]; every try runs them all, in turn, after one
 * loop without (slow drift in the machine's load hits them alike). */
static wf_status added(wf_comm *world, wf_comm *c, const coll_buf *b, const coll_op *ops,
                       const size_t *n, const int *iters, const int *sync, int n_ops, double *sec)
{
  wf_status st = WF_OK;
  double d[MAX_OPS][BUSY_TRIES];
  n_ops = WF_MIN(n_ops, MAX_OPS);
  for (int t = 0; t < BUSY_TRIES; t++)
    for (int i = 0; i < n_ops; i++) {
      double with = 0, without = 0;
      WF_TRY(busy_loop(world, c, b, OP_NONE, 0, iters[i], sync[i], &without));
      WF_TRY(busy_loop(world, c, b, ops[i], n[i], iters[i], sync[i], &with));
      d[i][t] = with - without;
    }
  for (int i = 0; i < n_ops; i++)
    sec[i] = fmax(0, median3(d[i]));
fail:
  return st;
}

/* Bytes per second of the vector's bytes for a collective that added t seconds, of
 * which alpha is its latency (1e12, "free", when it measured no more than that). */
static double rate(size_t n, double t, double alpha)
{
  return t > alpha ? n * 4.0 / (t - alpha) : 1e12;
}

/* Collectives over groups of g ranks, every group at once (as in a mesh), as a job sees
 * them: what a one-float all-reduce adds to a loop of work steps is alpha (ranks that
 * share cores wait for their partners to be scheduled, which a synchronised ping would
 * not see); what an all-reduce, an all-gather and the gradient path's all-reduce of the
 * job's message (b->big floats, msg_floats) add beyond that gives each one's bandwidth
 * (run_op says which the job uses where; on shared memory an all-gather is not half an
 * all-reduce). The groups meet on a world barrier as often as a job's do: its loss
 * average and dp reduction span every rank once a step, between them a tp group runs 4
 * small all-reduces per layer (b->sync, two forward and two backward), and the dp
 * reduction's large ones follow a whole step's work. Groups never brought together fall
 * out of phase with each other and measure the scheduler's time slices instead (0.3-5 ms
 * per all-reduce, from one profile to the next, for groups of 2 and 4 among 8 ranks on 2
 * cores); groups brought together at every one miss the partner's wait a tp group sees
 * (they read 0-0.2 ms, where dp 4 x tp 2 plans of 8 layers at 8 ranks spend ~0.2 ms per
 * tp all-reduce, from their step times). Rank 0's group answers. */
static wf_status measure_group(wf_comm *world, int g, const coll_buf *b, wf_hw_coll *out)
{
  wf_status st = WF_OK;
  wf_comm *c = NULL;
  int rank = wf_comm_rank(world);
  size_t n = b->big / (size_t)g * (size_t)g; /* whole pieces */
  const coll_op ops[MAX_OPS] = {OP_ALLREDUCE, OP_ALLREDUCE, OP_ALLGATHER, OP_DP_ALLREDUCE,
                                OP_ALLTOALL};
  const size_t sizes[MAX_OPS] = {1, n, n, n, n};
  const int iters[MAX_OPS] = {BUSY_ITERS, BIG_ITERS, BIG_ITERS, BIG_ITERS, BIG_ITERS};
  const int sync[MAX_OPS] = {WF_MIN(b->sync, BUSY_ITERS), 1, 1, 1, 1};
  double t[MAX_OPS]; /* alpha, then the vector's all-reduce, all-gather, dp all-reduce and
                      * all-to-all */
  WF_TRY(wf_comm_split(world, rank / g, rank, "profile", &c));
  WF_TRY(added(world, c, b, ops, sizes, iters, sync, MAX_OPS, t));
  *out = (wf_hw_coll){
      g, t[0], rate(n, t[1], t[0]), rate(n, t[2], t[0]), rate(n, t[3], t[0]), rate(n, t[4], t[0])};
fail:
  wf_comm_destroy(c);
  if (st == WF_OK)
    st = wf_comm_barrier(world);
  return st;
}

/* Cores the ranks deliver together: each runs the model's widest GEMM for a while, all at
 * once, and the sum of their rates over the one-thread rate measured alone; the median
 * of BUSY_TRIES (one of about ten single tries here read 0.9 of 2 cores). */
static wf_status measure_busy_cores(wf_comm *world, const wf_hw *alone, float *buf, double *cores)
{
  wf_status st = WF_OK;
  const wf_kset *k = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  int m = 256, n = 256, kk = 64, saved = wf_kernels_threads();
  double one = wf_hw_gemm_s(alone, m, n, kk, 1, WF_PREC_NO), d[BUSY_TRIES];
  wf_kernels_set_threads(1);
  for (int i = 0; i < BUSY_TRIES; i++) {
    int reps = 0;
    WF_TRY(wf_comm_barrier(world));
    double t0 = wf_now(), t = 0;
    while ((t = wf_now() - t0) < 0.3) { /* every rank at once for 0.3 s */
      WF_K(k, matmul)->forward(buf + 2 * m * kk, buf, buf + m * kk, NULL, m, kk, n, WF_PREC_NO,
                               NULL);
      reps++;
    }
    float sum = (float)(reps / t); /* GEMMs per second, then over all ranks */
    WF_TRY(wf_comm_allreduce(world, &sum, &sum, 1, WF_COMM_F32, WF_COMM_SUM));
    d[i] = one > 0 ? sum * one : 1;
  }
  *cores = median3(d);
fail:
  wf_kernels_set_threads(saved);
  return st;
}

/* Floats of the collectives that carry a dp job's bytes: its gradient buckets
 * (optim.bucket_mb, or the whole gradient when smaller; grads.c fills a bucket to at
 * least that size). A collective's rate depends on its size (caches, the transport's
 * protocol switches), so it is measured at the job's (tp's activations, B x T x C
 * floats per plan, take the same rate). */
static size_t msg_floats(const wf_config *cfg, const wf_model_dims *d)
{
  size_t n = wf_model_num_params(d), bucket = ((size_t)cfg->optim.bucket_mb << 20) / sizeof(float);
  if (bucket > 0 && bucket < n)
    n = bucket;
  return WF_MAX(n, MIN_MSG);
}

static wf_status measure_colls(wf_comm *world, size_t msg, int layers, wf_hw *hw)
{
  wf_status st = WF_OK;
  int W = wf_comm_size(world);
  coll_buf b = {NULL, msg, WF_MAX(1, 4 * layers)};
  /* the scratch (coll_buf); busy_cores' GEMM fits in it too */
  WF_CHECK_ALLOC(b.buf = calloc(2 * msg + 3 * (size_t)BUSY_N, sizeof *b.buf));
  for (int g = 2; g <= W && hw->n_coll < WF_HW_MAX_COLL; g *= 2)
    if (W % g == 0) /* every rank in a group of g */
      WF_TRY(measure_group(world, g, &b, &hw->coll[hw->n_coll++]));
  WF_TRY(measure_busy_cores(world, hw, b.buf, &hw->busy_cores));
  if (hw->n_coll > 0) { /* the links of unmeasured transfers: the largest group's */
    hw->intra_alpha_s = hw->inter_alpha_s = hw->coll[hw->n_coll - 1].alpha_s;
    hw->intra_bw = hw->inter_bw = hw->coll[hw->n_coll - 1].bw;
  }
fail:
  free(b.buf);
  return st;
}

/* wf_comm_agree without spinning: rank 0 measures GEMMs alone, and ranks spinning in
 * MPI's progress loop on the same cores would measure themselves instead. */
static wf_status agree_quietly(wf_comm *world, wf_status mine)
{
  wf_status st = WF_OK;
  wf_req *req = NULL;
  bool done = false;
  int32_t bad = mine != WF_OK;
  WF_TRY(wf_comm_iallreduce(world, &bad, &bad, 1, WF_COMM_I32, WF_COMM_MAX, &req));
  while (!done) {
    WF_TRY(wf_req_test(&req, &done));
    if (!done)
      usleep(1000);
  }
  st = bad ? WF_EINVAL : WF_OK;
fail:
  return st;
}

int wf_plan_profile_hw(const wf_config *cfg, wf_comm *world, const char *path, FILE *out)
{
  wf_hw hw = {0};
  char err[512] = "";
  wf_model_dims d = wf_model_dims_from_config(cfg);
  int T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len;
  int rank = world ? wf_comm_rank(world) : 0, W = world ? wf_comm_size(world) : 1;
  wf_status st = WF_OK;
  size_t msg = msg_floats(cfg, &d);
  if (rank == 0 && cfg->runtime.device == WF_DEV_CUDA) /* the planner's GPUs are its tables */
    fprintf(stderr, "weft: --profile-hw measures this machine's CPU cores and MPI; for a GPU, "
                    "plan with --hw h100-sxm, h200 or a100-80gb\n");
  if (rank == 0)
    st = wf__plan_measure(&d, cfg->train.batch_size * T, T, WF_MAX(W, 1), &hw);
  if (world && agree_quietly(world, st) != WF_OK)
    return 1;
  if (world && W > 1 && measure_colls(world, msg, d.L, &hw) != WF_OK)
    return 1;
  if (rank != 0)
    return 0;
  snprintf(hw.source + strlen(hw.source), sizeof hw.source - strlen(hw.source),
           "; collectives over 2..%d ranks at %zu floats", W, msg);
  if (wf_hw_save(&hw, path, err, sizeof err) != WF_OK) {
    fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  fprintf(out,
          "wrote %s: %d GEMM shapes (%.1f-%.1f GFLOP/s), memory %.1f GB/s, %d all-reduce "
          "group sizes, %.2f of %d cores delivered with %d ranks busy\n",
          path, hw.n_gemm, hw.n_gemm ? hw.gemm[0].tflops * 1e3 : 0,
          hw.n_gemm ? hw.gemm[hw.n_gemm - 1].tflops * 1e3 : 0, hw.mem_bw * 1e-9, hw.n_coll,
          hw.busy_cores, hw.cores, W);
  for (int i = 0; i < hw.n_coll; i++)
    fprintf(out,
            "  over %d ranks: alpha %.1f us; all-reduce %.2f (the gradient path's %.2f), "
            "all-gather %.2f, all-to-all %.2f GB/s of the vector\n",
            hw.coll[i].size, hw.coll[i].alpha_s * 1e6, hw.coll[i].bw * 1e-9,
            hw.coll[i].dp_bw * 1e-9, hw.coll[i].ag_bw * 1e-9, hw.coll[i].a2a_bw * 1e-9);
  return 0;
}
