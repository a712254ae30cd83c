/*
 * test_llama.c - Llama's kernels (RMSNorm, RoPE, SwiGLU, grouped-query attention) on
 * the CPU: each forward against a double-precision reference written here from the
 * published definitions (naive loops, sharing no code with kernels/cpu), each backward
 * against central finite differences of that reference, and each backward called
 * twice to check that it adds into its gradients. check.h gives the method and the
 * tolerances (FWD_RTOL, GRAD_RTOL); the few other bounds say where they come from.
 * Shapes are small and odd; the attention cases include T > 128 (the CPU kernel's
 * causal row blocks) and enough work to take the threaded paths.
 *
 * tests/kernels/llama_ops.py checks the same kernels against the PyTorch reference of
 * Hugging Face's Llama (tests/model/llama_ref.py), op by op.
 */
#include <string.h>

#include "check.h"
#include "wf_device.h"
#include "wf_kernels.h"

/* ---- RMSNorm ------------------------------------------------------------------- */

struct rms {
  int N, C;
  double eps;
  double *x, *wt, *out, *rstd;
  const float *w;
};

/* out = wt * x / sqrt(mean(x^2) + eps), per row */
static double rms_loss(void *p)
{
  struct rms *r = p;
  for (int i = 0; i < r->N; i++) {
    const double *x = r->x + (size_t)i * r->C;
    double ms = 0;
    for (int c = 0; c < r->C; c++)
      ms += x[c] * x[c] / r->C;
    r->rstd[i] = 1.0 / sqrt(ms + r->eps);
    for (int c = 0; c < r->C; c++)
      r->out[(size_t)i * r->C + c] = r->wt[c] * x[c] * r->rstd[i];
  }
  return dot_w(r->out, r->w, (size_t)r->N * r->C);
}

static void run_rmsnorm(int N, int C, float eps, uint64_t seed)
{
  uint64_t s = seed;
  size_t NC = (size_t)N * C;
  float *x = zeros(NC), *wt = zeros(C), *w = zeros(NC), *out = zeros(NC), *rstd = zeros(N);
  fill(x, NC, -0.7, 1.3, &s); /* a non-zero mean, which RMSNorm must not remove */
  for (int c = 0; c < C; c++) {
    x[c] *= 1e3f;      /* row 0: large, eps negligible */
    x[C + c] *= 1e-3f; /* row 1: mean(x^2) ~ 1e-6 < eps, eps dominates */
  }
  fill(wt, C, 0.5, 1.5, &s);
  fill(w, NC, -1, 1, &s);
  double *ro = malloc(NC * sizeof *ro), *rr = malloc(N * sizeof *rr);
  struct rms r = {N, C, (double)eps, to_double(x, NC), to_double(wt, C), ro, rr, w};
  wf_rmsnorm_forward(out, rstd, x, wt, eps, N, C);
  rms_loss(&r);
  check_close("rmsnorm out", out, ro, NC, FWD_RTOL);
  /* rstd spans 1e-3 .. 1e2 over the rows: compare each relatively */
  for (int i = 0; i < N; i++)
    check_close("rmsnorm rstd", rstd + i, rr + i, 1, FWD_RTOL);
  float *dx = zeros(NC), *dw = zeros(C);
  wf_rmsnorm_backward(dx, dw, w, x, wt, rstd, N, C);
  check_grad("rmsnorm dinp", rms_loss, &r, r.x, NC, dx);
  check_grad("rmsnorm dweight", rms_loss, &r, r.wt, C, dw);
  float *dx2 = zeros(NC), *dw2 = zeros(C), *dw3 = zeros(C);
  for (int k = 0; k < 2; k++)
    wf_rmsnorm_backward(dx2, dw2, w, x, wt, rstd, N, C);
  check_doubled("rmsnorm dinp", dx2, dx, NC);
  check_doubled("rmsnorm dweight", dw2, dw, C);
  /* NULL outputs are skipped, and each part is computed alone as with both */
  wf_rmsnorm_backward(NULL, dw3, w, x, wt, rstd, N, C);
  assert_memory_equal(dw3, dw, C * sizeof(float));
  memset(dx2, 0, NC * sizeof(float));
  wf_rmsnorm_backward(dx2, NULL, w, x, wt, rstd, N, C);
  assert_memory_equal(dx2, dx, NC * sizeof(float));
  /* without rstd (no backward follows): the same out */
  float *out2 = zeros(NC);
  wf_rmsnorm_forward(out2, NULL, x, wt, eps, N, C);
  assert_memory_equal(out2, out, NC * sizeof(float));
  free(x), free(wt), free(w), free(out), free(rstd), free(ro), free(rr), free(r.x), free(r.wt);
  free(dx), free(dw), free(dx2), free(dw2), free(dw3), free(out2);
}

