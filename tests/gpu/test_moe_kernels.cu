/*
 * test_moe_kernels.cu - the GPU's mixture-of-experts ops (kernels/cuda/moe_route.cu,
 * moe_dispatch.cu, moe_combine.cu, qknorm.cu, included here, so the code tested is the
 * module's) against their CPU twins (kernels/cpu/) on random inputs: the router's softmax,
 * top-k (OLMoE's raw weights and the renormalised ones), statistics and backward with the
 * load-balancing and z-loss terms, the auxiliary losses' accumulation; the expert-major
 * order dropless and under a capacity, the row moves both ways; the weighted combine and
 * its backward; and the queries' and keys' RMSNorm over the whole projection split over
 * tensor-parallel ranks (OLMoE) and per head (Qwen3). Shapes: 8 experts top-2 and 128
 * experts top-8 (Qwen3-30B-A3B's router), fp32 and bf16 activations. Exits 77 without a GPU.
 *
 * Tolerances. Integer results (the chosen experts, their counts, rows and the dropped
 * count) and moved elements are compared exactly. Both devices compute in fp32 from the
 * same (widened) values in other orders: a sum of at most 128 terms of O(1) (a softmax's
 * denominator, a column of probabilities over 200 tokens, a row of 96), rounding error
 * about sqrt(n) 6e-8 relative each: REL 1e-5 of the largest element compared leaves a
 * margin of 10 or more. A result stored in bf16 (8 bits of mantissa) may round the other
 * way after such a difference: one bf16 step, 2^-8 relative, so REL16 = 8e-3. A wrong
 * index, weight or group moves values by O(0.1) or more.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/moe_combine.cu"
#include "../../kernels/cuda/moe_dispatch.cu"
#include "../../kernels/cuda/moe_route.cu"
#include "../../kernels/cuda/qknorm.cu"
#include "module_stubs.h"
#include "storage.h"

#define REL   1e-5
#define REL16 8e-3

static int failures;
static unsigned seed = 12345;

static float urand(void)
{
  seed = seed * 1664525u + 1013904223u;
  return ((seed >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* A device copy of n bytes of h (NULL h: zeros). */
static void *up(const void *h, size_t bytes)
{
  void *d = NULL;
  CK(cudaMalloc(&d, bytes ? bytes : 1));
  if (bytes && h)
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  else if (bytes)
    CK(cudaMemset(d, 0, bytes));
  return d;
}

/* The device's n bytes, into a fresh host buffer. */
static void *down(const void *d, size_t bytes)
{
  CK(cudaDeviceSynchronize());
  void *h = malloc(bytes ? bytes : 1);
  if (bytes)
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  return h;
}

static float *rand_floats(size_t n, float scale)
{
  float *f = (float *)malloc(n * sizeof *f);
  for (size_t i = 0; i < n; i++)
    f[i] = scale * urand();
  return f;
}

/* n values in format fmt (random, or from f), host bytes. */
static void *stored(const float *f, size_t n, int fmt)
{
  void *h = malloc(n * wf_storage_size(fmt));
  wf_storage_store(h, f, n, fmt);
  return h;
}

/* The largest |a - b| over n values (read in format fmt) against tol x the largest |a|. */
static void near(const char *what, const void *a, const void *b, size_t n, int fmt, double tol)
{
  double worst = 0, top = 0;
  for (size_t i = 0; i < n; i++) {
    double x = wf_storage_get(a, i, fmt), y = wf_storage_get(b, i, fmt);
    worst = fmax(worst, fabs(x - y)), top = fmax(top, fabs(x));
  }
  bool ok = worst <= tol * fmax(top, 1e-30);
  failures += !ok;
  printf("%s %s: max diff %.3g of %.3g (tol %.1g relative)\n", ok ? "ok  " : "FAIL", what, worst,
         top, tol);
}

