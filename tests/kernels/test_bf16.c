/*
 * test_bf16.c - the bf16 kernels' CPU twins (the references their GPU kernels are tested
 * against): bf16 conversions against round.h, attention over bf16 tensors against the
 * fp32 attention at the mixed-precision bound of tests/common/att16_bound.h (multi-head
 * and grouped-query, T not a multiple of any tile), and the fused classifier against the
 * fp32 cross-entropy (whole vocabulary, and split in two slices combined as xent.h says).
 */
#include <string.h>

#include "../common/att16_bound.h"
#include "check.h"
#include "wf_kernels.h"

/* ---- conversions ------------------------------------------------------------------------ */

static void test_conversions(void **state)
{
  (void)state;
  enum { N = 4099 };
  uint64_t s = 7;
  float *x = zeros(N), *r = zeros(N), *back = zeros(N);
  wf_bf16 *h = calloc(N, sizeof *h);
  fill(x, N, -1e4, 1e4, &s);
  x[0] = 1.00390625f; /* 1 + 2^-8: a tie, to the even 1.0 */
  x[1] = -0.0f, x[2] = INFINITY, x[3] = NAN;
  wf_round_bf16(r, x, N);
  wf_bf16_from_floats(h, x, N);
  wf_bf16_to_floats(back, h, N);
  for (size_t i = 0; i < N; i++) {
    if (isnan(x[i]))
      assert_true(isnan(back[i]));
    else
      assert_memory_equal(&back[i], &r[i], sizeof(float));
  }
  assert_true(back[0] == 1.0f);
  assert_true(signbit(back[1]) && back[1] == 0.0f);
  free(x), free(r), free(back), free(h);
}

/* ---- attention ------------------------------------------------------------------------- */

/* Values uniform in [lo, hi), rounded to bf16: as float and as bf16. */
static void bf16_data(float *f, wf_bf16 *h, size_t n, double lo, double hi, uint64_t *s)
{
  fill(f, n, lo, hi, s);
  wf_bf16_from_floats(h, f, n);
  wf_bf16_to_floats(f, h, n);
}

/* Count elements outside the bound; report the first. */
static size_t outside(const char *what, const float *got, const float *ref, const double *bound,
                      size_t n)
{
  size_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    worst = fmax(worst, fabs((double)got[i] - ref[i]) / (bound[i] + ATT16_SLACK));
    if (!att16_within(got[i], ref[i], bound[i]) && bad++ == 0)
      print_error("%s[%zu]: %.7g, fp32 %.7g, bound %.3g\n", what, i, got[i], ref[i], bound[i]);
  }
  print_message("%-10s worst |err| / bound %.3f\n", what, worst);
  return bad;
}

/* Multi-head: the twin against wf_attention_forward/backward. */
static void mha_case(int B, int T, int NH, int hs, uint64_t seed)
{
  const int C = NH * hs;
  const size_t nx = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
  uint64_t s = seed;
  float *qkv = zeros(nx), *dout = zeros(ny), *out = zeros(ny), *dqkv = zeros(nx);
  float *att = zeros((size_t)B * NH * T * T), *scr = zeros((size_t)B * NH * T * T);
  float *got = zeros(nx), *lse = zeros((size_t)B * NH * T);
  wf_bf16 *x16 = calloc(nx, 2), *dy16 = calloc(ny, 2), *y16 = calloc(ny, 2), *dx16 = calloc(nx, 2);
  float *scratch = zeros(wf_attention_bf16_scratch(B, T, C, NH, NH));
  bf16_data(qkv, x16, nx, -2, 2, &s); /* scores up to a few units: a peaked softmax too */
  bf16_data(dout, dy16, ny, -1, 1, &s);
  wf_attention_forward(out, att, qkv, B, T, C, NH);
  wf_attention_backward(dqkv, scr, dout, qkv, att, B, T, C, NH);
  wf_attention_bf16_forward(y16, lse, x16, B, T, C, NH, NH);
  wf_attention_bf16_backward(dx16, scratch, dy16, x16, y16, lse, B, T, C, NH, NH);
  att16_bound bd = att16_bound_make(qkv, dout, NULL, B, T, C, NH);
  assert_non_null(bd.out);
  wf_bf16_to_floats(got, y16, ny);
  assert_int_equal(outside("out", got, out, bd.out, ny), 0);
  wf_bf16_to_floats(got, dx16, nx);
  assert_int_equal(outside("dqkv", got, dqkv, bd.dqkv, nx), 0);
  /* lse against the log-sum-exp of the fp32 probabilities' normaliser: exp(lse) is the
   * softmax denominator, so p_ij = exp(s_ij - lse_i) must match att (fp32 sums: 1e-5). */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const float *q = qkv + ((size_t)b * T + i) * 3 * C + (size_t)h * hs;
        const float *k = qkv + (size_t)b * T * 3 * C + C + (size_t)h * hs;
        double sc = 0;
        for (int d = 0; d < hs; d++)
          sc += (double)q[d] * k[d];
        double p0 = exp(sc / sqrt((double)hs) - lse[((size_t)b * NH + h) * T + i]);
        assert_true(fabs(p0 - att[(((size_t)b * NH + h) * T + i) * T]) <= 1e-5);
      }
  att16_bound_free(&bd);
  free(qkv), free(dout), free(out), free(dqkv), free(att), free(scr), free(got), free(lse);
  free(x16), free(dy16), free(y16), free(dx16), free(scratch);
}

