/*
 * attention.c - causal multi-head self-attention.
 *
 * Legend: B batch, T time, C channels, NH heads, hs = C / NH head size.
 * qkv (B,T,3C) holds q, k, v side by side; head h owns columns [h*hs, (h+1)*hs) of
 * each, so a head's Q, K and V are strided (ld 3C) matrices used in place by sgemm.
 *
 * Work is split over the B*NH (batch, head) pairs; each pair runs single-threaded
 * OpenBLAS calls. Causality is exploited by row blocks of BLK queries: block
 * [i0, i1) only needs keys [0, i1), so the GEMMs do about half of the full T x T
 * work at long T. Entries above the diagonal of att are written as 0, so att is a
 * full (T,T) softmax matrix per head, as the CUDA twin and the backward expect.
 *
 * The 16-bit forms (storage.h) load one (batch, head) pair's q, k, v into this thread's
 * working memory as a (T, 3 hs) matrix, run the same head functions on it with hs as
 * the width (so every GEMM has the fp32 kernel's shape), and store out and the
 * probabilities rounded; backward accumulates the head's dq, dk, dv in working memory
 * and adds them into dqkv.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

#define BLK 128

/* att rows [i0, i1) of one head: scaled scores in, causal softmax out. */
WF__CLONES static void softmax_rows(float *A, int T, int i0, int i1)
{
  for (int i = i0; i < i1; i++) {
    float *a = A + (size_t)i * T;
    float mx = wf__maxf(a, i + 1);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j <= i; j++) {
      a[j] = wf__expf(a[j] - mx);
      s += a[j];
    }
    float inv = 1.0f / s;
#pragma omp simd
    for (int j = 0; j <= i; j++)
      a[j] *= inv;
    memset(a + i + 1, 0, (size_t)(T - i - 1) * sizeof(float));
  }
}

static void head_forward(float *out, float *A, const float *q, const float *k, const float *v,
                         int T, int C, int hs)
{
  const int ld = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int i0 = 0; i0 < T; i0 += BLK) {
    int i1 = i0 + BLK < T ? i0 + BLK : T, m = i1 - i0;
    float *Ab = A + (size_t)i0 * T;
    /* scores (m, i1) = Q[i0:i1] . K[0:i1]^T * scale */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, hs, scale, q + (size_t)i0 * ld, ld,
                k, ld, 0.0f, Ab, T);
    softmax_rows(A, T, i0, i1);
    /* out[i0:i1] (m, hs) = att[i0:i1, 0:i1] . V[0:i1] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1, 1.0f, Ab, T, v, ld, 0.0f,
                out + (size_t)i0 * C, C);
  }
}

struct att {
  float *out, *att, *dqkv, *scratch;
  const float *qkv, *catt, *dout;
  int B, T, C, NH;
};

static void forward_share(void *p, int tid, int nt)
{
  const struct att *a = p;
  const int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
  size_t lo, hi;
  wf__split((size_t)a->B * NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / NH, h = bh % NH;
    const float *base = a->qkv + b * T * 3 * C + h * hs;
    head_forward(a->out + b * T * C + h * hs, a->att + bh * T * T, base, base + C, base + 2 * C, T,
                 C, hs);
  }
}

void wf_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
  struct att a = {.out = out, .att = att, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 64), forward_share, &a);
}

/* Rows [i0, i1) of one head: dS = att * (dA - rowsum(att * dA)), in place in D. */
WF__CLONES static void softmax_backward_rows(float *D, const float *A, int T, int i0, int i1)
{
  for (int i = i0; i < i1; i++) {
    float *d = D + (size_t)i * T;
    const float *a = A + (size_t)i * T;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j <= i; j++)
      s += a[j] * d[j];
#pragma omp simd
    for (int j = 0; j <= i; j++)
      d[j] = a[j] * (d[j] - s);
    /* keys i < j < i1 were computed by the block GEMM but are masked */
    for (int j = i + 1; j < i1; j++)
      d[j] = 0.0f;
  }
}

struct head_grad {
  float *dq, *dk, *dv;
  const float *q, *k, *v, *dout;
};

static void head_backward(const struct head_grad *g, float *D, const float *A, int T, int C, int hs)
{
  const int ld = 3 * C;
  const float scale = 1.0f / sqrtf((float)hs);
  for (int i0 = 0; i0 < T; i0 += BLK) {
    int i1 = i0 + BLK < T ? i0 + BLK : T, m = i1 - i0;
    const float *Ab = A + (size_t)i0 * T, *dO = g->dout + (size_t)i0 * C;
    float *Db = D + (size_t)i0 * T;
    /* dV[0:i1] += att[i0:i1, 0:i1]^T . dout[i0:i1] */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, m, 1.0f, Ab, T, dO, C, 1.0f, g->dv,
                ld);
    /* datt[i0:i1, 0:i1] = dout[i0:i1] . V[0:i1]^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, hs, 1.0f, dO, C, g->v, ld, 0.0f, Db,
                T);
    softmax_backward_rows(D, A, T, i0, i1);
    /* dQ[i0:i1] += scale dS . K[0:i1];  dK[0:i1] += scale dS^T . Q[i0:i1] */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, i1, scale, Db, T, g->k, ld, 1.0f,
                g->dq + (size_t)i0 * ld, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, hs, m, scale, Db, T,
                g->q + (size_t)i0 * ld, ld, 1.0f, g->dk, ld);
  }
}

