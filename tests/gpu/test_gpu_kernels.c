/*
 * test_gpu_kernels.c - every CUDA kernel against its CPU twin.
 *
 * Each case draws random inputs (Philox, fixed seed) with odd sizes, so that no
 * size is a multiple of a warp, tile or block, runs the CPU kernel
 * (kernels/cpu, the reference) and the CUDA launcher from the module's table on
 * copies of the same buffers, and compares every output element:
 *     |gpu - cpu| <= atol + rtol * |cpu|
 * Backward cases start the gradient buffers from random values, not zeros, so
 * that "adds into" is checked as well as the value added, and so is "writes" (matmul's
 * dinp, GELU's, SwiGLU's and attention's input gradients: wf_kernels.h), where an
 * addition would leave the random start in.
 *
 * Tolerances, and why:
 *  - TOL_EXACT (1e-6): one or two float operations per element (residual,
 *    scale, embedding and position forward): any difference is an indexing bug.
 *  - TOL_ELEM (2e-5): elementwise with exp/tanh/sqrt (GELU, AdamW, the loss):
 *    CUDA's expf/tanhf are within 2 ulp and the CPU twin's vectorised ones within
 *    a few ulp, i.e. ~1e-6 relative; 2e-5 leaves margin, a wrong formula is off
 *    by far more.
 *  - TOL_SUM (1e-4): reductions over up to a few hundred terms in a different
 *    order (GEMMs, layernorm, attention, softmax, atomics): float32 rounding
 *    grows like (terms x 6e-8 x magnitude), about 1e-5 for these sizes.
 *  - sumsq and the loss mean are accumulated in double on both sides: relative 1e-9
 *    (the GPU adds in another order; double's 2^-53 over 3e5 terms is ~1e-11).
 *  - xent_pack, tokens_check, checksum: exact (they move or find values, or add
 *    integers).
 *  - embedding and position backward: bit for bit. They add in the twin's order
 *    (embedding.cu, position.cu), so any
 *    difference is an order or indexing bug; and run twice, it gives the same bits.
 *  - column sums over many rows (TOL_COLSUM, 2e-3 absolute): each side adds 8192 terms
 *    in [-1, 1] in its own order; a sum's rounding error grows like sqrt(n) 2^-24
 *    sqrt(sum x^2), about 3e-4 here for either side, so 2e-3 leaves margin, while a lost
 *    or doubled row block (32 or more rows, each term up to 1) is off by far more.
 *  - round_bf16 / round_fp16 must agree bit for bit (the CPU twin's bit arithmetic
 *    against CUDA's __float2bfloat16_rn / __float2half_rn), NaN against NaN.
 *  - The 16-bit tables (storage.h: bf16 and fp16 activations) against the CPU's 16-bit
 *    tables: storing and loading bit for bit; fp32 outputs (statistics, gradients) at the
 *    fp32 tolerances above, since both sides compute in fp32 from the same 16-bit
 *    inputs; a 16-bit output may in addition round the other way where the two fp32
 *    values straddle a rounding boundary, one step of the format: 2^-7 |x| (bf16, 8
 *    significant bits) or 2^-10 |x| (fp16, 11), plus fp16's subnormal step 2^-24.
 *  - attention on tensor cores (cuDNN, the bf16 flash kernels) against the fp32 CPU
 *    attention: tests/common/att16_bound.h's per-element bound, derived there from bf16's
 *    unit roundoff 2^-8 at the points the bf16 paths round (weft's flash kernels round
 *    exactly where the bound assumes; cuDNN's internal rounding points are not
 *    documented, so it gets twice the bound).
 *  - the fused bf16 classifier against its CPU twin: statistics and losses TOL_SUM
 *    (fp32 sums against the twin's double); each dlogit within one bf16 step of the
 *    twin's (both round an fp32 value that differs in its last bits: 2^-7 relative).
 *
 * Exits 77 (meson: skipped) only when the machine has no GPU (wf_gpu_open says
 * WF_ENODEV: no NVIDIA driver, or it reports no device), after printing why. A GPU
 * that is there but unusable (the module or a CUDA library does not load) fails.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/att16_bound.h"
#include "../common/encode.h"
#include "wf_config.h"
#include "wf_device.h"
#include "wf_gpu.h"
#include "wf_kernels.h"

#define SEED       20241122u
#define TOL_EXACT  1e-6f
#define TOL_ELEM   2e-5f
#define TOL_SUM    1e-4f
#define TOL_COLSUM 2e-3f
#define MAX_BUFS   64

typedef struct ctx {
  wf_gpu *g;
  const wf_kset *k;
  wf_stream *stream;
  void *dev[MAX_BUFS]; /* device buffers of the current case */
  void *host[MAX_BUFS];
  int n_dev, n_host;
  uint64_t draw; /* RNG stream of the next random buffer */
  int failures;
} ctx;

/* ---- buffers (all released by end_case) ----------------------------------------- */

static void *keep_host(ctx *c, void *p)
{
  if (!p || c->n_host == MAX_BUFS) {
    fprintf(stderr, "out of host buffers\n");
    exit(1);
  }
  c->host[c->n_host++] = p;
  return p;
}

static float *hzero(ctx *c, size_t n) { return keep_host(c, calloc(n ? n : 1, sizeof(float))); }

/* Uniform in [lo, hi), a fresh RNG stream per buffer. */
static float *hrand(ctx *c, size_t n, float lo, float hi)
{
  float *p = hzero(c, n);
  uint64_t s = c->draw++;
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (hi - lo) * wf_rng_uniform(SEED, s, i);
  return p;
}

static int *hints(ctx *c, size_t n, int lo, int hi)
{
  int *p = keep_host(c, calloc(n ? n : 1, sizeof(int)));
  uint64_t s = c->draw++;
  for (size_t i = 0; i < n; i++)
    p[i] = lo + (int)(wf_rng_u64(SEED, s, i) % (uint64_t)(hi - lo));
  return p;
}

/* A device copy of `bytes` from host `h`. */
static void *dcopy(ctx *c, const void *h, size_t bytes)
{
  void *d = NULL;
  if (c->n_dev == MAX_BUFS || wf_gpu_malloc(c->g, &d, bytes) != WF_OK ||
      wf_gpu_memcpy_h2d(c->g, d, h, bytes) != WF_OK) {
    fprintf(stderr, "device buffer of %zu bytes failed\n", bytes);
    exit(1);
  }
  c->dev[c->n_dev++] = d;
  return d;
}

static float *df(ctx *c, const float *h, size_t n) { return dcopy(c, h, n * sizeof(float)); }
static int *di(ctx *c, const int *h, size_t n) { return dcopy(c, h, n * sizeof(int)); }

static void end_case(ctx *c)
{
  while (c->n_dev)
    wf_gpu_free(c->g, c->dev[--c->n_dev]);
  while (c->n_host)
    free(c->host[--c->n_host]);
}

/* ---- comparison ------------------------------------------------------------------- */

/* Compare the CPU result `ref` with device buffer `d`; prints one line. */
static void expect_close(ctx *c, const char *what, const float *ref, const float *d, size_t n,
                         float atol, float rtol)
{
  float *got = hzero(c, n);
  size_t bad = n, worst_i = 0;
  double worst = 0.0;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof(float)) != WF_OK)
    bad = 0;
  for (size_t i = 0; i < n && bad == n; i++) {
    /* equal values match, infinities too (a 16-bit store's overflow on both sides),
     * where the tolerance itself is NaN (0 x inf) */
    double err = got[i] == ref[i] ? 0.0 : fabs((double)got[i] - ref[i]);
    if (got[i] != ref[i] && !(err <= atol + rtol * fabs(ref[i])))
      bad = i;
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  if (bad == n) {
    printf("  ok   %-28s n=%-7zu max |err| %.3g at %zu\n", what, n, worst, worst_i);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g\n", what, n, bad, ref[bad], got[bad]);
  c->failures++;
}

static void expect_bits(ctx *c, const char *what, const float *ref, const float *d, size_t n);

/* ---- the cases --------------------------------------------------------------------- */

/* The bf16-only ops' set (attention_lse, classifier), and the GPU's twin of encode.h:
 * GPT-2's input from the embedding and position ops. */
static const wf_kset *bf16_of(const ctx *c) { return wf_kset_as(c->k, WF_DT_BF16); }

static void gpu_encode(ctx *c, float *out, const int *inp, const float *wte, int v_offset, int Vl,
                       const float *wpe, int B, int T, int C)
{
  WF_K(c->k, embedding)->forward(out, inp, wte, v_offset, Vl, B * T, C, c->stream);
  if (wpe)
    WF_K(c->k, position)->forward(out, wpe, NULL, B, T, C, c->stream);
}

static void gpu_encode_backward(ctx *c, float *dwte, float *dwpe, const float *dout, const int *inp,
                                int v_offset, int Vl, int B, int T, int C)
{
  if (dwte)
    WF_K(c->k, embedding)->backward(dwte, dout, inp, v_offset, Vl, B * T, C, c->stream);
  if (dwpe)
    WF_K(c->k, position)->backward(dwpe, dout, NULL, B, T, C, c->stream);
}

static void test_encoder(ctx *c)
{
  const int B = 3, T = 7, C = 13, V = 11, maxT = 9;
  const size_t BTC = (size_t)B * T * C;
  int *inp = hints(c, (size_t)B * T, 0, V);
  float *wte = hrand(c, (size_t)V * C, -1, 1), *wpe = hrand(c, (size_t)maxT * C, -1, 1);
  float *out = hzero(c, BTC), *d_out = df(c, out, BTC);
  int *d_inp = di(c, inp, (size_t)B * T);
  encode(out, inp, wte, 0, INT_MAX, wpe, B, T, C);
  gpu_encode(c, d_out, d_inp, df(c, wte, (size_t)V * C), 0, INT_MAX, df(c, wpe, (size_t)maxT * C),
             B, T, C);
  expect_close(c, "embedding+position forward out", out, d_out, BTC, TOL_EXACT, TOL_EXACT);

  float *dout = hrand(c, BTC, -1, 1);
  float *dwte = hrand(c, (size_t)V * C, -1, 1), *dwpe = hrand(c, (size_t)maxT * C, -1, 1);
  float *d_dwte = df(c, dwte, (size_t)V * C), *d_dwpe = df(c, dwpe, (size_t)maxT * C);
  encode_backward(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C);
  gpu_encode_backward(c, d_dwte, d_dwpe, df(c, dout, BTC), d_inp, 0, INT_MAX, B, T, C);
  expect_bits(c, "encoder_backward dwte", dwte, d_dwte, (size_t)V * C);
  expect_bits(c, "encoder_backward dwpe", dwpe, d_dwpe, (size_t)maxT * C);
}

/* The embedding's backward at GPT-2's width: 4096 tokens (4 of embedding.cu's token
 * tiles), six in seven of them on 5 rows, the rest anywhere in 5000: dwte and dwpe are
 * the CPU twin's bit for bit, on two runs from the same start (same seed, same bits). */
static void test_encoder_deterministic(ctx *c)
{
  const int B = 8, T = 512, C = 768, V = 5000, maxT = 512;
  const size_t BT = (size_t)B * T, BTC = BT * C, VC = (size_t)V * C, PC = (size_t)maxT * C;
  int *inp = hints(c, BT, 0, 5), *rare = hints(c, BT, 0, V);
  for (size_t i = 0; i < BT; i++)
    inp[i] = i % 7 ? inp[i] : rare[i];
  float *dout = hrand(c, BTC, -1, 1), *dwte = hrand(c, VC, -1, 1), *dwpe = hrand(c, PC, -1, 1);
  float *d_dout = df(c, dout, BTC);
  int *d_inp = di(c, inp, BT);
  float *d_w[2] = {df(c, dwte, VC), df(c, dwte, VC)}, *d_p[2] = {df(c, dwpe, PC), df(c, dwpe, PC)};
  for (int run = 0; run < 2; run++)
    gpu_encode_backward(c, d_w[run], d_p[run], d_dout, d_inp, 0, INT_MAX, B, T, C);
  encode_backward(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C);
  expect_bits(c, "encoder_backward dwte, run 1", dwte, d_w[0], VC);
  expect_bits(c, "encoder_backward dwte, run 2", dwte, d_w[1], VC);
  expect_bits(c, "encoder_backward dwpe, run 1", dwpe, d_p[0], PC);
  expect_bits(c, "encoder_backward dwpe, run 2", dwpe, d_p[1], PC);
}

/* The vocabulary-parallel embedding, rank by rank of a 3-way split of V = 12 rows:
 * rank 0 adds wpe, and in the first pass rank 1 passes dwpe = NULL and rank 2
 * dwte = NULL, so the NULL paths run. 21 tokens in 12 rows repeat; in the second
 * pass every token lies in two rows of rank 2's slice, so many additions hit the
 * same row, and in none of rank 0's, so its out is wpe and its dwte is untouched. */
static void encoder_vp_rank(ctx *c, const int *inp, const float *wte, const float *wpe, int r,
                            bool nulls)
{
  const int B = 3, T = 7, C = 13, Vl = 4, maxT = 9, v_offset = r * Vl;
  const size_t BTC = (size_t)B * T * C, VlC = (size_t)Vl * C, PC = (size_t)maxT * C;
  int *d_inp = di(c, inp, (size_t)B * T);
  const float *w = wte + (size_t)v_offset * C, *pe = r == 0 ? wpe : NULL;
  float *out = hzero(c, BTC), *d_out = df(c, out, BTC);
  encode(out, inp, w, v_offset, Vl, pe, B, T, C);
  gpu_encode(c, d_out, d_inp, df(c, w, VlC), v_offset, Vl, pe ? df(c, pe, PC) : NULL, B, T, C);
  expect_close(c, "embedding+position forward (split) out", out, d_out, BTC, TOL_EXACT, TOL_EXACT);

  float *dout = hrand(c, BTC, -1, 1);
  float *dwte = hrand(c, VlC, -1, 1), *dwpe = hrand(c, PC, -1, 1);
  float *d_dwte = df(c, dwte, VlC), *d_dwpe = df(c, dwpe, PC);
  float *cw = nulls && r == 2 ? NULL : dwte, *cp = nulls && r == 1 ? NULL : dwpe;
  encode_backward(cw, cp, dout, inp, v_offset, Vl, B, T, C);
  gpu_encode_backward(c, cw ? d_dwte : NULL, cp ? d_dwpe : NULL, df(c, dout, BTC), d_inp, v_offset,
                      Vl, B, T, C);
  expect_bits(c, "encoder_backward_vp dwte", dwte, d_dwte, VlC);
  expect_bits(c, "encoder_backward_vp dwpe", dwpe, d_dwpe, PC);
}

static void test_encoder_vp(ctx *c)
{
  const int B = 3, T = 7, C = 13, V = 12, maxT = 9;
  int *inp = hints(c, (size_t)B * T, 0, V);
  float *wte = hrand(c, (size_t)V * C, -1, 1), *wpe = hrand(c, (size_t)maxT * C, -1, 1);
  for (int r = 0; r < 3; r++)
    encoder_vp_rank(c, inp, wte, wpe, r, true);
  int *crowded = hints(c, (size_t)B * T, 8, 10); /* rows 0 and 1 of rank 2's slice */
  encoder_vp_rank(c, crowded, wte, wpe, 2, false);
  encoder_vp_rank(c, crowded, wte, wpe, 0, false); /* and no token in rank 0's slice */
}

static void test_layernorm(ctx *c)
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

/* Host operands as the model hands them to a GEMM of precision lowp: rounded to it. */
static float *operand(ctx *c, size_t n, int lowp)
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

static void test_matmul(ctx *c)
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

static void test_matmul_gelu(ctx *c)
{
  matmul_gelu_case(c, 37, 72, 64, WF_PREC_NO);
  end_case(c);
  matmul_gelu_case(c, 37, 45, 29, WF_PREC_NO);
  end_case(c);
  matmul_gelu_case(c, 40, 72, 64, WF_PREC_BF16);
}

/* res = a + b then layernorm, out of place and with res aliasing a (as the model calls
 * it): the sum is one addition (TOL_EXACT), the norm a reduction (TOL_SUM). */
static void test_residual_layernorm(ctx *c)
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

/* Attention on each side with the buffers its own table sizes: the CPU keeps (T, T)
 * probabilities, the GPU a log-sum-exp per row (heads up to 128) or the same (T, T)
 * (larger heads). Each backward reads what its own forward kept, so only out and dqkv
 * are compared. T = 77 is no multiple of the GPU's 64-row blocks or 32-row tiles. */
static void attention_case(ctx *c, int B, int T, int NH, int hs)
{
  const int C = NH * hs;
  const size_t BTC = (size_t)B * T * C, QKV = 3 * BTC, ATT = (size_t)B * NH * T * T;
  const size_t saved = WF_K(c->k, attention)->saved(B, T, C, NH);
  const size_t scratch = WF_K(c->k, attention)->scratch(B, T, C, NH);
  char name[96];
  float *qkv = hrand(c, QKV, -1, 1), *out = hzero(c, BTC), *att = hzero(c, ATT);
  float *d_out = df(c, out, BTC), *d_qkv = df(c, qkv, QKV);
  float *d_att = df(c, hzero(c, saved), saved);
  wf_attention_forward(out, att, qkv, B, T, C, NH);
  WF_K(c->k, attention)->forward(d_out, d_att, d_qkv, NULL, B, T, C, NH, NH, c->stream);
  snprintf(name, sizeof name, "attention_forward hs=%d T=%d", hs, T);
  expect_close(c, name, out, d_out, BTC, TOL_SUM, TOL_SUM);

  float *dout = hrand(c, BTC, -1, 1), *dqkv = hrand(c, QKV, -1, 1);
  float *d_dqkv = df(c, dqkv, QKV), *d_scratch = df(c, hzero(c, scratch), scratch);
  wf_attention_backward(dqkv, hzero(c, ATT), dout, qkv, att, B, T, C, NH);
  WF_K(c->k, attention)
      ->backward(d_dqkv, d_scratch, df(c, dout, BTC), d_qkv, d_att, NULL, B, T, C, NH, NH,
                 c->stream);
  snprintf(name, sizeof name, "attention_backward hs=%d dqkv", hs);
  expect_close(c, name, dqkv, d_dqkv, QKV, TOL_SUM, TOL_SUM);
}

static void test_attention(ctx *c)
{
  attention_case(c, 2, 9, 3, 5);
  end_case(c);
  attention_case(c, 2, 77, 2, 64);
  end_case(c);
  attention_case(c, 1, 77, 1, 128);
  end_case(c);
  attention_case(c, 1, 33, 2, 160); /* past the flash kernels: the (T, T) fallback */
}

/* ---- attention on tensor cores ------------------------------------------------------- */

static const char *path_name(int p)
{
  return p == WF_ATTN_CUDNN ? "cudnn" : p == WF_ATTN_FLASH ? "flash" : "reference";
}

/* Result got (host; NULL: it could not be read) against the fp32 CPU result ref within
 * factor x the bf16 bound. */
static void bound_verdict(ctx *c, const char *what, const float *ref, const float *got,
                          const double *bound, size_t n, double factor)
{
  size_t bad = got ? n : 0;
  double worst = 0.0;
  for (size_t i = 0; i < n && bad == n; i++) {
    worst = fmax(worst, fabs((double)got[i] - ref[i]) / (factor * bound[i] + ATT16_SLACK));
    if (!att16_within(got[i], ref[i], factor * bound[i]))
      bad = i;
  }
  if (bad == n) {
    printf("  ok   %-28s n=%-7zu worst |err| / bound %.3f\n", what, n, worst);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g bound %.3g\n", what, n, bad, ref[bad],
         got ? got[bad] : NAN, factor * bound[bad]);
  c->failures++;
}

/* Device result d (fp32) against the fp32 CPU result ref within factor x the bf16 bound. */
static void expect_bound(ctx *c, const char *what, const float *ref, const float *d,
                         const double *bound, size_t n, double factor)
{
  float *got = hzero(c, n);
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof(float)) != WF_OK)
    got = NULL;
  bound_verdict(c, what, ref, got, bound, n, factor);
}