static void test_rmsnorm(void **state)
{
  run_rmsnorm(7, 12, 1e-5f, 21);
  run_rmsnorm(5, 45, 1e-6f, 22);
  run_rmsnorm(301, 97, 1e-5f, 23); /* N*C > 16384: rows and columns split over threads */
}

/* The table's fused residual + RMSNorm is the composition of the two kernels. */
static void test_residual_rmsnorm(void **state)
{
  enum { N = 37, C = 45, NC = N * C };
  const wf_kset *k = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  uint64_t s = 24;
  float a[NC], b[NC], wt[C], res[NC], out[NC], rstd[N], res2[NC], out2[NC], rstd2[N];
  fill(a, NC, -2, 2, &s);
  fill(b, NC, -2, 2, &s);
  fill(wt, C, 0.5, 1.5, &s);
  wf_residual_forward(res, a, b, NC);
  wf_rmsnorm_forward(out, rstd, res, wt, 1e-5f, N, C);
  WF_K(k, rmsnorm)->residual_forward(res2, out2, rstd2, a, b, wt, 1e-5f, N, C, NULL);
  assert_memory_equal(res, res2, sizeof res);
  assert_memory_equal(out, out2, sizeof out);
  assert_memory_equal(rstd, rstd2, sizeof rstd);
  WF_K(k, rmsnorm)
      ->residual_forward(a, out2, NULL, a, b, wt, 1e-5f, N, C, NULL); /* res aliases a */
  assert_memory_equal(a, res, sizeof res);
  assert_memory_equal(out, out2, sizeof out);
}

/* ---- RoPE ---------------------------------------------------------------------- */

/* The table against cos/sin of t theta^(-2i/hs) in double. The table's angle is
 * Hugging Face's fp32 one: 2i/hs, theta^(that), its inverse and t times it are each
 * rounded to fp32 (relative 2^-24 each, powf within 1 ulp = 2^-23), and the exponent's
 * rounding moves theta^e by ln(theta) 2^-24 relative (ln 500000 = 13.1). The angle is
 * then within (13.1 + 5) 2^-24 |angle| of the exact one, and cos/sin move by at most
 * that, plus the final rounding (2^-24): the bound below, with 20 for 18.1. */
static void run_rope_table(int T, int hs, double theta)
{
  float *cs = zeros((size_t)T * hs);
  wf_rope_table(cs, T, hs, theta, NULL);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < hs / 2; i++) {
      double angle = t * pow(theta, -2.0 * i / hs);
      double tol = 20.0 * 0x1p-24 * angle + 0x1p-24;
      double c = cs[(size_t)t * hs + i], sn = cs[(size_t)t * hs + hs / 2 + i];
      if (fabs(c - cos(angle)) > tol || fabs(sn - sin(angle)) > tol) {
        print_error("rope table t=%d i=%d: cos %.9g sin %.9g, expected %.9g %.9g (tol %.3g)\n", t,
                    i, c, sn, cos(angle), sin(angle), tol);
        fail();
      }
    }
  free(cs);
}

static void test_rope_table(void **state)
{
  run_rope_table(67, 16, 10000.0);
  run_rope_table(2048, 128, 500000.0);
  run_rope_table(5, 2, 500000.0);
}

