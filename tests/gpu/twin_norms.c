/*
 * twin_norms.c - CUDA kernels against their CPU twins (twin.h): LayerNorm, residual + LayerNorm,
 * RMSNorm.
 */
#include "twin.h"

void test_layernorm(ctx *c)
{
  const int N = 37, C = 45;
  const size_t NC = (size_t)N * C;
  float *inp = hrand(c, NC, -2, 2), *w = hrand(c, C, 0.5f, 1.5f), *b = hrand(c, C, -1, 1);
  float *out = hzero(c, NC), *mean = hzero(c, N), *rstd = hzero(c, N);
  float *d_out = df(c, out, NC), *d_mean = df(c, mean, N), *d_rstd = df(c, rstd, N);
  float *d_inp = df(c, inp, NC), *d_w = df(c, w, C);
  wf_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  WF_K(c->k, layernorm)->forward(d_out, d_mean, d_rstd, d_inp, d_w, df(c, b, C), N, C, c->stream);
  expect_close(c, "layernorm_forward out", out, d_out, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_forward mean", mean, d_mean, N, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_forward rstd", rstd, d_rstd, N, TOL_SUM, TOL_SUM);

  float *dout = hrand(c, NC, -1, 1), *dinp = hrand(c, NC, -1, 1);
  float *dw = hrand(c, C, -1, 1), *db = hrand(c, C, -1, 1);
  float *d_dinp = df(c, dinp, NC), *d_dw = df(c, dw, C), *d_db = df(c, db, C);
  /* Both sides use the CPU's mean and rstd, so only the backward is compared. */
  wf_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  WF_K(c->k, layernorm)
      ->backward(d_dinp, d_dw, d_db, df(c, dout, NC), d_inp, d_w, df(c, mean, N), df(c, rstd, N), N,
                 C, c->stream);
  expect_close(c, "layernorm_backward dinp", dinp, d_dinp, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_backward dweight", dw, d_dw, C, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_backward dbias", db, d_db, C, TOL_SUM, TOL_SUM);
}

/* res = a + b then layernorm, out of place and with res aliasing a (as the model calls
 * it): the sum is one addition (TOL_EXACT), the norm a reduction (TOL_SUM). */
void test_residual_layernorm(ctx *c)
{
  const int N = 37, C = 45;
  const size_t NC = (size_t)N * C;
  float *a = hrand(c, NC, -2, 2), *b = hrand(c, NC, -2, 2), *w = hrand(c, C, 0.5f, 1.5f);
  float *bias = hrand(c, C, -1, 1), *res = hzero(c, NC), *ln = hzero(c, NC);
  float *mean = hzero(c, N), *rstd = hzero(c, N);
  float *d_a = df(c, a, NC), *d_b = df(c, b, NC), *d_w = df(c, w, C), *d_bias = df(c, bias, C);
  float *d_res = df(c, res, NC), *d_ln = df(c, ln, NC), *d_mean = df(c, mean, N);
  float *d_rstd = df(c, rstd, N);
  wf_residual_forward(res, a, b, NC);
  wf_layernorm_forward(ln, mean, rstd, res, w, bias, N, C);
  WF_K(c->k, layernorm)
      ->residual_forward(d_res, d_ln, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C, c->stream);
  expect_close(c, "residual_layernorm res", res, d_res, NC, TOL_EXACT, TOL_EXACT);
  expect_close(c, "residual_layernorm ln", ln, d_ln, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "residual_layernorm mean", mean, d_mean, N, TOL_SUM, TOL_SUM);
  expect_close(c, "residual_layernorm rstd", rstd, d_rstd, N, TOL_SUM, TOL_SUM);
  WF_K(c->k, layernorm)
      ->residual_forward(d_a, d_ln, NULL, NULL, d_a, d_b, d_w, d_bias, N, C, c->stream);
  expect_close(c, "residual_layernorm in place", res, d_a, NC, TOL_EXACT, TOL_EXACT);
  expect_close(c, "residual_layernorm ln (in place)", ln, d_ln, NC, TOL_SUM, TOL_SUM);
}

