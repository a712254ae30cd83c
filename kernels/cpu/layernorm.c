/*
 * layernorm.c - layer normalisation over the last dimension, eps 1e-5.
 *
 * Legend: N rows (B*T), C channels. Rows are independent and split over threads.
 * Statistics are computed in double (two passes: mean, then centred variance) so that
 * rstd does not lose digits to cancellation when |mean| >> std.
 * Backward: dinp needs only its own row; dweight/dbias sum over rows, so a second
 * pass gives each thread a column range and sums rows in order (deterministic,
 * independent of the thread count, no scratch memory).
 * The 16-bit forms (storage.h) load each row into this thread's working rows and run
 * the same row functions on it: bit for bit the fp32 kernel on the widened input.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

#define LN_EPS 1e-5

struct ln {
  float *out, *mean, *rstd, *dinp, *dweight, *dbias;
  const float *inp, *weight, *bias, *dout, *cmean, *crstd;
  int N, C;
  void *out16; /* the 16-bit forms (fmt) */
  const void *inp16;
  int fmt;
};

static void norm_row(float *o, float *mean_out, float *rstd_out, const float *x, const float *w,
                     const float *b, int C)
{
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < C; c++)
    s += x[c];
  float m = (float)(s / C);
  double v = 0.0;
#pragma omp simd reduction(+ : v)
  for (int c = 0; c < C; c++) {
    double d = (double)x[c] - m;
    v += d * d;
  }
  float rs = (float)(1.0 / sqrt(v / C + LN_EPS));
#pragma omp simd
  for (int c = 0; c < C; c++)
    o[c] = (x[c] - m) * rs * w[c] + b[c];
  if (mean_out)
    *mean_out = m;
  if (rstd_out)
    *rstd_out = rs;
}

static void forward_share(void *p, int tid, int nt)
{
  const struct ln *l = p;
  size_t lo, hi;
  wf__split((size_t)l->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    norm_row(l->out + i * l->C, l->mean ? l->mean + i : NULL, l->rstd ? l->rstd + i : NULL,
             l->inp + i * l->C, l->weight, l->bias, l->C);
}

void wf_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C)
{
  struct ln l = {.out = out,
                 .mean = mean,
                 .rstd = rstd,
                 .inp = inp,
                 .weight = weight,
                 .bias = bias,
                 .N = N,
                 .C = C};
  wf__parallel(wf__threads_for((size_t)N * C), forward_share, &l);
}

/* dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight */
static void dinp_row(float *dx, const float *dy, const float *x, const float *w, float m, float rs,
                     int C)
{
  float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
  for (int c = 0; c < C; c++) {
    float g = dy[c] * w[c];
    sg += g;
    sgx += g * (x[c] - m) * rs;
  }
  sg /= (float)C;
  sgx /= (float)C;
#pragma omp simd
  for (int c = 0; c < C; c++) {
    float xh = (x[c] - m) * rs;
    dx[c] += rs * (dy[c] * w[c] - sg - xh * sgx);
  }
}

static void dinp_share(void *p, int tid, int nt)
{
  const struct ln *l = p;
  size_t lo, hi;
  wf__split((size_t)l->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    dinp_row(l->dinp + i * l->C, l->dout + i * l->C, l->inp + i * l->C, l->weight, l->cmean[i],
             l->crstd[i], l->C);
}

/* Columns [lo, hi) of one row's parameter gradients: dweight += dy x-hat, dbias += dy. */
static inline void params_row(float *dw, float *db, const float *dy, const float *x, float m,
                              float rs, size_t lo, size_t hi)
{
  if (dw) {
#pragma omp simd
    for (size_t c = lo; c < hi; c++)
      dw[c] += dy[c] * ((x[c] - m) * rs);
  }
  if (db) {
#pragma omp simd
    for (size_t c = lo; c < hi; c++)
      db[c] += dy[c];
  }
}

static void params_share(void *p, int tid, int nt)
{
  const struct ln *l = p;
  size_t lo, hi;
  wf__split((size_t)l->C, tid, nt, 16, &lo, &hi);
  float *dw = l->dweight, *db = l->dbias;
  for (int i = 0; i < l->N; i++) {
    const float *dy = l->dout + (size_t)i * l->C, *x = l->inp + (size_t)i * l->C;
    float m = l->cmean[i], rs = l->crstd[i];
    params_row(dw, db, dy, x, m, rs, lo, hi);
  }
}

void wf_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C)
{
  struct ln l = {.dinp = dinp,
                 .dweight = dweight,
                 .dbias = dbias,
                 .inp = inp,
                 .weight = weight,
                 .dout = dout,
                 .cmean = mean,
                 .crstd = rstd,
                 .N = N,
                 .C = C};
  int nt = wf__threads_for((size_t)N * C);
  if (dinp)
    wf__parallel(nt, dinp_share, &l);
  if (dweight || dbias)
    wf__parallel(nt, params_share, &l);
}

