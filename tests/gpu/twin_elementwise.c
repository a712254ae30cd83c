/*
 * twin_elementwise.c - CUDA kernels against their CPU twins (twin.h): elementwise ops: launches of
 * every size, GELU + residual, AdamW, sum of squares and scale, rounding to 16 bits, RoPE, SwiGLU.
 */
#include "twin.h"

/* The launch count grows by one per launch (and by none for an empty call). */
void test_launches(ctx *c)
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

void test_gelu_residual(ctx *c)
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

void test_adamw(ctx *c)
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

/* Accumulation into a non-zero start checks "adds into" as well as the sum. */
void test_sumsq_scale(ctx *c)
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

/* Random values over 2^-30 .. 2^20 of both signs (both formats' subnormals, normals
 * and fp16's overflow), then the edge cases: ties of each format, the largest finite
 * values and their overflow thresholds, subnormals, zeros, infinities and a NaN. */
void test_round(ctx *c)
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

/* RoPE in place on a packed qkv, forward and backward, with the same table on both
 * sides: each output is two products and a sum of values in [-1, 1] (the GPU may fuse
 * them into an FMA), so TOL_EXACT; v heads must come back untouched, which the same
 * comparison checks. hs = 10 (h2 = 5) and 13 rows are no multiple of anything. pos
 * (B,T), host, or NULL: each row's own positions (packed documents), the same arithmetic
 * on another row of the table. */
void rope_case(ctx *c, int B, int T, int NH, int NKV, int hs, double theta, const int *pos)
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

void test_rope(ctx *c)
{
  rope_case(c, 3, 13, 6, 2, 10, 500000.0, NULL);
  end_case(c);
  rope_case(c, 2, 77, 4, 4, 64, 10000.0, NULL); /* multi-head, a Llama head size */
}

/* SwiGLU: exp on both sides (TOL_ELEM), tails where exp over/underflows included. */
void test_swiglu(ctx *c)
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