static void test_attention_mha(void **state)
{
  (void)state;
  mha_case(2, 37, 3, 16, 11); /* T, B*NH, hs: no multiple of a tile */
  mha_case(1, 70, 2, 64, 12);
}

/* Grouped-query: the same as multi-head attention with each kv head repeated for its
 * query heads, and dk, dv summed over them. */
static void test_attention_gqa(void **state)
{
  (void)state;
  enum { B = 2, T = 23, NH = 4, NKV = 2, hs = 8, C = NH * hs, LG = C + 2 * NKV * hs };
  const size_t ng = (size_t)B * T * LG, nm = (size_t)B * T * 3 * C, ny = (size_t)B * T * C;
  uint64_t s = 13;
  float *xg = zeros(ng), *dy = zeros(ny), *xm = zeros(nm), *lse_g = zeros((size_t)B * NH * T);
  float *lse_m = zeros((size_t)B * NH * T), *a = zeros(ng), *m = zeros(nm), *sum = zeros(ng);
  float *mag = zeros(ng);
  wf_bf16 *xg16 = calloc(ng, 2), *xm16 = calloc(nm, 2), *dy16 = calloc(ny, 2);
  wf_bf16 *yg = calloc(ny, 2), *ym = calloc(ny, 2), *dg = calloc(ng, 2), *dm = calloc(nm, 2);
  float *sg = zeros(wf_attention_bf16_scratch(B, T, C, NH, NKV));
  float *sm = zeros(wf_attention_bf16_scratch(B, T, C, NH, NH));
  bf16_data(xg, xg16, ng, -2, 2, &s);
  bf16_data(dy, dy16, ny, -1, 1, &s);
  for (size_t r = 0; r < (size_t)B * T; r++) /* expand: query head h reads kv head h / 2 */
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < hs; d++) {
        xm[r * 3 * C + h * hs + d] = xg[r * LG + h * hs + d];
        xm[r * 3 * C + C + h * hs + d] = xg[r * LG + C + (h / 2) * hs + d];
        xm[r * 3 * C + 2 * C + h * hs + d] = xg[r * LG + C + (NKV + h / 2) * hs + d];
      }
  wf_bf16_from_floats(xm16, xm, nm);
  wf_attention_bf16_forward(yg, lse_g, xg16, B, T, C, NH, NKV);
  wf_attention_bf16_forward(ym, lse_m, xm16, B, T, C, NH, NH);
  assert_memory_equal(yg, ym, ny * 2); /* the same floats in the same order */
  assert_memory_equal(lse_g, lse_m, (size_t)B * NH * T * sizeof(float));
  wf_attention_bf16_backward(dg, sg, dy16, xg16, yg, lse_g, B, T, C, NH, NKV);
  wf_attention_bf16_backward(dm, sm, dy16, xm16, ym, lse_m, B, T, C, NH, NH);
  wf_bf16_to_floats(a, dg, ng);
  wf_bf16_to_floats(m, dm, nm);
  for (size_t r = 0; r < (size_t)B * T; r++)
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < hs; d++) {
        assert_true(a[r * LG + h * hs + d] == m[r * 3 * C + h * hs + d]); /* dq */
        float k = m[r * 3 * C + C + h * hs + d], v = m[r * 3 * C + 2 * C + h * hs + d];
        sum[r * LG + C + (h / 2) * hs + d] += k;
        sum[r * LG + C + (NKV + h / 2) * hs + d] += v;
        mag[r * LG + C + (h / 2) * hs + d] += fabsf(k);
        mag[r * LG + C + (NKV + h / 2) * hs + d] += fabsf(v);
      }
  /* dk, dv of a kv head: the group's fp32 sum rounded once (u |sum|, plus the fp32 sums'
   * order, 1e-6) against each head's gradient rounded (u |term| each) and then summed. */
  for (size_t r = 0; r < (size_t)B * T; r++)
    for (int i = C; i < LG; i++)
      assert_true(fabs(a[r * LG + i] - sum[r * LG + i]) <=
                  ATT16_U * (fabs(sum[r * LG + i]) + mag[r * LG + i]) + 1e-6);
  free(xg), free(dy), free(xm), free(lse_g), free(lse_m), free(a), free(m), free(sum), free(mag);
  free(xg16), free(xm16), free(dy16), free(yg), free(ym), free(dg), free(dm), free(sg), free(sm);
}

/* ---- the fused classifier --------------------------------------------------------------- */

enum { CN = 9, CV = 37, CLD = 40 };

