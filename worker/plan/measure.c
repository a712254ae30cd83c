/*
 * measure.c - this machine's profile (worker --profile-hw, and the planner's default):
 * GEMMs at the model's shapes through the device's kernel table, the attention kernel,
 * memory bandwidth, and under mpirun all-reduces over groups of 2, 4, ... ranks.
 *
 * The GEMMs run on rank 0 alone (the others wait), at one thread and at every core:
 * the time model gives a rank cores / ranks threads, or one thread and a share of a
 * core. A GEMM above MAX_FLOPS is measured with fewer rows: a large GEMM's rate does
 * not depend on its row count, and the profile stays a few seconds long.
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
  const wf_ktable *k;
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
      b->k->matmul_forward(y, x, w, NULL, m, k, n, WF_PREC_NO, NULL);
    else /* attention of one batch row over m heads: qkv (T, 3 hs m) */
      b->k->attention_forward(y, w, x, 1, n, k * m, m, NULL);
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
        hw->gemm[i].threads == threads)
      return;
  if (hw->n_gemm >= WF_HW_MAX_GEMM || m < 1 || n < 1 || k < 1)
    return;
  int rows = m;
  while (rows > 16 && 2.0 * rows * n * k > MAX_FLOPS)
    rows /= 2;
  if ((size_t)rows * k + (size_t)n * k + (size_t)rows * n > b->n)
    return;
  double t = best_of(b, 0, rows, n, k);
  hw->gemm[hw->n_gemm++] = (wf_hw_gemm){m, n, k, threads, 2.0 * rows * n * k / t * 1e-12};
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
  hw->gemm[hw->n_gemm++] = (wf_hw_gemm){T, T, hs, threads, 4.0 * heads * T * T * hs / t * 1e-12};
}

/* Every GEMM shape of the model's layers and head for micro-batches of T .. N rows and
 * tp sizes 1, 2, 4 ... up to tpmax that divide the heads. */
static void model_shapes(bench *b, wf_hw *hw, const wf_gpt_dims *d, int N, int T, int tpmax,
                         int threads)
{
  int C = d->C;
  for (int tp = 1; tp <= tpmax && d->NH % tp == 0 && C % tp == 0; tp *= 2) {
    for (int rows = T; rows <= N; rows *= 4) {
      add_gemm(b, hw, rows, 3 * C / tp, C, threads);
      add_gemm(b, hw, rows, C, C / tp, threads);
      add_gemm(b, hw, rows, 4 * C / tp, C, threads);
      add_gemm(b, hw, rows, C, 4 * C / tp, threads);
      add_gemm(b, hw, rows, d->Vp / tp, C, threads);
    }
  }
  add_attention(b, hw, T, C / d->NH, threads);
}

/* Bytes per second of a residual add over 64 MiB (two reads and a write). */
static double mem_bandwidth(bench *b)
{
  size_t n = WF_MIN(b->n / 3, (size_t)16 << 20);
  double best = INFINITY;
  for (int r = 0; r <= REPS; r++) {
    double t = wf_now();
    b->k->residual_forward(b->buf, b->buf + n, b->buf + 2 * n, n, NULL);
    wf_dev_stream_sync(b->dev, NULL);
    t = wf_now() - t;
    if (r > 0 && t < best)
      best = t;
  }
  return 12.0 * n / best;
}

static double host_memory(void)
{
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (double)pages * size : 0;
}

wf_status wf__plan_measure(const wf_gpt_dims *d, int N, int T, int tpmax, wf_hw *hw)
{
  wf_status st = WF_OK;
  bench b = {.dev = wf_dev_cpu(), .n = (size_t)48 << 20};
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN), saved = wf_kernels_threads();
  b.k = wf_dev_kernels(b.dev);
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
  /* collectives until measured: shared memory, one copy in and out at memory speed */
  hw->intra_alpha_s = hw->inter_alpha_s = 20e-6;
  hw->intra_bw = hw->inter_bw = hw->mem_bw / 4;
fail:
  wf_kernels_set_threads(saved);
  wf_dev_free(b.dev, b.buf);
  return st;
}

