/*
 * moe_dispatch.c - the expert-major order of (token, choice) pairs and the row moves
 * into it and back (moe_dispatch.h).
 *
 * Legend: N tokens, K choices each, E experts, C row width. The order is a counting sort
 * (serial: N K integer steps). The moves split tokens over threads; the backward adds a
 * token's K rows in choice order, so its sums do not depend on the thread count.
 */
#include <string.h>

#include "cpu_int.h"
#include "storage.h"
#include "wf_kernels.h"

void wf_moe_dispatch(int *pos, int *counts, float *dropped, const int *idx, int N, int E, int K,
                     int cap)
{
  size_t pairs = (size_t)N * (size_t)K;
  int *next = (int *)wf__work(0, (size_t)E), *taken = (int *)wf__work(1, (size_t)E);
  long gone = 0;
  if (!next || !taken) /* out of memory: logged, and reported by the device's check */
    return;
  memset(counts, 0, (size_t)E * sizeof *counts);
  memset(taken, 0, (size_t)E * sizeof *taken);
  for (size_t i = 0; i < pairs; i++) /* the rows each expert keeps */
    if (cap <= 0 || counts[idx[i]] < cap)
      counts[idx[i]]++;
  next[0] = 0;
  for (int e = 1; e < E; e++) /* each expert's first row */
    next[e] = next[e - 1] + counts[e - 1];
  for (size_t i = 0; i < pairs; i++) { /* its first counts[e] pairs in pair order */
    int e = idx[i];
    if (taken[e] < counts[e])
      pos[i] = next[e] + taken[e]++;
    else
      pos[i] = -1, gone++;
  }
  *dropped = (float)gone;
}

typedef struct moves {
  void *xp;
  const void *x;
  float *dx;
  const float *dxp;
  const int *pos;
  int N, K, C, fmt;
} moves;

static void permute_share(void *ctx, int tid, int nt)
{
  const moves *v = ctx;
  size_t row = (size_t)v->C * wf_storage_size(v->fmt), lo, hi;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++)
    for (int j = 0; j < v->K; j++) {
      int p = v->pos[n * (size_t)v->K + (size_t)j];
      if (p >= 0)
        memcpy((char *)v->xp + (size_t)p * row, (const char *)v->x + n * row, row);
    }
}

void wf_moe_permute(void *xp, const void *x, const int *pos, int N, int K, int C, int fmt)
{
  moves v = {.xp = xp, .x = x, .pos = pos, .N = N, .K = K, .C = C, .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * (size_t)K * (size_t)C), permute_share, &v);
}

static void unpermute_share(void *ctx, int tid, int nt)
{
  const moves *v = ctx;
  size_t C = (size_t)v->C, lo, hi;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    float *d = v->dx + n * C;
    for (int j = 0; j < v->K; j++) {
      int p = v->pos[n * (size_t)v->K + (size_t)j];
      if (p < 0)
        continue;
      const float *s = v->dxp + (size_t)p * C;
#pragma omp simd
      for (size_t c = 0; c < C; c++)
        d[c] += s[c];
    }
  }
}

void wf_moe_unpermute(float *dx, const float *dxp, const int *pos, int N, int K, int C)
{
  moves v = {.dx = dx, .dxp = dxp, .pos = pos, .N = N, .K = K, .C = C};
  wf__parallel(wf__threads_for((size_t)N * (size_t)K * (size_t)C), unpermute_share, &v);
}

/* ---- the op (wf_kreg.h): the functions above, the stream unused ---------------------- */

static void dispatch(int *pos, int *counts, float *dropped, const int *idx, int N, int E, int K,
                     int cap, wf_stream *s)
{
  (void)s;
  wf_moe_dispatch(pos, counts, dropped, idx, N, E, K, cap);
}

static void permute(void *xp, const void *x, const int *pos, int N, int K, int C, int fmt,
                    wf_stream *s)
{
  (void)s;
  wf_moe_permute(xp, x, pos, N, K, C, fmt);
}

static void unpermute(float *dx, const float *dxp, const int *pos, int N, int K, int C,
                      wf_stream *s)
{
  (void)s;
  wf_moe_unpermute(dx, dxp, pos, N, K, C);
}

static const wf_moe_dispatch_op op = {dispatch, permute, unpermute};
const wf_kvariants wf__cpu_moe_dispatch = WF_KV_ANY(moe_dispatch, WF_OP_VERSION_moe_dispatch, &op);
