/*
 * twin_storage.c - CUDA kernels against their CPU twins (twin.h): the 16-bit tables (storage.h:
 * bf16 and fp16 activations) against the CPU's, and AdamW writing the 16-bit weight copy.
 */
#include "../common/att16_bound.h"
#include "twin.h"

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

void test_storage(ctx *c)
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
void test_adamw_store(ctx *c)
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