static void same_ints(const char *what, const int *a, const int *b, size_t n)
{
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    bad += a[i] != b[i];
  failures += bad != 0;
  printf("%s %s: %zu of %zu differ\n", bad ? "FAIL" : "ok  ", what, bad, n);
}

static double tol_of(int fmt) { return fmt == WF_PREC_NO ? REL : REL16; }

/* ---- the router -------------------------------------------------------------------------- */

static void route(const char *name, int N, int E, int K, bool renorm, int fmt)
{
  char what[160];
  size_t S = WF_MOE_STATS(E);
  float *logits = rand_floats((size_t)N * E, 3.0f); /* spread: distinct top-k */
  float *probs = (float *)malloc((size_t)N * E * 4), *lse = (float *)malloc((size_t)N * 4);
  float *w = (float *)malloc((size_t)N * K * 4), *stats = (float *)malloc(S * 4);
  int *idx = (int *)malloc((size_t)N * K * 4);
  memcpy(probs, logits, (size_t)N * E * 4); /* in place, as the model calls it */
  float *dp = (float *)up(logits, (size_t)N * E * 4), *dl = (float *)up(NULL, (size_t)N * 4);
  float *dwt = (float *)up(NULL, (size_t)N * K * 4), *ds = (float *)up(NULL, S * 4);
  int *di = (int *)up(NULL, (size_t)N * K * 4);
  wf_moe_route_forward(probs, lse, idx, w, stats, probs, N, E, K, renorm);
  moe_route_op.forward(dp, dl, di, dwt, ds, dp, N, E, K, renorm, NULL);
  snprintf(what, sizeof what, "%s route: probabilities", name);
  near(what, probs, down(dp, (size_t)N * E * 4), (size_t)N * E, WF_PREC_NO, REL);
  snprintf(what, sizeof what, "%s route: logsumexp", name);
  near(what, lse, down(dl, (size_t)N * 4), (size_t)N, WF_PREC_NO, REL);
  snprintf(what, sizeof what, "%s route: chosen experts", name);
  same_ints(what, idx, (int *)down(di, (size_t)N * K * 4), (size_t)N * K);
  snprintf(what, sizeof what, "%s route: weights", name);
  near(what, w, down(dwt, (size_t)N * K * 4), (size_t)N * K, WF_PREC_NO, REL);
  float *gs = (float *)down(ds, S * 4);
  snprintf(what, sizeof what, "%s route: counts, probability sums, z sum", name);
  near(what, stats, gs, S, WF_PREC_NO, REL);
  /* backward from random weight gradients and whole-model counts */
  float *dw = rand_floats((size_t)N * K, 1.0f), *cnt = (float *)malloc((size_t)E * 4);
  for (int e = 0; e < E; e++)
    cnt[e] = stats[e] + (float)(e % 3); /* other layers' choices too */
  size_t es = wf_storage_size(fmt);
  void *dlog = malloc((size_t)N * E * es), *ddlog = up(NULL, (size_t)N * E * es);
  float *ddw = (float *)up(dw, (size_t)N * K * 4), *dcnt = (float *)up(cnt, (size_t)E * 4);
  wf_moe_route_backward(dlog, dw, probs, lse, idx, w, cnt, 0.37f, 0.011f, N, E, K, renorm, fmt);
  moe_route_op.backward(ddlog, ddw, dp, dl, di, dwt, dcnt, 0.37f, 0.011f, N, E, K, renorm, fmt,
                        NULL);
  snprintf(what, sizeof what, "%s route backward: dlogits (%s)", name,
           fmt == WF_PREC_NO ? "fp32" : "bf16");
  near(what, dlog, down(ddlog, (size_t)N * E * es), (size_t)N * E, fmt, tol_of(fmt));
  /* the auxiliary losses from these statistics */
  double acc[3] = {0.5, 0.25, 1}, *dacc = (double *)up(acc, sizeof acc);
  wf_moe_aux_accumulate(acc, stats, E, 2.0 * N);
  moe_route_op.aux_accumulate(dacc, ds, E, 2.0 * N, NULL);
  double *ga = (double *)down(dacc, sizeof acc);
  bool ok = true;
  for (int i = 0; i < 3; i++)
    ok &= fabs(acc[i] - ga[i]) <= REL * fmax(fabs(acc[i]), 1.0);
  failures += !ok;
  printf("%s %s aux accumulate: %.9g %.9g %.9g against %.9g %.9g %.9g\n", ok ? "ok  " : "FAIL",
         name, ga[0], ga[1], ga[2], acc[0], acc[1], acc[2]);
}