/* Whether the path taken is the one this case must take (see test_attention_paths). */
static void expect_path(ctx *c, int impl, int path, bool cudnn_shape)
{
  bool ok = impl == WF_ATTN_REFERENCE ? path == WF_ATTN_REFERENCE
            : impl == WF_ATTN_FLASH
                ? path == WF_ATTN_FLASH
                : path == WF_ATTN_CUDNN || (!cudnn_shape && path == WF_ATTN_FLASH);
  if (!ok) {
    printf("  FAIL runtime.attention=%s ran %s (the module logged why)\n", path_name(impl),
           path_name(path));
    c->failures++;
  }
}

/* The table's fp32 entries under setting `impl`, forward then backward (under `impl_bwd`),
 * against the fp32 CPU attention, on bf16 inputs (the bf16 paths round nothing more). */
static void attention_path_case(ctx *c, int B, int T, int NH, int hs, int impl, int impl_bwd)
{
  const int C = NH * hs;
  const size_t BTC = (size_t)B * T * C, QKV = 3 * BTC, ATT = (size_t)B * NH * T * T;
  char name[96];
  WF_K(c->k, attention)->set_impl(impl);
  int path = WF_K(c->k, attention)->path(B, T, C, NH, NH);
  printf(" B %d T %d, %d heads of %d, runtime.attention=%s: %s\n", B, T, NH, hs, path_name(impl),
         path_name(path));
  expect_path(c, impl, path, T % 128 == 0);
  const size_t saved = WF_K(c->k, attention)->saved(B, T, C, NH),
               scratch = WF_K(c->k, attention)->scratch(B, T, C, NH);
  float *qkv = operand(c, QKV, WF_PREC_BF16), *dout = operand(c, BTC, WF_PREC_BF16);
  float *out = hzero(c, BTC), *att = hzero(c, ATT), *dqkv = hrand(c, QKV, -1, 1);
  float *d_out = df(c, out, BTC), *d_qkv = df(c, qkv, QKV), *d_att = df(c, hzero(c, saved), saved);
  float *d_dqkv = df(c, dqkv, QKV), *d_scratch = df(c, hzero(c, scratch), scratch);
  wf_attention_forward(out, att, qkv, B, T, C, NH);
  wf_attention_backward(dqkv, hzero(c, ATT), dout, qkv, att, B, T, C, NH);
  WF_K(c->k, attention)->forward(d_out, d_att, d_qkv, NULL, B, T, C, NH, NH, c->stream);
  WF_K(c->k, attention)->set_impl(impl_bwd);
  WF_K(c->k, attention)
      ->backward(d_dqkv, d_scratch, df(c, dout, BTC), d_qkv, d_att, NULL, B, T, C, NH, NH,
                 c->stream);
  int p2 = WF_K(c->k, attention)->path(B, T, C, NH, NH);
  att16_bound bd = att16_bound_make(qkv, dout, NULL, B, T, C, NH);
  double f_out = path == WF_ATTN_CUDNN ? 2 : 1,
         f_bwd = path == WF_ATTN_CUDNN || p2 == WF_ATTN_CUDNN ? 2 : 1;
  snprintf(name, sizeof name, "attention %s out", path_name(path));
  if (path == WF_ATTN_REFERENCE)
    expect_close(c, name, out, d_out, BTC, TOL_SUM, TOL_SUM);
  else
    expect_bound(c, name, out, d_out, bd.out, BTC, f_out);
  snprintf(name, sizeof name, "attention %s dqkv", path_name(p2));
  if (path == WF_ATTN_REFERENCE && p2 == WF_ATTN_REFERENCE)
    expect_close(c, name, dqkv, d_dqkv, QKV, TOL_SUM, TOL_SUM);
  else /* a backward after the reference forward reads its output rounded: the bound holds */
    expect_bound(c, name, dqkv, d_dqkv, bd.dqkv, QKV, f_bwd);
  att16_bound_free(&bd);
}

/* Every setting on shapes that are no multiple of any tile (T 77 and 130, B x NH 3 and 1),
 * and on one cuDNN must take (T 128): there runtime.attention=cudnn must run cuDNN (a GPU
 * machine without a loadable cuDNN 9 fails here, with the module's reason in the log). */
static void test_attention_paths(ctx *c)
{
  static const int impls[] = {WF_ATTN_REFERENCE, WF_ATTN_FLASH, WF_ATTN_CUDNN};
  for (size_t i = 0; i < WF_ARRAY_LEN(impls); i++) {
    attention_path_case(c, 1, 77, 3, 64, impls[i], impls[i]);
    end_case(c);
    attention_path_case(c, 1, 130, 1, 128, impls[i], impls[i]);
    end_case(c);
    attention_path_case(c, 3, 128, 1, 64, impls[i], impls[i]);
    end_case(c);
  }
  printf(" forward and backward under different settings\n");
  attention_path_case(c, 1, 77, 3, 64, WF_ATTN_REFERENCE, WF_ATTN_FLASH);
  end_case(c);
  attention_path_case(c, 1, 77, 3, 64, WF_ATTN_FLASH, WF_ATTN_REFERENCE);
  WF_K(c->k, attention)->set_impl(WF_ATTN_REFERENCE);
}

/* bf16 device buffer d (n) against bf16 host values ref within rel |ref| + atol. */
static void expect_close16(ctx *c, const char *what, const wf_bf16 *ref, const wf_bf16 *d, size_t n,
                           float atol, float rel)
{
  float *r = hzero(c, n), *g = hzero(c, n);
  wf_bf16 *got = keep_host(c, calloc(n ? n : 1, sizeof *got));
  size_t bad = n;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof *got) != WF_OK)
    bad = 0;
  wf_bf16_to_floats(r, ref, n);
  wf_bf16_to_floats(g, got, n);
  for (size_t i = 0; i < n && bad == n; i++)
    if (!(fabsf(g[i] - r[i]) <= atol + rel * fabsf(r[i])))
      bad = i;
  if (bad == n) {
    printf("  ok   %-28s n=%zu\n", what, n);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g\n", what, n, bad, r[bad], g[bad]);
  c->failures++;
}

static wf_bf16 *h16(ctx *c, const float *f, size_t n)
{
  wf_bf16 *h = keep_host(c, calloc(n ? n : 1, sizeof *h));
  wf_bf16_from_floats(h, f, n);
  return h;
}

/* A device buffer of n bf16, read back widened. */
static float *read16(ctx *c, const wf_bf16 *d, size_t n)
{
  wf_bf16 *h = keep_host(c, calloc(n ? n : 1, sizeof *h));
  float *f = hzero(c, n);
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, h, d, n * sizeof *h) != WF_OK)
    return NULL;
  wf_bf16_to_floats(f, h, n);
  return f;
}

static void expect_true(ctx *c, const char *what, bool ok)
{
  printf("  %-4s %s\n", ok ? "ok" : "FAIL", what);
  c->failures += !ok;
}

/* test_attention_gqa16's verdicts: (g) grouped-query against (m) its multi-head expansion. */
typedef struct gqa16 {
  int B, T, NH, NKV, hs;
  const wf_bf16 *yg, *ym, *dg, *dm;
  const float *lg, *lm;
} gqa16;

static void gqa16_compare(ctx *c, const gqa16 *x)
{
  const int C = x->NH * x->hs, LG = C + 2 * x->NKV * x->hs, hs = x->hs;
  const size_t rows = (size_t)x->B * x->T, ny = rows * C, nl = (size_t)x->B * x->NH * x->T;
  float *yg = read16(c, x->yg, ny), *ym = read16(c, x->ym, ny);
  float *dg = read16(c, x->dg, rows * LG), *dm = read16(c, x->dm, rows * 3 * C);
  float *lg = hzero(c, nl), *lm = hzero(c, nl), *sum = hzero(c, rows * LG),
        *mag = hzero(c, rows * LG);
  bool ok = yg && ym && dg && dm && wf_gpu_memcpy_d2h(c->g, lg, x->lg, nl * 4) == WF_OK &&
            wf_gpu_memcpy_d2h(c->g, lm, x->lm, nl * 4) == WF_OK;
  expect_true(c, "gqa out, lse bit for bit",
              ok && !memcmp(yg, ym, ny * 4) && !memcmp(lg, lm, nl * 4));
  bool dq = ok, dkv = ok;
  for (size_t r = 0; ok && r < rows; r++)
    for (int h = 0; h < x->NH; h++)
      for (int d = 0; d < hs; d++) {
        float k = dm[r * 3 * C + C + h * hs + d], v = dm[r * 3 * C + 2 * C + h * hs + d];
        int j = h / (x->NH / x->NKV);
        size_t kk = r * LG + C + (size_t)j * hs + d,
               vv = r * LG + C + (size_t)(x->NKV + j) * hs + d;
        dq = dq && dg[r * LG + h * hs + d] == dm[r * 3 * C + h * hs + d];
        sum[kk] += k, mag[kk] += fabsf(k), sum[vv] += v, mag[vv] += fabsf(v);
      }
  for (size_t i = 0; ok && i < rows * LG; i++)
    if (i % LG >= (size_t)C)
      dkv = dkv && fabs(dg[i] - sum[i]) <= ATT16_U * (fabs(sum[i]) + mag[i]) + 1e-6;
  expect_true(c, "gqa dq bit for bit", dq);
  expect_true(c, "gqa dk, dv: the group's sum", dkv);
}