/* RMSNorm and the fused residual + RMSNorm: reductions over C (TOL_SUM); the sum of the
 * fused op is one addition (TOL_EXACT). Rows of very different scale (x1e3, x1e-3: eps
 * dominates) exercise the statistics. */
void test_rmsnorm(ctx *c)
{
  const int N = 37, C = 45;
  const size_t NC = (size_t)N * C;
  const float eps = 1e-5f;
  float *inp = hrand(c, NC, -2, 2), *w = hrand(c, C, 0.5f, 1.5f);
  for (int i = 0; i < C; i++)
    inp[i] *= 1e3f, inp[C + i] *= 1e-3f;
  float *out = hzero(c, NC), *rstd = hzero(c, N);
  float *d_out = df(c, out, NC), *d_rstd = df(c, rstd, N), *d_inp = df(c, inp, NC);
  float *d_w = df(c, w, C);
  wf_rmsnorm_forward(out, rstd, inp, w, eps, N, C);
  WF_K(c->k, rmsnorm)->forward(d_out, d_rstd, d_inp, d_w, eps, N, C, c->stream);
  expect_close(c, "rmsnorm_forward out", out, d_out, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "rmsnorm_forward rstd", rstd, d_rstd, N, 0, TOL_SUM);

  float *dout = hrand(c, NC, -1, 1), *dinp = hrand(c, NC, -1, 1), *dw = hrand(c, C, -1, 1);
  float *d_dinp = df(c, dinp, NC), *d_dw = df(c, dw, C), *d_dout = df(c, dout, NC);
  float *d_crstd = df(c, rstd, N); /* both sides use the CPU's rstd */
  wf_rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
  WF_K(c->k, rmsnorm)->backward(d_dinp, d_dw, d_dout, d_inp, d_w, d_crstd, N, C, c->stream);
  expect_close(c, "rmsnorm_backward dinp", dinp, d_dinp, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "rmsnorm_backward dweight", dw, d_dw, C, TOL_SUM, TOL_SUM);
  wf_rmsnorm_backward(NULL, dw, dout, inp, w, rstd, N, C); /* NULL dinp: only dweight */
  WF_K(c->k, rmsnorm)->backward(NULL, d_dw, d_dout, d_inp, d_w, d_crstd, N, C, c->stream);
  expect_close(c, "rmsnorm_backward dweight only", dw, d_dw, C, TOL_SUM, TOL_SUM);
  wf_rmsnorm_backward(dinp, NULL, dout, inp, w, rstd, N, C); /* NULL dweight */
  WF_K(c->k, rmsnorm)->backward(d_dinp, NULL, d_dout, d_inp, d_w, d_crstd, N, C, c->stream);
  expect_close(c, "rmsnorm_backward dinp only", dinp, d_dinp, NC, TOL_SUM, TOL_SUM);

  float *a = hrand(c, NC, -2, 2), *b = hrand(c, NC, -2, 2), *res = hzero(c, NC);
  float *d_a = df(c, a, NC), *d_b = df(c, b, NC), *d_res = df(c, res, NC);
  wf_residual_forward(res, a, b, NC);
  wf_rmsnorm_forward(out, rstd, res, w, eps, N, C);
  WF_K(c->k, rmsnorm)->residual_forward(d_res, d_out, d_rstd, d_a, d_b, d_w, eps, N, C, c->stream);
  expect_close(c, "residual_rmsnorm res", res, d_res, NC, TOL_EXACT, TOL_EXACT);
  expect_close(c, "residual_rmsnorm out", out, d_out, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "residual_rmsnorm rstd", rstd, d_rstd, N, 0, TOL_SUM);
  WF_K(c->k, rmsnorm)->residual_forward(d_a, d_out, NULL, d_a, d_b, d_w, eps, N, C, c->stream);
  expect_close(c, "residual_rmsnorm in place", res, d_a, NC, TOL_EXACT, TOL_EXACT);
  expect_close(c, "residual_rmsnorm out (in place)", out, d_out, NC, TOL_SUM, TOL_SUM);
}