/* Llama 3.1's rescaled frequency of f (rope_type llama3), in double from the formula:
 * with the wavelength w = 2 pi / f, w < old / high keeps f, w > old / low divides it by
 * factor, and in between s = (old / w - low) / (high - low) interpolates. *band is 0
 * (kept), 1 (interpolated) or 2 (divided). */
static double llama3_freq(double f, const wf_rope_scaling *sc, int *band)
{
  double old = sc->original_max_position_embeddings, w = 2 * M_PI / f;
  double lo = sc->low_freq_factor, hi = sc->high_freq_factor;
  *band = w < old / hi ? 0 : w > old / lo ? 2 : 1;
  double s = (old / w - lo) / (hi - lo);
  return *band == 0 ? f : *band == 2 ? f / sc->factor : (1 - s) * f / sc->factor + s * f;
}

/* The scaled table against cos/sin of t times that in double. The fp32 frequency
 * before scaling is within e0 = 20 2^-24 of theta^(-2i/hs) (run_rope_table's bound,
 * for the angle of an unscaled table, holds for f). Kept and divided bands add at most
 * one rounding (a division by factor). In between, fp32 computes w (2 roundings, and
 * 2 pi's), old / w (2) and s (2 more): s is off by at most (high / (high - low))
 * (e0 + 6 2^-24) + 2^-24, and the frequency f ((1 - s) / factor + s), relative to
 * itself, by factor times that (its sensitivity to s, largest at s = 0), plus e0 and 5
 * roundings of the products and sum. The angle t f adds one rounding, cos/sin theirs. */
static void run_rope_table_llama3(int T, int hs, double theta, const wf_rope_scaling *sc)
{
  const double u = 0x1p-24, e0 = 20 * u;
  const double hi = sc->high_freq_factor, span = hi - sc->low_freq_factor;
  const double mid = e0 + sc->factor * (hi / span * (e0 + 6 * u) + u) + 5 * u;
  int seen[3] = {0};
  float *cs = zeros((size_t)T * hs);
  wf_rope_table(cs, T, hs, theta, sc);
  for (int i = 0; i < hs / 2; i++) {
    int band;
    double f = llama3_freq(pow(theta, -2.0 * i / hs), sc, &band);
    double rel = (band == 1 ? mid : e0 + u) + u;
    seen[band]++;
    for (int t = 0; t < T; t++) {
      double angle = t * f, tol = rel * angle + u;
      double c = cs[(size_t)t * hs + i], sn = cs[(size_t)t * hs + hs / 2 + i];
      if (fabs(c - cos(angle)) > tol || fabs(sn - sin(angle)) > tol) {
        print_error("llama3 rope table t=%d i=%d (band %d): cos %.9g sin %.9g, expected %.9g "
                    "%.9g (tol %.3g)\n",
                    t, i, band, c, sn, cos(angle), sin(angle), tol);
        fail();
      }
    }
  }
  assert_true(seen[0] > 0 && seen[1] > 0 && seen[2] > 0); /* every band is checked */
  free(cs);
}

static void test_rope_table_llama3(void **state)
{
  /* Llama 3.2 1B's scaling at its head size; then a test-size head (hs 16, theta 10000,
   * factor 8) whose original context (12) is shorter than the table, with wavelengths
   * under 8 kept and over 24 divided. */
  const wf_rope_scaling l32 = {WF_ROPE_LLAMA3, 32, 1, 4, 8192};
  const wf_rope_scaling tiny = {WF_ROPE_LLAMA3, 8, 0.5, 1.5, 12};
  run_rope_table_llama3(4096, 64, 500000.0, &l32);
  run_rope_table_llama3(64, 16, 10000.0, &tiny);
  /* rope_type none is the unscaled table, bit for bit */
  const wf_rope_scaling none = {WF_ROPE_NONE, 8, 1, 4, 12};
  float a[64 * 16], b[64 * 16];
  wf_rope_table(a, 64, 16, 10000.0, NULL);
  wf_rope_table(b, 64, 16, 10000.0, &none);
  assert_memory_equal(a, b, sizeof a);
}

