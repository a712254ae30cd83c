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