/* Grouped-query attention (NH 3 sharing one kv head), under the flash kernels, against
 * the same entries on multi-head inputs with each kv head repeated: out, lse and dq must
 * be bit for bit the same (the same kernel on the same values); dk and dv of a kv head
 * are the group's sum in fp32 rounded once, against per-head gradients rounded then
 * summed: u (|sum| + sum |term|). The multi-head results themselves are held to the fp32
 * attention by test_attention_paths and storage_attention_tc. Two sets of entries: the
 * bf16 entries (attention_bf16_*; k16 NULL), and the bf16 table's (k16: its attention_gqa
 * and attention entries, which read dout in bf16 and write dqkv in bf16). */
static void gqa16_case(ctx *c, const wf_kset *k16)
{
  enum {
    B = 1,
    T = 77,
    NH = 3,
    NKV = 1,
    G = NH / NKV,
    hs = 64,
    C = NH * hs,
    LG = C + 2 * NKV * hs
  };
  const size_t ng = (size_t)B * T * LG, nm = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
  const size_t nl = (size_t)B * NH * T;
  WF_K(c->k, attention)->set_impl(WF_ATTN_FLASH);
  float *xg = operand(c, ng, WF_PREC_BF16), *dy = operand(c, ny, WF_PREC_BF16), *xm = hzero(c, nm);
  for (size_t r = 0; r < (size_t)B * T; r++)
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < hs; d++) {
        xm[r * 3 * C + h * hs + d] = xg[r * LG + h * hs + d];
        xm[r * 3 * C + C + h * hs + d] = xg[r * LG + C + (h / G) * hs + d];
        xm[r * 3 * C + 2 * C + h * hs + d] = xg[r * LG + C + (NKV + h / G) * hs + d];
      }
  wf_bf16 *d_xg = dcopy(c, h16(c, xg, ng), ng * 2), *d_xm = dcopy(c, h16(c, xm, nm), nm * 2);
  wf_bf16 *d_dy = dcopy(c, h16(c, dy, ny), ny * 2), *zero16 = h16(c, hzero(c, nm), nm);
  wf_bf16 *d_yg = dcopy(c, zero16, ny * 2), *d_ym = dcopy(c, zero16, ny * 2);
  wf_bf16 *d_dg = dcopy(c, zero16, ng * 2), *d_dm = dcopy(c, zero16, nm * 2);
  gqa16 x = {B, T, NH, NKV, hs, d_yg, d_ym, d_dg, d_dm, NULL, NULL};
  if (!k16) {
    float *d_lg = df(c, hzero(c, nl), nl), *d_lm = df(c, hzero(c, nl), nl);
    size_t sg = WF_K(bf16_of(c), attention_lse)->scratch(B, T, C, NH, NKV),
           sm = WF_K(bf16_of(c), attention_lse)->scratch(B, T, C, NH, NH);
    float *d_sg = df(c, hzero(c, sg), sg), *d_sm = df(c, hzero(c, sm), sm);
    WF_K(bf16_of(c), attention_lse)->forward(d_yg, d_lg, d_xg, B, T, C, NH, NKV, c->stream);
    WF_K(bf16_of(c), attention_lse)->forward(d_ym, d_lm, d_xm, B, T, C, NH, NH, c->stream);
    WF_K(bf16_of(c), attention_lse)
        ->backward(d_dg, d_sg, d_dy, d_xg, d_yg, d_lg, B, T, C, NH, NKV, c->stream);
    WF_K(bf16_of(c), attention_lse)
        ->backward(d_dm, d_sm, d_dy, d_xm, d_ym, d_lm, B, T, C, NH, NH, c->stream);
    x.lg = d_lg, x.lm = d_lm;
  } else {
    size_t sv = WF_K(k16, attention)->saved(B, T, C, NH),
           sx = WF_K(k16, attention)->scratch(B, T, C, NH);
    float *d_ag = df(c, hzero(c, sv), sv), *d_am = df(c, hzero(c, sv), sv);
    float *d_sx = df(c, hzero(c, sx), sx);
    WF_K(k16, attention)->forward(d_yg, d_ag, d_xg, NULL, B, T, C, NH, NKV, c->stream);
    WF_K(k16, attention)->forward(d_ym, d_am, d_xm, NULL, B, T, C, NH, NH, c->stream);
    WF_K(k16, attention)->backward(d_dg, d_sx, d_dy, d_xg, d_ag, NULL, B, T, C, NH, NKV, c->stream);
    WF_K(k16, attention)->backward(d_dm, d_sx, d_dy, d_xm, d_am, NULL, B, T, C, NH, NH, c->stream);
    x.lg = d_ag, x.lm = d_am; /* att begins with the lse (B,NH,T) */
  }
  gqa16_compare(c, &x);
  WF_K(c->k, attention)->set_impl(WF_ATTN_REFERENCE);
}

static void test_attention_gqa16(ctx *c)
{
  printf(" the bf16 entries\n");
  gqa16_case(c, NULL);
  end_case(c);
  printf(" the bf16 table's attention entries\n");
  gqa16_case(c, bf16_of(c));
}

/* ---- the fused classifier ------------------------------------------------------------- */

#define TOL_BF16_STEP 0x1p-7f /* one bf16 step: 2^-7 of the value at most */

/* logits (N, ld) as bf16 in [-6, 6), padding NaN (never read); targets in [0, V). */
static wf_bf16 *cls_logits(ctx *c, int N, int V, int ld)
{
  float *f = hrand(c, (size_t)N * ld, -6, 6);
  for (int i = 0; i < N; i++)
    for (int j = V; j < ld; j++)
      f[(size_t)i * ld + j] = NAN;
  return h16(c, f, (size_t)N * ld);
}

/* The whole-vocabulary classifier in place: ld 40 (element by element) and 64 (16-byte
 * loads with a tail: V 61). */
static void classifier_case(ctx *c, int N, int V, int ld)
{
  const size_t NL = (size_t)N * ld;
  wf_bf16 *x = cls_logits(c, N, V, ld);
  int *t = hints(c, N, 0, V);
  float *loss = hzero(c, N), *d_loss = df(c, loss, N);
  wf_bf16 *d_x = dcopy(c, x, NL * 2);
  WF_K(bf16_of(c), classifier)->fused(d_x, d_loss, di(c, t, N), 1.0f / N, N, V, ld, c->stream);
  wf_classifier_bf16(x, loss, t, 1.0f / N, N, V, ld);
  expect_close(c, "classifier_bf16 losses", loss, d_loss, N, TOL_SUM, TOL_SUM);
  expect_close16(c, "classifier_bf16 dlogits", x, d_x, NL, 1e-9f, TOL_BF16_STEP);
}

/* One vocabulary slice at v_offset 5 with some targets outside it: its statistics, then
 * the gradient from them out of place and in place. */
static void xent16_case(ctx *c)
{
  const int N = 13, V = 37, ld = 40, v_offset = 5;
  const size_t NL = (size_t)N * ld;
  wf_bf16 *x = cls_logits(c, N, V, ld), *d_x = dcopy(c, x, NL * 2);
  int *t = hints(c, N, 0, v_offset + V + 8), *d_t = di(c, t, N);
  float *mx = hzero(c, N), *se = hzero(c, N), *tl = hzero(c, N);
  float *d_mx = df(c, mx, N), *d_se = df(c, se, N), *d_tl = df(c, tl, N);
  wf_xent_stats_bf16(mx, se, tl, x, t, N, V, ld, v_offset);
  WF_K(bf16_of(c), classifier)->stats(d_mx, d_se, d_tl, d_x, d_t, N, V, ld, v_offset, c->stream);
  expect_close(c, "xent_stats_bf16 row_max", mx, d_mx, N, 0, 0);
  expect_close(c, "xent_stats_bf16 row_sumexp", se, d_se, N, TOL_SUM, TOL_SUM);
  expect_close(c, "xent_stats_bf16 target_logit", tl, d_tl, N, 0, 0);
  wf_bf16 *d = keep_host(c, calloc(NL, sizeof *d)), *d_d = dcopy(c, d, NL * 2);
  float *cm = df(c, mx, N), *cs = df(c, se, N); /* both sides from the CPU statistics */
  wf_xent_backward_bf16(d, x, mx, se, t, 0.5f, N, V, ld, v_offset);
  WF_K(bf16_of(c), classifier)
      ->backward(d_d, d_x, cm, cs, d_t, 0.5f, N, V, ld, v_offset, c->stream);
  expect_close16(c, "xent_backward_bf16", d, d_d, NL, 1e-9f, TOL_BF16_STEP);
  WF_K(bf16_of(c), classifier)
      ->backward(d_x, d_x, cm, cs, d_t, 0.5f, N, V, ld, v_offset, c->stream);
  expect_close16(c, "xent_backward_bf16 in place", d, d_x, NL, 1e-9f, TOL_BF16_STEP);
}

static void test_classifier(ctx *c)
{
  classifier_case(c, 13, 37, 40);
  end_case(c);
  classifier_case(c, 5, 61, 64);
  end_case(c);
  xent16_case(c);
}

/* The launch count grows by one per launch (and by none for an empty call). */
static void test_launches(ctx *c)
{
  float x = 1.0f, *d_x = df(c, &x, 1);
  uint64_t a = c->k->reg->launches();
  WF_K(c->k, norm)->scale(d_x, 2.0f, 1, c->stream);
  WF_K(c->k, norm)->scale(d_x, 2.0f, 0, c->stream);
  uint64_t b = c->k->reg->launches();
  printf("  %-4s launches: %llu -> %llu\n", b == a + 1 ? "ok" : "FAIL", (unsigned long long)a,
         (unsigned long long)b);
  c->failures += b != a + 1;
}

static void test_gelu_residual(ctx *c)
{
  const size_t N = 1001;
  float *x = hrand(c, N, -4, 4), *y = hrand(c, N, -1, 1), *out = hzero(c, N);
  float *d_x = df(c, x, N), *d_y = df(c, y, N), *d_out = df(c, out, N);
  wf_gelu_forward(out, x, N);
  WF_K(c->k, gelu)->forward(d_out, d_x, N, c->stream);
  expect_close(c, "gelu_forward out", out, d_out, N, TOL_ELEM, TOL_ELEM);
  float *dinp = hrand(c, N, -1, 1), *d_dinp = df(c, dinp, N);
  wf_gelu_backward(dinp, x, y, N);
  WF_K(c->k, gelu)->backward(d_dinp, d_x, d_y, N, c->stream);
  expect_close(c, "gelu_backward dinp", dinp, d_dinp, N, TOL_ELEM, TOL_ELEM);

  wf_residual_forward(out, x, y, N);
  WF_K(c->k, residual)->forward(d_out, d_x, d_y, N, c->stream);
  expect_close(c, "residual_forward out", out, d_out, N, TOL_EXACT, TOL_EXACT);
  float *da = hrand(c, N, -1, 1), *db = hrand(c, N, -1, 1);
  float *d_da = df(c, da, N), *d_db = df(c, db, N);
  wf_residual_backward(da, db, y, N);
  WF_K(c->k, residual)->backward(d_da, d_db, d_y, N, c->stream);
  expect_close(c, "residual_backward da", da, d_da, N, TOL_EXACT, TOL_EXACT);
  expect_close(c, "residual_backward db", db, d_db, N, TOL_EXACT, TOL_EXACT);
}

/* A vocabulary slice [v_offset, v_offset + V) with padding to ld; targets drawn
 * from a wider range so some rows have their target in another slice. */
static void test_xent(ctx *c)
{
  const int N = 13, V = 37, ld = 40, v_offset = 5;
  const size_t NL = (size_t)N * ld;
  float *logits = hrand(c, NL, -4, 4);
  int *targets = hints(c, N, 0, v_offset + V + 8);
  float *mx = hzero(c, N), *se = hzero(c, N), *tl = hzero(c, N), *loss = hzero(c, N);
  float *d_logits = df(c, logits, NL), *d_mx = df(c, mx, N), *d_se = df(c, se, N);
  float *d_tl = df(c, tl, N), *d_loss = df(c, loss, N);
  int *d_targets = di(c, targets, N);
  wf_xent_stats(mx, se, tl, logits, targets, N, V, ld, v_offset);
  WF_K(c->k, xent)->stats(d_mx, d_se, d_tl, d_logits, d_targets, N, V, ld, v_offset, c->stream);
  expect_close(c, "xent_stats row_max", mx, d_mx, N, TOL_EXACT, TOL_EXACT);
  expect_close(c, "xent_stats row_sumexp", se, d_se, N, TOL_SUM, TOL_SUM);
  expect_close(c, "xent_stats target_logit", tl, d_tl, N, TOL_EXACT, TOL_EXACT);
  /* From here both sides use the CPU statistics. */
  float *dm = df(c, mx, N), *ds = df(c, se, N);
  wf_xent_loss(loss, mx, se, tl, N);
  WF_K(c->k, xent)->loss(d_loss, dm, ds, df(c, tl, N), N, c->stream);
  expect_close(c, "xent_loss", loss, d_loss, N, TOL_ELEM, TOL_ELEM);
  float *dl = hrand(c, NL, -1, 1), *d_dl = df(c, dl, NL); /* padding must become 0 */
  wf_xent_backward(dl, logits, mx, se, targets, 1.0f / N, N, V, ld, v_offset);
  WF_K(c->k, xent)
      ->backward(d_dl, d_logits, dm, ds, d_targets, 1.0f / N, N, V, ld, v_offset, c->stream);
  expect_close(c, "xent_backward dlogits", dl, d_dl, NL, TOL_ELEM, TOL_ELEM);
  /* In place, as the trainer calls it: dlogits aliases logits. */
  wf_xent_backward(logits, logits, mx, se, targets, 0.5f, N, V, ld, v_offset);
  WF_K(c->k, xent)
      ->backward(d_logits, d_logits, dm, ds, d_targets, 0.5f, N, V, ld, v_offset, c->stream);
  expect_close(c, "xent_backward in place", logits, d_logits, NL, TOL_ELEM, TOL_ELEM);
}

