/*
 * twin_loss.c - CUDA kernels against their CPU twins (twin.h): the loss: the fused bf16 classifier,
 * cross-entropy, its parts and the loss mean.
 */
#include "twin.h"

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

void test_classifier(ctx *c)
{
  classifier_case(c, 13, 37, 40);
  end_case(c);
  classifier_case(c, 5, 61, 64);
  end_case(c);
  xent16_case(c);
}

/* A vocabulary slice [v_offset, v_offset + V) with padding to ld; targets drawn
 * from a wider range so some rows have their target in another slice. */
void test_xent(ctx *c)
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

/* Vocabulary-parallel statistics: 3 ranks' packed rows, one with an empty slice (its
 * sumexp 0 must add nothing), combined; then the loss mean added to a running sum. */
void test_xent_parts(ctx *c)
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
