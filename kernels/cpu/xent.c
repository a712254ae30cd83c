/*
 * xent.c - softmax cross-entropy in two passes, so that vocabulary-parallel ranks
 * can reduce between them (see wf_kernels.h for the combination formula).
 *
 * Legend: N rows (B*T), V vocabulary columns held here, ld the row stride of logits
 * (>= V; columns [V, ld) are padding), v_offset the global index of column 0.
 * Rows are independent and split over threads. Sums of exponentials accumulate in
 * double: a row has up to ~50k terms.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

WF__CLONES static void stats_row(float *mx_out, float *se_out, float *tl_out, const float *l,
                                 int target, int V, int v_offset)
{
  float mx = V > 0 ? wf__maxf(l, V) : -INFINITY; /* an empty slice adds nothing */
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < V; j++)
    s += wf__expf(l[j] - mx);
  int local = target - v_offset;
  *mx_out = mx;
  *se_out = (float)s;
  *tl_out = local >= 0 && local < V ? l[local] : 0.0f;
}

struct xe {
  float *row_max, *row_sumexp, *target_logit, *dlogits;
  const float *logits, *cmax, *csum;
  void *dlogits16; /* the 16-bit forms (fmt) */
  const void *logits16;
  int fmt;
  const int *targets;
  float dloss;
  int N, V, ld, v_offset;
};