static void test_adamw(ctx *c)
{
  const size_t n = 1001;
  float *p = hrand(c, n, -1, 1), *m = hrand(c, n, -0.1f, 0.1f), *v = hrand(c, n, 0, 0.01f);
  float *g = hrand(c, n, -1, 1);
  float *d_p = df(c, p, n), *d_m = df(c, m, n), *d_v = df(c, v, n);
  wf_adamw_update(p, m, v, g, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, 0.5f);
  WF_K(c->k, adamw)
      ->update(d_p, d_m, d_v, df(c, g, n), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 3, 0.5f, c->stream);
  expect_close(c, "adamw params", p, d_p, n, TOL_ELEM, TOL_ELEM);
  expect_close(c, "adamw m", m, d_m, n, TOL_ELEM, TOL_ELEM);
  expect_close(c, "adamw v", v, d_v, n, TOL_ELEM, TOL_ELEM);
}

/* A device double, read back. */
static double read_double(ctx *c, const double *d)
{
  double x = NAN;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, &x, d, sizeof x) != WF_OK)
    return NAN;
  return x;
}

static void expect_double(ctx *c, const char *what, double want, double got, double rtol)
{
  bool ok = fabs(got - want) <= rtol * fabs(want);
  printf("  %-4s %-28s cpu %.12g gpu %.12g\n", ok ? "ok" : "FAIL", what, want, got);
  c->failures += !ok;
}

/* Accumulation into a non-zero start checks "adds into" as well as the sum. */
static void test_sumsq_scale(ctx *c)
{
  const size_t n = 300007; /* more than one grid's worth: exercises both passes */
  float *x = hrand(c, n, -1, 1), *d_x = df(c, x, n);
  double acc = 2.5, *d_acc = dcopy(c, &acc, sizeof acc);
  wf_sumsq_acc(&acc, x, n);
  WF_K(c->k, norm)->sumsq_acc(d_acc, d_x, n, c->stream);
  double before = read_double(c, d_acc);
  expect_double(c, "sumsq_acc", acc, before, 1e-9);
  WF_K(c->k, norm)
      ->sumsq_acc(d_acc, d_x, 0, c->stream); /* empty: adds nothing, to the GPU's own sum */
  expect_double(c, "sumsq_acc empty", before, read_double(c, d_acc), 0);
  wf_sumsq_acc(&acc, x + 1, n - 1); /* not 16-byte aligned: the element-wise loads */
  WF_K(c->k, norm)->sumsq_acc(d_acc, d_x + 1, n - 1, c->stream);
  expect_double(c, "sumsq_acc unaligned", acc, read_double(c, d_acc), 1e-9);
  wf_sumsq_acc(&acc, x + 3, 1001); /* one block, one launch */
  WF_K(c->k, norm)->sumsq_acc(d_acc, d_x + 3, 1001, c->stream);
  expect_double(c, "sumsq_acc small", acc, read_double(c, d_acc), 1e-9);
  wf_scale(x, -0.37f, n);
  WF_K(c->k, norm)->scale(d_x, -0.37f, n, c->stream);
  expect_close(c, "scale", x, d_x, n, TOL_EXACT, TOL_EXACT);
}

/* Vocabulary-parallel statistics: 3 ranks' packed rows, one with an empty slice (its
 * sumexp 0 must add nothing), combined; then the loss mean added to a running sum. */
static void test_xent_parts(ctx *c)
{
  const int N = 37, parts = 3;
  const size_t S = 3 * (size_t)N;
  float *mx = hrand(c, N, -3, 3), *se = hrand(c, N, 0.5f, 9), *tl = hrand(c, N, -2, 2);
  float *stats = hzero(c, S), *d_stats = df(c, stats, S);
  wf_xent_pack(stats, mx, se, tl, N);
  WF_K(c->k, xent)->pack(d_stats, df(c, mx, N), df(c, se, N), df(c, tl, N), N, c->stream);
  expect_close(c, "xent_pack", stats, d_stats, S, 0, 0);
  float *all = hrand(c, parts * S, -3, 3);
  for (int i = 0; i < N; i++) { /* sumexp > 0, and part 1 an empty slice */
    for (int r = 0; r < parts; r++)
      all[(size_t)r * S + 3 * i + 1] = r == 1 ? 0.0f : fabsf(all[(size_t)r * S + 3 * i + 1]) + 1;
    all[S + 3 * i] = -INFINITY;
  }
  float *cm = hzero(c, N), *cs = hzero(c, N), *ct = hzero(c, N);
  float *d_cm = df(c, cm, N), *d_cs = df(c, cs, N), *d_ct = df(c, ct, N);
  wf_xent_combine(cm, cs, ct, all, N, parts);
  WF_K(c->k, xent)->combine(d_cm, d_cs, d_ct, df(c, all, parts * S), N, parts, c->stream);
  expect_close(c, "xent_combine row_max", cm, d_cm, N, 0, 0);
  expect_close(c, "xent_combine row_sumexp", cs, d_cs, N, TOL_ELEM, TOL_ELEM);
  expect_close(c, "xent_combine target_logit", ct, d_ct, N, TOL_EXACT, TOL_EXACT);
  float *losses = hrand(c, N, 0, 11);
  double acc = 1.25, *d_acc = dcopy(c, &acc, sizeof acc);
  wf_loss_accumulate(&acc, losses, N);
  WF_K(c->k, xent)->accumulate(d_acc, df(c, losses, N), N, c->stream);
  expect_double(c, "loss_accumulate", acc, read_double(c, d_acc), 1e-9);
  const int NB = 40001; /* a B x T of several blocks: the two-pass sum */
  float *many = hrand(c, NB, 0, 11);
  wf_loss_accumulate(&acc, many, NB);
  WF_K(c->k, xent)->accumulate(d_acc, df(c, many, NB), NB, c->stream);
  expect_double(c, "loss_accumulate (40001)", acc, read_double(c, d_acc), 1e-9);
}

/* The first bad token of a long batch (two of them: the first must win), none, and
 * a negative one at position 0. */
static void test_tokens(ctx *c)
{
  const size_t n = 5003;
  const int V = 50;
  int *tok = hints(c, n, 0, V), bad[2], got[2];
  tok[4000] = V, tok[3001] = -7;
  int *d_tok = di(c, tok, n), *d_bad = di(c, tok, 2);
  for (int round = 0; round < 3; round++) {
    if (round == 1)
      tok[4000] = 1, tok[3001] = 2, d_tok = di(c, tok, n);
    if (round == 2)
      tok[0] = -1, d_tok = di(c, tok, n);
    wf_tokens_check(bad, tok, n, V);
    WF_K(c->k, tokens)->check(d_bad, d_tok, n, V, c->stream);
    bool ok = wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
              wf_gpu_memcpy_d2h(c->g, got, d_bad, sizeof got) == WF_OK && got[0] == bad[0] &&
              got[1] == bad[1];
    printf("  %-4s %-28s cpu {%d, %d} gpu {%d, %d}\n", ok ? "ok" : "FAIL", "tokens_check", bad[0],
           bad[1], got[0], got[1]);
    c->failures += !ok;
  }
}

/* Bit-exact comparison of a rounding result; a NaN must meet a NaN. */
static void expect_bits(ctx *c, const char *what, const float *ref, const float *d, size_t n)
{
  float *got = hzero(c, n);
  size_t bad = n;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * sizeof(float)) != WF_OK)
    bad = 0;
  for (size_t i = 0; i < n && bad == n; i++)
    if (isnan(ref[i]) ? !isnan(got[i]) : memcmp(&ref[i], &got[i], sizeof(float)) != 0)
      bad = i;
  if (bad == n) {
    printf("  ok   %-28s n=%-7zu bit for bit\n", what, n);
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu: cpu %.9g gpu %.9g\n", what, n, bad, ref[bad], got[bad]);
  c->failures++;
}

/* Random values over 2^-30 .. 2^20 of both signs (both formats' subnormals, normals
 * and fp16's overflow), then the edge cases: ties of each format, the largest finite
 * values and their overflow thresholds, subnormals, zeros, infinities and a NaN. */
static void test_round(ctx *c)
{
  const size_t R = 4001;
  static const float edge[] = {1.0f,
                               1.00390625f /* 1 + 2^-8: bf16 tie */,
                               1.005859375f /* 1 + 3 * 2^-9 */,
                               1.00048828125f /* 1 + 2^-11: fp16 tie */,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               -65520.0f,
                               3.3895314e38f /* bf16 max */,
                               3.4028235e38f /* FLT_MAX */,
                               5.9604645e-8f /* 2^-24 */,
                               2.9802322e-8f /* 2^-25 */,
                               6.1035156e-5f /* 2^-14 */,
                               1e-40f /* fp32 subnormal */,
                               0.0f,
                               -0.0f,
                               INFINITY,
                               -INFINITY,
                               NAN};
  const size_t E = WF_ARRAY_LEN(edge), n = R + E;
  float *x = hzero(c, n), *u = hrand(c, R, -30, 20), *s = hrand(c, R, -1, 1);
  for (size_t i = 0; i < R; i++)
    x[i] = copysignf(exp2f(u[i]), s[i]);
  memcpy(x + R, edge, sizeof edge);
  float *y = hzero(c, n), *d_x = df(c, x, n), *d_y = df(c, y, n);
  wf_round_bf16(y, x, n);
  WF_K(bf16_of(c), round)->round(d_y, d_x, n, c->stream);
  expect_bits(c, "round_bf16", y, d_y, n);
  wf_round_fp16(y, x, n);
  WF_K(wf_kset_as(c->k, WF_DT_F16), round)->round(d_y, d_x, n, c->stream);
  expect_bits(c, "round_fp16", y, d_y, n);
  wf_round_fp16(x, x, n); /* in place, as the model calls it */
  WF_K(wf_kset_as(c->k, WF_DT_F16), round)->round(d_x, d_x, n, c->stream);
  expect_bits(c, "round_fp16 in place", x, d_x, n);
}

/* ---- the 16-bit tables ------------------------------------------------------------ */

typedef struct tables16 {
  int fmt;
  const wf_kset *cpu, *gpu;
} tables16;

/* n activations in [lo, hi), stored in the format (host). */
static uint16_t *hact(ctx *c, size_t n, int fmt, float lo, float hi)
{
  float *x = hrand(c, n, lo, hi);
  uint16_t *h = keep_host(c, calloc(n ? n : 1, sizeof(uint16_t)));
  wf_storage_store(h, x, n, fmt);
  return h;
}

static uint16_t *hact0(ctx *c, size_t n) { return keep_host(c, calloc(n ? n : 1, 2)); }

static void *d16(ctx *c, const uint16_t *h, size_t n) { return dcopy(c, h, n * 2); }

static void expect_stored16_by(ctx *c, const tables16 *t, const char *what, const uint16_t *ref,
                               const void *d, size_t n, float atol, float rtol, const uint16_t *by,
                               double per_by);

/* A 16-bit device output against the CPU's: the fp32 tolerance plus one step of the
 * format (see the top). */
static void expect_stored16(ctx *c, const tables16 *t, const char *what, const uint16_t *ref,
                            const void *d, size_t n, float atol, float rtol)
{
  expect_stored16_by(c, t, what, ref, d, n, atol, rtol, NULL, 0);
}

/* The same, the tolerance of element i widened by per_by |by[i]| (by: 16-bit host
 * values of another tensor the output is a function of; NULL: none). */
static void expect_stored16_by(ctx *c, const tables16 *t, const char *what, const uint16_t *ref,
                               const void *d, size_t n, float atol, float rtol, const uint16_t *by,
                               double per_by)
{
  uint16_t *got = hact0(c, n);
  float *r = hzero(c, n), *g = hzero(c, n), *p = hzero(c, n);
  double step = t->fmt == WF_PREC_BF16 ? 0x1p-7 : 0x1p-10;
  size_t bad = n;
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d, n * 2) != WF_OK)
    bad = 0;
  wf_storage_load(r, ref, n, t->fmt);
  wf_storage_load(g, got, n, t->fmt);
  if (by)
    wf_storage_load(p, by, n, t->fmt);
  for (size_t i = 0; i < n && bad == n; i++) {
    double tol = atol + (rtol + step) * fabs(r[i]) + per_by * fabs(p[i]) + 0x1p-24;
    if (!(fabs((double)g[i] - r[i]) <= tol))
      bad = i;
  }
  if (bad == n) {
    printf("  ok   %-28s n=%zu (%s)\n", what, n, wf_storage_name(t->fmt));
    return;
  }
  printf("  FAIL %-28s n=%-7zu at %zu (%s): cpu %.9g gpu %.9g\n", what, n, bad,
         wf_storage_name(t->fmt), r[bad], g[bad]);
  c->failures++;
}

static void storage_convert(ctx *c, const tables16 *t)
{
  const size_t n = 1001;
  float *x = hrand(c, n, -70000, 70000), *back = hzero(c, n), *d_back = df(c, back, n);
  uint16_t *h = hact0(c, n), *dh = d16(c, h, n);
  WF_K(t->cpu, cast)->store(h, x, n, NULL);
  WF_K(t->gpu, cast)->store(dh, df(c, x, n), n, c->stream);
  uint16_t *got = hact0(c, n);
  wf_gpu_stream_sync(c->g, c->stream);
  wf_gpu_memcpy_d2h(c->g, got, dh, n * 2);
  if (memcmp(got, h, n * 2) != 0) {
    printf("  FAIL store (%s): not bit for bit\n", wf_storage_name(t->fmt));
    c->failures++;
  }
  WF_K(t->cpu, cast)->load(back, h, n, NULL);
  WF_K(t->gpu, cast)->load(d_back, dh, n, c->stream);
  expect_close(c, "load", back, d_back, n, 0, 0);
}