/* Median seconds of an all-reduce of n floats over c. */
static wf_status time_allreduce(wf_comm *c, float *buf, size_t n, double *sec)
{
  wf_status st = WF_OK;
  double t[7];
  for (int r = 0; r < 7; r++) {
    WF_TRY(wf_comm_barrier(c));
    double t0 = wf_now();
    WF_TRY(wf_comm_allreduce(c, buf, buf, n, WF_COMM_F32, WF_COMM_SUM));
    t[r] = wf_now() - t0;
  }
  for (int i = 1; i < 7; i++) /* insertion sort, then the median */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      double x = t[j];
      t[j] = t[j - 1], t[j - 1] = x;
    }
  *sec = t[3];
fail:
  return st;
}

/* alpha and bandwidth of all-reduces over the first g ranks: the least-squares line
 * through (bytes, seconds) at three sizes. */
static wf_status measure_group(wf_comm *world, int g, float *buf, wf_hw_coll *out)
{
  wf_status st = WF_OK;
  wf_comm *c = NULL;
  static const size_t sizes[] = {4096, 65536, 1 << 20};
  double x[3], y[3], sx = 0, sy = 0, sxx = 0, sxy = 0;
  int rank = wf_comm_rank(world);
  WF_TRY(wf_comm_split(world, rank < g ? 0 : 1, rank, "profile", &c));
  for (int i = 0; i < 3; i++) {
    x[i] = (double)sizes[i] * 4, y[i] = 0;
    if (rank < g)
      WF_TRY(time_allreduce(c, buf, sizes[i], &y[i]));
    sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  }
  double slope = (3 * sxy - sx * sy) / (3 * sxx - sx * sx);
  double alpha = (sy - slope * sx) / 3;
  *out = (wf_hw_coll){g, fmax(alpha, 0), slope > 0 ? 1 / slope : 1e12};
fail:
  wf_comm_destroy(c);
  if (st == WF_OK)
    st = wf_comm_barrier(world);
  return st;
}

static wf_status measure_colls(wf_comm *world, wf_hw *hw)
{
  wf_status st = WF_OK;
  int W = wf_comm_size(world);
  float *buf = NULL;
  WF_CHECK_ALLOC(buf = calloc((size_t)1 << 20, sizeof *buf));
  for (int g = 2; g <= W && hw->n_coll<WF_HW_MAX_COLL; g = g * 2> W && g < W ? W : g * 2)
    WF_TRY(measure_group(world, g, buf, &hw->coll[hw->n_coll++]));
  if (hw->n_coll > 0) { /* the links of unmeasured transfers: the largest group's */
    hw->intra_alpha_s = hw->inter_alpha_s = hw->coll[hw->n_coll - 1].alpha_s;
    hw->intra_bw = hw->inter_bw = hw->coll[hw->n_coll - 1].bw;
  }
fail:
  free(buf);
  return st;
}

int wf_plan_profile_hw(const wf_config *cfg, wf_comm *world, const char *path, FILE *out)
{
  wf_hw hw = {0};
  char err[512] = "";
  wf_gpt_dims d = wf_gpt_dims_from_config(cfg);
  int T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len;
  int rank = world ? wf_comm_rank(world) : 0, W = world ? wf_comm_size(world) : 1;
  wf_status st = WF_OK;
  if (rank == 0)
    st = wf__plan_measure(&d, cfg->train.batch_size * T, T, WF_MAX(W, 1), &hw);
  if (world && wf_comm_agree(world, st, NULL) != WF_OK)
    return 1;
  if (world && W > 1 && measure_colls(world, &hw) != WF_OK)
    return 1;
  if (rank != 0)
    return 0;
  snprintf(hw.source + strlen(hw.source), sizeof hw.source - strlen(hw.source),
           "; all-reduces over 2..%d ranks", W);
  if (wf_hw_save(&hw, path, err, sizeof err) != WF_OK) {
    fprintf(stderr, "weft: error: %s\n", err);
    return 1;
  }
  fprintf(out,
          "wrote %s: %d GEMM shapes (%.1f-%.1f GFLOP/s), memory %.1f GB/s, %d all-reduce "
          "group sizes\n",
          path, hw.n_gemm, hw.n_gemm ? hw.gemm[0].tflops * 1e3 : 0,
          hw.n_gemm ? hw.gemm[hw.n_gemm - 1].tflops * 1e3 : 0, hw.mem_bw * 1e-9, hw.n_coll);
  for (int i = 0; i < hw.n_coll; i++)
    fprintf(out, "  all-reduce over %d ranks: %.1f us + bytes / %.2f GB/s\n", hw.coll[i].size,
            hw.coll[i].alpha_s * 1e6, hw.coll[i].bw * 1e-9);
  return 0;
}
