/*
 * test_grad.c - every kernel's forward against a double-precision reference, and its
 * backward against central finite differences of that reference (see check.h for
 * the method and the tolerances). Shapes are small and odd on purpose; the matmul
 * and attention cases also include shapes that take the threaded GEMM split and the
 * causal row blocking (T > 128). Every backward is also called twice to check that it
 * ADDS into its gradients (2x the first result).
 */
#include "check.h"
#include "wf_kernels.h"

/* ---- encoder ------------------------------------------------------------------- */

struct enc {
  int B, T, C;
  const int *inp;
  double *wte, *wpe, *out;
  const float *w;
};

static double enc_loss(void *p)
{
  struct enc *e = p;
  for (int bt = 0; bt < e->B * e->T; bt++)
    for (int c = 0; c < e->C; c++)
      e->out[bt * e->C + c] = e->wte[e->inp[bt] * e->C + c] + e->wpe[(bt % e->T) * e->C + c];
  return dot_w(e->out, e->w, (size_t)e->B * e->T * e->C);
}

static void test_encoder(void **state)
{
  enum { B = 2, T = 5, C = 12, V = 7, MAXT = 6, N = B * T * C };
  uint64_t s = 1;
  int inp[B * T];
  for (int i = 0; i < B * T; i++)
    inp[i] = (int)(urand(&s) * V);
  inp[3] = inp[7] = 2; /* the same token twice, so backward must accumulate rows */
  float wte[V * C], wpe[MAXT * C], w[N], out[N];
  fill(wte, V * C, -1, 1, &s);
  fill(wpe, MAXT * C, -1, 1, &s);
  fill(w, N, -1, 1, &s);
  double ro[N];
  struct enc e = {B, T, C, inp, to_double(wte, V * C), to_double(wpe, MAXT * C), ro, w};
  encode(out, inp, wte, 0, INT_MAX, wpe, B, T, C);
  enc_loss(&e);
  check_close("encoder out", out, ro, N, FWD_RTOL);
  float *dwte = zeros(V * C), *dwpe = zeros(MAXT * C);
  encode_backward(dwte, dwpe, w, inp, 0, INT_MAX, B, T, C);
  check_grad("dwte", enc_loss, &e, e.wte, V * C, dwte);
  check_grad("dwpe", enc_loss, &e, e.wpe, MAXT * C, dwpe);
  float *d2 = zeros(V * C), *p2 = zeros(MAXT * C);
  encode_backward(d2, p2, w, inp, 0, INT_MAX, B, T, C);
  encode_backward(d2, p2, w, inp, 0, INT_MAX, B, T, C);
  check_doubled("dwte", d2, dwte, V * C);
  check_doubled("dwpe", p2, dwpe, MAXT * C);
  free(e.wte), free(e.wpe), free(dwte), free(dwpe), free(d2), free(p2);
}

/* ---- layernorm ----------------------------------------------------------------- */

struct ln {
  int N, C;
  double *x, *wt, *b, *out;
  const float *w;
};

static double ln_loss(void *p)
{
  struct ln *l = p;
  for (int i = 0; i < l->N; i++) {
    const double *x = l->x + i * l->C;
    double m = 0, v = 0;
    for (int c = 0; c < l->C; c++)
      m += x[c] / l->C;
    for (int c = 0; c < l->C; c++)
      v += (x[c] - m) * (x[c] - m) / l->C;
    for (int c = 0; c < l->C; c++)
      l->out[i * l->C + c] = (x[c] - m) / sqrt(v + 1e-5) * l->wt[c] + l->b[c];
  }
  return dot_w(l->out, l->w, (size_t)l->N * l->C);
}

static void test_layernorm(void **state)
{
  enum { N = 7, C = 12, NC = N * C };
  uint64_t s = 2;
  float x[NC], wt[C], b[C], w[NC], out[NC], mean[N], rstd[N];
  fill(x, NC, -0.7, 1.3, &s); /* a non-zero mean */
  fill(wt, C, 0.5, 1.5, &s);
  fill(b, C, -0.5, 0.5, &s);
  fill(w, NC, -1, 1, &s);
  double ro[NC];
  struct ln l = {N, C, to_double(x, NC), to_double(wt, C), to_double(b, C), ro, w};
  wf_layernorm_forward(out, mean, rstd, x, wt, b, N, C);
  ln_loss(&l);
  check_close("layernorm out", out, ro, NC, FWD_RTOL);
  float *dx = zeros(NC), *dw = zeros(C), *db = zeros(C);
  wf_layernorm_backward(dx, dw, db, w, x, wt, mean, rstd, N, C);
  check_grad("ln dinp", ln_loss, &l, l.x, NC, dx);
  check_grad("ln dweight", ln_loss, &l, l.wt, C, dw);
  check_grad("ln dbias", ln_loss, &l, l.b, C, db);
  float *dx2 = zeros(NC), *dw2 = zeros(C), *db2 = zeros(C);
  for (int k = 0; k < 2; k++)
    wf_layernorm_backward(dx2, dw2, db2, w, x, wt, mean, rstd, N, C);
  check_doubled("ln dinp", dx2, dx, NC);
  check_doubled("ln dweight", dw2, dw, C);
  check_doubled("ln dbias", db2, db, C);
  free(l.x), free(l.wt), free(l.b), free(dx), free(dw), free(db), free(dx2), free(dw2);
  free(db2);
}

