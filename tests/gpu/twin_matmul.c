/*
 * twin_matmul.c - CUDA kernels against their CPU twins (twin.h): the GEMMs: matmul, its fused GELU,
 * column sums (the bias gradients), and that a GEMM allocates nothing.
 */
#include "twin.h"

/* Host operands as the model hands them to a GEMM of precision lowp: rounded to it. */
float *operand(ctx *c, size_t n, int lowp)
{
  float *x = hrand(c, n, -1, 1);
  if (lowp == WF_PREC_BF16)
    wf_round_bf16(x, x, n);
  if (lowp == WF_PREC_FP16)
    wf_round_fp16(x, x, n);
  return x;
}

/* One forward + backward; with_bias and with_dinp cover the NULL cases. Operands of a
 * 16-bit lowp are exact in it, so their products are exact in fp32 on both sides and
 * only the order of the sums differs: TOL_SUM, as for fp32. TF32 rounds each operand
 * to 10 mantissa bits (relative 2^-11 each, 2^-10 per product of terms in [-1, 1]), so
 * a sum of K products moves by at most K * 2^-10: that is tol_tf32's atol. */
static void matmul_case(ctx *c, int N, int C, int OC, bool with_bias, bool with_dinp, int lowp,
                        bool tf32)
{
  const size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
  const float tol_f = tf32 ? (float)C * 0x1p-10f : TOL_SUM,
              tol_b = tf32 ? (float)N * 0x1p-10f : TOL_SUM;
  const float tol_i = tf32 ? (float)OC * 0x1p-10f : TOL_SUM;
  char name[96];
  float *inp = operand(c, NC, lowp), *w = operand(c, OCC, lowp), *b = hrand(c, OC, -1, 1);
  float *out = hzero(c, NO), *d_out = df(c, out, NO);
  float *d_inp = df(c, inp, NC), *d_w = df(c, w, OCC);
  WF_K(c->k, matmul)->set_tf32(tf32);
  wf_matmul_forward(out, inp, w, with_bias ? b : NULL, N, C, OC);
  WF_K(c->k, matmul)
      ->forward(d_out, d_inp, d_w, with_bias ? df(c, b, OC) : NULL, N, C, OC, lowp, c->stream);
  snprintf(name, sizeof name, "matmul_forward out%s", with_bias ? "" : " (no bias)");
  expect_close(c, name, out, d_out, NO, tol_f, TOL_SUM);

  float *dout = operand(c, NO, lowp), *dinp = hrand(c, NC, -1, 1);
  float *dw = hrand(c, OCC, -1, 1), *db = hrand(c, OC, -1, 1);
  float *d_dinp = df(c, dinp, NC), *d_dw = df(c, dw, OCC), *d_db = df(c, db, OC);
  wf_matmul_backward(with_dinp ? dinp : NULL, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC);
  WF_K(c->k, matmul)
      ->backward(with_dinp ? d_dinp : NULL, d_dw, with_bias ? d_db : NULL, df(c, dout, NO), d_inp,
                 d_w, N, C, OC, lowp, c->stream);
  WF_K(c->k, matmul)->set_tf32(0);
  expect_close(c, "matmul_backward dinp", dinp, d_dinp, NC, tol_i, TOL_SUM);
  expect_close(c, "matmul_backward dweight", dw, d_dw, OCC, tol_b, TOL_SUM);
  expect_close(c, "matmul_backward dbias", db, d_db, OC, TOL_SUM, TOL_SUM);
}

void test_matmul(ctx *c)
{
  matmul_case(c, 37, 45, 29, true, true, WF_PREC_NO, false);
  end_case(c);
  matmul_case(c, 5, 3, 67, false, false, WF_PREC_NO, false); /* untouched dinp, dbias stay */
  end_case(c);
  printf(" bf16 operands\n");
  matmul_case(c, 37, 45, 29, true, true, WF_PREC_BF16, false);
  end_case(c);
  printf(" fp16 operands\n");
  matmul_case(c, 64, 72, 40, true, true, WF_PREC_FP16, false);
  end_case(c);
  printf(" tf32\n");
  matmul_case(c, 37, 45, 29, true, true, WF_PREC_NO, true);
}

/* The MLP's fused fc + GELU against the composition: pre as a GEMM (TOL_SUM), gelu_out
 * within TOL_GELU_EPI. OC = 64 runs cuBLASLt's GELU_AUX_BIAS epilogue; OC = 29 (not a
 * multiple of 8, which the epilogue's aux needs) the plain GEMM and gelu.cu. */
#define TOL_GELU_EPI 2e-3f /* see matmul_gelu_case */
static void matmul_gelu_case(ctx *c, int N, int C, int OC, int lowp)
{
  /* cuBLASLt's epilogue may take tanh from the hardware approximation (tanh.approx.f32,
   * relative error about 2^-11 by the PTX ISA); gelu = 0.5 x (1 + tanh(.)), so it moves
   * by at most 0.5 |x| 2^-11 ~ 2.5e-4 |x|, and |pre| < 8 here (sums of 72 products in
   * [-1, 1] with a spread of about sqrt(72 / 9) ~ 3): 2e-3. */
  const size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
  float *inp = operand(c, NC, lowp), *w = operand(c, OCC, lowp), *b = hrand(c, OC, -1, 1);
  float *pre = hzero(c, NO), *out = hzero(c, NO), *d_pre = df(c, pre, NO), *d_out = df(c, out, NO);
  wf_matmul_forward(pre, inp, w, b, N, C, OC);
  wf_gelu_forward(out, pre, NO);
  WF_K(c->k, matmul)
      ->gelu_forward(d_out, d_pre, df(c, inp, NC), df(c, w, OCC), df(c, b, OC), N, C, OC, lowp,
                     c->stream);
  expect_close(c, "matmul_gelu_forward pre", pre, d_pre, NO, TOL_SUM, TOL_SUM);
  expect_close(c, "matmul_gelu_forward out", out, d_out, NO, TOL_GELU_EPI, TOL_GELU_EPI);
}