/* ---- 16-bit storage --------------------------------------------------------------------- */

static void forward16_share(void *p, int tid, int nt)
{
  const struct ln *l = p;
  size_t lo, hi, C = (size_t)l->C;
  float *x = wf__work(0, C), *o = wf__work(1, C);
  if (!x || !o)
    return;
  wf__split((size_t)l->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    wf__load(x, l->inp16, i * C, C, l->fmt);
    norm_row(o, l->mean ? l->mean + i : NULL, l->rstd ? l->rstd + i : NULL, x, l->weight, l->bias,
             l->C);
    wf__store(l->out16, i * C, o, C, l->fmt);
  }
}

void wf_layernorm_forward16(void *out, float *mean, float *rstd, const void *inp,
                            const float *weight, const float *bias, int N, int C, int fmt)
{
  struct ln l = {.out16 = out,
                 .mean = mean,
                 .rstd = rstd,
                 .inp16 = inp,
                 .weight = weight,
                 .bias = bias,
                 .N = N,
                 .C = C,
                 .fmt = fmt};
  wf__parallel(wf__threads_for((size_t)N * C), forward16_share, &l);
}

static void dinp16_share(void *p, int tid, int nt)
{
  const struct ln *l = p;
  size_t lo, hi, C = (size_t)l->C;
  float *x = wf__work(0, C);
  if (!x)
    return;
  wf__split((size_t)l->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++) {
    wf__load(x, l->inp16, i * C, C, l->fmt);
    dinp_row(l->dinp + i * C, l->dout + i * C, x, l->weight, l->cmean[i], l->crstd[i], l->C);
  }
}

/* The column ranges of params_share, each row's range loaded first. */
static void params16_share(void *p, int tid, int nt)
{
  const struct ln *l = p;
  size_t lo, hi, C = (size_t)l->C;
  wf__split(C, tid, nt, 16, &lo, &hi);
  float *x = wf__work(0, C), *dw = l->dweight, *db = l->dbias;
  if (!x)
    return;
  for (int i = 0; i < l->N; i++) {
    const float *dy = l->dout + (size_t)i * C;
    float m = l->cmean[i], rs = l->crstd[i];
    wf__load(x + lo, l->inp16, (size_t)i * C + lo, hi - lo, l->fmt);
    params_row(dw, db, dy, x, m, rs, lo, hi);
  }
}

void wf_layernorm_backward16(float *dinp, float *dweight, float *dbias, const float *dout,
                             const void *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C, int fmt)
{
  struct ln l = {.dinp = dinp,
                 .dweight = dweight,
                 .dbias = dbias,
                 .inp16 = inp,
                 .weight = weight,
                 .dout = dout,
                 .cmean = mean,
                 .crstd = rstd,
                 .N = N,
                 .C = C,
                 .fmt = fmt};
  int nt = wf__threads_for((size_t)N * C);
  if (dinp)
    wf__parallel(nt, dinp16_share, &l);
  if (dweight || dbias)
    wf__parallel(nt, params16_share, &l);
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

#define LAYERNORM_VARIANT(name, fmt)                                                               \
  static void name##_forward(void *out, float *mean, float *rstd, const void *inp, const float *w, \
                             const float *b, int N, int C, wf_stream *s)                           \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_layernorm_forward(out, mean, rstd, inp, w, b, N, C);                                      \
    else                                                                                           \
      wf_layernorm_forward16(out, mean, rstd, inp, w, b, N, C, fmt);                               \
  }                                                                                                \
  static void name##_backward(float *dinp, float *dw, float *db, const float *dout,                \
                              const void *inp, const float *w, const float *mean,                  \
                              const float *rstd, int N, int C, wf_stream *s)                       \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);                         \
    else                                                                                           \
      wf_layernorm_backward16(dinp, dw, db, dout, inp, w, mean, rstd, N, C, fmt);                  \
  }                                                                                                \
  static void name##_residual_forward(void *res, void *out, float *mean, float *rstd,              \
                                      const void *a, const float *b, const float *w,               \
                                      const float *bias, int N, int C, wf_stream *s)               \
  {                                                                                                \
    wf__residual_forward_as(res, a, b, (size_t)N *C, fmt);                                         \
    name##_forward(out, mean, rstd, res, w, bias, N, C, s);                                        \
  }                                                                                                \
  static const wf_layernorm_op name = {name##_forward, name##_backward, name##_residual_forward}

LAYERNORM_VARIANT(f32, WF_DT_F32);
LAYERNORM_VARIANT(bf16, WF_DT_BF16);
LAYERNORM_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_layernorm = WF_KV(layernorm, WF_OP_VERSION_layernorm, &f32, &bf16, &f16);