/* ---- matmul -------------------------------------------------------------------- */

struct mm {
  int N, C, OC;
  double *x, *wt, *b, *out; /* b may be NULL */
  const float *w;
};

static double mm_loss(void *p)
{
  struct mm *m = p;
  for (int i = 0; i < m->N; i++)
    for (int o = 0; o < m->OC; o++) {
      double acc = m->b ? m->b[o] : 0.0;
      for (int c = 0; c < m->C; c++)
        acc += m->x[(size_t)i * m->C + c] * m->wt[(size_t)o * m->C + c];
      m->out[(size_t)i * m->OC + o] = acc;
    }
  return dot_w(m->out, m->w, (size_t)m->N * m->OC);
}

static void run_matmul(int N, int C, int OC, int with_bias, uint64_t seed)
{
  uint64_t s = seed;
  size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  float *x = zeros(nx), *wt = zeros(nw), *b = zeros(OC), *w = zeros(no), *out = zeros(no);
  fill(x, nx, -1, 1, &s);
  fill(wt, nw, -1, 1, &s);
  fill(b, OC, -1, 1, &s);
  fill(w, no, -1, 1, &s);
  double *ro = malloc(no * sizeof *ro), *rb = with_bias ? to_double(b, OC) : NULL;
  struct mm m = {N, C, OC, to_double(x, nx), to_double(wt, nw), rb, ro, w};
  wf_matmul_forward(out, x, wt, with_bias ? b : NULL, N, C, OC);
  mm_loss(&m);
  check_close("matmul out", out, ro, no, FWD_RTOL);
  float *dx = nans(nx), *dw = zeros(nw), *db = zeros(OC); /* dinp is written, from NaN */
  wf_matmul_backward(dx, dw, with_bias ? db : NULL, w, x, wt, N, C, OC);
  check_grad("mm dinp", mm_loss, &m, m.x, nx, dx);
  check_grad("mm dweight", mm_loss, &m, m.wt, nw, dw);
  if (with_bias)
    check_grad("mm dbias", mm_loss, &m, m.b, OC, db);
  /* twice: dinp is written again (1x), the parameters' gradients add (2x) */
  float *dx2 = nans(nx), *dw2 = zeros(nw), *db2 = zeros(OC);
  for (int k = 0; k < 2; k++)
    wf_matmul_backward(dx2, dw2, with_bias ? db2 : NULL, w, x, wt, N, C, OC);
  check_rewritten("mm dinp", dx2, dx, nx);
  check_doubled("mm dweight", dw2, dw, nw);
  if (with_bias)
    check_doubled("mm dbias", db2, db, OC);
  free(x), free(wt), free(b), free(w), free(out), free(ro), free(rb), free(m.x), free(m.wt);
  free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}

static void test_matmul(void **state)
{
  run_matmul(7, 12, 5, 1, 3);
  run_matmul(7, 12, 5, 0, 4);
  /* N*C*OC > 2^20: the GEMMs are split over threads, by columns (OC > N) ... */
  run_matmul(37, 97, 301, 1, 5);
  /* ... and by rows (N > OC) */
  run_matmul(301, 97, 37, 1, 6);
}

static void test_matmul_no_dinp(void **state)
{
  enum { N = 7, C = 12, OC = 5 };
  uint64_t s = 7;
  float x[N * C], wt[OC * C], w[N * OC], dw1[OC * C] = {0}, dw2[OC * C] = {0};
  fill(x, N * C, -1, 1, &s);
  fill(wt, OC * C, -1, 1, &s);
  fill(w, N * OC, -1, 1, &s);
  float dx[N * C] = {0};
  wf_matmul_backward(dx, dw1, NULL, w, x, wt, N, C, OC);
  wf_matmul_backward(NULL, dw2, NULL, w, x, wt, N, C, OC);
  for (int i = 0; i < OC * C; i++)
    assert_true(dw1[i] == dw2[i]);
  /* no output channels: dinp is the empty sum, written as 0; dweight gets nothing */
  float dx0[N * C];
  for (int i = 0; i < N * C; i++)
    dx0[i] = NAN;
  wf_matmul_backward(dx0, dw2, NULL, w, x, wt, N, C, 0);
  for (int i = 0; i < N * C; i++)
    assert_true(dx0[i] == 0.0f);
  for (int i = 0; i < OC * C; i++)
    assert_true(dw1[i] == dw2[i]);
}

/* ---- attention ----------------------------------------------------------------- */

struct at {
  int B, T, C, NH;
  double *qkv, *out, *att;
  const float *w;
};