static void backward_share(void *p, int tid, int nt)
{
  const struct att *a = p;
  const int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
  size_t lo, hi;
  wf__split((size_t)a->B * NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / NH, h = bh % NH;
    size_t off = b * T * 3 * C + h * hs;
    struct head_grad g = {
        .dq = a->dqkv + off,
        .dk = a->dqkv + off + C,
        .dv = a->dqkv + off + 2 * C,
        .q = a->qkv + off,
        .k = a->qkv + off + C,
        .v = a->qkv + off + 2 * C,
        .dout = a->dout + b * T * C + h * hs,
    };
    head_backward(&g, a->scratch + bh * T * T, a->catt + bh * T * T, T, C, hs);
  }
}

void wf_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH)
{
  struct att a = {.dqkv = dqkv,
                  .scratch = scratch,
                  .qkv = qkv,
                  .catt = att,
                  .dout = dout,
                  .B = B,
                  .T = T,
                  .C = C,
                  .NH = NH};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 32), backward_share, &a);
}

/* ---- 16-bit storage ------------------------------------------------------------------------ */

struct att16 {
  void *out, *att;
  float *dqkv;
  const void *qkv, *catt;
  const float *dout;
  int B, T, C, NH, fmt;
};

/* Head h of batch b's q, k, v rows -> w (T, 3 hs): q at column 0, k at hs, v at 2 hs. */
static void load_head(float *w, const struct att16 *a, size_t b, size_t h)
{
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH;
  for (size_t t = 0; t < T; t++)
    for (size_t part = 0; part < 3; part++)
      wf__load(w + t * 3 * hs + part * hs, a->qkv, (b * T + t) * 3 * C + part * C + h * hs, hs,
               a->fmt);
}

static void forward16_share(void *p, int tid, int nt)
{
  const struct att16 *a = p;
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH, lo, hi;
  float *w = wf__work(0, T * 3 * hs), *A = wf__work(1, T * T), *o = wf__work(2, T * hs);
  if (!w || !A || !o)
    return;
  wf__split((size_t)a->B * a->NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / a->NH, h = bh % a->NH;
    load_head(w, a, b, h);
    head_forward(o, A, w, w + hs, w + 2 * hs, (int)T, (int)hs, (int)hs);
    for (size_t t = 0; t < T; t++)
      wf__store(a->out, (b * T + t) * C + h * hs, o + t * hs, hs, a->fmt);
    wf__store(a->att, bh * T * T, A, T * T, a->fmt);
  }
}

void wf_attention_forward16(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                            int fmt)
{
  struct att16 a = {
      .out = out, .att = att, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH, .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 64), forward16_share, &a);
}

static void backward16_share(void *p, int tid, int nt)
{
  const struct att16 *a = p;
  size_t T = (size_t)a->T, C = (size_t)a->C, hs = C / (size_t)a->NH, lo, hi;
  float *w = wf__work(0, T * 3 * hs), *A = wf__work(1, T * T), *D = wf__work(2, T * T);
  float *dw = wf__work(3, T * 3 * hs), *dO = wf__work(4, T * hs);
  if (!w || !A || !D || !dw || !dO)
    return;
  wf__split((size_t)a->B * a->NH, tid, nt, 1, &lo, &hi);
  for (size_t bh = lo; bh < hi; bh++) {
    size_t b = bh / a->NH, h = bh % a->NH;
    load_head(w, a, b, h);
    wf__load(A, a->catt, bh * T * T, T * T, a->fmt);
    for (size_t t = 0; t < T; t++)
      memcpy(dO + t * hs, a->dout + (b * T + t) * C + h * hs, hs * sizeof(float));
    memset(dw, 0, T * 3 * hs * sizeof(float));
    struct head_grad g = {dw, dw + hs, dw + 2 * hs, w, w + hs, w + 2 * hs, dO};
    head_backward(&g, D, A, (int)T, (int)hs, (int)hs);
    for (size_t t = 0; t < T; t++)
      for (size_t part = 0; part < 3; part++) {
        float *dst = a->dqkv + (b * T + t) * 3 * C + part * C + h * hs;
        const float *src = dw + t * 3 * hs + part * hs;
        for (size_t j = 0; j < hs; j++)
          dst[j] += src[j];
      }
  }
}

void wf_attention_backward16(float *dqkv, float *scratch, const float *dout, const void *qkv,
                             const void *att, int B, int T, int C, int NH, int fmt)
{
  (void)scratch;
  struct att16 a = {.dqkv = dqkv,
                    .qkv = qkv,
                    .catt = att,
                    .dout = dout,
                    .B = B,
                    .T = T,
                    .C = C,
                    .NH = NH,
                    .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)B * NH * T * T * (C / NH) / 32), backward16_share, &a);
}
