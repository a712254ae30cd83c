/*
 * check.h - helpers for the kernel tests: a seeded generator, float <-> double
 * copies, the finite-difference gradient check, the "backward adds" check and the
 * attention reference.
 *
 * How a backward is checked: each test writes a reference forward in double
 * (naive loops, independent of the kernel code) and a scalar L = sum(out * w) with
 * fixed random w. Central differences of that double L, with h = 1e-5, are accurate
 * to ~1e-9: truncation h^2 |L'''| / 6 ~ 1e-11 and rounding eps64 |L| / h ~ 1e-9 for
 * |L| <= 100. The kernel's float32 gradient (dout = w) carries rounding of
 * ~eps32 = 6e-8 times the magnitude of the summed terms, i.e. a few 1e-7 relative
 * for our sizes; GRAD_RTOL = 1e-4 leaves margin for compilers and thread counts,
 * while any wrong or missing term moves a gradient by O(its scale) and fails.
 */
#ifndef WF_TESTS_KERNELS_CHECK_H
#define WF_TESTS_KERNELS_CHECK_H

#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../common/encode.h"

#define FD_H      1e-5
#define GRAD_RTOL 1e-4
/* float32 forward vs double reference: a few eps32 per accumulated term. */
#define FWD_RTOL 2e-5

static inline double urand(uint64_t *s)
{
  /* xorshift64*: deterministic, good enough for test data */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return (double)((*s * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

/* x[i] uniform in [lo, hi) */
static inline void fill(float *x, size_t n, double lo, double hi, uint64_t *s)
{
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(lo + (hi - lo) * urand(s));
}

static inline double *to_double(const float *x, size_t n)
{
  double *d = malloc(n * sizeof *d);
  for (size_t i = 0; i < n; i++)
    d[i] = x[i];
  return d;
}

static inline float *zeros(size_t n) { return calloc(n, sizeof(float)); }

static inline double dot_w(const double *out, const float *w, size_t n)
{
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += out[i] * w[i];
  return s;
}

/* Compare a float result with a double reference: |a - r| <= rtol (|r| + max|r|). */
static inline void check_close(const char *what, const float *a, const double *r, size_t n,
                               double rtol)
{
  double scale = 0.0;
  for (size_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(r[i]));
  for (size_t i = 0; i < n; i++) {
    if (fabs(a[i] - r[i]) > rtol * (fabs(r[i]) + scale)) {
      print_error("%s[%zu]: got %.9g, expected %.9g (scale %.3g)\n", what, i, a[i], r[i], scale);
      fail();
    }
  }
}

typedef double (*loss_fn)(void *ctx);

/* Central differences of loss(ctx) with respect to x (one of the inputs that loss
 * reads), at every element when n <= 64, else at 40 elements spread by a stride
 * coprime with n, compared with the analytic gradient g. */
static inline void check_grad(const char *what, loss_fn loss, void *ctx, double *x, size_t n,
                              const float *g)
{
  size_t count = n <= 64 ? n : 40, step = n <= 64 ? 1 : n / 40 + 1;
  while (n > 64 && n % step == 0)
    step++;
  double *fd = malloc(count * sizeof *fd);
  size_t *at = malloc(count * sizeof *at);
  double scale = 0.0;
  for (size_t k = 0; k < count; k++) {
    size_t i = (k * step) % n;
    double x0 = x[i];
    x[i] = x0 + FD_H;
    double lp = loss(ctx);
    x[i] = x0 - FD_H;
    double lm = loss(ctx);
    x[i] = x0;
    at[k] = i;
    fd[k] = (lp - lm) / (2.0 * FD_H);
    scale = fmax(scale, fabs(fd[k]));
  }
  assert_true(scale > 0.0); /* a test whose gradient is all zero checks nothing */
  for (size_t k = 0; k < count; k++) {
    size_t i = at[k];
    if (fabs(g[i] - fd[k]) > GRAD_RTOL * (fabs(fd[k]) + scale)) {
      print_error("%s[%zu]: analytic %.9g, finite difference %.9g (scale %.3g)\n", what, i, g[i],
                  fd[k], scale);
      fail();
    }
  }
  free(fd);
  free(at);
}

/* Backward twice from zero gives 2x the first result. Exactly so where each call adds
 * one finished value; where a call adds its terms one by one into the gradient
 * (dbias over N rows, GEMM K-blocks with beta = 1), the second call's additions round
 * differently: up to N eps32 ~ 2e-5 of the gradient's scale for N <= 301, and
 * ~sqrt(N) eps32 typically. A backward that overwrites instead gives 1x and fails. */
static inline void check_doubled(const char *what, const float *g2, const float *g1, size_t n)
{
  double scale = 0.0;
  for (size_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(2.0 * g1[i]));
  for (size_t i = 0; i < n; i++) {
    if (fabs(g2[i] - 2.0 * g1[i]) > 2e-5 * (fabs(2.0 * g1[i]) + scale)) {
      print_error("%s[%zu]: second call gave %.9g, expected 2 x %.9g\n", what, i, g2[i], g1[i]);
      fail();
    }
  }
}

/* A float buffer of n NaNs: an output a backward WRITES (matmul's dinp, ...) starts
 * so, and any element it does not write stays NaN and fails the comparison. */
static inline float *nans(size_t n)
{
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = NAN;
  return x;
}

/* A written output computed twice, from NaN and from the first call's result: equal bit
 * for bit (a backward that added into it would give 2x, or NaN). */
static inline void check_rewritten(const char *what, const float *g2, const float *g1, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    if (memcmp(&g2[i], &g1[i], sizeof *g1) != 0) {
      print_error("%s[%zu]: second call gave %.9g, the first %.9g\n", what, i, g2[i], g1[i]);
      fail();
    }
  }
}

/* Causal softmax attention in double, written from its definition (tests' reference):
 * qkv (B,T,C + 2 NKV hs) = [q heads | k heads | v heads], hs = C / NH, query head h
 * reading kv head h / (NH / NKV) (Llama's repeat_kv as an index; NKV == NH is GPT-2's
 * multi-head attention); out (B,T,C), att (B,NH,T,T) the probabilities, 0 above the
 * diagonal. */
static inline void ref_attention(double *out, double *att, const double *qkv, int B, int T, int C,
                                 int NH, int NKV)
{
  const int hs = C / NH, G = NH / NKV;
  const size_t ld = (size_t)C + 2 * (size_t)NKV * hs, koff = C, voff = C + (size_t)NKV * hs;
  double scale = 1.0 / sqrt(hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const double *q = qkv + ((size_t)b * T + i) * ld + h * hs;
        double *arow = att + (((size_t)b * NH + h) * T + i) * T, mx = -INFINITY, sum = 0;
        for (int j = 0; j < T; j++) {
          const double *k = qkv + ((size_t)b * T + j) * ld + koff + (h / G) * hs;
          double dot = 0;
          for (int d = 0; d < hs; d++)
            dot += q[d] * k[d];
          arow[j] = j <= i ? dot * scale : -INFINITY;
          mx = fmax(mx, arow[j]);
        }
        for (int j = 0; j < T; j++)
          sum += arow[j] = exp(arow[j] - mx);
        for (int j = 0; j < T; j++)
          arow[j] /= sum;
        double *o = out + ((size_t)b * T + i) * C + h * hs;
        for (int d = 0; d < hs; d++) {
          double acc = 0;
          for (int j = 0; j <= i; j++)
            acc += arow[j] * qkv[((size_t)b * T + j) * ld + voff + (h / G) * hs + d];
          o[d] = acc;
        }
      }
}

#endif /* WF_TESTS_KERNELS_CHECK_H */