/* ---- the expert-major order and the moves ------------------------------------------------- */

static void dispatch(const char *name, int N, int E, int K, int cap, int C, int fmt)
{
  char what[160];
  size_t pairs = (size_t)N * K, es = wf_storage_size(fmt);
  int *idx = (int *)malloc(pairs * 4), *pos = (int *)malloc(pairs * 4);
  int *counts = (int *)malloc((size_t)E * 4);
  for (int n = 0; n < N; n++) /* K distinct experts a token, skewed towards the low ones */
    for (int j = 0; j < K; j++)
      idx[n * K + j] = (n * n % 7 == 0 ? j : (n + 3 * j) % E);
  float dropped = 0;
  wf_moe_dispatch(pos, counts, &dropped, idx, N, E, K, cap);
  int *di = (int *)up(idx, pairs * 4), *dpos = (int *)up(NULL, pairs * 4);
  int *dc = (int *)up(NULL, (size_t)E * 4);
  float *dd = (float *)up(NULL, 4);
  moe_dispatch_op.dispatch(dpos, dc, dd, di, N, E, K, cap, NULL);
  snprintf(what, sizeof what, "%s dispatch (capacity %d): rows", name, cap);
  same_ints(what, pos, (int *)down(dpos, pairs * 4), pairs);
  snprintf(what, sizeof what, "%s dispatch (capacity %d): counts", name, cap);
  same_ints(what, counts, (int *)down(dc, (size_t)E * 4), (size_t)E);
  float gd = *(float *)down(dd, 4);
  failures += gd != dropped;
  printf("%s %s dispatch (capacity %d): %g dropped (CPU %g)\n", gd == dropped ? "ok  " : "FAIL",
         name, cap, gd, dropped);
  int rows = 0;
  for (int e = 0; e < E; e++)
    rows += counts[e];
  float *xf = rand_floats((size_t)N * C, 1.0f);
  void *x = stored(xf, (size_t)N * C, fmt), *xp = calloc((size_t)rows * C, es);
  void *dx = up(x, (size_t)N * C * es), *dxp = up(xp, (size_t)rows * C * es);
  wf_moe_permute(xp, x, pos, N, K, C, fmt);
  moe_dispatch_op.permute(dxp, dx, dpos, N, K, C, fmt, NULL);
  snprintf(what, sizeof what, "%s permute (capacity %d)", name, cap);
  near(what, xp, down(dxp, (size_t)rows * C * es), (size_t)rows * C, fmt, 0.0);
  float *g = rand_floats((size_t)rows * C, 1.0f), *acc = rand_floats((size_t)N * C, 1.0f);
  float *dg = (float *)up(g, (size_t)rows * C * 4), *dacc = (float *)up(acc, (size_t)N * C * 4);
  wf_moe_unpermute(acc, g, pos, N, K, C);
  moe_dispatch_op.unpermute(dacc, dg, dpos, N, K, C, NULL);
  snprintf(what, sizeof what, "%s unpermute (capacity %d)", name, cap);
  near(what, acc, down(dacc, (size_t)N * C * 4), (size_t)N * C, WF_PREC_NO, REL);
  /* combine the permuted rows back, and its backward */
  float *y = rand_floats((size_t)rows * C, 1.0f), *w = rand_floats(pairs, 1.0f);
  float *out = (float *)malloc((size_t)N * C * 4), *dout = rand_floats((size_t)N * C, 1.0f);
  float *dy = (float *)up(y, (size_t)rows * C * 4), *dw = (float *)up(w, pairs * 4);
  float *dout_d = (float *)up(dout, (size_t)N * C * 4);
  float *gout = (float *)up(NULL, (size_t)N * C * 4);
  wf_moe_combine(out, y, w, pos, N, K, C);
  moe_combine_op.combine(gout, dy, dw, dpos, N, K, C, NULL);
  snprintf(what, sizeof what, "%s combine (capacity %d)", name, cap);
  near(what, out, down(gout, (size_t)N * C * 4), (size_t)N * C, WF_PREC_NO, REL);
  void *dyp = calloc((size_t)rows * C, es), *gdyp = up(dyp, (size_t)rows * C * es);
  float *dwc = (float *)malloc(pairs * 4), *gdw = (float *)up(NULL, pairs * 4);
  wf_moe_combine_backward(dyp, dwc, dout, y, w, pos, N, K, C, fmt);
  moe_combine_op.backward(gdyp, gdw, dout_d, dy, dw, dpos, N, K, C, fmt, NULL);
  snprintf(what, sizeof what, "%s combine backward (capacity %d): expert rows", name, cap);
  near(what, dyp, down(gdyp, (size_t)rows * C * es), (size_t)rows * C, fmt, tol_of(fmt));
  snprintf(what, sizeof what, "%s combine backward (capacity %d): weights", name, cap);
  near(what, dwc, down(gdw, pairs * 4), pairs, WF_PREC_NO, REL);
}

