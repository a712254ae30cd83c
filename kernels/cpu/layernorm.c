/*
 * layernorm.c - layer normalisation over the last dimension, eps 1e-5.
 *
 * Legend: N rows (B*T), C channels. Rows are independent and split over threads.
 * Statistics are computed in double (two passes: mean, then centred variance) so that
 * rstd does not lose digits to cancellation when |mean| >> std.
 * Backward: dinp needs only its own row; dweight/dbias sum over rows, so a second
 * pass gives each thread a column range and sums rows in order (deterministic,
 * independent of the thread count, no scratch memory).
 */
#include <math.h>
#include <omp.h>

#include "cpu_int.h"
#include "wf_kernels.h"

#define LN_EPS 1e-5

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

void wf_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C)
{
  int nt = wf__threads_for((size_t)N * C);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int i = 0; i < N; i++)
    norm_row(out + (size_t)i * C, mean ? mean + i : NULL, rstd ? rstd + i : NULL,
             inp + (size_t)i * C, weight, bias, C);
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

static void params_backward(float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *mean, const float *rstd, int N, int C, int nt)
{
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split((size_t)C, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
    for (int i = 0; i < N; i++) {
      const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
      float m = mean[i], rs = rstd[i];
      if (dweight) {
#pragma omp simd
        for (size_t c = lo; c < hi; c++)
          dweight[c] += dy[c] * ((x[c] - m) * rs);
      }
      if (dbias) {
#pragma omp simd
        for (size_t c = lo; c < hi; c++)
          dbias[c] += dy[c];
      }
    }
  }
}

void wf_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C)
{
  int nt = wf__threads_for((size_t)N * C);
  if (dinp) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int i = 0; i < N; i++)
      dinp_row(dinp + (size_t)i * C, dout + (size_t)i * C, inp + (size_t)i * C, weight, mean[i],
               rstd[i], C);
  }
  if (dweight || dbias)
    params_backward(dweight, dbias, dout, inp, mean, rstd, N, C, nt);
}