static double at_loss(void *p)
{
  struct at *a = p;
  ref_attention(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH, a->NH);
  return dot_w(a->out, a->w, (size_t)a->B * a->T * a->C);
}

static void run_attention(int B, int T, int C, int NH, uint64_t seed)
{
  uint64_t s = seed;
  size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
  float *qkv = zeros(nq), *w = zeros(no), *out = zeros(no), *att = zeros(na);
  fill(qkv, nq, -1.5, 1.5, &s);
  fill(w, no, -1, 1, &s);
  double *ro = malloc(no * sizeof *ro), *ra = malloc(na * sizeof *ra);
  struct at a = {B, T, C, NH, to_double(qkv, nq), ro, ra, w};
  wf_attention_forward(out, att, qkv, B, T, C, NH);
  at_loss(&a);
  check_close("attention out", out, ro, no, FWD_RTOL);
  check_close("attention att", att, ra, na, FWD_RTOL);
  for (size_t i = 0; i < na; i++) /* above the diagonal: exactly 0 */
    if ((i % T) > (i / T) % T)
      assert_true(att[i] == 0.0f);
  float *dq = nans(nq), *dq2 = nans(nq), *scratch = zeros(na); /* dqkv is written */
  wf_attention_backward(dq, scratch, w, qkv, att, B, T, C, NH);
  check_grad("dqkv", at_loss, &a, a.qkv, nq, dq);
  for (int k = 0; k < 2; k++)
    wf_attention_backward(dq2, scratch, w, qkv, att, B, T, C, NH);
  check_rewritten("dqkv", dq2, dq, nq);
  free(qkv), free(w), free(out), free(att), free(ro), free(ra), free(a.qkv), free(dq);
  free(dq2), free(scratch);
}

static void test_attention(void **state)
{
  run_attention(2, 5, 12, 3, 8);
  run_attention(1, 1, 6, 2, 9); /* a single position: att = 1 */
  /* T > 128: two causal row blocks, and the (b, h) loop is threaded */
  run_attention(2, 133, 8, 2, 10);
}

/* ---- gelu, residual ------------------------------------------------------------ */

struct ew {
  size_t n;
  double *x, *y, *out;
  const float *w;
};

static double gelu_loss(void *p)
{
  struct ew *e = p;
  for (size_t i = 0; i < e->n; i++) {
    double x = e->x[i];
    e->out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  }
  return dot_w(e->out, e->w, e->n);
}

static void test_gelu(void **state)
{
  enum { N = 61 };
  uint64_t s = 11;
  float x[N], w[N], out[N], dx[N], dx2[N];
  for (int i = 0; i < N; i++) /* dinp is written: from NaN */
    dx[i] = dx2[i] = NAN;
  fill(x, N, -4, 4, &s);
  x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f, x[3] = 1e-3f; /* tails and the origin */
  fill(w, N, -1, 1, &s);
  double ro[N];
  struct ew e = {N, to_double(x, N), NULL, ro, w};
  wf_gelu_forward(out, x, N);
  gelu_loss(&e);
  check_close("gelu out", out, ro, N, FWD_RTOL);
  wf_gelu_backward(dx, x, w, N);
  check_grad("gelu dinp", gelu_loss, &e, e.x, N, dx);
  for (int k = 0; k < 2; k++) /* written again, not added: 1x */
    wf_gelu_backward(dx2, x, w, N);
  check_rewritten("gelu dinp", dx2, dx, N);
  free(e.x);
}

static double res_loss(void *p)
{
  struct ew *e = p;
  for (size_t i = 0; i < e->n; i++)
    e->out[i] = e->x[i] + e->y[i];
  return dot_w(e->out, e->w, e->n);
}

static void test_residual(void **state)
{
  enum { N = 37 };
  uint64_t s = 12;
  float a[N], b[N], w[N], out[N], da[N] = {0}, db[N] = {0};
  fill(a, N, -1, 1, &s);
  fill(b, N, -1, 1, &s);
  fill(w, N, -1, 1, &s);
  double ro[N];
  struct ew e = {N, to_double(a, N), to_double(b, N), ro, w};
  wf_residual_forward(out, a, b, N);
  res_loss(&e);
  check_close("residual out", out, ro, N, FWD_RTOL);
  wf_residual_backward(da, db, w, N);
  check_grad("residual da", res_loss, &e, e.x, N, da);
  check_grad("residual db", res_loss, &e, e.y, N, db);
  wf_residual_backward(da, db, w, N);
  for (int i = 0; i < N; i++)
    assert_true(da[i] == 2.0f * w[i] && db[i] == 2.0f * w[i]);
  free(e.x), free(e.y);
}

int main(void)
{
  /* two threads even on one core, so the threaded paths run */
  wf_kernels_set_threads(2);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoder),   cmocka_unit_test(test_layernorm),
      cmocka_unit_test(test_matmul),    cmocka_unit_test(test_matmul_no_dinp),
      cmocka_unit_test(test_attention), cmocka_unit_test(test_gelu),
      cmocka_unit_test(test_residual),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