/* logits as bf16 and as floats, padding NaN in both (never read); targets. */
static void cls_data(wf_bf16 *h, float *f, int *targets, uint64_t seed)
{
  uint64_t s = seed;
  fill(f, (size_t)CN * CLD, -6, 6, &s);
  wf_bf16_from_floats(h, f, (size_t)CN * CLD);
  wf_bf16_to_floats(f, h, (size_t)CN * CLD);
  for (int i = 0; i < CN; i++) {
    for (int j = CV; j < CLD; j++)
      f[i * CLD + j] = NAN, h[i * CLD + j] = 0x7fc0;
    targets[i] = (int)(urand(&s) * CV);
  }
  targets[0] = 0, targets[1] = CV - 1;
}

/* dlogits: the twin rounds the fp32 gradient to bf16, so within u of it; padding 0. */
static void check_dlogits(const wf_bf16 *got, const float *ref)
{
  for (int i = 0; i < CN; i++)
    for (int j = 0; j < CLD; j++) {
      float g = wf_bf16_to_float(got[i * CLD + j]);
      if (j >= CV) {
        assert_true(g == 0.0f);
        continue;
      }
      assert_true(fabs(g - ref[i * CLD + j]) <= ATT16_U * fabs(ref[i * CLD + j]) + 1e-9);
    }
}

static void test_classifier(void **state)
{
  (void)state;
  wf_bf16 h[CN * CLD];
  float f[CN * CLD], d[CN * CLD], mx[CN], se[CN], tl[CN], loss[CN], got[CN];
  int targets[CN];
  cls_data(h, f, targets, 21);
  wf_xent_stats(mx, se, tl, f, targets, CN, CV, CLD, 0);
  wf_xent_loss(loss, mx, se, tl, CN);
  wf_xent_backward(d, f, mx, se, targets, 0.25f, CN, CV, CLD, 0);
  wf_classifier_bf16(h, got, targets, 0.25f, CN, CV, CLD);
  for (int i = 0; i < CN; i++) /* the same double sum, then the same float ops */
    assert_true(fabs(got[i] - loss[i]) <= 1e-6 * (1 + fabs(loss[i])));
  check_dlogits(h, d);
}

/* Two vocabulary slices, as two tensor-parallel ranks hold them: columns [0, 20) and
 * [20, CV) of each row, each in its own (CN, SLD) buffer with its own padding. Their
 * statistics combined give the whole row's; the gradients, written in place, the whole
 * row's gradient. */
enum { V0 = 20, SLD = 24 };

static void slice_of(wf_bf16 *dst, const wf_bf16 *h, int lo, int hi)
{
  for (int i = 0; i < CN; i++)
    for (int j = 0; j < SLD; j++)
      dst[i * SLD + j] = lo + j < hi ? h[i * CLD + lo + j] : 0x7fc0; /* NaN padding */
}

static void test_classifier_split(void **state)
{
  (void)state;
  wf_bf16 h[CN * CLD], s0[CN * SLD], s1[CN * SLD], back[CN * CLD];
  float f[CN * CLD], d[CN * CLD], all[2 * CN * 3], mx[CN], se[CN], tl[CN], loss[CN];
  float rm[CN], rs[CN], rt[CN], rl[CN], gm[CN], gs[CN], gt[CN];
  int targets[CN];
  cls_data(h, f, targets, 22);
  slice_of(s0, h, 0, V0);
  slice_of(s1, h, V0, CV);
  wf_xent_stats(rm, rs, rt, f, targets, CN, CV, CLD, 0);
  wf_xent_loss(rl, rm, rs, rt, CN);
  wf_xent_backward(d, f, rm, rs, targets, 0.5f, CN, CV, CLD, 0);
  wf_xent_stats_bf16(gm, gs, gt, s0, targets, CN, V0, SLD, 0);
  wf_xent_pack(all, gm, gs, gt, CN);
  wf_xent_stats_bf16(gm, gs, gt, s1, targets, CN, CV - V0, SLD, V0);
  wf_xent_pack(all + 3 * CN, gm, gs, gt, CN);
  wf_xent_combine(mx, se, tl, all, CN, 2);
  wf_xent_loss(loss, mx, se, tl, CN);
  for (int i = 0; i < CN; i++) { /* two double partial sums combined in float */
    assert_true(fabs(loss[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i])));
    assert_true(tl[i] == rt[i] && mx[i] == rm[i]);
  }
  wf_xent_backward_bf16(s0, s0, mx, se, targets, 0.5f, CN, V0, SLD, 0);
  wf_xent_backward_bf16(s1, s1, mx, se, targets, 0.5f, CN, CV - V0, SLD, V0);
  for (int i = 0; i < CN; i++) {
    for (int j = 0; j < CLD; j++) /* reassemble the row; padding from the second slice */
      back[i * CLD + j] = j < V0 ? s0[i * SLD + j] : j < CV ? s1[i * SLD + j - V0] : 0;
    for (int j = V0; j < SLD; j++)
      assert_true(s0[i * SLD + j] == 0); /* the slice's padding zeroed */
    for (int j = CV - V0; j < SLD; j++)
      assert_true(s1[i * SLD + j] == 0);
  }
  check_dlogits(back, d);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conversions),      cmocka_unit_test(test_attention_mha),
      cmocka_unit_test(test_attention_gqa),    cmocka_unit_test(test_classifier),
      cmocka_unit_test(test_classifier_split),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
