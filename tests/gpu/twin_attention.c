/*
 * twin_attention.c - CUDA kernels against their CPU twins (twin.h): attention: the fp32 kernels,
 * the paths on tensor cores (cuDNN, flash), bf16 and fp32 grouped-query attention, packed
 * documents.
 */
#include "../common/att16_bound.h"
#include "twin.h"

/* Attention on each side with the buffers its own table sizes: the CPU keeps (T, T)
 * probabilities, the GPU a log-sum-exp per row (heads up to 128) or the same (T, T)
 * (larger heads). Each backward reads what its own forward kept, so only out and dqkv
 * are compared. T = 77 is no multiple of the GPU's 64-row blocks or 32-row tiles. */
void attention_case(ctx *c, int B, int T, int NH, int hs)
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

void test_attention(ctx *c)
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

const char *path_name(int p)
{
  return p == WF_ATTN_CUDNN ? "cudnn" : p == WF_ATTN_FLASH ? "flash" : "reference";
}

/* Result got (host; NULL: it could not be read) against the fp32 CPU result ref within
 * factor x the bf16 bound. */
void bound_verdict(ctx *c, const char *what, const float *ref, const float *got,
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
void expect_path(ctx *c, int impl, int path, bool cudnn_shape)
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
void test_attention_paths(ctx *c)
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

void test_attention_gqa16(ctx *c)
{
  printf(" the bf16 entries\n");
  gqa16_case(c, NULL);
  end_case(c);
  printf(" the bf16 table's attention entries\n");
  gqa16_case(c, bf16_of(c));
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

void test_gqa(ctx *c)
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
void test_documents(ctx *c)
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
