/*
 * test_storage.c - activations stored in 16 bits (kernels/storage.h) and the CPU's
 * 16-bit kernels, through the CPU device's tables of each format (wf_dev_kernels, wf_device.h).
 *
 *  - Storing: the 16 bits stored for x widen to exactly what round.h rounds x to (bf16
 *    and fp16; round.h is itself checked against an independent reference in
 *    test_round.c): every fp32 exponent, the subnormals, the ties, overflow, NaN and
 *    +-inf, -0. Loading is exact (store(load(h)) == h for every 16-bit pattern that is
 *    not a NaN).
 *  - Each 16-bit kernel (the table's entries that take activations) equals, bit for
 *    bit, store(the fp32 table's entry on the loaded inputs): the inputs are drawn and
 *    stored, loaded back, the fp32 kernel runs on the loaded values, and its outputs,
 *    stored, must be the 16-bit kernel's bytes; fp32 outputs (statistics, gradients)
 *    must be equal floats. That is the definition in storage.h: the same computation,
 *    only the storage differs.
 *  - The GEMMs (matmul_*): the 16-bit forms accumulate exact products in fp32 panel by
 *    panel, so they may sum in another order than one sgemm over the loaded operands.
 *    Two sums of the same K exact products in different orders differ by at most
 *    2 K u sum_k |a_k b_k| (u = 2^-24; each recursive sum is within (K-1) u sum |.| of
 *    the exact one, Higham's gamma_{K-1}), so the fp32 outputs are checked against that
 *    bound per element; a stored output may then round across one tie: within that
 *    bound plus one ulp of the format.
 */
#include <stdbool.h>
#include <string.h>

#include "check.h"
#include "wf_device.h"
#include "wf_kernels.h"

#define U32 (1.0 / 16777216.0) /* 2^-24: fp32's unit roundoff */

static const int FMTS[2] = {WF_PREC_BF16, WF_PREC_FP16};

