/*
 * moe_combine.c - a token's MoE output as the weighted sum of its experts' rows, and the
 * backward (moe_combine.h).
 *
 * Legend: N tokens, K choices each, C row width. Tokens are split over threads; a token
 * sums its K rows in choice order, and a dot product runs over its C columns in order,
 * so results do not depend on the thread count.
 */
#include <string.h>

#include "cpu_int.h"
#include "storage.h"
#include "wf_kernels.h"

typedef struct comb {
  float *out, *dw;
  void *dyp;
  const float *y, *w, *dout;
  const int *pos;
  int N, K, C, fmt;
} comb;

static void combine_share(void *ctx, int tid, int nt)
{
  const comb *v = ctx;
  size_t C = (size_t)v->C, K = (size_t)v->K, lo, hi;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    float *o = v->out + n * C;
    memset(o, 0, C * sizeof *o);
    for (size_t j = 0; j < K; j++) {
      int p = v->pos[n * K + j];
      if (p < 0)
        continue;
      const float *y = v->y + (size_t)p * C, w = v->w[n * K + j];
#pragma omp simd
      for (size_t c = 0; c < C; c++)
        o[c] += w * y[c];
    }
  }
}

void wf_moe_combine(float *out, const float *y, const float *w, const int *pos, int N, int K, int C)
{
  comb v = {.out = out, .y = y, .w = w, .pos = pos, .N = N, .K = K, .C = C};
  wf__parallel(wf__threads_for((size_t)N * (size_t)K * (size_t)C), combine_share, &v);
}

static void backward_share(void *ctx, int tid, int nt)
{
  const comb *v = ctx;
  size_t C = (size_t)v->C, K = (size_t)v->K, lo, hi;
  float *row = wf__work(0, C);
  if (!row)
    return;
  wf__split((size_t)v->N, tid, nt, 1, &lo, &hi);
  for (size_t n = lo; n < hi; n++) {
    const float *d = v->dout + n * C;
    for (size_t j = 0; j < K; j++) {
      int p = v->pos[n * K + j];
      float w = v->w[n * K + j], dot = 0;
      if (p < 0) {
        v->dw[n * K + j] = 0;
        continue;
      }
      const float *y = v->y + (size_t)p * C;
      for (size_t c = 0; c < C; c++)
        dot += d[c] * y[c], row[c] = w * d[c];
      v->dw[n * K + j] = dot;
      wf__store(v->dyp, (size_t)p * C, row, C, v->fmt);
    }
  }
}

void wf_moe_combine_backward(void *dyp, float *dw, const float *dout, const float *y,
                             const float *w, const int *pos, int N, int K, int C, int fmt)
{
  comb v = {.dyp = dyp,
            .dw = dw,
            .dout = dout,
            .y = y,
            .w = w,
            .pos = pos,
            .N = N,
            .K = K,
            .C = C,
            .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * (size_t)K * (size_t)C), backward_share, &v);
}

/* ---- the op (wf_kreg.h): the functions above, the stream unused ---------------------- */

static void combine(float *out, const float *y, const float *w, const int *pos, int N, int K, int C,
                    wf_stream *s)
{
  (void)s;
  wf_moe_combine(out, y, w, pos, N, K, C);
}

static void bwd(void *dyp, float *dw, const float *dout, const float *y, const float *w,
                const int *pos, int N, int K, int C, int fmt, wf_stream *s)
{
  (void)s;
  wf_moe_combine_backward(dyp, dw, dout, y, w, pos, N, K, C, fmt);
}

static const wf_moe_combine_op op = {combine, bwd};
const wf_kvariants wf__cpu_moe_combine = WF_KV_ANY(moe_combine, WF_OP_VERSION_moe_combine, &op);