void test_matmul_gelu(ctx *c)
{
  matmul_gelu_case(c, 37, 72, 64, WF_PREC_NO);
  end_case(c);
  matmul_gelu_case(c, 37, 45, 29, WF_PREC_NO);
  end_case(c);
  matmul_gelu_case(c, 40, 72, 64, WF_PREC_BF16);
}

/* Column sums at GPT-2's width over many rows (colsum.cu cuts them over rows too):
 * layernorm's dweight and dbias and a linear layer's dbias at C = 768, N = 8192, against
 * the twin within TOL_COLSUM, and a second run from the same start gives the same bits. */
void test_colsums(ctx *c)
{
  const int N = 8192, C = 768;
  const size_t NC = (size_t)N * C;
  float *inp = hrand(c, NC, -2, 2), *w = hrand(c, C, 0.5f, 1.5f), *dout = hrand(c, NC, -1, 1);
  float *mean = hrand(c, N, -0.1f, 0.1f), *rstd = hrand(c, N, 0.5f, 1.5f);
  float *dw = hrand(c, C, -1, 1), *db = hrand(c, C, -1, 1), *dbias = hrand(c, C, -1, 1);
  float *d_inp = df(c, inp, NC), *d_w = df(c, w, C), *d_dout = df(c, dout, NC);
  float *d_mean = df(c, mean, N), *d_rstd = df(c, rstd, N);
  float *d_dw[2], *d_db[2], *d_dbias[2];
  for (int run = 0; run < 2; run++) {
    d_dw[run] = df(c, dw, C), d_db[run] = df(c, db, C), d_dbias[run] = df(c, dbias, C);
    WF_K(c->k, layernorm)
        ->backward(NULL, d_dw[run], d_db[run], d_dout, d_inp, d_w, d_mean, d_rstd, N, C, c->stream);
    WF_K(c->k, matmul)
        ->backward(NULL, NULL, d_dbias[run], d_dout, d_inp, d_w, N, C, C, WF_PREC_NO, c->stream);
  }
  wf_layernorm_backward(NULL, dw, db, dout, inp, w, mean, rstd, N, C);
  wf_matmul_backward(NULL, NULL, dbias, dout, inp, w, N, C, C);
  expect_close(c, "layernorm_backward dweight", dw, d_dw[0], C, TOL_COLSUM, 0);
  expect_close(c, "layernorm_backward dbias", db, d_db[0], C, TOL_COLSUM, 0);
  expect_close(c, "matmul_backward dbias", dbias, d_dbias[0], C, TOL_COLSUM, 0);
  float *again = hzero(c, C);
  const char *what[3] = {"dweight, run 2", "dbias, run 2", "matmul dbias, run 2"};
  float *first[3] = {d_dw[0], d_db[0], d_dbias[0]}, *second[3] = {d_dw[1], d_db[1], d_dbias[1]};
  for (int i = 0; i < 3; i++) {
    if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
        wf_gpu_memcpy_d2h(c->g, again, first[i], C * sizeof(float)) != WF_OK)
      c->failures++;
    expect_bits(c, what[i], again, second[i], C);
  }
}

/* A mixed-precision GEMM allocates nothing (matmul.cu): the GPU's free memory is the
 * same before and after a bf16 backward at N 4096, C 768, OC 16384 (16-bit copies of its
 * operands, which a stream-ordered pool used to keep, are 165 MB there). The margin, 32
 * MiB, is for kernels CUDA loads on their first use (lazy loading: about a MiB each). */
void test_gemm_allocates_nothing(ctx *c)
{
  const int N = 4096, C = 768, OC = 16384;
  const size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
  float *d_inp = df(c, operand(c, NC, WF_PREC_BF16), NC);
  float *d_w = df(c, operand(c, OCC, WF_PREC_BF16), OCC);
  float *d_dout = df(c, operand(c, NO, WF_PREC_BF16), NO);
  float *d_dinp = df(c, hzero(c, NC), NC), *d_dw = df(c, hzero(c, OCC), OCC);
  size_t free0 = 0, free1 = 0, total = 0;
  bool ok = wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
            wf_gpu_mem_info(c->g, &free0, &total) == WF_OK;
  WF_K(c->k, matmul)
      ->backward(d_dinp, d_dw, NULL, d_dout, d_inp, d_w, N, C, OC, WF_PREC_BF16, c->stream);
  ok = ok && wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
       wf_gpu_mem_info(c->g, &free1, &total) == WF_OK;
  double drop = ok ? ((double)free0 - (double)free1) / (1 << 20) : INFINITY;
  ok = ok && drop < 32;
  printf("  %-4s %-28s free memory fell by %.1f MiB\n", ok ? "ok" : "FAIL", "bf16 GEMM scratch",
         drop);
  c->failures += !ok;
}