struct rope {
  int B, T, NH, NKV, hs;
  const float *cs;
  double *x, *out;
  const float *w;
};

/* Hugging Face's apply_rotary_pos_emb on the q and k heads: x * cos + rotate_half(x) *
 * sin, rotate_half(x) = cat(-x[h2:], x[:h2]); v heads pass through. */
static double rope_loss(void *p)
{
  struct rope *r = p;
  const int hs = r->hs, h2 = hs / 2, W = (r->NH + 2 * r->NKV) * hs;
  for (int bt = 0; bt < r->B * r->T; bt++) {
    const float *cs = r->cs + (size_t)(bt % r->T) * hs;
    for (int e = 0; e < W; e++) {
      const double *x = r->x + (size_t)bt * W;
      int j = e / hs, d = e % hs;
      double v = x[e];
      if (j < r->NH + r->NKV) {
        double rot = d < h2 ? -x[e + h2] : x[e - h2];
        v = x[e] * (double)cs[d % h2] + rot * (double)cs[h2 + d % h2];
      }
      r->out[(size_t)bt * W + e] = v;
    }
  }
  return dot_w(r->out, r->w, (size_t)r->B * r->T * W);
}

static void run_rope(int B, int T, int NH, int NKV, int hs, double theta, uint64_t seed)
{
  uint64_t s = seed;
  const size_t n = (size_t)B * T * (NH + 2 * NKV) * hs;
  float *cs = zeros((size_t)T * hs), *x = zeros(n), *y = zeros(n), *w = zeros(n), *d = zeros(n);
  wf_rope_table(cs, T, hs, theta, NULL);
  fill(x, n, -1.5, 1.5, &s);
  fill(w, n, -1, 1, &s);
  double *ro = malloc(n * sizeof *ro);
  struct rope r = {B, T, NH, NKV, hs, cs, to_double(x, n), ro, w};
  memcpy(y, x, n * sizeof(float));
  wf_rope_forward(y, cs, NULL, B, T, NH, NKV, hs);
  rope_loss(&r);
  check_close("rope out", y, ro, n, FWD_RTOL);
  for (size_t i = 0; i < n; i++) { /* v heads untouched, exactly */
    size_t e = i % ((size_t)(NH + 2 * NKV) * hs);
    if (e >= (size_t)(NH + NKV) * hs)
      assert_true(y[i] == x[i]);
  }
  /* backward: d = w mapped in place to dL/dx (v columns: w itself) */
  memcpy(d, w, n * sizeof(float));
  wf_rope_backward(d, cs, NULL, B, T, NH, NKV, hs);
  check_grad("rope dqkv", rope_loss, &r, r.x, n, d);
  /* the rotation is orthogonal: backward undoes forward, to a few roundings (the pair
   * is turned twice, each output from two rounded products and a rounded sum) */
  wf_rope_backward(y, cs, NULL, B, T, NH, NKV, hs);
  double *xd = to_double(x, n);
  check_close("rope backward(forward(x))", y, xd, n, 1e-6);
  free(cs), free(x), free(y), free(w), free(d), free(ro), free(r.x), free(xd);
}

static void test_rope(void **state)
{
  run_rope(2, 7, 4, 2, 8, 10000.0, 31);
  run_rope(1, 5, 3, 3, 6, 500000.0, 32);   /* multi-head (NKV == NH), hs/2 odd */
  run_rope(3, 33, 8, 1, 16, 500000.0, 33); /* 1 kv head; B*T*(NH+NKV)*hs > 16384: threads */
}

/* ---- SwiGLU -------------------------------------------------------------------- */

struct glu {
  int N, F;
  double *x, *out;
  const float *w;
};