static uint32_t bits(float x)
{
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float from_bits(uint32_t u)
{
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static const wf_kset *table(int fmt)
{
  const wf_kset *k = wf_kset_as(wf_dev_kernels(wf_dev_cpu(), WF_DT_F32), fmt);
  assert_non_null(k);
  assert_int_equal(k->dt, fmt);
  return k;
}

/* ---- storing and loading ---------------------------------------------------------------- */

static void check_store_one(int fmt, float x)
{
  uint16_t h;
  float back, want;
  wf_storage_store(&h, &x, 1, fmt);
  wf_storage_load(&back, &h, 1, fmt);
  (fmt == WF_PREC_BF16 ? wf_round_bf16 : wf_round_fp16)(&want, &x, 1);
  if (isnan(want) ? !isnan(back) : bits(back) != bits(want)) {
    print_error("%s: store(%a) loads as %a, round.h says %a\n", wf_storage_name(fmt), (double)x,
                (double)back, (double)want);
    fail();
  }
}

static void test_store_matches_round(void **state)
{
  static const float special[] = {0.0f,      -0.0f,    1.0f,      0x1.01p0f,  -0x1.01p0f,
                                  0x1.03p0f, 65504.0f, 65519.0f,  65520.0f,   -65520.0f,
                                  0x1p-14f,  0x1p-24f, 0x1p-25f,  0x1.8p-25f, 0x1p-149f,
                                  3.4e38f,   INFINITY, -INFINITY, NAN,        0x1.fffffep127f};
  for (int f = 0; f < 2; f++) {
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
      check_store_one(FMTS[f], special[i]);
    /* every exponent, random significands and both signs */
    uint64_t s = 7;
    for (uint32_t e = 0; e < 255; e++)
      for (int r = 0; r < 64; r++) {
        uint32_t m = (uint32_t)(urand(&s) * 8388608.0);
        uint32_t sign = (uint32_t)(r & 1) << 31;
        check_store_one(FMTS[f], from_bits(sign | e << 23 | m));
        check_store_one(FMTS[f], from_bits(sign | e << 23 | (m & ~0xfffu) | 0x1000u));
      }
  }
}

static void test_load_exact(void **state)
{
  for (int f = 0; f < 2; f++)
    for (uint32_t h = 0; h < 65536; h++) {
      uint16_t in = (uint16_t)h, out;
      float x;
      wf_storage_load(&x, &in, 1, FMTS[f]);
      if (isnan(x))
        continue;
      wf_storage_store(&out, &x, 1, FMTS[f]);
      if (out != in) {
        print_error("%s: %04x loads as %a and stores back as %04x\n", wf_storage_name(FMTS[f]), h,
                    (double)x, out);
        fail();
      }
    }
}

/* The table entries agree with the direct functions and with each other. */
static void test_tables(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  assert_int_equal(k32->dt, WF_PREC_NO);
  assert_ptr_equal(wf_kset_as(k32, WF_PREC_NO), k32);
  assert_null(wf_kset_as(k32, 99));
  for (int f = 0; f < 2; f++) {
    const wf_kset *k = table(FMTS[f]);
    assert_ptr_equal(wf_kset_as(k, WF_PREC_NO), k32);
    assert_ptr_equal(wf_kset_as(k, FMTS[f]), k);
    assert_ptr_equal(WF_K(k, adamw)->update, WF_K(k32, adamw)->update); /* no activation */
    assert_ptr_equal(WF_K(k, norm), WF_K(k32, norm)); /* an op of no element type: one table */
  }
}

/* ---- kernels ---------------------------------------------------------------------------- */

/* Activations in both forms: n values drawn in [lo, hi), stored (h) and loaded back (x). */
typedef struct act {
  uint16_t *h;
  float *x;
  size_t n;
} act;

static act act_new(size_t n, int fmt, double lo, double hi, uint64_t *s)
{
  act a = {malloc(n * sizeof(uint16_t)), malloc(n * sizeof(float)), n};
  fill(a.x, n, lo, hi, s);
  wf_storage_store(a.h, a.x, n, fmt);
  wf_storage_load(a.x, a.h, n, fmt);
  return a;
}

static void act_free(act *a)
{
  free(a->h);
  free(a->x);
}

/* The 16-bit output h equals the fp32 output x stored. */
static void expect_stored(const char *what, int fmt, const uint16_t *h, const float *x, size_t n)
{
  uint16_t *want = malloc(n * sizeof *want);
  wf_storage_store(want, x, n, fmt);
  for (size_t i = 0; i < n; i++)
    if (h[i] != want[i]) {
      print_error("%s (%s)[%zu]: %04x, the fp32 kernel's %a stores as %04x\n", what,
                  wf_storage_name(fmt), i, h[i], (double)x[i], want[i]);
      free(want);
      fail();
    }
  free(want);
}

static void expect_equal(const char *what, int fmt, const float *a, const float *b, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (bits(a[i]) != bits(b[i])) {
      print_error("%s (%s)[%zu]: %a, the fp32 kernel's %a\n", what, wf_storage_name(fmt), i,
                  (double)a[i], (double)b[i]);
      fail();
    }
}

#define N 48
#define C 96

static void test_layernorm(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  for (int f = 0; f < 2; f++) {
    int fmt = FMTS[f];
    const wf_kset *k = table(fmt);
    uint64_t s = 11 + f;
    act x = act_new(N * C, fmt, -3, 5, &s), a = act_new(N * C, fmt, -2, 2, &s);
    float w[C], b[C], *res = zeros(N * C), *y32 = zeros(N * C), *bsum = zeros(N * C);
    float m32[N], r32[N], m16[N], r16[N];
    uint16_t *y16 = calloc(N * C, 2), *res16 = calloc(N * C, 2);
    fill(w, C, 0.5, 1.5, &s), fill(b, C, -0.5, 0.5, &s), fill(bsum, N * C, -1, 1, &s);
    WF_K(k32, layernorm)->forward(y32, m32, r32, x.x, w, b, N, C, NULL);
    WF_K(k, layernorm)->forward(y16, m16, r16, x.h, w, b, N, C, NULL);
    expect_stored("layernorm_forward out", fmt, y16, y32, N * C);
    expect_equal("layernorm_forward mean", fmt, m16, m32, N);
    expect_equal("layernorm_forward rstd", fmt, r16, r32, N);
    /* residual: res = store(a + b), ln = the layernorm of the stored res */
    WF_K(k, layernorm)->residual_forward(res16, y16, m16, r16, a.h, bsum, w, b, N, C, NULL);
    WF_K(k32, residual)->forward(res, a.x, bsum, (size_t)N * C, NULL);
    expect_stored("residual_layernorm res", fmt, res16, res, N * C);
    wf_storage_load(res, res16, N * C, fmt);
    WF_K(k32, layernorm)->forward(y32, m32, r32, res, w, b, N, C, NULL);
    expect_stored("residual_layernorm ln", fmt, y16, y32, N * C);
    expect_equal("residual_layernorm rstd", fmt, r16, r32, N);
    /* backward: dinp, dweight, dbias fp32, added into */
    float *dy = zeros(N * C), *dx32 = zeros(N * C), *dx16 = zeros(N * C);
    float dw32[C] = {0}, db32[C] = {0}, dw16[C] = {0}, db16[C] = {0};
    fill(dy, N * C, -1, 1, &s);
    fill(dx32, N * C, -1, 1, &s);
    memcpy(dx16, dx32, N * C * sizeof(float));
    WF_K(k32, layernorm)->backward(dx32, dw32, db32, dy, x.x, w, m32, r32, N, C, NULL);
    WF_K(k, layernorm)->backward(dx16, dw16, db16, dy, x.h, w, m32, r32, N, C, NULL);
    expect_equal("layernorm_backward dinp", fmt, dx16, dx32, N * C);
    expect_equal("layernorm_backward dweight", fmt, dw16, dw32, C);
    expect_equal("layernorm_backward dbias", fmt, db16, db32, C);
    act_free(&x), act_free(&a);
    free(res), free(y32), free(bsum), free(y16), free(res16), free(dy), free(dx32), free(dx16);
  }
}

/* AdamW writing the 16-bit copy (adamw_update_store): bit for bit adamw_update then
 * store, in every table, on a vector the threads split unevenly and whose blocks
 * (4096) end mid-thread; low NULL is adamw_update alone. */
static void test_adamw_store(void **state)
{
  enum { P = 100003 };
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  for (int f = -1; f < 2; f++) {
    int fmt = f < 0 ? WF_PREC_NO : FMTS[f];
    const wf_kset *k = f < 0 ? k32 : table(fmt);
    uint64_t s = 41 + f;
    float *p[2], *m[2], *v[2], *g = zeros(P);
    void *low = calloc(P, 4), *want = calloc(P, 4);
    for (int i = 0; i < 2; i++)
      p[i] = zeros(P), m[i] = zeros(P), v[i] = zeros(P);
    fill(p[0], P, -1, 1, &s), fill(m[0], P, -0.1, 0.1, &s), fill(v[0], P, 0, 0.01, &s);
    fill(g, P, -1, 1, &s);
    memcpy(p[1], p[0], P * 4), memcpy(m[1], m[0], P * 4), memcpy(v[1], v[0], P * 4);
    WF_K(k32, adamw)
        ->update(p[0], m[0], v[0], g, P, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f, NULL);
    WF_K(k, cast)->store(want, p[0], P, NULL);
    WF_K(k, adamw)->update_store(p[1], low, m[1], v[1], g, P, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                                 0.5f, NULL);
    assert_memory_equal(p[1], p[0], P * 4);
    assert_memory_equal(m[1], m[0], P * 4);
    assert_memory_equal(v[1], v[0], P * 4);
    assert_memory_equal(low, want, P * wf_storage_size(fmt));
    WF_K(k, adamw)->update_store(p[1], NULL, m[1], v[1], g, P, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 6,
                                 0.5f, NULL);
    WF_K(k32, adamw)
        ->update(p[0], m[0], v[0], g, P, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 6, 0.5f, NULL);
    assert_memory_equal(p[1], p[0], P * 4);
    for (int i = 0; i < 2; i++)
      free(p[i]), free(m[i]), free(v[i]);
    free(g), free(low), free(want);
  }
}

static void test_elementwise(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  size_t n = 1000; /* not a multiple of the kernels' blocks */
  for (int f = 0; f < 2; f++) {
    int fmt = FMTS[f];
    const wf_kset *k = table(fmt);
    uint64_t s = 21 + f;
    act x = act_new(n, fmt, -4, 4, &s), a = act_new(n, fmt, -4, 4, &s);
    act dy = act_new(n, fmt, -1, 1, &s); /* stored, as the fcproj GEMM's backward writes it */
    float *y32 = zeros(n), *b = zeros(n), *d32 = zeros(n), *d16 = zeros(n);
    uint16_t *y16 = calloc(n, 2);
    fill(b, n, -1, 1, &s), fill(d32, n, -1, 1, &s);
    memcpy(d16, d32, n * sizeof(float));
    WF_K(k32, gelu)->forward(y32, x.x, n, NULL);
    WF_K(k, gelu)->forward(y16, x.h, n, NULL);
    expect_stored("gelu_forward", fmt, y16, y32, n);
    WF_K(k32, gelu)->backward(d32, x.x, dy.x, n, NULL); /* both write over what was there */
    WF_K(k, gelu)->backward(y16, x.h, dy.h, n, NULL);
    expect_stored("gelu_backward", fmt, y16, d32, n);
    WF_K(k32, residual)->forward(y32, a.x, b, n, NULL);
    WF_K(k, residual)->forward(y16, a.h, b, n, NULL);
    expect_stored("residual_forward", fmt, y16, y32, n);
    WF_K(k, residual)->forward(a.h, a.h, b, n, NULL); /* in place */
    expect_stored("residual_forward in place", fmt, a.h, y32, n);
    WF_K(k, cast)->store(y16, b, n, NULL);
    WF_K(k, cast)->load(d16, y16, n, NULL);
    WF_K(k32, cast)->store(y32, d16, n, NULL); /* the fp32 table copies */
    expect_stored("store", fmt, y16, y32, n);
    act_free(&x), act_free(&a), act_free(&dy);
    free(y32), free(b), free(d32), free(d16), free(y16);
  }
}

static void test_xent(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  const int V = 200, LD = 256, v0 = 100; /* a vocabulary slice with padding columns */
  for (int f = 0; f < 2; f++) {
    int fmt = FMTS[f];
    const wf_kset *k = table(fmt);
    uint64_t s = 31 + f;
    act l = act_new((size_t)N * LD, fmt, -6, 6, &s);
    int tg[N];
    for (int i = 0; i < N; i++)
      tg[i] = (int)(urand(&s) * 400);
    float mx32[N], se32[N], tl32[N], mx16[N], se16[N], tl16[N];
    WF_K(k32, xent)->stats(mx32, se32, tl32, l.x, tg, N, V, LD, v0, NULL);
    WF_K(k, xent)->stats(mx16, se16, tl16, l.h, tg, N, V, LD, v0, NULL);
    expect_equal("xent_stats max", fmt, mx16, mx32, N);
    expect_equal("xent_stats sumexp", fmt, se16, se32, N);
    expect_equal("xent_stats target", fmt, tl16, tl32, N);
    float *d32 = zeros((size_t)N * LD);
    WF_K(k32, xent)->backward(d32, l.x, mx32, se32, tg, 0.01f, N, V, LD, v0, NULL);
    WF_K(k, xent)->backward(l.h, l.h, mx32, se32, tg, 0.01f, N, V, LD, v0, NULL); /* in place */
    expect_stored("xent_backward", fmt, l.h, d32, (size_t)N * LD);
    act_free(&l);
    free(d32);
  }
}

static void test_attention(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  const int B = 2, T = 37, CH = 48, NH = 3; /* T past no block boundary, hs 16 */
  size_t nq = (size_t)B * T * 3 * CH, no = (size_t)B * T * CH, na = (size_t)B * NH * T * T;
  for (int f = 0; f < 2; f++) {
    int fmt = FMTS[f];
    const wf_kset *k = table(fmt);
    uint64_t s = 41 + f;
    act qkv = act_new(nq, fmt, -2, 2, &s);
    float *o32 = zeros(no), *a32 = zeros(na), *a16w = zeros(na);
    uint16_t *o16 = calloc(no, 2);
    void *a16 = calloc(WF_K(k, attention)->saved(B, T, CH, NH), sizeof(float));
    assert_true(WF_K(k, attention)->saved(B, T, CH, NH) * 4 >= na * 2);
    WF_K(k32, attention)->forward(o32, a32, qkv.x, NULL, B, T, CH, NH, NH, NULL);
    WF_K(k, attention)->forward(o16, a16, qkv.h, NULL, B, T, CH, NH, NH, NULL);
    expect_stored("attention_forward out", fmt, o16, o32, no);
    expect_stored("attention_forward att", fmt, a16, a32, na);
    /* backward from the stored probabilities: the fp32 kernel on them, dqkv stored */
    act dout = act_new(no, fmt, -1, 1, &s); /* stored, as attproj's backward writes it */
    float *dq32 = zeros(nq);
    uint16_t *dq16 = calloc(nq, 2);
    float *sc = zeros(WF_K(k32, attention)->scratch(B, T, CH, NH));
    fill(dq32, nq, -1, 1, &s);
    wf_storage_load(a16w, a16, na, fmt);
    WF_K(k32, attention)->backward(dq32, sc, dout.x, qkv.x, a16w, NULL, B, T, CH, NH, NH, NULL);
    WF_K(k, attention)->backward(dq16, NULL, dout.h, qkv.h, a16, NULL, B, T, CH, NH, NH, NULL);
    expect_stored("attention_backward dqkv", fmt, dq16, dq32, nq);
    act_free(&qkv), act_free(&dout);
    free(o32), free(a32), free(a16w), free(o16), free(a16), free(dq32), free(dq16);
    free(sc);
  }
}

/* Llama's ops: RMSNorm, SwiGLU and RoPE at shapes that cross the CPU forms' row blocks
 * (rmsnorm.c, rope.c, swiglu.c: 2^16 floats of one operand per block), grouped-query attention with
 * NKV = NH / 2. */
static void test_llama(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  const int R = 1500, CR = 96, F = 96, B = 2, T = 1100, NH = 4, NKV = 2, hs = 16;
  const size_t nr = (size_t)R * CR, nw = (size_t)(NH + 2 * NKV) * hs, nq = (size_t)B * T * nw;
  for (int f = 0; f < 2; f++) {
    int fmt = FMTS[f];
    const wf_kset *k = table(fmt);
    uint64_t s = 61 + f;
    act x = act_new(nr, fmt, -3, 3, &s), gu = act_new((size_t)R * 2 * F, fmt, -4, 4, &s);
    float w[96], *y32 = zeros(nr), r32[1500], r16[1500], *h32 = zeros((size_t)R * F);
    uint16_t *y16 = calloc(nr, 2), *h16 = calloc((size_t)R * F, 2);
    fill(w, CR, 0.5, 1.5, &s);
    WF_K(k32, rmsnorm)->forward(y32, r32, x.x, w, 1e-5f, R, CR, NULL);
    WF_K(k, rmsnorm)->forward(y16, r16, x.h, w, 1e-5f, R, CR, NULL);
    expect_stored("rmsnorm_forward out", fmt, y16, y32, nr);
    expect_equal("rmsnorm_forward rstd", fmt, r16, r32, R);
    float *dy = zeros(nr), *dx32 = zeros(nr), *dx16 = zeros(nr), dw32[96] = {0}, dw16[96] = {0};
    fill(dy, nr, -1, 1, &s);
    WF_K(k32, rmsnorm)->backward(dx32, dw32, dy, x.x, w, r32, R, CR, NULL);
    WF_K(k, rmsnorm)->backward(dx16, dw16, dy, x.h, w, r32, R, CR, NULL);
    expect_equal("rmsnorm_backward dinp", fmt, dx16, dx32, nr);
    expect_equal("rmsnorm_backward dweight", fmt, dw16, dw32, CR);
    WF_K(k32, swiglu)->forward(h32, gu.x, R, F, NULL);
    WF_K(k, swiglu)->forward(h16, gu.h, R, F, NULL);
    expect_stored("swiglu_forward", fmt, h16, h32, (size_t)R * F);
    act dh = act_new((size_t)R * F, fmt, -1, 1, &s); /* as the down GEMM's backward writes it */
    float *dg32 = nans((size_t)R * 2 * F);
    uint16_t *dg16 = calloc((size_t)R * 2 * F, 2);
    WF_K(k32, swiglu)->backward(dg32, gu.x, dh.x, R, F, NULL); /* written, from NaN */
    WF_K(k, swiglu)->backward(dg16, gu.h, dh.h, R, F, NULL);
    expect_stored("swiglu_backward", fmt, dg16, dg32, (size_t)R * 2 * F);
    /* RoPE in place: the rotated fp32 copy stored is the 16-bit kernel's */
    act q = act_new(nq, fmt, -2, 2, &s);
    float *cs = zeros((size_t)T * hs);
    wf_rope_table(cs, T, hs, 10000.0, NULL);
    WF_K(k32, rope)->forward(q.x, cs, NULL, B, T, NH, NKV, hs, NULL);
    WF_K(k, rope)->forward(q.h, cs, NULL, B, T, NH, NKV, hs, NULL);
    expect_stored("rope_forward", fmt, q.h, q.x, nq);
    act_free(&x), act_free(&gu), act_free(&q), act_free(&dh);
    free(y32), free(h32), free(y16), free(h16), free(dy), free(dx32), free(dx16);
    free(dg32), free(dg16), free(cs);
  }
  /* grouped-query attention: as test_attention, kv heads shared by two query heads */
  const int TA = 37, CH = NH * hs;
  size_t na = (size_t)B * TA * nw, no = (size_t)B * TA * CH, nt = (size_t)B * NH * TA * TA;
  for (int f = 0; f < 2; f++) {
    int fmt = FMTS[f];
    const wf_kset *k = table(fmt);
    uint64_t s = 71 + f;
    act qkv = act_new(na, fmt, -2, 2, &s);
    float *o32 = zeros(no), *a32 = zeros(nt), *a16w = zeros(nt);
    uint16_t *o16 = calloc(no, 2);
    void *a16 = calloc(WF_K(k, attention)->saved(B, TA, CH, NH), sizeof(float));
    WF_K(k32, attention)->forward(o32, a32, qkv.x, NULL, B, TA, CH, NH, NKV, NULL);
    WF_K(k, attention)->forward(o16, a16, qkv.h, NULL, B, TA, CH, NH, NKV, NULL);
    expect_stored("attention_gqa_forward out", fmt, o16, o32, no);
    expect_stored("attention_gqa_forward att", fmt, a16, a32, nt);
    /* dk and dv sum the group's query heads in fp32 before they are stored */
    act dout = act_new(no, fmt, -1, 1, &s);
    float *dq32 = zeros(na);
    uint16_t *dq16 = calloc(na, 2);
    float *sc = zeros(WF_K(k32, attention)->scratch(B, TA, CH, NH));
    fill(dq32, na, -1, 1, &s);
    wf_storage_load(a16w, a16, nt, fmt);
    WF_K(k32, attention)->backward(dq32, sc, dout.x, qkv.x, a16w, NULL, B, TA, CH, NH, NKV, NULL);
    WF_K(k, attention)->backward(dq16, NULL, dout.h, qkv.h, a16, NULL, B, TA, CH, NH, NKV, NULL);
    expect_stored("attention_gqa_backward dqkv", fmt, dq16, dq32, na);
    /* RoPE's backward in place on the stored gradient: rotated in fp32, stored */
    float *cs = zeros((size_t)TA * hs);
    wf_rope_table(cs, TA, hs, 10000.0, NULL);
    wf_storage_load(dq32, dq16, na, fmt);
    WF_K(k32, rope)->backward(dq32, cs, NULL, B, TA, NH, NKV, hs, NULL);
    WF_K(k, rope)->backward(dq16, cs, NULL, B, TA, NH, NKV, hs, NULL);
    expect_stored("rope_backward", fmt, dq16, dq32, na);
    free(cs);
    act_free(&qkv), act_free(&dout);
    free(o32), free(a32), free(a16w), free(o16), free(a16), free(dq32), free(dq16);
    free(sc);
  }
}

/* |got - want| <= 2 K u sum_k |a_k b_k| + slack (see the top). */
static void expect_within_sum_bound(const char *what, int fmt, const float *got, const float *want,
                                    const double *abs_sum, size_t n, int K, const float *ulp_of)
{
  for (size_t i = 0; i < n; i++) {
    double bound = 2.0 * K * U32 * abs_sum[i];
    if (ulp_of) /* a stored output: one step of the format across a tie */
      bound += fabs(ulp_of[i]) * (fmt == WF_PREC_BF16 ? 0x1p-7 : 0x1p-10) * 1.0001;
    if (fabs((double)got[i] - want[i]) > bound) {
      print_error("%s (%s)[%zu]: %.9g vs %.9g, bound %.3g\n", what, wf_storage_name(fmt), i,
                  (double)got[i], (double)want[i], bound);
      fail();
    }
  }
}

/* The bias a 16-bit output adds is rounded to the format first (kernels/matmul.h), so where
 * the product nearly cancels its rounding the two conventions part: with u the format's
 * step at 1, bias 1 + 0.6u (rounded: 1 + u) and a product of -u/4, the exact bias gives
 * round(1 + 0.35u) = 1, the rounded one round(1 + 0.75u) = 1 + u. Every path: fp16, bf16
 * on the widened twins and through oneDNN, and the fused GELU's pre. */
static void test_bias_rounded(void **state)
{
  enum { R = 4, K = 3, O = 5 };
  for (int path = 0; path < 3; path++) {
    int fmt = path == 0 ? WF_PREC_FP16 : WF_PREC_BF16;
    float u = path == 0 ? 0x1p-10f : 0x1p-7f;
    wf_kernels_allow_bf16_gemm(path == 2);
    if (path == 2 && !wf_kernels_bf16_gemm_fast())
      break;
    const wf_kset *k = table(fmt);
    float x[R * K] = {0}, w[O * K] = {0}, bias[O], y[R * O], want = 1.0f + u;
    for (int r = 0; r < R; r++)
      x[r * K] = 1.0f;
    for (int o = 0; o < O; o++)
      w[o * K] = -0.25f * u, bias[o] = 1.0f + 0.6f * u;
    uint16_t x16[R * K], w16[O * K], y16[R * O], g16[R * O];
    wf_storage_store(x16, x, R * K, fmt);
    wf_storage_store(w16, w, O * K, fmt);
    WF_K(k, matmul)->forward(y16, x16, w16, bias, R, K, O, fmt, NULL);
    wf_storage_load(y, y16, R * O, fmt);
    for (int i = 0; i < R * O; i++)
      assert_true(y[i] == want);
    WF_K(k, matmul)->gelu_forward(g16, y16, x16, w16, bias, R, K, O, fmt, NULL);
    wf_storage_load(y, y16, R * O, fmt);
    for (int i = 0; i < R * O; i++)
      assert_true(y[i] == want);
  }
  wf_kernels_allow_bf16_gemm(1);
}

/* The 16-bit GEMMs against fp32 on the same operands, for bf16 and fp16, and for bf16
 * again with oneDNN (dnnl.c) where this CPU and build run it, on two threads so the
 * split over the pool is exercised: fmt_path 0 fp16, 1 bf16 on the widened twins, 2
 * bf16 through oneDNN. */
static void test_matmul(void **state)
{
  const wf_kset *k32 = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  const int M = 40, K = 300, OC = 520; /* past one panel of 256 in K and in OC */
  int threads = wf_kernels_threads();
  wf_kernels_set_threads(2);
  for (int path = 0; path < 3; path++) {
    int fmt = path == 0 ? WF_PREC_FP16 : WF_PREC_BF16;
    wf_kernels_allow_bf16_gemm(path == 2);
    if (path == 2 && !wf_kernels_bf16_gemm_fast()) {
      printf("bf16 GEMMs through oneDNN not run: %s\n", wf_kernels_bf16_gemm());
      break;
    }
    int f = path == 0 ? 0 : 1;
    const wf_kset *k = table(fmt);
    uint64_t s = 51 + (uint64_t)f;
    act x = act_new((size_t)M * K, fmt, -1, 1, &s), w = act_new((size_t)OC * K, fmt, -1, 1, &s);
    act dy = act_new((size_t)M * OC, fmt, -1, 1, &s);
    float *bias = zeros(OC), *y32 = zeros((size_t)M * OC), *y = zeros((size_t)M * OC);
    uint16_t *y16 = calloc((size_t)M * OC, 2);
    double *fs = calloc((size_t)M * OC, sizeof(double));
    fill(bias, OC, -1, 1, &s);
    for (int r = 0; r < M; r++)
      for (int o = 0; o < OC; o++) {
        double a = fabs(bias[o]);
        for (int c = 0; c < K; c++)
          a += fabs((double)x.x[(size_t)r * K + c] * w.x[(size_t)o * K + c]);
        fs[(size_t)r * OC + o] = a;
      }
    WF_K(k32, matmul)->forward(y32, x.x, w.x, bias, M, K, OC, WF_PREC_NO, NULL);
    WF_K(k, matmul)->forward_f32(y, x.h, w.h, bias, M, K, OC, fmt, NULL);
    expect_within_sum_bound("matmul_forward_f32", fmt, y, y32, fs, (size_t)M * OC, K + 1, NULL);
    /* a 16-bit output adds the bias rounded to the format (kernels/matmul.h) */
    float *rb = zeros(OC), *yr = zeros((size_t)M * OC);
    uint16_t *b16 = calloc(OC, 2);
    wf_storage_store(b16, bias, OC, fmt);
    wf_storage_load(rb, b16, OC, fmt);
    WF_K(k32, matmul)->forward(yr, x.x, w.x, rb, M, K, OC, WF_PREC_NO, NULL);
    WF_K(k, matmul)->forward(y16, x.h, w.h, bias, M, K, OC, fmt, NULL);
    wf_storage_load(y, y16, (size_t)M * OC, fmt);
    expect_within_sum_bound("matmul_forward", fmt, y, yr, fs, (size_t)M * OC, K + 1, yr);
    /* the fused GELU: pre as matmul_forward stores it, the GELU of the stored pre */
    uint16_t *g16 = calloc((size_t)M * OC, 2);
    WF_K(k, matmul)->gelu_forward(g16, y16, x.h, w.h, bias, M, K, OC, fmt, NULL);
    float *g32 = zeros((size_t)M * OC);
    wf_storage_load(y, y16, (size_t)M * OC, fmt);
    WF_K(k32, gelu)->forward(g32, y, (size_t)M * OC, NULL);
    expect_stored("matmul_gelu_forward gelu", fmt, g16, g32, (size_t)M * OC);
    /* backward: dinp (M,K) written over NaN; dweight (OC,K), dbias (OC) added into zeros */
    float *dx32 = nans((size_t)M * K), *dx = nans((size_t)M * K);
    float *dw32 = zeros((size_t)OC * K), *dw = zeros((size_t)OC * K), *db32 = zeros(OC),
          *db = zeros(OC);
    double *bx = calloc((size_t)M * K, sizeof(double)),
           *bw = calloc((size_t)OC * K, sizeof(double));
    double *bb = calloc(OC, sizeof(double));
    for (int r = 0; r < M; r++)
      for (int o = 0; o < OC; o++) {
        double d = fabs(dy.x[(size_t)r * OC + o]);
        bb[o] += d;
        for (int c = 0; c < K; c++) {
          bx[(size_t)r * K + c] += d * fabs(w.x[(size_t)o * K + c]);
          bw[(size_t)o * K + c] += d * fabs(x.x[(size_t)r * K + c]);
        }
      }
    WF_K(k32, matmul)->backward(dx32, dw32, db32, dy.x, x.x, w.x, M, K, OC, WF_PREC_NO, NULL);
    WF_K(k, matmul)->backward_f32(dx, dw, db, dy.h, x.h, w.h, M, K, OC, fmt, NULL);
    expect_within_sum_bound("matmul_backward_f32 dinp", fmt, dx, dx32, bx, (size_t)M * K, OC, NULL);
    expect_within_sum_bound("matmul_backward dweight", fmt, dw, dw32, bw, (size_t)OC * K, M, NULL);
    expect_within_sum_bound("matmul_backward dbias", fmt, db, db32, bb, OC, M, NULL);
    /* dinp in the format, written over NaN (0xffff in both formats), within the sum bound
     * plus one step of the format (the top); dweight and dbias added again: the twice
     * accumulated sum is one sum of 2M terms against twice the reference, so the same
     * bound with 2M terms and twice the absolute sums */
    uint16_t *dx16 = malloc((size_t)M * K * 2);
    memset(dx16, 0xff, (size_t)M * K * 2);
    WF_K(k, matmul)->backward(dx16, dw, db, dy.h, x.h, w.h, M, K, OC, fmt, NULL);
    wf_storage_load(dx, dx16, (size_t)M * K, fmt);
    expect_within_sum_bound("matmul_backward dinp", fmt, dx, dx32, bx, (size_t)M * K, OC, dx32);
    for (size_t i = 0; i < (size_t)OC * K; i++)
      dw32[i] *= 2.0f;
    for (int o = 0; o < OC; o++)
      db32[o] *= 2.0f, bb[o] *= 2.0;
    for (size_t i = 0; i < (size_t)OC * K; i++)
      bw[i] *= 2.0;
    expect_within_sum_bound("matmul_backward dweight, twice", fmt, dw, dw32, bw, (size_t)OC * K,
                            2 * M, NULL);
    expect_within_sum_bound("matmul_backward dbias, twice", fmt, db, db32, bb, OC, 2 * M, NULL);
    memset(dx16, 0xff, (size_t)M * K * 2); /* no OC: the empty sum, 0, written */
    WF_K(k, matmul)->backward(dx16, NULL, NULL, dy.h, x.h, w.h, M, K, 0, fmt, NULL);
    for (size_t i = 0; i < (size_t)M * K; i++)
      assert_int_equal(dx16[i], 0);
    free(dx16);
    act_free(&x), act_free(&w), act_free(&dy);
    free(bias), free(y32), free(y), free(y16), free(fs), free(g16), free(g32);
    free(rb), free(yr), free(b16);
    free(dx32), free(dx), free(dw32), free(dw), free(db32), free(db), free(bx), free(bw), free(bb);
  }
  wf_kernels_allow_bf16_gemm(1);
  wf_kernels_set_threads(threads);
}

/* Where the CPU has bf16 dot products and the build has oneDNN, bf16 GEMMs use it (the
 * banner's claim); elsewhere the reason is given. */
static void test_bf16_gemm_path(void **state)
{
  const char *why = wf_kernels_bf16_gemm();
  printf("bf16 GEMMs: %s\n", why);
#ifdef WF_TEST_HAVE_DNNL
  if (__builtin_cpu_supports("avx512bf16")) {
    assert_true(wf_kernels_bf16_gemm_fast());
    assert_non_null(strstr(why, "oneDNN"));
  }
#endif
  wf_kernels_allow_bf16_gemm(0);
  assert_false(wf_kernels_bf16_gemm_fast());
  assert_string_equal(wf_kernels_bf16_gemm(), "runtime.cpu_bf16_gemm=false");
  wf_kernels_allow_bf16_gemm(1);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_store_matches_round),
      cmocka_unit_test(test_load_exact),
      cmocka_unit_test(test_tables),
      cmocka_unit_test(test_adamw_store),
      cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_xent),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_llama),
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_bias_rounded),
      cmocka_unit_test(test_bf16_gemm_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
