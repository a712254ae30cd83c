/*
 * rmsnorm.c - RMSNorm over the last dimension (Llama's norm), as Hugging Face's
 * LlamaRMSNorm computes it: rstd = 1 / sqrt(mean(x^2) + eps), out = weight * (x * rstd).
 *
 * Legend: N rows (B*T), C channels. Rows are independent and split over threads. The
 * sum of squares is taken in double (rstd is then correctly rounded to float for any
 * C we run), whatever the activations' precision.
 * Backward: dinp needs only its own row; dweight sums over rows, so a second pass gives
 * each thread a column range and sums rows in order (deterministic, independent of the
 * thread count, no scratch), as layernorm.c does.
 */
#include <math.h>

#include "cpu_int.h"
#include "wf_kernels.h"

struct rms {
  float *out, *rstd, *dinp, *dweight;
  const float *inp, *weight, *dout, *crstd;
  float eps;
  int N, C;
};

static void norm_row(float *o, float *rstd_out, const float *x, const float *w, float eps, int C)
{
  double ss = 0.0;
#pragma omp simd reduction(+ : ss)
  for (int c = 0; c < C; c++)
    ss += (double)x[c] * x[c];
  float rs = (float)(1.0 / sqrt(ss / C + eps));
#pragma omp simd
  for (int c = 0; c < C; c++)
    o[c] = w[c] * (x[c] * rs);
  if (rstd_out)
    *rstd_out = rs;
}

static void forward_share(void *p, int tid, int nt)
{
  const struct rms *r = p;
  size_t lo, hi;
  wf__split((size_t)r->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    norm_row(r->out + i * r->C, r->rstd ? r->rstd + i : NULL, r->inp + i * r->C, r->weight, r->eps,
             r->C);
}

void wf_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps,
                        int N, int C)
{
  struct rms r = {
      .out = out, .rstd = rstd, .inp = inp, .weight = weight, .eps = eps, .N = N, .C = C};
  wf__parallel(wf__threads_for((size_t)N * C), forward_share, &r);
}

/* dinp = rstd * (g - xhat * mean(g * xhat)), g = dout * weight, xhat = x * rstd */
static void dinp_row(float *dx, const float *dy, const float *x, const float *w, float rs, int C)
{
  float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
  for (int c = 0; c < C; c++)
    sgx += dy[c] * w[c] * (x[c] * rs);
  sgx /= (float)C;
#pragma omp simd
  for (int c = 0; c < C; c++)
    dx[c] += rs * (dy[c] * w[c] - (x[c] * rs) * sgx);
}

static void dinp_share(void *p, int tid, int nt)
{
  const struct rms *r = p;
  size_t lo, hi;
  wf__split((size_t)r->N, tid, nt, 1, &lo, &hi);
  for (size_t i = lo; i < hi; i++)
    dinp_row(r->dinp + i * r->C, r->dout + i * r->C, r->inp + i * r->C, r->weight, r->crstd[i],
             r->C);
}

static void dweight_share(void *p, int tid, int nt)
{
  const struct rms *r = p;
  size_t lo, hi;
  wf__split((size_t)r->C, tid, nt, 16, &lo, &hi);
  float *dw = r->dweight;
  for (int i = 0; i < r->N; i++) {
    const float *dy = r->dout + (size_t)i * r->C, *x = r->inp + (size_t)i * r->C;
    float rs = r->crstd[i];
#pragma omp simd
    for (size_t c = lo; c < hi; c++)
      dw[c] += dy[c] * (x[c] * rs);
  }
}

void wf_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C)
{
  struct rms r = {.dinp = dinp,
                  .dweight = dweight,
                  .inp = inp,
                  .weight = weight,
                  .dout = dout,
                  .crstd = rstd,
                  .N = N,
                  .C = C};
  int nt = wf__threads_for((size_t)N * C);
  if (dinp)
    wf__parallel(nt, dinp_share, &r);
  if (dweight)
    wf__parallel(nt, dweight_share, &r);
}

/* ---- 16-bit storage: row blocks through this thread's working memory (cpu_int.h) --------- */

void wf_rmsnorm_forward16(void *out, float *rstd, const void *inp, const float *weight, float eps,
                          int N, int C, int fmt)
{
  size_t blk = wf__block_rows((size_t)C);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = wf__widened(WF__W_IN, inp, r0, n, (size_t)C, fmt), *y = wf__work(WF__W_OUT, n * C);
    if (!x || !y)
      return;
    wf_rmsnorm_forward(y, rstd ? rstd + r0 : NULL, x, weight, eps, (int)n, C);
    wf__store(out, r0 * C, y, n * C, fmt);
  }
}

void wf_rmsnorm_backward16(float *dinp, float *dweight, const float *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, int fmt)
{
  size_t blk = wf__block_rows((size_t)C);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = wf__widened(WF__W_IN, inp, r0, n, (size_t)C, fmt);
    if (!x)
      return;
    wf_rmsnorm_backward(dinp ? dinp + r0 * C : NULL, dweight, dout + r0 * C, x, weight, rstd + r0,
                        (int)n, C);
  }
}

/* ---- the op (wf_kreg.h): one variant per element type, the type bound ----------------- */

#define RMSNORM_VARIANT(name, fmt)                                                                 \
  static void name##_forward(void *out, float *rstd, const void *inp, const float *w, float eps,   \
                             int N, int C, wf_stream *s)                                           \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_rmsnorm_forward(out, rstd, inp, w, eps, N, C);                                            \
    else                                                                                           \
      wf_rmsnorm_forward16(out, rstd, inp, w, eps, N, C, fmt);                                     \
  }                                                                                                \
  static void name##_backward(float *dinp, float *dw, const float *dout, const void *inp,          \
                              const float *w, const float *rstd, int N, int C, wf_stream *s)       \
  {                                                                                                \
    if (fmt == WF_DT_F32)                                                                          \
      wf_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);                                     \
    else                                                                                           \
      wf_rmsnorm_backward16(dinp, dw, dout, inp, w, rstd, N, C, fmt);                              \
  }                                                                                                \
  static void name##_residual_forward(void *res, void *out, float *rstd, const void *a,            \
                                      const float *b, const float *w, float eps, int N, int C,     \
                                      wf_stream *s)                                                \
  {                                                                                                \
    wf__residual_forward_as(res, a, b, (size_t)N *C, fmt);                                         \
    name##_forward(out, rstd, res, w, eps, N, C, s);                                               \
  }                                                                                                \
  static const wf_rmsnorm_op name = {name##_forward, name##_backward, name##_residual_forward}

RMSNORM_VARIANT(f32, WF_DT_F32);
RMSNORM_VARIANT(bf16, WF_DT_BF16);
RMSNORM_VARIANT(f16, WF_DT_F16);
const wf_kvariants wf__cpu_rmsnorm = WF_KV(rmsnorm, WF_OP_VERSION_rmsnorm, &f32, &bf16, &f16);