/* out = gate sigmoid(gate) * up */
static double glu_loss(void *p)
{
  struct glu *g = p;
  for (int n = 0; n < g->N; n++)
    for (int i = 0; i < g->F; i++) {
      double a = g->x[(size_t)n * 2 * g->F + i], u = g->x[(size_t)n * 2 * g->F + g->F + i];
      g->out[(size_t)n * g->F + i] = a / (1.0 + exp(-a)) * u;
    }
  return dot_w(g->out, g->w, (size_t)g->N * g->F);
}

static void run_swiglu(int N, int F, uint64_t seed)
{
  uint64_t s = seed;
  const size_t NI = (size_t)N * 2 * F, NO = (size_t)N * F;
  float *x = zeros(NI), *w = zeros(NO), *out = zeros(NO), *dx = nans(NI), *dx2 = nans(NI);
  fill(x, NI, -5, 5, &s);
  x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f, x[3] = -95.0f; /* tails (exp clamps at 88) */
  fill(w, NO, -1, 1, &s);
  double *ro = malloc(NO * sizeof *ro);
  struct glu g = {N, F, to_double(x, NI), ro, w};
  wf_swiglu_forward(out, x, N, F);
  glu_loss(&g);
  check_close("swiglu out", out, ro, NO, FWD_RTOL);
  wf_swiglu_backward(dx, x, w, N, F);
  check_grad("swiglu dinp", glu_loss, &g, g.x, NI, dx);
  for (int k = 0; k < 2; k++) /* dinp is written, from NaN, not added: 1x */
    wf_swiglu_backward(dx2, x, w, N, F);
  check_rewritten("swiglu dinp", dx2, dx, NI);
  free(x), free(w), free(out), free(dx), free(dx2), free(ro), free(g.x);
}

static void test_swiglu(void **state)
{
  run_swiglu(7, 13, 41);
  run_swiglu(129, 131, 42); /* N*F > 16384: rows split over threads */
}

/* ---- grouped-query attention --------------------------------------------------- */

struct gqa {
  int B, T, C, NH, NKV;
  double *qkv, *out, *att;
  const float *w;
};

static double gqa_loss(void *p)
{
  struct gqa *a = p;
  ref_attention(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH, a->NKV);
  return dot_w(a->out, a->w, (size_t)a->B * a->T * a->C);
}

static void run_gqa(int B, int T, int NH, int NKV, int hs, uint64_t seed)
{
  uint64_t s = seed;
  const int C = NH * hs;
  const size_t nq = (size_t)B * T * (C + 2 * NKV * hs), no = (size_t)B * T * C,
               na = (size_t)B * NH * T * T;
  float *qkv = zeros(nq), *w = zeros(no), *out = zeros(no), *att = zeros(na);
  fill(qkv, nq, -1.5, 1.5, &s);
  fill(w, no, -1, 1, &s);
  double *ro = malloc(no * sizeof *ro), *ra = malloc(na * sizeof *ra);
  struct gqa a = {B, T, C, NH, NKV, to_double(qkv, nq), ro, ra, w};
  wf_attention_gqa_forward(out, att, qkv, NULL, B, T, C, NH, NKV);
  gqa_loss(&a);
  check_close("gqa out", out, ro, no, FWD_RTOL);
  check_close("gqa att", att, ra, na, FWD_RTOL);
  for (size_t i = 0; i < na; i++) /* above the diagonal: exactly 0 */
    if ((i % T) > (i / T) % T)
      assert_true(att[i] == 0.0f);
  float *dq = nans(nq), *dq2 = nans(nq), *scratch = zeros(na); /* dqkv is written */
  wf_attention_gqa_backward(dq, scratch, w, qkv, att, NULL, B, T, C, NH, NKV);
  check_grad("gqa dqkv", gqa_loss, &a, a.qkv, nq, dq);
  for (int k = 0; k < 2; k++) /* dk, dv still sum the group's heads, from zero */
    wf_attention_gqa_backward(dq2, scratch, w, qkv, att, NULL, B, T, C, NH, NKV);
  check_rewritten("gqa dqkv", dq2, dq, nq);
  free(qkv), free(w), free(out), free(att), free(ro), free(ra), free(a.qkv), free(dq);
  free(dq2), free(scratch);
}