static void stats_share(void *p, int tid, int nt)
{
  const struct xe *x = p;
  size_t lo, hi;
  wf__split((size_t)x->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    stats_row(x->row_max + i, x->row_sumexp + i, x->target_logit + i, x->logits + i * x->ld,
              x->targets[i], x->V, x->v_offset);
}

void wf_xent_stats(float *row_max, float *row_sumexp, float *target_logit, const float *logits,
                   const int *targets, int N, int V, int ld, int v_offset)
{
  struct xe x = {.row_max = row_max,
                 .row_sumexp = row_sumexp,
                 .target_logit = target_logit,
                 .logits = logits,
                 .targets = targets,
                 .N = N,
                 .V = V,
                 .ld = ld,
                 .v_offset = v_offset};
  wf__parallel(wf__threads_for((size_t)N * V), stats_share, &x);
}

void wf_xent_loss(float *losses, const float *row_max, const float *row_sumexp,
                  const float *target_logit, int N)
{
  for (int i = 0; i < N; i++)
    losses[i] = logf(row_sumexp[i]) + row_max[i] - target_logit[i];
}

WF__CLONES static void backward_row(float *d, const float *l, float mx, float se, int target,
                                    float dloss, int V, int ld, int v_offset)
{
  float scale = dloss / se;
#pragma omp simd
  for (int j = 0; j < V; j++)
    d[j] = wf__expf(l[j] - mx) * scale;
  int local = target - v_offset;
  if (local >= 0 && local < V)
    d[local] -= dloss;
  for (int j = V; j < ld; j++)
    d[j] = 0.0f;
}

static void backward_share(void *p, int tid, int nt)
{
  const struct xe *x = p;
  size_t lo, hi;
  wf__split((size_t)x->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    backward_row(x->dlogits + i * x->ld, x->logits + i * x->ld, x->cmax[i], x->csum[i],
                 x->targets[i], x->dloss, x->V, x->ld, x->v_offset);
}

void wf_xent_backward(float *dlogits, const float *logits, const float *row_max,
                      const float *row_sumexp, const int *targets, float dloss, int N, int V,
                      int ld, int v_offset)
{
  struct xe x = {.dlogits = dlogits,
                 .logits = logits,
                 .cmax = row_max,
                 .csum = row_sumexp,
                 .targets = targets,
                 .dloss = dloss,
                 .N = N,
                 .V = V,
                 .ld = ld,
                 .v_offset = v_offset};
  wf__parallel(wf__threads_for((size_t)N * V), backward_share, &x);
}

void wf_xent_pack(float *stats, const float *row_max, const float *row_sumexp,
                  const float *target_logit, int N)
{
  for (int i = 0; i < N; i++) {
    stats[3 * (size_t)i] = row_max[i];
    stats[3 * (size_t)i + 1] = row_sumexp[i];
    stats[3 * (size_t)i + 2] = target_logit[i];
  }
}

/* Rows are cheap (a few flops per part) and N is a micro-batch's tokens: one thread.
 * The order of the sums over parts is the parts' order, so every rank combines the
 * same gathered buffer into the same bits. */
void wf_xent_combine(float *row_max, float *row_sumexp, float *target_logit, const float *all,
                     int N, int parts)
{
  size_t stride = 3 * (size_t)N;
  for (int i = 0; i < N; i++) {
    float M = -INFINITY, S = 0, tl = 0;
    for (int r = 0; r < parts; r++)
      M = fmaxf(M, all[(size_t)r * stride + 3 * (size_t)i]);
    for (int r = 0; r < parts; r++) {
      const float *x = all + (size_t)r * stride + 3 * (size_t)i;
      if (x[1] > 0)
        S += x[1] * expf(x[0] - M);
      tl += x[2];
    }
    row_max[i] = M, row_sumexp[i] = S, target_logit[i] = tl;
  }
}

void wf_loss_accumulate(double *acc, const float *losses, int N)
{
  double sum = 0.0;
  for (int i = 0; i < N; i++)
    sum += losses[i];
  *acc += (double)(float)(sum / N);
}

/* ---- 16-bit storage: each row through this thread's working rows ---------------------------- */

static void stats16_share(void *p, int tid, int nt)
{
  const struct xe *x = p;
  size_t lo, hi, ld = (size_t)x->ld;
  float *l = wf__work(0, (size_t)x->V);
  if (!l)
    return;
  wf__split((size_t)x->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    wf__load(l, x->logits16, i * ld, (size_t)x->V, x->fmt);
    stats_row(x->row_max + i, x->row_sumexp + i, x->target_logit + i, l, x->targets[i], x->V,
              x->v_offset);
  }
}

void wf_xent_stats16(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                     const int *targets, int N, int V, int ld, int v_offset, int fmt)
{
  struct xe x = {.row_max = row_max,
                 .row_sumexp = row_sumexp,
                 .target_logit = target_logit,
                 .logits16 = logits,
                 .targets = targets,
                 .N = N,
                 .V = V,
                 .ld = ld,
                 .v_offset = v_offset,
                 .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * V), stats16_share, &x);
}

static void backward16_share(void *p, int tid, int nt)
{
  const struct xe *x = p;
  size_t lo, hi, ld = (size_t)x->ld;
  float *l = wf__work(0, ld), *d = wf__work(1, ld);
  if (!l || !d)
    return;
  wf__split((size_t)x->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    wf__load(l, x->logits16, i * ld, (size_t)x->V, x->fmt);
    backward_row(d, l, x->cmax[i], x->csum[i], x->targets[i], x->dloss, x->V, x->ld, x->v_offset);
    wf__store(x->dlogits16, i * ld, d, ld, x->fmt);
  }
}

void wf_xent_backward16(void *dlogits, const void *logits, const float *row_max,
                        const float *row_sumexp, const int *targets, float dloss, int N, int V,
                        int ld, int v_offset, int fmt)
{
  struct xe x = {.dlogits16 = dlogits,
                 .logits16 = logits,
                 .cmax = row_max,
                 .csum = row_sumexp,
                 .targets = targets,
                 .dloss = dloss,
                 .N = N,
                 .V = V,
                 .ld = ld,
                 .v_offset = v_offset,
                 .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * V), backward16_share, &x);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

static void pack(float *stats, const float *row_max, const float *row_sumexp,
                 const float *target_logit, int N, wf_stream *s)
{
  wf_xent_pack(stats, row_max, row_sumexp, target_logit, N);
}

static void combine(float *row_max, float *row_sumexp, float *target_logit, const float *all, int N,
                    int parts, wf_stream *s)
{
  wf_xent_combine(row_max, row_sumexp, target_logit, all, N, parts);
}

static void loss(float *losses, const float *row_max, const float *row_sumexp,
                 const float *target_logit, int N, wf_stream *s)
{
  wf_xent_loss(losses, row_max, row_sumexp, target_logit, N);
}

static void accumulate(double *acc, const float *losses, int N, wf_stream *s)
{
  wf_loss_accumulate(acc, losses, N);
}

#define XENT_VARIANT(name, fmt)                                                                    \
  static void name##_stats(float *mx, float *se, float *tl, const void *logits,                    \
                           const int *targets, int N, int V, int ld, int v0, wf_stream *s)         \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_xent_stats(mx, se, tl, logits, targets, N, V, ld, v0);                                    \
    else                                                                                           \
      wf_xent_stats16(mx, se, tl, logits, targets, N, V, ld, v0, fmt);                             \
  }                                                                                                \
  static void name##_backward(void *dlogits, const void *logits, const float *mx, const float *se, \
                              const int *targets, float dloss, int N, int V, int ld, int v0,       \
                              wf_stream *s)                                                        \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_xent_backward(dlogits, logits, mx, se, targets, dloss, N, V, ld, v0);                     \
    else                                                                                           \
      wf_xent_backward16(dlogits, logits, mx, se, targets, dloss, N, V, ld, v0, fmt);              \
  }                                                                                                \
  static const wf_xent_op name = {name##_stats, pack, combine, loss, name##_backward, accumulate}

XENT_VARIANT(f32, WF_DT_F32);
XENT_VARIANT(bf16, WF_DT_BF16);
XENT_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_xent = WF_KV(xent, WF_OP_VERSION_xent, &f32, &bf16, &f16);