/* C 45: the kernels' column-by-column loops; C 64: their packs of 8 (act_int.h). */
static void storage_norms(ctx *c, const tables16 *t, int C)
{
  const int N = 37;
  const size_t NC = (size_t)N * C;
  uint16_t *x = hact(c, NC, t->fmt, -2, 2), *out = hact0(c, NC), *res = hact0(c, NC);
  float *w = hrand(c, C, 0.5f, 1.5f), *b = hrand(c, C, -1, 1), *bsum = hrand(c, NC, -1, 1);
  float *mean = hzero(c, N), *rstd = hzero(c, N), *d_mean = df(c, mean, N);
  float *d_rstd = df(c, rstd, N), *d_w = df(c, w, C), *d_b = df(c, b, C);
  void *d_x = d16(c, x, NC), *d_out = d16(c, out, NC);
  WF_K(t->cpu, layernorm)->forward(out, mean, rstd, x, w, b, N, C, NULL);
  WF_K(t->gpu, layernorm)->forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, c->stream);
  expect_stored16(c, t, "layernorm_forward out", out, d_out, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_forward rstd", rstd, d_rstd, N, TOL_SUM, TOL_SUM);
  float *dout = hrand(c, NC, -1, 1), *dinp = hrand(c, NC, -1, 1), *dw = hrand(c, C, -1, 1);
  float *db = hrand(c, C, -1, 1), *d_dinp = df(c, dinp, NC), *d_dw = df(c, dw, C);
  float *d_db = df(c, db, C);
  WF_K(t->cpu, layernorm)->backward(dinp, dw, db, dout, x, w, mean, rstd, N, C, NULL);
  WF_K(t->gpu, layernorm)
      ->backward(d_dinp, d_dw, d_db, df(c, dout, NC), d_x, d_w, df(c, mean, N), df(c, rstd, N), N,
                 C, c->stream);
  expect_close(c, "layernorm_backward dinp", dinp, d_dinp, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_backward dweight", dw, d_dw, C, TOL_SUM, TOL_SUM);
  expect_close(c, "layernorm_backward dbias", db, d_db, C, TOL_SUM, TOL_SUM);
  WF_K(t->cpu, layernorm)->residual_forward(res, out, mean, rstd, x, bsum, w, b, N, C, NULL);
  WF_K(t->gpu, layernorm)
      ->residual_forward(d_x, d_out, d_mean, d_rstd, d_x, df(c, bsum, NC), d_w, d_b, N, C,
                         c->stream); /* res aliasing a, as the model calls it */
  expect_stored16(c, t, "residual_layernorm res", res, d_x, NC, TOL_EXACT, TOL_EXACT);
  expect_stored16(c, t, "residual_layernorm ln", out, d_out, NC, TOL_SUM, TOL_SUM);
}

static void storage_elementwise(ctx *c, const tables16 *t)
{
  const size_t n = 1001;
  uint16_t *x = hact(c, n, t->fmt, -4, 4), *y = hact0(c, n), *dx = hact(c, n, t->fmt, -1, 1);
  uint16_t *dy = hact(c, n, t->fmt, -1, 1); /* as the fcproj GEMM's backward stores it */
  float *b = hrand(c, n, -1, 1);
  void *d_x = d16(c, x, n), *d_y = d16(c, y, n), *d_dx = d16(c, dx, n);
  WF_K(t->cpu, gelu)->forward(y, x, n, NULL);
  WF_K(t->gpu, gelu)->forward(d_y, d_x, n, c->stream);
  expect_stored16(c, t, "gelu_forward", y, d_y, n, TOL_ELEM, TOL_ELEM);
  /* operands off 16-byte alignment: the kernels go element by element (act_int.h) */
  uint16_t *y1 = (uint16_t *)d_y + 1;
  WF_K(t->cpu, gelu)->forward(y + 1, x + 1, n - 1, NULL);
  WF_K(t->gpu, gelu)->forward(y1, (uint16_t *)d_x + 1, n - 1, c->stream);
  expect_stored16(c, t, "gelu_forward, unaligned", y + 1, y1, n - 1, TOL_ELEM, TOL_ELEM);
  WF_K(t->cpu, gelu)->backward(dx, x, dy, n, NULL); /* written, in the format */
  WF_K(t->gpu, gelu)->backward(d_dx, d_x, d16(c, dy, n), n, c->stream);
  expect_stored16(c, t, "gelu_backward", dx, d_dx, n, TOL_ELEM, TOL_ELEM);
  WF_K(t->cpu, residual)->forward(y, x, b, n, NULL);
  WF_K(t->gpu, residual)->forward(d_y, d_x, df(c, b, n), n, c->stream);
  expect_stored16(c, t, "residual_forward", y, d_y, n, TOL_EXACT, TOL_EXACT);
}

static void storage_xent(ctx *c, const tables16 *t)
{
  const int N = 13, V = 37, ld = 40, v0 = 5;
  const size_t NL = (size_t)N * ld;
  uint16_t *l = hact(c, NL, t->fmt, -4, 4);
  int *tg = hints(c, N, 0, v0 + V + 8), *d_tg = di(c, tg, N);
  float *mx = hzero(c, N), *se = hzero(c, N), *tl = hzero(c, N);
  float *d_mx = df(c, mx, N), *d_se = df(c, se, N), *d_tl = df(c, tl, N);
  void *d_l = d16(c, l, NL);
  WF_K(t->cpu, xent)->stats(mx, se, tl, l, tg, N, V, ld, v0, NULL);
  WF_K(t->gpu, xent)->stats(d_mx, d_se, d_tl, d_l, d_tg, N, V, ld, v0, c->stream);
  expect_close(c, "xent_stats row_max", mx, d_mx, N, TOL_EXACT, TOL_EXACT);
  expect_close(c, "xent_stats row_sumexp", se, d_se, N, TOL_SUM, TOL_SUM);
  expect_close(c, "xent_stats target_logit", tl, d_tl, N, TOL_EXACT, TOL_EXACT);
  WF_K(t->cpu, xent)->backward(l, l, mx, se, tg, 0.5f, N, V, ld, v0, NULL); /* in place */
  WF_K(t->gpu, xent)
      ->backward(d_l, d_l, df(c, mx, N), df(c, se, N), d_tg, 0.5f, N, V, ld, v0, c->stream);
  expect_stored16(c, t, "xent_backward in place", l, d_l, NL, TOL_ELEM, TOL_ELEM);
}

/* The fused matmul + GELU's output against the CPU's: both take the GELU of the stored
 * pre-activation (matmul.cu), which their different sum orders may put a step of the
 * format apart where the fp32 sum lies near a rounding boundary (2^-7 |pre| bf16, 2^-10
 * fp16), times GELU's slope (at most 1.13). On top: the GEMM's TOL_SUM, one step of the
 * output and TOL_ELEM. A wrong bias, layout or activation is off by O(|pre|) and fails. */
static void expect_gelu16(ctx *c, const tables16 *t, const uint16_t *ref, const uint16_t *pre,
                          const void *d, size_t n)
{
  double step = t->fmt == WF_PREC_BF16 ? 0x1p-7 : 0x1p-10;
  expect_stored16_by(c, t, "matmul_gelu_forward out", ref, d, n, TOL_SUM, TOL_ELEM, pre,
                     1.13 * step + TOL_SUM);
}

/* 16-bit operands: exact products on both sides, summed in other orders (TOL_SUM); the
 * fused GELU: expect_gelu16. */
static void storage_matmul(ctx *c, const tables16 *t, int N, int C, int OC)
{
  const size_t NC = (size_t)N * C, NO = (size_t)N * OC, OCC = (size_t)OC * C;
  uint16_t *x = hact(c, NC, t->fmt, -1, 1), *w = hact(c, OCC, t->fmt, -1, 1);
  uint16_t *dy = hact(c, NO, t->fmt, -1, 1), *y = hact0(c, NO), *g = hact0(c, NO);
  float *b = hrand(c, OC, -1, 1), *y32 = hzero(c, NO), *d_b = df(c, b, OC);
  void *d_x = d16(c, x, NC), *d_w = d16(c, w, OCC), *d_y = d16(c, y, NO), *d_g = d16(c, g, NO);
  float *d_y32 = df(c, y32, NO);
  WF_K(t->cpu, matmul)->forward(y, x, w, b, N, C, OC, t->fmt, NULL);
  WF_K(t->gpu, matmul)->forward(d_y, d_x, d_w, d_b, N, C, OC, t->fmt, c->stream);
  expect_stored16(c, t, "matmul_forward out", y, d_y, NO, TOL_SUM, TOL_SUM);
  WF_K(t->cpu, matmul)->forward_f32(y32, x, w, b, N, C, OC, t->fmt, NULL);
  WF_K(t->gpu, matmul)->forward_f32(d_y32, d_x, d_w, d_b, N, C, OC, t->fmt, c->stream);
  expect_close(c, "matmul_forward_f32 out", y32, d_y32, NO, TOL_SUM, TOL_SUM);
  WF_K(t->cpu, matmul)->gelu_forward(g, y, x, w, b, N, C, OC, t->fmt, NULL);
  WF_K(t->gpu, matmul)->gelu_forward(d_g, d_y, d_x, d_w, d_b, N, C, OC, t->fmt, c->stream);
  expect_stored16(c, t, "matmul_gelu_forward pre", y, d_y, NO, TOL_SUM, TOL_SUM);
  expect_gelu16(c, t, g, y, d_g, NO);
  float *dx = hrand(c, NC, -1, 1), *dw = hrand(c, OCC, -1, 1), *db = hrand(c, OC, -1, 1);
  float *d_dx = df(c, dx, NC), *d_dw = df(c, dw, OCC), *d_db = df(c, db, OC);
  void *d_dy = d16(c, dy, NO);
  WF_K(t->cpu, matmul)->backward_f32(dx, dw, db, dy, x, w, N, C, OC, t->fmt, NULL);
  WF_K(t->gpu, matmul)->backward_f32(d_dx, d_dw, d_db, d_dy, d_x, d_w, N, C, OC, t->fmt, c->stream);
  expect_close(c, "matmul_backward_f32 dinp", dx, d_dx, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "matmul_backward dweight", dw, d_dw, OCC, TOL_SUM, TOL_SUM);
  expect_close(c, "matmul_backward dbias", db, d_db, OC, TOL_SUM, TOL_SUM);
  /* dinp in the format, written over a random start; dweight and dbias added again */
  uint16_t *dx16 = hact0(c, NC);
  void *d_dx16 = d16(c, hact(c, NC, t->fmt, -1, 1), NC);
  WF_K(t->cpu, matmul)->backward(dx16, dw, db, dy, x, w, N, C, OC, t->fmt, NULL);
  WF_K(t->gpu, matmul)->backward(d_dx16, d_dw, d_db, d_dy, d_x, d_w, N, C, OC, t->fmt, c->stream);
  expect_stored16(c, t, "matmul_backward dinp", dx16, d_dx16, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "matmul_backward dweight, twice", dw, d_dw, OCC, TOL_SUM, TOL_SUM);
  expect_close(c, "matmul_backward dbias, twice", db, d_db, OC, TOL_SUM, TOL_SUM);
}

/* Each side keeps what its own table keeps (the CPU 16-bit probabilities, the GPU its
 * lse, and for bf16 its output); out and dqkv are compared. Under the tests' setting
 * (runtime.attention=reference) the GPU runs the fp32 kernels on widened q, k, v and
 * dout (stored in the format, as the output projection's backward writes it); both
 * store dqkv rounded to the format. */
static void storage_attention(ctx *c, const tables16 *t, int B, int T, int NH, int hs)
{
  const int C = NH * hs;
  const size_t BTC = (size_t)B * T * C, QKV = 3 * BTC;
  size_t cs = WF_K(t->cpu, attention)->saved(B, T, C, NH),
         gs = WF_K(t->gpu, attention)->saved(B, T, C, NH);
  size_t gx = WF_K(t->gpu, attention)->scratch(B, T, C, NH);
  uint16_t *qkv = hact(c, QKV, t->fmt, -1, 1), *out = hact0(c, BTC);
  float *att = hzero(c, cs), *d_att = df(c, hzero(c, gs), gs);
  void *d_qkv = d16(c, qkv, QKV), *d_out = d16(c, out, BTC);
  WF_K(t->cpu, attention)->forward(out, att, qkv, NULL, B, T, C, NH, NH, NULL);
  WF_K(t->gpu, attention)->forward(d_out, d_att, d_qkv, NULL, B, T, C, NH, NH, c->stream);
  expect_stored16(c, t, "attention_forward out", out, d_out, BTC, TOL_SUM, TOL_SUM);
  uint16_t *dout = hact(c, BTC, t->fmt, -1, 1);
  uint16_t *dqkv = hact(c, QKV, t->fmt, -1, 1); /* written over, in the format */
  void *d_dqkv = d16(c, dqkv, QKV);
  WF_K(t->cpu, attention)->backward(dqkv, NULL, dout, qkv, att, NULL, B, T, C, NH, NH, NULL);
  WF_K(t->gpu, attention)
      ->backward(d_dqkv, df(c, hzero(c, gx), gx), d16(c, dout, BTC), d_qkv, d_att, NULL, B, T, C,
                 NH, NH, c->stream);
  /* the CPU's backward reads the probabilities stored in 16 bits, the GPU's recomputes
   * them in fp32: one rounding of each, 2^-8 (bf16) or 2^-11 (fp16) relative, in sums
   * of T terms of |dout| <= 1 and |q|, |k|, |v| <= 1: step * T absolute; both store
   * dqkv rounded (expect_stored16's step) */
  float tol = (float)(T * (t->fmt == WF_PREC_BF16 ? 0x1p-8 : 0x1p-11));
  expect_stored16(c, t, "attention_backward dqkv", dqkv, d_dqkv, QKV, tol, TOL_SUM);
}

/* The bf16 table's attention on tensor cores (runtime.attention=flash, cudnn: the path
 * the setting must take, as test_attention_paths) against the fp32 CPU attention on the
 * widened inputs, within att16_bound.h's bound (twice it for cuDNN): out and dqkv as
 * stored in bf16 (dqkv written over a random start). */
static void storage_attention_tc(ctx *c, const tables16 *t, int B, int T, int NH, int hs)
{
  static const int impls[] = {WF_ATTN_FLASH, WF_ATTN_CUDNN};
  const int C = NH * hs;
  const size_t BTC = (size_t)B * T * C, QKV = 3 * BTC, ATT = (size_t)B * NH * T * T;
  for (size_t i = 0; i < WF_ARRAY_LEN(impls); i++) {
    WF_K(c->k, attention)->set_impl(impls[i]);
    int path = WF_K(c->k, attention)->path(B, T, C, NH, NH);
    printf(" %s table, B %d T %d, %d heads of %d, runtime.attention=%s: %s\n",
           wf_storage_name(t->fmt), B, T, NH, hs, path_name(impls[i]), path_name(path));
    expect_path(c, impls[i], path, T % 128 == 0);
    size_t gs = WF_K(t->gpu, attention)->saved(B, T, C, NH),
           gx = WF_K(t->gpu, attention)->scratch(B, T, C, NH);
    uint16_t *q16 = hact(c, QKV, t->fmt, -1, 1), *dy16 = hact(c, BTC, t->fmt, -1, 1);
    float *qkv = hzero(c, QKV), *dout = hzero(c, BTC);
    float *out = hzero(c, BTC), *att = hzero(c, ATT), *dqkv = hrand(c, QKV, -1, 1);
    wf_storage_load(qkv, q16, QKV, t->fmt);
    wf_storage_load(dout, dy16, BTC, t->fmt);
    void *d_qkv = d16(c, q16, QKV), *d_out = d16(c, hact0(c, BTC), BTC);
    void *d_dqkv = d16(c, hact(c, QKV, t->fmt, -1, 1), QKV);
    float *d_att = df(c, hzero(c, gs), gs);
    wf_attention_forward(out, att, qkv, B, T, C, NH);
    wf_attention_backward(dqkv, hzero(c, ATT), dout, qkv, att, B, T, C, NH);
    WF_K(t->gpu, attention)->forward(d_out, d_att, d_qkv, NULL, B, T, C, NH, NH, c->stream);
    WF_K(t->gpu, attention)
        ->backward(d_dqkv, df(c, hzero(c, gx), gx), d16(c, dy16, BTC), d_qkv, d_att, NULL, B, T, C,
                   NH, NH, c->stream);
    att16_bound bd = att16_bound_make(qkv, dout, NULL, B, T, C, NH);
    double f = path == WF_ATTN_CUDNN ? 2 : 1;
    bound_verdict(c, "attention_forward out (bf16)", out, read16(c, d_out, BTC), bd.out, BTC, f);
    bound_verdict(c, "attention_backward dqkv (bf16)", dqkv,
                  read16(c, (const wf_bf16 *)d_dqkv, QKV), bd.dqkv, QKV, f);
    att16_bound_free(&bd);
    end_case(c);
  }
  WF_K(c->k, attention)->set_impl(WF_ATTN_REFERENCE);
}

/* Two device buffers of `bytes` hold the same bits. */
static void expect_same_bytes(ctx *c, const char *what, const void *want, const void *got,
                              size_t bytes)
{
  unsigned char *a = keep_host(c, calloc(bytes ? bytes : 1, 1));
  unsigned char *b = keep_host(c, calloc(bytes ? bytes : 1, 1));
  bool ok = wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
            wf_gpu_memcpy_d2h(c->g, a, want, bytes) == WF_OK &&
            wf_gpu_memcpy_d2h(c->g, b, got, bytes) == WF_OK && memcmp(a, b, bytes) == 0;
  printf("  %-4s %-28s %zu bytes, bit for bit\n", ok ? "ok" : "FAIL", what, bytes);
  c->failures += !ok;
}

/* A 16-bit output adds its bias rounded to the format (kernels/matmul.h), on cuBLASLt's
 * epilogue or its fp32-block fallback alike: tests/kernels/test_storage.c's case (bias
 * 1 + 0.6u, product -u/4: 1 + u rounded, where the exact bias gives 1), the pre of the
 * fused GELU too. */
static void storage_bias_rounded(ctx *c, const tables16 *t)
{
  const int N = 8, C = 8, OC = 16;
  const float u = t->fmt == WF_PREC_FP16 ? 0x1p-10f : 0x1p-7f;
  float *x = hzero(c, (size_t)N * C), *w = hzero(c, (size_t)OC * C), *b = hzero(c, OC);
  float *y = hzero(c, (size_t)N * OC);
  for (int r = 0; r < N; r++)
    x[r * C] = 1.0f;
  for (int o = 0; o < OC; o++)
    w[o * C] = -0.25f * u, b[o] = 1.0f + 0.6f * u;
  for (int i = 0; i < N * OC; i++)
    y[i] = 1.0f + u;
  uint16_t *x16 = hact0(c, (size_t)N * C), *w16 = hact0(c, (size_t)OC * C);
  uint16_t *want = hact0(c, (size_t)N * OC);
  wf_storage_store(x16, x, (size_t)N * C, t->fmt);
  wf_storage_store(w16, w, (size_t)OC * C, t->fmt);
  wf_storage_store(want, y, (size_t)N * OC, t->fmt);
  void *d_x = d16(c, x16, (size_t)N * C), *d_w = d16(c, w16, (size_t)OC * C);
  void *d_y = d16(c, hact0(c, (size_t)N * OC), (size_t)N * OC);
  void *d_g = d16(c, hact0(c, (size_t)N * OC), (size_t)N * OC);
  void *d_want = d16(c, want, (size_t)N * OC);
  float *d_b = df(c, b, OC);
  WF_K(t->gpu, matmul)->forward(d_y, d_x, d_w, d_b, N, C, OC, t->fmt, c->stream);
  expect_same_bytes(c, "matmul_forward rounded bias", d_want, d_y, (size_t)N * OC * 2);
  WF_K(t->gpu, matmul)->gelu_forward(d_g, d_y, d_x, d_w, d_b, N, C, OC, t->fmt, c->stream);
  expect_same_bytes(c, "matmul_gelu_forward pre, bias", d_want, d_y, (size_t)N * OC * 2);
}

/* Llama's 16-bit kernels are the fp32 kernels' code on loaded operands (act_int.h):
 * each equals, bit for bit, the GPU's fp32 entry on the widened operands with its
 * activation outputs stored (the GPU's `store`), as storage.h defines the 16-bit forms. */
static void storage_llama_exact(ctx *c, const tables16 *t)
{
  const wf_kset *k32 = c->k;
  const int N = 37, C = 48, F = 40, B = 2, T = 29, NH = 4, NKV = 2, hs = 8;
  const size_t NC = (size_t)N * C, NF = (size_t)N * F, BTW = (size_t)B * T * (NH + 2 * NKV) * hs;
  uint16_t *x = hact(c, NC, t->fmt, -2, 2), *gu = hact(c, 2 * NF, t->fmt, -4, 4);
  uint16_t *q = hact(c, BTW, t->fmt, -1, 1);
  float *w = df(c, hrand(c, C, 0.5f, 1.5f), C), *b = df(c, hrand(c, NC, -1, 1), NC);
  float *dy = df(c, hrand(c, NC, -1, 1), NC);
  void *dh16 = d16(c, hact(c, NF, t->fmt, -1, 1), NF); /* as the down GEMM's backward stores it */
  float *cs = hzero(c, (size_t)T * hs);
  wf_rope_table(cs, T, hs, 10000.0, NULL);
  float *d_cs = df(c, cs, (size_t)T * hs);
  void *x16 = d16(c, x, NC), *y16 = d16(c, hact0(c, NC), NC), *r16 = d16(c, hact0(c, NC), NC);
  float *x32 = df(c, hzero(c, NC), NC), *y32 = df(c, hzero(c, NC), NC);
  void *want = d16(c, hact0(c, 2 * NF + BTW), 2 * NF + BTW); /* the largest stored output */
  float *rs16 = df(c, hzero(c, N), N), *rs32 = df(c, hzero(c, N), N);
  WF_K(t->gpu, cast)->load(x32, x16, NC, c->stream);
  WF_K(t->gpu, rmsnorm)->forward(y16, rs16, x16, w, 1e-5f, N, C, c->stream);
  WF_K(k32, rmsnorm)->forward(y32, rs32, x32, w, 1e-5f, N, C, c->stream);
  WF_K(t->gpu, cast)->store(want, y32, NC, c->stream);
  expect_same_bytes(c, "rmsnorm_forward out", want, y16, NC * 2);
  expect_same_bytes(c, "rmsnorm_forward rstd", rs32, rs16, N * 4);
  float *dx16 = df(c, hzero(c, NC), NC), *dx32 = df(c, hzero(c, NC), NC);
  float *dw16 = df(c, hzero(c, C), C), *dw32 = df(c, hzero(c, C), C);
  WF_K(t->gpu, rmsnorm)->backward(dx16, dw16, dy, x16, w, rs32, N, C, c->stream);
  WF_K(k32, rmsnorm)->backward(dx32, dw32, dy, x32, w, rs32, N, C, c->stream);
  expect_same_bytes(c, "rmsnorm_backward dinp", dx32, dx16, NC * 4);
  expect_same_bytes(c, "rmsnorm_backward dweight", dw32, dw16, C * 4);
  /* residual then RMSNorm: res = store(a + b), out = rmsnorm(load(res)) */
  WF_K(t->gpu, rmsnorm)->residual_forward(r16, y16, rs16, x16, b, w, 1e-5f, N, C, c->stream);
  WF_K(k32, residual)->forward(y32, x32, b, NC, c->stream);
  WF_K(t->gpu, cast)->store(want, y32, NC, c->stream);
  expect_same_bytes(c, "residual_rmsnorm res", want, r16, NC * 2);
  WF_K(t->gpu, cast)->load(x32, want, NC, c->stream);
  WF_K(k32, rmsnorm)->forward(y32, rs32, x32, w, 1e-5f, N, C, c->stream);
  WF_K(t->gpu, cast)->store(want, y32, NC, c->stream);
  expect_same_bytes(c, "residual_rmsnorm out", want, y16, NC * 2);
  expect_same_bytes(c, "residual_rmsnorm rstd", rs32, rs16, N * 4);

  void *gu16 = d16(c, gu, 2 * NF), *h16o = d16(c, hact0(c, NF), NF);
  float *gu32 = df(c, hzero(c, 2 * NF), 2 * NF), *h32 = df(c, hzero(c, NF), NF);
  void *dg16 = d16(c, hact0(c, 2 * NF), 2 * NF);
  float *dg32 = df(c, hzero(c, 2 * NF), 2 * NF);
  WF_K(t->gpu, cast)->load(gu32, gu16, 2 * NF, c->stream);
  WF_K(t->gpu, swiglu)->forward(h16o, gu16, N, F, c->stream);
  WF_K(k32, swiglu)->forward(h32, gu32, N, F, c->stream);
  WF_K(t->gpu, cast)->store(want, h32, NF, c->stream);
  expect_same_bytes(c, "swiglu_forward", want, h16o, NF * 2);
  float *dh = df(c, hzero(c, NF), NF);
  WF_K(t->gpu, cast)->load(dh, dh16, NF, c->stream);
  WF_K(t->gpu, swiglu)->backward(dg16, gu16, dh16, N, F, c->stream);
  WF_K(k32, swiglu)->backward(dg32, gu32, dh, N, F, c->stream);
  WF_K(t->gpu, cast)->store(want, dg32, 2 * NF, c->stream);
  expect_same_bytes(c, "swiglu_backward", want, dg16, 2 * NF * 2);

  void *q16 = d16(c, q, BTW);
  float *q32 = df(c, hzero(c, BTW), BTW);
  WF_K(t->gpu, cast)->load(q32, q16, BTW, c->stream);
  WF_K(t->gpu, rope)->forward(q16, d_cs, NULL, B, T, NH, NKV, hs, c->stream);
  WF_K(k32, rope)->forward(q32, d_cs, NULL, B, T, NH, NKV, hs, c->stream);
  WF_K(t->gpu, cast)->store(want, q32, BTW, c->stream);
  expect_same_bytes(c, "rope_forward", want, q16, BTW * 2);
  WF_K(t->gpu, cast)->load(q32, q16, BTW, c->stream); /* the backward map on the rotated values */
  WF_K(t->gpu, rope)->backward(q16, d_cs, NULL, B, T, NH, NKV, hs, c->stream);
  WF_K(k32, rope)->backward(q32, d_cs, NULL, B, T, NH, NKV, hs, c->stream);
  WF_K(t->gpu, cast)->store(want, q32, BTW, c->stream);
  expect_same_bytes(c, "rope_backward", want, q16, BTW * 2);
}

/* Llama's ops in 16 bits: the GPU's 16-bit kernels against the CPU's row blocks; the
 * same tolerances as their fp32 twins (test_rmsnorm, test_swiglu, test_rope, test_gqa)
 * plus one step of the format on each stored output. */
static void storage_llama(ctx *c, const tables16 *t)
{
  const int N = 37, C = 48, F = 40, B = 2, T = 29, NH = 4, NKV = 2, hs = 8;
  const size_t NC = (size_t)N * C, W = (size_t)(NH + 2 * NKV) * hs, BTW = (size_t)B * T * W;
  const size_t BTQ = (size_t)B * T * NH * hs;
  uint16_t *x = hact(c, NC, t->fmt, -2, 2), *out = hact0(c, NC);
  float *w = hrand(c, C, 0.5f, 1.5f), *rstd = hzero(c, N), *d_rstd = df(c, rstd, N);
  void *d_x = d16(c, x, NC), *d_out = d16(c, out, NC);
  WF_K(t->cpu, rmsnorm)->forward(out, rstd, x, w, 1e-5f, N, C, NULL);
  WF_K(t->gpu, rmsnorm)->forward(d_out, d_rstd, d_x, df(c, w, C), 1e-5f, N, C, c->stream);
  expect_stored16(c, t, "rmsnorm_forward out", out, d_out, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "rmsnorm_forward rstd", rstd, d_rstd, N, 0, TOL_SUM);
  float *dout = hrand(c, NC, -1, 1), *dinp = hrand(c, NC, -1, 1), *dw = hrand(c, C, -1, 1);
  float *d_dinp = df(c, dinp, NC), *d_dw = df(c, dw, C);
  WF_K(t->cpu, rmsnorm)->backward(dinp, dw, dout, x, w, rstd, N, C, NULL);
  WF_K(t->gpu, rmsnorm)
      ->backward(d_dinp, d_dw, df(c, dout, NC), d_x, df(c, w, C), df(c, rstd, N), N, C, c->stream);
  expect_close(c, "rmsnorm_backward dinp", dinp, d_dinp, NC, TOL_SUM, TOL_SUM);
  expect_close(c, "rmsnorm_backward dweight", dw, d_dw, C, TOL_SUM, TOL_SUM);

  uint16_t *gu = hact(c, (size_t)N * 2 * F, t->fmt, -4, 4), *h = hact0(c, (size_t)N * F);
  void *d_gu = d16(c, gu, (size_t)N * 2 * F), *d_h = d16(c, h, (size_t)N * F);
  WF_K(t->cpu, swiglu)->forward(h, gu, N, F, NULL);
  WF_K(t->gpu, swiglu)->forward(d_h, d_gu, N, F, c->stream);
  expect_stored16(c, t, "swiglu_forward", h, d_h, (size_t)N * F, TOL_ELEM, TOL_ELEM);
  uint16_t *dh = hact(c, (size_t)N * F, t->fmt, -1, 1);
  uint16_t *dgu = hact(c, (size_t)N * 2 * F, t->fmt, -1, 1); /* written over */
  void *d_dgu = d16(c, dgu, (size_t)N * 2 * F);
  WF_K(t->cpu, swiglu)->backward(dgu, gu, dh, N, F, NULL);
  WF_K(t->gpu, swiglu)->backward(d_dgu, d_gu, d16(c, dh, (size_t)N * F), N, F, c->stream);
  expect_stored16(c, t, "swiglu_backward", dgu, d_dgu, (size_t)N * 2 * F, TOL_ELEM, TOL_ELEM);

  float *cs = hzero(c, (size_t)T * hs);
  wf_rope_table(cs, T, hs, 10000.0, NULL);
  uint16_t *qkv = hact(c, BTW, t->fmt, -1, 1);
  void *d_qkv = d16(c, qkv, BTW);
  WF_K(t->cpu, rope)->forward(qkv, cs, NULL, B, T, NH, NKV, hs, NULL);
  WF_K(t->gpu, rope)->forward(d_qkv, df(c, cs, (size_t)T * hs), NULL, B, T, NH, NKV, hs, c->stream);
  expect_stored16(c, t, "rope_forward", qkv, d_qkv, BTW, TOL_ELEM, TOL_ELEM);

  size_t as = WF_K(t->cpu, attention)->saved(B, T, NH * hs, NH);
  size_t gs = WF_K(t->gpu, attention)->saved(B, T, NH * hs, NH);
  size_t gx = WF_K(t->gpu, attention)->scratch(B, T, NH * hs, NH);
  uint16_t *o = hact0(c, BTQ), *q = hact(c, BTW, t->fmt, -1, 1); /* unrotated: both sides' */
  void *d_q = d16(c, q, BTW);
  float *att = hzero(c, as), *d_att = df(c, hzero(c, gs), gs);
  void *d_o = d16(c, o, BTQ);
  WF_K(t->cpu, attention)->forward(o, att, q, NULL, B, T, NH * hs, NH, NKV, NULL);
  WF_K(t->gpu, attention)->forward(d_o, d_att, d_q, NULL, B, T, NH * hs, NH, NKV, c->stream);
  expect_stored16(c, t, "attention_gqa_forward out", o, d_o, BTQ, TOL_SUM, TOL_SUM);
  uint16_t *dat = hact(c, BTQ, t->fmt, -1, 1);
  uint16_t *dq = hact(c, BTW, t->fmt, -1, 1); /* written over, in the format */
  void *d_dq = d16(c, dq, BTW);
  WF_K(t->cpu, attention)->backward(dq, NULL, dat, q, att, NULL, B, T, NH * hs, NH, NKV, NULL);
  WF_K(t->gpu, attention)
      ->backward(d_dq, df(c, hzero(c, gx), gx), d16(c, dat, BTQ), d_q, d_att, NULL, B, T, NH * hs,
                 NH, NKV, c->stream);
  /* as storage_attention: the CPU reads 16-bit probabilities, the GPU recomputes them in
   * fp32; dk and dv sum over the NH / NKV query heads of their group: step * T * G; both
   * store dqkv rounded (expect_stored16's step) */
  float tol = (float)(T * (NH / NKV) * (t->fmt == WF_PREC_BF16 ? 0x1p-8 : 0x1p-11));
  expect_stored16(c, t, "attention_gqa_backward dqkv", dq, d_dq, BTW, tol, TOL_SUM);
  /* RoPE's backward in place on the same stored gradient (the CPU's) */
  void *d_dr = d16(c, dq, BTW);
  WF_K(t->cpu, rope)->backward(dq, cs, NULL, B, T, NH, NKV, hs, NULL);
  WF_K(t->gpu, rope)->backward(d_dr, df(c, cs, (size_t)T * hs), NULL, B, T, NH, NKV, hs, c->stream);
  expect_stored16(c, t, "rope_backward", dq, d_dr, BTW, TOL_ELEM, TOL_ELEM);
}

static void test_storage(ctx *c)
{
  const int fmts[2] = {WF_PREC_BF16, WF_PREC_FP16};
  const wf_kset *cpu32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  for (int f = 0; f < 2; f++) {
    tables16 t = {fmts[f], wf_kset_as(cpu32, fmts[f]), wf_kset_as(c->k, fmts[f])};
    if (!t.gpu || (int)t.gpu->dt != t.fmt) {
      printf("  FAIL the GPU has no %s table\n", wf_storage_name(t.fmt));
      c->failures++;
      continue;
    }
    printf(" %s\n", wf_storage_name(t.fmt));
    storage_convert(c, &t);
    end_case(c);
    storage_norms(c, &t, 45);
    end_case(c);
    storage_norms(c, &t, 64);
    end_case(c);
    storage_elementwise(c, &t);
    end_case(c);
    storage_xent(c, &t);
    end_case(c);
    storage_matmul(c, &t, 37, 45, 29);
    end_case(c);
    storage_matmul(c, &t, 40, 72, 64);
    end_case(c);
    storage_bias_rounded(c, &t);
    end_case(c);
    storage_attention(c, &t, 2, 77, 2, 64);
    end_case(c);
    storage_attention(c, &t, 1, 33, 2, 160); /* the (T, T) fallback on the GPU */
    end_case(c);
    storage_llama(c, &t);
    end_case(c);
    storage_llama_exact(c, &t);
    end_case(c);
    if (t.fmt == WF_PREC_BF16) {
      storage_attention_tc(c, &t, 1, 77, 3, 64);
      storage_attention_tc(c, &t, 3, 128, 1, 64); /* a shape cuDNN must take */
      storage_attention_tc(c, &t, 1, 130, 1, 128);
    }
  }
}

/* AdamW writing the model's 16-bit copy (each table's adamw_update_store): bit for bit
 * the fp32 update then the table's store on the GPU (the pass it replaces), and the
 * copy within one step of the format of the CPU twin's (the parameters agree within
 * TOL_ELEM, so a stored value may round the other way: expect_stored16). */
static void test_adamw_store(ctx *c)
{
  const size_t n = 100003; /* several blocks, a ragged tail */
  const int fmts[2] = {WF_PREC_BF16, WF_PREC_FP16};
  for (int f = 0; f < 2; f++) {
    tables16 t = {fmts[f], wf_dev_kernels(wf_dev_cpu(), fmts[f]), wf_kset_as(c->k, fmts[f])};
    float *p = hrand(c, n, -1, 1), *m = hrand(c, n, -0.1f, 0.1f), *v = hrand(c, n, 0, 0.01f);
    float *g = df(c, hrand(c, n, -1, 1), n);
    uint16_t *low = hact0(c, n);
    float *p1 = df(c, p, n), *m1 = df(c, m, n), *v1 = df(c, v, n);
    float *p2 = df(c, p, n), *m2 = df(c, m, n), *v2 = df(c, v, n);
    void *want = d16(c, low, n), *got = d16(c, low, n);
    WF_K(c->k, adamw)
        ->update(p1, m1, v1, g, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f, c->stream);
    WF_K(t.gpu, cast)->store(want, p1, n, c->stream);
    WF_K(t.gpu, adamw)
        ->update_store(p2, got, m2, v2, g, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f, c->stream);
    printf(" %s\n", wf_storage_name(t.fmt));
    expect_same_bytes(c, "adamw_update_store params", p1, p2, n * 4);
    expect_same_bytes(c, "adamw_update_store m", m1, m2, n * 4);
    expect_same_bytes(c, "adamw_update_store v", v1, v2, n * 4);
    expect_same_bytes(c, "adamw_update_store copy", want, got, n * 2);
    float *hg = hzero(c, n);
    wf_gpu_stream_sync(c->g, c->stream);
    wf_gpu_memcpy_d2h(c->g, hg, g, n * 4);
    WF_K(t.cpu, adamw)
        ->update_store(p, low, m, v, hg, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f, NULL);
    expect_stored16(c, &t, "adamw_update_store copy (cpu)", low, got, n, TOL_ELEM, TOL_ELEM);
    end_case(c);
  }
}

/* ---- Llama's kernels ------------------------------------------------------------- */

/* RMSNorm and the fused residual + RMSNorm: reductions over C (TOL_SUM); the sum of the
 * fused op is one addition (TOL_EXACT). Rows of very different scale (x1e3, x1e-3: eps
 * dominates) exercise the statistics. */
static void test_rmsnorm(ctx *c)
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

/* RoPE in place on a packed qkv, forward and backward, with the same table on both
 * sides: each output is two products and a sum of values in [-1, 1] (the GPU may fuse
 * them into an FMA), so TOL_EXACT; v heads must come back untouched, which the same
 * comparison checks. hs = 10 (h2 = 5) and 13 rows are no multiple of anything. pos
 * (B,T), host, or NULL: each row's own positions (packed documents), the same arithmetic
 * on another row of the table. */
static void rope_case(ctx *c, int B, int T, int NH, int NKV, int hs, double theta, const int *pos)
{
  const size_t n = (size_t)B * T * (NH + 2 * NKV) * hs, ncs = (size_t)T * hs;
  float *cs = hzero(c, ncs), *x = hrand(c, n, -1, 1), *dx = hrand(c, n, -1, 1);
  wf_rope_table(cs, T, hs, theta, NULL);
  float *d_cs = df(c, cs, ncs), *d_x = df(c, x, n), *d_dx = df(c, dx, n);
  int *d_pos = pos ? di(c, pos, (size_t)B * T) : NULL;
  wf_rope_forward(x, cs, pos, B, T, NH, NKV, hs);
  WF_K(c->k, rope)->forward(d_x, d_cs, d_pos, B, T, NH, NKV, hs, c->stream);
  expect_close(c, pos ? "documents rope_forward qkv" : "rope_forward qkv", x, d_x, n, TOL_EXACT,
               TOL_EXACT);
  wf_rope_backward(dx, cs, pos, B, T, NH, NKV, hs);
  WF_K(c->k, rope)->backward(d_dx, d_cs, d_pos, B, T, NH, NKV, hs, c->stream);
  expect_close(c, pos ? "documents rope_backward dqkv" : "rope_backward dqkv", dx, d_dx, n,
               TOL_EXACT, TOL_EXACT);
}

static void test_rope(ctx *c)
{
  rope_case(c, 3, 13, 6, 2, 10, 500000.0, NULL);
  end_case(c);
  rope_case(c, 2, 77, 4, 4, 64, 10000.0, NULL); /* multi-head, a Llama head size */
}

/* SwiGLU: exp on both sides (TOL_ELEM), tails where exp over/underflows included. */
static void test_swiglu(ctx *c)
{
  const int N = 37, F = 45;
  const size_t NI = (size_t)N * 2 * F, NO = (size_t)N * F;
  float *x = hrand(c, NI, -6, 6);
  x[0] = -30.0f, x[1] = 30.0f, x[2] = -95.0f, x[3] = 95.0f, x[4] = 0.0f;
  float *out = hzero(c, NO), *d_out = df(c, out, NO), *d_x = df(c, x, NI);
  wf_swiglu_forward(out, x, N, F);
  WF_K(c->k, swiglu)->forward(d_out, d_x, N, F, c->stream);
  expect_close(c, "swiglu_forward out", out, d_out, NO, TOL_ELEM, TOL_ELEM);
  float *dout = hrand(c, NO, -1, 1), *dinp = hrand(c, NI, -1, 1), *d_dinp = df(c, dinp, NI);
  wf_swiglu_backward(dinp, x, dout, N, F);
  WF_K(c->k, swiglu)->backward(d_dinp, d_x, df(c, dout, NO), N, F, c->stream);
  expect_close(c, "swiglu_backward dinp", dinp, d_dinp, NI, TOL_ELEM, TOL_ELEM);
}

/* ---- packed documents (attention.h's starts) ------------------------------------------ */

/* Random documents: a row starts a new one at position t > 0 with probability 1/8, so
 * lengths vary from 1 up, and a first row of a single document each time. */
static int *hstarts(ctx *c, int B, int T)
{
  int *s = keep_host(c, calloc((size_t)B * T, sizeof(int)));
  uint64_t draw = c->draw++;
  for (int b = 0; b < B; b++)
    for (int t = 1; t < T; t++) {
      bool cut = b > 0 && wf_rng_uniform(SEED, draw, (uint64_t)b * T + t) < 0.125f;
      s[(size_t)b * T + t] = cut ? t : s[(size_t)b * T + t - 1];
    }
  return s;
}

/* Attention kept to documents on the path runtime.attention `impl` picks (the module logs
 * which; cuDNN refusing its masked graph runs the flash kernels): the fp32 reference
 * against the CPU within TOL_SUM, as attention_case; cuDNN and flash on bf16 operands
 * within the bf16 bound (att16_bound.h, with the starts), cuDNN's factor 2 as in
 * attention_path_case (which path ran is not asked: both bounds hold for either). */
static void doc_attention_case(ctx *c, int B, int T, int NH, int NKV, int hs, int impl)
{
  const int C = NH * hs;
  const size_t BTC = (size_t)B * T * C, QKV = (size_t)B * T * (C + 2 * NKV * hs);
  const size_t ATT = (size_t)B * NH * T * T;
  char name[96];
  WF_K(c->k, attention)->set_impl(impl);
  const size_t saved = WF_K(c->k, attention)->saved(B, T, C, NH),
               scratch = WF_K(c->k, attention)->scratch(B, T, C, NH);
  int lowp = impl == WF_ATTN_REFERENCE ? WF_PREC_NO : WF_PREC_BF16;
  int *starts = hstarts(c, B, T), *d_starts = di(c, starts, (size_t)B * T);
  float *qkv = operand(c, QKV, lowp), *dout = operand(c, BTC, lowp);
  float *out = hzero(c, BTC), *att = hzero(c, ATT), *dqkv = hzero(c, QKV);
  float *d_out = df(c, out, BTC), *d_qkv = df(c, qkv, QKV), *d_att = df(c, hzero(c, saved), saved);
  float *d_dqkv = df(c, dqkv, QKV), *d_scratch = df(c, hzero(c, scratch), scratch);
  wf_attention_gqa_forward(out, att, qkv, starts, B, T, C, NH, NKV);
  wf_attention_gqa_backward(dqkv, hzero(c, ATT), dout, qkv, att, starts, B, T, C, NH, NKV);
  WF_K(c->k, attention)->forward(d_out, d_att, d_qkv, d_starts, B, T, C, NH, NKV, c->stream);
  WF_K(c->k, attention)
      ->backward(d_dqkv, d_scratch, df(c, dout, BTC), d_qkv, d_att, d_starts, B, T, C, NH, NKV,
                 c->stream);
  printf(" documents, B %d T %d, %d heads of %d (%d kv), runtime.attention=%s\n", B, T, NH, hs, NKV,
         path_name(impl));
  if (impl == WF_ATTN_REFERENCE) {
    snprintf(name, sizeof name, "documents %s out", path_name(impl));
    expect_close(c, name, out, d_out, BTC, TOL_SUM, TOL_SUM);
    snprintf(name, sizeof name, "documents %s dqkv", path_name(impl));
    expect_close(c, name, dqkv, d_dqkv, QKV, TOL_SUM, TOL_SUM);
  } else { /* multi-head only: the bound's layout (grouped-query: the reference's case) */
    att16_bound bd = att16_bound_make(qkv, dout, starts, B, T, C, NH);
    snprintf(name, sizeof name, "documents %s out", path_name(impl));
    expect_bound(c, name, out, d_out, bd.out, BTC, 2);
    snprintf(name, sizeof name, "documents %s dqkv", path_name(impl));
    expect_bound(c, name, dqkv, d_dqkv, bd.dqkv, QKV, 2);
    att16_bound_free(&bd);
  }
  WF_K(c->k, attention)->set_impl(WF_ATTN_REFERENCE);
}

/* RoPE and learned positions at each row's own position (t - its document's start):
 * RoPE as rope_case, the position ops' gathered sums as their plain cases. */
static void doc_positions_case(ctx *c)
{
  const int B = 2, T = 77, NH = 4, NKV = 2, hs = 16, C = 24;
  const size_t BTC = (size_t)B * T * C;
  int *starts = hstarts(c, B, T), *pos = keep_host(c, calloc((size_t)B * T, sizeof(int)));
  for (int i = 0; i < B * T; i++)
    pos[i] = i % T - starts[i];
  int *d_pos = di(c, pos, (size_t)B * T);
  rope_case(c, B, T, NH, NKV, hs, 10000.0, pos);
  float *wpe = hrand(c, (size_t)T * C, -1, 1), *out = hrand(c, BTC, -1, 1);
  float *d_out = df(c, out, BTC), *d_wpe = df(c, wpe, (size_t)T * C);
  wf_position_forward(out, wpe, pos, B, T, C);
  WF_K(c->k, position)->forward(d_out, d_wpe, d_pos, B, T, C, c->stream);
  expect_close(c, "documents position_forward", out, d_out, BTC, TOL_EXACT, TOL_EXACT);
  wf_position_backward(wpe, out, pos, B, T, C);
  WF_K(c->k, position)->backward(d_wpe, d_out, d_pos, B, T, C, c->stream);
  expect_close(c, "documents position_backward", wpe, d_wpe, (size_t)T * C, TOL_SUM, TOL_SUM);
}

/* Packed documents on every attention path and the position ops; T = 77 is no multiple
 * of the tiles, 256 one cuDNN takes on every version. */
static void test_documents(ctx *c)
{
  static const int impls[] = {WF_ATTN_REFERENCE, WF_ATTN_FLASH, WF_ATTN_CUDNN};
  for (size_t i = 0; i < sizeof impls / sizeof *impls; i++) {
    doc_attention_case(c, 2, 77, 2, 2, 64, impls[i]);
    end_case(c);
    doc_attention_case(c, 2, 256, 2, 2, 128, impls[i]);
    end_case(c);
  }
  doc_attention_case(c, 2, 77, 4, 2, 64, WF_ATTN_REFERENCE); /* grouped-query */
  end_case(c);
  doc_attention_case(c, 1, 33, 2, 2, 160, WF_ATTN_REFERENCE); /* the (T, T) fallback */
  end_case(c);
  doc_positions_case(c);
}

/* Grouped-query attention, each side with the buffers its own table sizes (as
 * attention_case): out and dqkv within TOL_SUM. With NKV == NH the GPU's grouped entry
 * must also give exactly what its multi-head entry gives (the same kernels). */
static void gqa_case(ctx *c, int B, int T, int NH, int NKV, int hs)
{
  const int C = NH * hs;
  const size_t BTC = (size_t)B * T * C, QKV = (size_t)B * T * (C + 2 * NKV * hs);
  const size_t ATT = (size_t)B * NH * T * T;
  const size_t saved = WF_K(c->k, attention)->saved(B, T, C, NH);
  const size_t scratch = WF_K(c->k, attention)->scratch(B, T, C, NH);
  char name[96];
  float *qkv = hrand(c, QKV, -1, 1), *out = hzero(c, BTC), *att = hzero(c, ATT);
  float *d_out = df(c, out, BTC), *d_qkv = df(c, qkv, QKV);
  float *d_att = df(c, hzero(c, saved), saved);
  wf_attention_gqa_forward(out, att, qkv, NULL, B, T, C, NH, NKV);
  WF_K(c->k, attention)->forward(d_out, d_att, d_qkv, NULL, B, T, C, NH, NKV, c->stream);
  snprintf(name, sizeof name, "gqa_forward %d/%d hs=%d T=%d", NH, NKV, hs, T);
  expect_close(c, name, out, d_out, BTC, TOL_SUM, TOL_SUM);

  float *dout = hrand(c, BTC, -1, 1), *dqkv = hrand(c, QKV, -1, 1);
  float *d_dout = df(c, dout, BTC), *d_dqkv = df(c, dqkv, QKV);
  float *d_scratch = df(c, hzero(c, scratch), scratch);
  wf_attention_gqa_backward(dqkv, hzero(c, ATT), dout, qkv, att, NULL, B, T, C, NH, NKV);
  WF_K(c->k, attention)
      ->backward(d_dqkv, d_scratch, d_dout, d_qkv, d_att, NULL, B, T, C, NH, NKV, c->stream);
  snprintf(name, sizeof name, "gqa_backward %d/%d hs=%d dqkv", NH, NKV, hs);
  expect_close(c, name, dqkv, d_dqkv, QKV, TOL_SUM, TOL_SUM);
  if (NKV != NH)
    return;
  float *d_out2 = df(c, hzero(c, BTC), BTC), *d_att2 = df(c, hzero(c, saved), saved);
  WF_K(c->k, attention)->forward(d_out2, d_att2, d_qkv, NULL, B, T, C, NH, NH, c->stream);
  float *got = hzero(c, BTC);
  if (wf_gpu_stream_sync(c->g, c->stream) != WF_OK ||
      wf_gpu_memcpy_d2h(c->g, got, d_out2, BTC * sizeof(float)) != WF_OK)
    got[0] = NAN;
  expect_close(c, "gqa_forward = attention_forward", got, d_out, BTC, 0, 0);
}

static void test_gqa(ctx *c)
{
  gqa_case(c, 2, 9, 4, 2, 5);
  end_case(c);
  gqa_case(c, 2, 77, 4, 1, 64); /* one kv head (multi-query); T past a 64-row block */
  end_case(c);
  gqa_case(c, 1, 77, 6, 3, 128);
  end_case(c);
  gqa_case(c, 2, 33, 3, 3, 32); /* NKV == NH */
  end_case(c);
  gqa_case(c, 1, 33, 4, 2, 160); /* past the flash kernels: the (T, T) fallback */
  end_case(c);
  gqa_case(c, 1, 21, 2, 2, 160); /* the fallback with NKV == NH */
  end_case(c);
}

/* Column sums at GPT-2's width over many rows (colsum.cu cuts them over rows too):
 * layernorm's dweight and dbias and a linear layer's dbias at C = 768, N = 8192, against
 * the twin within TOL_COLSUM, and a second run from the same start gives the same bits. */
static void test_colsums(ctx *c)
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
static void test_gemm_allocates_nothing(ctx *c)
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

/* The 64-bit checksum (checksum.h): the CPU's value exactly, either sign, and one
 * changed element or two swapped ones change it. */
static void test_checksum(ctx *c)
{
  const size_t n = ((size_t)1 << 20) + 3;
  float *x = hrand(c, n, -1, 1);
  float *d_x = df(c, x, n);
  uint64_t *d_h = dcopy(c, &(uint64_t){7}, sizeof(uint64_t)), want, got;
  for (int neg = 0; neg < 2; neg++) {
    wf_checksum(&want, x, n, neg);
    WF_K(c->k, checksum)->sum(d_h, d_x, n, neg, c->stream);
    bool ok = wf_gpu_stream_sync(c->g, c->stream) == WF_OK &&
              wf_gpu_memcpy_d2h(c->g, &got, d_h, sizeof got) == WF_OK && got == want;
    printf("  %-4s %-28s cpu %016llx gpu %016llx\n", ok ? "ok" : "FAIL",
           neg ? "checksum, negated" : "checksum", (unsigned long long)want,
           (unsigned long long)got);
    c->failures += !ok;
  }
  uint64_t h0, h1, h2;
  wf_checksum(&h0, x, n, 0);
  float t = x[5];
  x[5] = nextafterf(x[5], 2.0f); /* one bit */
  wf_checksum(&h1, x, n, 0);
  x[5] = x[6], x[6] = t; /* x[5] and x[6] swapped */
  wf_checksum(&h2, x, n, 0);
  bool ok = h0 != h1 && h0 != h2 && h1 != h2;
  printf("  %-4s %-28s one bit and a swap change it\n", ok ? "ok" : "FAIL", "checksum");
  c->failures += !ok;
}

/* The device seam counts the host's waits for the GPU per call (wf_device.h): a copy
 * to the device, a kernel and a write view wait for nothing; a read, a stream or event
 * synchronisation, a read view and a write-back wait once each. */
static void test_host_syncs(ctx *c)
{
  char why[256] = "";
  wf_dev *dev = NULL;
  wf_event *ev = NULL;
  float h[64] = {1}, *d = NULL;
  wf_dev_view v;
  if (wf_dev_open_cuda(&dev, c->g, why, sizeof why) != WF_OK ||
      wf_dev_alloc_floats(dev, &d, 64) != WF_OK || wf_dev_event_create(dev, &ev) != WF_OK) {
    printf("  FAIL the CUDA device: %s\n", why);
    c->failures++;
    goto exit;
  }
  struct {
    const char *what;
    int want;
  } step[] = {{"copy to the device", 0}, {"kernel", 0},      {"wf_dev_read", 1},
              {"event sync", 1},         {"stream sync", 1}, {"read view", 1},
              {"unmap (read)", 0},       {"write view", 0},  {"unmap (write)", 1}};
  for (size_t i = 0; i < WF_ARRAY_LEN(step); i++) {
    uint64_t s0 = wf_dev_host_syncs(dev);
    wf_status st = WF_OK;
    switch (i) {
    case 0: st = wf_dev_copy(dev, d, h, sizeof h, WF_COPY_H2D, NULL); break;
    case 1: WF_K(wf_dev_kernels(dev, WF_DT_F32), norm)->scale(d, 2.0f, 64, NULL); break;
    case 2: st = wf_dev_read(dev, h, d, sizeof h); break;
    case 3:
      st = wf_dev_event_record(dev, ev, NULL);
      st = st == WF_OK ? wf_dev_event_sync(dev, ev) : st;
      break;
    case 4: st = wf_dev_stream_sync(dev, NULL); break;
    case 5: st = wf_dev_map(dev, &v, d, sizeof h, WF_MAP_READ); break;
    case 6: st = wf_dev_unmap(dev, &v); break;
    case 7: st = wf_dev_map(dev, &v, d, sizeof h, WF_MAP_WRITE); break;
    case 8: memset(v.host, 0, sizeof h), st = wf_dev_unmap(dev, &v); break;
    }
    int got = (int)(wf_dev_host_syncs(dev) - s0);
    bool ok = st == WF_OK && got == step[i].want;
    printf("  %-4s %-28s %d wait(s)\n", ok ? "ok" : "FAIL", step[i].what, got);
    c->failures += !ok;
  }
  if (h[0] != 2.0f) {
    printf("  FAIL the kernel's result read back: %g, want 2\n", h[0]);
    c->failures++;
  }
exit:
  wf_dev_event_destroy(dev, ev);
  if (dev)
    wf_dev_free(dev, d);
  wf_dev_close(dev);
}

static const struct {
  const char *name;
  void (*fn)(ctx *c);
} cases[] = {
    {"encoder", test_encoder},
    {"encoder_vp", test_encoder_vp},
    {"encoder backward, deterministic", test_encoder_deterministic},
    {"column sums at C 768", test_colsums},
    {"GEMM scratch", test_gemm_allocates_nothing},
    {"checksum", test_checksum},
    {"host syncs of the device seam", test_host_syncs},
    {"layernorm", test_layernorm},
    {"matmul", test_matmul},
    {"matmul+gelu", test_matmul_gelu},
    {"residual+layernorm", test_residual_layernorm},
    {"attention", test_attention},
    {"attention paths", test_attention_paths},
    {"attention bf16 gqa", test_attention_gqa16},
    {"classifier bf16", test_classifier},
    {"launches", test_launches},
    {"gelu+residual", test_gelu_residual},
    {"xent", test_xent},
    {"adamw", test_adamw},
    {"adamw writing the 16-bit copy", test_adamw_store},
    {"sumsq+scale", test_sumsq_scale},
    {"xent parts+loss", test_xent_parts},
    {"tokens", test_tokens},
    {"round", test_round},
    {"16-bit storage", test_storage},
    {"rmsnorm", test_rmsnorm},
    {"rope", test_rope},
    {"swiglu", test_swiglu},
    {"attention (grouped-query)", test_gqa},
    {"packed documents", test_documents},
};

int main(void)
{
  char why[512] = "";
  ctx c = {0};
  wf_status st = wf_gpu_open(&c.g, why, sizeof why);
  if (st == WF_ENODEV) {
    printf("skip: no GPU: %s\n", why);
    return 77;
  }
  if (st != WF_OK) {
    printf("FAIL: %s\n", why);
    return 1;
  }
  const wf_kreg *reg = wf_kreg_check(wf_gpu_kernel_table(c.g));
  wf_kset sets[WF_DT_COUNT];
  if (reg)
    wf_kset_resolve(sets, reg);
  c.k = reg ? &sets[WF_DT_F32] : NULL;
  void *stream = NULL;
  if (!c.k || wf_gpu_set_device(c.g, 0) != WF_OK || wf_gpu_stream_create(c.g, &stream) != WF_OK) {
    fprintf(stderr, "GPU present but the kernel registry or a stream is unusable\n");
    return 1;
  }
  c.stream = stream;
  wf_mem_stats before, after;
  wf_mem_get_stats(&before);
  for (size_t i = 0; i < WF_ARRAY_LEN(cases); i++) {
    printf("%s\n", cases[i].name);
    cases[i].fn(&c);
    end_case(&c);
  }
  if (c.k->reg->last_error() != WF_OK) {
    printf("FAIL a launch reported an error (logged above)\n");
    c.failures++;
  }
  wf_mem_get_stats(&after);
  if (after.current[WF_MEM_DEVICE] != before.current[WF_MEM_DEVICE]) {
    printf("FAIL device memory accounting: %lld bytes before, %lld after\n",
           (long long)before.current[WF_MEM_DEVICE], (long long)after.current[WF_MEM_DEVICE]);
    c.failures++;
  }
  wf_gpu_stream_destroy(c.g, c.stream);
  wf_gpu_close(c.g);
  printf("%d failure(s)\n", c.failures);
  return c.failures ? 1 : 0;
}
