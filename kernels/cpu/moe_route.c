/*
 * moe_route.c - the mixture-of-experts router's softmax, top-k and losses (moe_route.h).
 *
 * Legend: N tokens, E experts, K experts per token. Rows are independent and split over
 * threads; the statistics are summed serially over the rows afterwards, so they do not
 * depend on the thread count (cnt is a count, exact; psum and zsum round alike every
 * run). The softmax uses libm's expf: there are only E exponentials per token, and the
 * choice of experts follows the probabilities, so they are as close as fp32 gets.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_int.h"
#include "storage.h"
#include "wf_kernels.h"

typedef struct route {
  float *probs, *lse, *w;
  int *idx;
  const float *logits, *dw, *cnt;
  void *dlogits;
  float aux_scale, z_scale;
  int N, E, K, fmt;
  bool renorm;
} route;

/* The K largest of p (E), decreasing, a tie to the lower expert: selection by repeated
 * scans (K and E are small). */
static void top_k(int *idx, const float *p, int E, int K)
{
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      bool taken = false;
      for (int i = 0; i < j && !taken; i++)
        taken = idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best]))
        best = e;
    }
    idx[j] = best;
  }
}

static void forward_row(const route *r, size_t n)
{
  int E = r->E, K = r->K;
  const float *x = r->logits + n * (size_t)E;
  float *p = r->probs + n * (size_t)E, m = x[0], sum = 0;
  for (int e = 1; e < E; e++)
    m = x[e] > m ? x[e] : m;
  for (int e = 0; e < E; e++)
    sum += p[e] = expf(x[e] - m);
  for (int e = 0; e < E; e++)
    p[e] /= sum;
  r->lse[n] = m + logf(sum);
  int *idx = r->idx + n * (size_t)K;
  float *w = r->w + n * (size_t)K, s = 0;
  top_k(idx, p, E, K);
  for (int j = 0; j < K; j++)
    s += w[j] = p[idx[j]];
  for (int j = 0; r->renorm && j < K; j++)
    w[j] /= s;
}

static void forward_share(void *ctx, int tid, int nt)
{
  const route *r = ctx;
  size_t lo, hi;
  wf__split((size_t)r->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++)
    forward_row(r, n);
}

void wf_moe_route_forward(float *probs, float *lse, int *idx, float *w, float *stats,
                          const float *logits, int N, int E, int K, bool renorm)
{
  route r = {.probs = probs,
             .lse = lse,
             .w = w,
             .idx = idx,
             .logits = logits,
             .N = N,
             .E = E,
             .K = K,
             .renorm = renorm};
  wf__parallel(wf__threads_for((size_t)N * (size_t)E * (size_t)K), forward_share, &r);
  float *cnt = stats, *psum = stats + E;
  double z = 0;
  for (int e = 0; e < 2 * E; e++)
    stats[e] = 0;
  for (size_t n = 0; n < (size_t)N; n++) { /* serially: the same sums at any thread count */
    for (int j = 0; j < K; j++)
      cnt[idx[n * (size_t)K + (size_t)j]] += 1;
    for (int e = 0; e < E; e++)
      psum[e] += probs[n * (size_t)E + (size_t)e];
    z += (double)lse[n] * lse[n];
  }
  stats[2 * E] = (float)z;
  stats[2 * E + 1] = 0;
}

/* g (E) = dL / dprobs of token n: every expert's share of the load-balancing loss, and
 * at the chosen ones their weight's gradient through the renormalisation:
 * w_j = p_j / S, dp_j = (dw_j - sum_i dw_i w_i) / S. */
static void prob_grad(const route *r, size_t n, float *g)
{
  int E = r->E, K = r->K;
  const int *idx = r->idx + n * (size_t)K;
  const float *dw = r->dw + n * (size_t)K, *w = r->w + n * (size_t)K;
  const float *p = r->probs + n * (size_t)E;
  for (int e = 0; e < E; e++)
    g[e] = r->aux_scale * r->cnt[e];
  float s = 0, dot = 0;
  for (int j = 0; j < K; j++)
    s += p[idx[j]], dot += dw[j] * w[j];
  for (int j = 0; j < K; j++)
    g[idx[j]] += r->renorm ? (dw[j] - dot) / s : dw[j];
}

static void backward_share(void *ctx, int tid, int nt)
{
  const route *r = ctx;
  int E = r->E;
  float *g = wf__work(0, 2 * (size_t)E), *d = g + E;
  size_t lo, hi;
  if (!g)
    return;
  wf__split((size_t)r->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    const float *p = r->probs + n * (size_t)E;
    float pg = 0, zl = r->z_scale * r->lse[n];
    prob_grad(r, n, g);
    for (int e = 0; e < E; e++)
      pg += p[e] * g[e];
    for (int e = 0; e < E; e++) /* softmax: dlogit = p (g - p.g); the z-loss's 2 lse p */
      d[e] = p[e] * (g[e] - pg) + zl * p[e];
    wf__store(r->dlogits, n * (size_t)E, d, (size_t)E, r->fmt);
  }
}

void wf_moe_route_backward(void *dlogits, const float *dw, const float *probs, const float *lse,
                           const int *idx, const float *w, const float *cnt, float aux_scale,
                           float z_scale, int N, int E, int K, bool renorm, int fmt)
{
  route r = {.probs = (float *)probs,
             .lse = (float *)lse,
             .w = (float *)w,
             .idx = (int *)idx,
             .dw = dw,
             .cnt = cnt,
             .dlogits = dlogits,
             .aux_scale = aux_scale,
             .z_scale = z_scale,
             .N = N,
             .E = E,
             .K = K,
             .fmt = fmt,
             .renorm = renorm};
  wf__parallel(wf__threads_for((size_t)N * (size_t)E * (size_t)K), backward_share, &r);
}

void wf_moe_aux_accumulate(double *acc, const float *sums, int E, double R)
{
  double a = 0;
  for (int e = 0; e < E; e++)
    a += (double)sums[e] * sums[E + e];
  acc[0] += (double)E * a / (R * R);
  acc[1] += sums[2 * E] / R;
  acc[2] += sums[2 * E + 1];
}

/* ---- the op (wf_kreg.h): the functions above, the stream unused ---------------------- */

static void fwd(float *probs, float *lse, int *idx, float *w, float *stats, const float *logits,
                int N, int E, int K, bool renorm, wf_stream *s)
{
  (void)s;
  wf_moe_route_forward(probs, lse, idx, w, stats, logits, N, E, K, renorm);
}

static void bwd(void *dlogits, const float *dw, const float *probs, const float *lse,
                const int *idx, const float *w, const float *cnt, float aux_scale, float z_scale,
                int N, int E, int K, bool renorm, int fmt, wf_stream *s)
{
  (void)s;
  wf_moe_route_backward(dlogits, dw, probs, lse, idx, w, cnt, aux_scale, z_scale, N, E, K, renorm,
                        fmt);
}

static void aux(double *acc, const float *sums, int E, double R, wf_stream *s)
{
  (void)s;
  wf_moe_aux_accumulate(acc, sums, E, R);
}

static const wf_moe_route_op op = {fwd, bwd, aux};
const wf_kvariants wf__cpu_moe_route = WF_KV_ANY(moe_route, WF_OP_VERSION_moe_route, &op);