/* ---- the queries' and keys' norms --------------------------------------------------------- */

/* Rows of [q | k | v] of nq + nk + nv; query groups of gq over fq, key groups gk over fk. */
static void qknorm(const char *name, int N, int nq, int gq, int fq, int nk, int gk, int fk, int fmt)
{
  char what[160];
  int nv = nk, ld = nq + nk + nv, G = nq / gq + nk / gk;
  size_t es = wf_storage_size(fmt), n = (size_t)N * ld, wd = (size_t)N * (nq + nk);
  float *xf = rand_floats(n, 1.0f), *wq = rand_floats((size_t)gq, 1.0f);
  float *wk = rand_floats((size_t)gk, 1.0f);
  void *qkv = stored(xf, n, fmt), *raw = malloc(wd * es);
  float *ss = (float *)malloc((size_t)N * G * 4), *rstd = (float *)malloc((size_t)N * G * 4);
  void *dq = up(qkv, n * es), *draw = up(NULL, wd * es);
  float *dss = (float *)up(NULL, (size_t)N * G * 4), *drs = (float *)up(NULL, (size_t)N * G * 4);
  float *dwq_w = (float *)up(wq, (size_t)gq * 4), *dwk_w = (float *)up(wk, (size_t)gk * 4);
  wf_qknorm_sumsq(ss, qkv, N, ld, nq, gq, nk, gk, fmt);
  qknorm_op.sumsq(dss, dq, N, ld, nq, gq, nk, gk, fmt, NULL);
  snprintf(what, sizeof what, "%s qknorm: sums of squares", name);
  near(what, ss, down(dss, (size_t)N * G * 4), (size_t)N * G, WF_PREC_NO, REL);
  for (size_t i = 0; i < (size_t)N * G; i++) /* the other tp ranks' parts of each group */
    ss[i] *= (float)fq / gq;
  CK(cudaMemcpy(dss, ss, (size_t)N * G * 4, cudaMemcpyHostToDevice));
  wf_qknorm_forward(qkv, raw, rstd, ss, wq, wk, N, ld, nq, gq, fq, nk, gk, fk, 1e-5f, fmt);
  qknorm_op.forward(dq, draw, drs, dss, dwq_w, dwk_w, N, ld, nq, gq, fq, nk, gk, fk, 1e-5f, fmt,
                    NULL);
  snprintf(what, sizeof what, "%s qknorm forward: rows", name);
  near(what, qkv, down(dq, n * es), n, fmt, tol_of(fmt));
  snprintf(what, sizeof what, "%s qknorm forward: raw", name);
  near(what, raw, down(draw, wd * es), wd, fmt, 0.0);
  snprintf(what, sizeof what, "%s qknorm forward: rstd", name);
  near(what, rstd, down(drs, (size_t)N * G * 4), (size_t)N * G, WF_PREC_NO, REL);
  float *gf = rand_floats(n, 1.0f);
  void *dqkv = stored(gf, n, fmt), *ddqkv = up(dqkv, n * es);
  float *dot = (float *)malloc((size_t)N * G * 4), *ddot = (float *)up(NULL, (size_t)N * G * 4);
  wf_qknorm_dot(dot, dqkv, raw, rstd, wq, wk, N, ld, nq, gq, nk, gk, fmt);
  qknorm_op.dot(ddot, ddqkv, draw, drs, dwq_w, dwk_w, N, ld, nq, gq, nk, gk, fmt, NULL);
  snprintf(what, sizeof what, "%s qknorm: dot products", name);
  near(what, dot, down(ddot, (size_t)N * G * 4), (size_t)N * G, WF_PREC_NO, REL * 10);
  float *gwq = rand_floats((size_t)gq, 1.0f), *gwk = rand_floats((size_t)gk, 1.0f);
  float *dgwq = (float *)up(gwq, (size_t)gq * 4), *dgwk = (float *)up(gwk, (size_t)gk * 4);
  CK(cudaMemcpy(ddot, dot, (size_t)N * G * 4, cudaMemcpyHostToDevice));
  wf_qknorm_backward(dqkv, gwq, gwk, raw, rstd, dot, wq, wk, N, ld, nq, gq, fq, nk, gk, fk, fmt);
  qknorm_op.backward(ddqkv, dgwq, dgwk, draw, drs, ddot, dwq_w, dwk_w, N, ld, nq, gq, fq, nk, gk,
                     fk, fmt, NULL);
  snprintf(what, sizeof what, "%s qknorm backward: input gradients", name);
  near(what, dqkv, down(ddqkv, n * es), n, fmt, tol_of(fmt));
  snprintf(what, sizeof what, "%s qknorm backward: query weights' gradient", name);
  near(what, gwq, down(dgwq, (size_t)gq * 4), (size_t)gq, WF_PREC_NO, REL * 10);
  snprintf(what, sizeof what, "%s qknorm backward: key weights' gradient", name);
  near(what, gwk, down(dgwk, (size_t)gk * 4), (size_t)gk, WF_PREC_NO, REL * 10);
}

int main(void)
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no GPU: skipped\n");
    return 77;
  }
  for (int f = 0; f < 2; f++) {
    int fmt = f ? WF_PREC_BF16 : WF_PREC_NO;
    const char *t = f ? "bf16" : "fp32";
    char name[64];
    snprintf(name, sizeof name, "E 8 top-2 raw (%s)", t);
    route(name, 200, 8, 2, false, fmt);
    snprintf(name, sizeof name, "E 128 top-8 renormalised (%s)", t);
    route(name, 200, 128, 8, true, fmt);
    snprintf(name, sizeof name, "%s", t);
    dispatch(name, 300, 8, 2, 0, 96, fmt);
    dispatch(name, 300, 8, 2, 40, 96, fmt);
    /* OLMoE: one group over this tp rank's 4 x 16 queries of a 2-rank projection */
    snprintf(name, sizeof name, "OLMoE-like tp 2 (%s)", t);
    qknorm(name, 50, 64, 64, 128, 32, 32, 64, fmt);
    /* Qwen3: 4 query heads and 2 key heads of 32 */
    snprintf(name, sizeof name, "Qwen3-like (%s)", t);
    qknorm(name, 50, 128, 32, 32, 64, 32, 32, fmt);
  }
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