static void test_gqa(void **state)
{
  run_gqa(2, 5, 4, 2, 3, 51);
  run_gqa(1, 6, 3, 1, 4, 52);   /* one kv head for all query heads (multi-query) */
  run_gqa(2, 4, 3, 3, 4, 53);   /* NKV == NH: multi-head attention */
  run_gqa(2, 133, 4, 2, 4, 54); /* T > 128: two causal row blocks; threaded */
}

/* Grouped-query attention is multi-head attention on repeated kv heads (repeat_kv):
 * the GQA kernel against the multi-head kernel on the expanded qkv. out and dq come
 * from the same products in the same order (the same sgemm calls on other strides);
 * dk and dv of a kv head are the sum of its query heads' multi-head dk and dv, added
 * in another order: FWD_RTOL (a few roundings of G terms) for all. */
static void test_gqa_is_repeated_kv(void **state)
{
  enum { B = 2, T = 37, NH = 6, NKV = 2, hs = 8, G = NH / NKV, C = NH * hs };
  const size_t ldg = C + 2 * NKV * hs, ldm = 3 * C, no = (size_t)B * T * C;
  const size_t na = (size_t)B * NH * T * T;
  uint64_t s = 55;
  float *qg = zeros(B * T * ldg), *qm = zeros(B * T * ldm), *w = zeros(no);
  fill(qg, B * T * ldg, -1.5, 1.5, &s);
  fill(w, no, -1, 1, &s);
  for (size_t bt = 0; bt < (size_t)B * T; bt++) {
    memcpy(qm + bt * ldm, qg + bt * ldg, C * sizeof(float));
    for (int h = 0; h < NH; h++) {
      memcpy(qm + bt * ldm + C + h * hs, qg + bt * ldg + C + (h / G) * hs, hs * sizeof(float));
      memcpy(qm + bt * ldm + 2 * C + h * hs, qg + bt * ldg + C + (NKV + h / G) * hs,
             hs * sizeof(float));
    }
  }
  float *og = zeros(no), *om = zeros(no), *ag = zeros(na), *am = zeros(na), *sc = zeros(na);
  wf_attention_gqa_forward(og, ag, qg, NULL, B, T, C, NH, NKV);
  wf_attention_forward(om, am, qm, B, T, C, NH);
  double *ref = to_double(om, no);
  check_close("gqa out vs repeated kv", og, ref, no, FWD_RTOL);
  free(ref);
  float *dg = zeros(B * T * ldg), *dm = zeros(B * T * ldm);
  wf_attention_gqa_backward(dg, sc, w, qg, ag, NULL, B, T, C, NH, NKV);
  wf_attention_backward(dm, sc, w, qm, am, B, T, C, NH);
  double *sum = calloc((size_t)B * T * ldg, sizeof *sum); /* dm folded back to GQA's layout */
  for (size_t bt = 0; bt < (size_t)B * T; bt++) {
    for (int e = 0; e < C; e++)
      sum[bt * ldg + e] = dm[bt * ldm + e];
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < hs; d++) {
        sum[bt * ldg + C + (h / G) * hs + d] += dm[bt * ldm + C + h * hs + d];
        sum[bt * ldg + C + (NKV + h / G) * hs + d] += dm[bt * ldm + 2 * C + h * hs + d];
      }
  }
  check_close("gqa dqkv vs repeated kv", dg, sum, B * T * ldg, FWD_RTOL);
  free(qg), free(qm), free(w), free(og), free(om), free(ag), free(am), free(sc), free(dg);
  free(dm), free(sum);
}

int main(void)
{
  /* two threads even on one core, so the threaded paths run */
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmsnorm),    cmocka_unit_test(test_residual_rmsnorm),
      cmocka_unit_test(test_rope_table), cmocka_unit_test(test_rope_table_llama3),
      cmocka_unit_test(test_rope),       cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_gqa),        cmocka_unit_test(test_gqa_is_repeated_kv),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
