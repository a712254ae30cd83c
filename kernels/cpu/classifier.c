/*
 * classifier.c - the fused classifier over bf16 logits (classifier.h): the CPU twin of
 * kernels/cuda/classifier.cu.
 *
 * Legend: N rows (B*T), V vocabulary columns held here, ld the row stride (>= V;
 * columns [V, ld) are padding), v_offset the global index of column 0. Rows are
 * independent and split over threads. The sum of exponentials accumulates in double,
 * as xent.c's does; the gradient of each element is computed in float exactly as the
 * GPU computes it (exp(l - M) * (1 / S), minus the one-hot, times dloss) and rounded
 * to bf16.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

typedef struct row_stats {
  float max, sumexp, target;
} row_stats;

static row_stats stats_row(const wf_bf16 *l, int target, int V, int v_offset)
{
  row_stats r = {-INFINITY, 0.0f, 0.0f};
  double s = 0.0;
  for (int j = 0; j < V; j++)
    r.max = fmaxf(r.max, wf_bf16_to_float(l[j]));
  for (int j = 0; j < V; j++)
    s += wf__expf(wf_bf16_to_float(l[j]) - r.max);
  int local = target - v_offset;
  r.sumexp = (float)s;
  r.target = local >= 0 && local < V ? wf_bf16_to_float(l[local]) : 0.0f;
  return r;
}

/* d (ld) = dloss (softmax - onehot) of l; d may be l. */
static void backward_row(wf_bf16 *d, const wf_bf16 *l, float mx, float se, int target, float dloss,
                         int V, int ld, int v_offset)
{
  float inv = 1.0f / se;
  int local = target - v_offset;
  for (int j = 0; j < V; j++) {
    float p = wf__expf(wf_bf16_to_float(l[j]) - mx) * inv;
    d[j] = wf_bf16_from_float((p - (j == local ? 1.0f : 0.0f)) * dloss);
  }
  for (int j = V; j < ld; j++)
    d[j] = 0;
}

struct cls {
  wf_bf16 *dlogits;
  const wf_bf16 *logits;
  float *losses, *row_max, *row_sumexp, *target_logit;
  const float *cmax, *csum;
  const int *targets;
  float dloss;
  int N, V, ld, v_offset;
};

static void classifier_share(void *p, int tid, int nt)
{
  const struct cls *c = p;
  size_t lo, hi;
  wf__split((size_t)c->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    wf_bf16 *row = c->dlogits + i * c->ld;
    row_stats r = stats_row(row, c->targets[i], c->V, 0);
    c->losses[i] = logf(r.sumexp) + r.max - r.target;
    backward_row(row, row, r.max, r.sumexp, c->targets[i], c->dloss, c->V, c->ld, 0);
  }
}

void wf_classifier_bf16(wf_bf16 *logits, float *losses, const int *targets, float dloss, int N,
                        int V, int ld)
{
  struct cls c = {.dlogits = logits,
                  .losses = losses,
                  .targets = targets,
                  .dloss = dloss,
                  .N = N,
                  .V = V,
                  .ld = ld};
  wf__parallel(wf__threads_for((size_t)N * V), classifier_share, &c);
}

static void stats_share(void *p, int tid, int nt)
{
  const struct cls *c = p;
  size_t lo, hi;
  wf__split((size_t)c->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    row_stats r = stats_row(c->logits + i * c->ld, c->targets[i], c->V, c->v_offset);
    c->row_max[i] = r.max, c->row_sumexp[i] = r.sumexp, c->target_logit[i] = r.target;
  }
}

void wf_xent_stats_bf16(float *row_max, float *row_sumexp, float *target_logit,
                        const wf_bf16 *logits, const int *targets, int N, int V, int ld,
                        int v_offset)
{
  struct cls c = {.logits = logits,
                  .row_max = row_max,
                  .row_sumexp = row_sumexp,
                  .target_logit = target_logit,
                  .targets = targets,
                  .N = N,
                  .V = V,
                  .ld = ld,
                  .v_offset = v_offset};
  wf__parallel(wf__threads_for((size_t)N * V), stats_share, &c);
}

static void backward_share(void *p, int tid, int nt)
{
  const struct cls *c = p;
  size_t lo, hi;
  wf__split((size_t)c->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    backward_row(c->dlogits + i * c->ld, c->logits + i * c->ld, c->cmax[i], c->csum[i],
                 c->targets[i], c->dloss, c->V, c->ld, c->v_offset);
}

void wf_xent_backward_bf16(wf_bf16 *dlogits, const wf_bf16 *logits, const float *row_max,
                           const float *row_sumexp, const int *targets, float dloss, int N, int V,
                           int ld, int v_offset)
{
  struct cls c = {.dlogits = dlogits,
                  .logits = logits,
                  .cmax = row_max,
                  .csum = row_sumexp,
                  .targets = targets,
                  .dloss = dloss,
                  .N = N,
                  .V = V,
                  .ld = ld,
                  .v_offset = v_offset};
  wf__parallel(wf__threads_for((size_t)N * V), backward_share, &c);
}

/* ---- the op (wf_kreg.h): bf16 only ---------------------------------------------------- */

static void fused(void *logits, float *losses, const int *targets, float dloss, int N, int V,
                  int ld, wf_stream *s)
{
  wf_classifier_bf16(logits, losses, targets, dloss, N, V, ld);
}

static void stats(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                  const int *targets, int N, int V, int ld, int v_offset, wf_stream *s)
{
  wf_xent_stats_bf16(row_max, row_sumexp, target_logit, logits, targets, N, V, ld, v_offset);
}

static void backward(void *dlogits, const void *logits, const float *row_max,
                     const float *row_sumexp, const int *targets, float dloss, int N, int V, int ld,
                     int v_offset, wf_stream *s)
{
  wf_xent_backward_bf16(dlogits, logits, row_max, row_sumexp, targets, dloss, N, V, ld, v_offset);
}

static const wf_classifier_op bf16 = {fused, stats, backward};
const wf_kvariants wf__cpu_classifier =
    WF_KV(classifier, WF_OP_VERSION_classifier, NULL, &bf16, NULL);
