/*
 * test_determinism.c - the same inputs twice give bit-identical outputs with the
 * configured thread count (2, so the threaded paths run even on one core), for a
 * small transformer-block-shaped sequence of every kernel; and a run with 1 thread
 * (or 3) agrees with it within float rounding (the split changes no formula).
 */
#include <string.h>

#include "check.h"
#include "wf_kernels.h"

/* Sizes put every kernel above the 16384-element threshold under which it runs on
 * one thread (WF__PAR_MIN in kernels/cpu), so every threaded path is taken. */
enum { B = 3, T = 97, C = 96, NH = 4, OC = 3 * C, V = 129, LD = 136 };
enum { BT = B * T, NQ = BT * OC, NA = B * NH * T * T, NL = BT * LD };

/* Every output and gradient of one forward + backward + AdamW pass, in one buffer. */
struct run {
  float ln[BT * C], mean[BT], rstd[BT], qkv[NQ], att[NA], attout[BT * C], gel[BT * C];
  float logits[NL], mx[BT], se[BT], tl[BT], loss[BT];
  float dqkv[NQ], scratch[NA], dln[BT * C], dw[OC * C], db[OC], dlnw[C], dlnb[C];
  float dwl[V * C], dx[BT * C], p[OC * C], m[OC * C], v[OC * C], dgel[BT * C], dattout[BT * C];
  double norm;
};

struct inputs {
  float x[BT * C], lnw[C], lnb[C], w[OC * C], b[OC], wl[V * C];
  int targets[BT];
};

static void pass(struct run *r, const struct inputs *in)
{
  memset(r, 0, sizeof *r);
  wf_layernorm_forward(r->ln, r->mean, r->rstd, in->x, in->lnw, in->lnb, BT, C);
  wf_matmul_forward(r->qkv, r->ln, in->w, in->b, BT, C, OC);
  wf_attention_forward(r->attout, r->att, r->qkv, B, T, C, NH);
  wf_gelu_forward(r->gel, r->attout, BT * C);
  wf_matmul_forward(r->logits, r->gel, in->wl, NULL, BT, C, V); /* ld = V here */
  wf_xent_stats(r->mx, r->se, r->tl, r->logits, in->targets, BT, V, V, 0);
  wf_xent_loss(r->loss, r->mx, r->se, r->tl, BT);
  wf_xent_backward(r->logits, r->logits, r->mx, r->se, in->targets, 1.0f / BT, BT, V, V, 0);
  wf_matmul_backward(r->dgel, r->dwl, NULL, r->logits, r->gel, in->wl, BT, C, V);
  wf_gelu_backward(r->dattout, r->attout, r->dgel, BT * C);
  wf_attention_backward(r->dqkv, r->scratch, r->dattout, r->qkv, r->att, B, T, C, NH);
  wf_matmul_backward(r->dln, r->dw, r->db, r->dqkv, r->ln, in->w, BT, C, OC);
  wf_layernorm_backward(r->dx, r->dlnw, r->dlnb, r->dln, in->x, in->lnw, r->mean, r->rstd, BT, C);
  memcpy(r->p, in->w, sizeof r->p);
  wf_adamw_update(r->p, r->m, r->v, r->dw, OC * C, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
  r->norm = wf_sumsq(r->dw, OC * C);
}

static void make_inputs(struct inputs *in)
{
  uint64_t s = 41;
  fill(in->x, BT * C, -1, 1, &s);
  fill(in->lnw, C, 0.5, 1.5, &s);
  fill(in->lnb, C, -0.1, 0.1, &s);
  fill(in->w, OC * C, -0.3, 0.3, &s);
  fill(in->b, OC, -0.1, 0.1, &s);
  fill(in->wl, V * C, -0.3, 0.3, &s);
  for (int i = 0; i < BT; i++)
    in->targets[i] = (int)(urand(&s) * V);
}

static void test_bit_identical(void **state)
{
  struct inputs *in = malloc(sizeof *in);
  struct run *a = malloc(sizeof *a), *b = malloc(sizeof *b);
  make_inputs(in);
  wf_kernels_set_threads(2);
  pass(a, in);
  pass(b, in);
  assert_memory_equal(a, b, sizeof *a);
  /* 1 and 3 threads (uneven shares): the same mathematics with other GEMM splits
   * and reduction orders; the gradients pass through ~6 float32 kernels, so they
   * agree to ~1e-5 of their scale (1e-4 leaves margin). */
  double ref[BT * C];
  for (int i = 0; i < BT * C; i++)
    ref[i] = a->dx[i];
  for (int nt = 1; nt <= 3; nt += 2) {
    wf_kernels_set_threads(nt);
    assert_int_equal(wf_kernels_threads(), nt);
    pass(b, in);
    assert_true(fabs(a->norm - b->norm) <= 1e-4 * a->norm);
    check_close("dx, 1 or 3 threads vs 2", b->dx, ref, BT * C, 1e-4);
  }
  wf_kernels_set_threads(0); /* below 1 means 1 */
  assert_int_equal(wf_kernels_threads(), 1);
  free(in), free(a), free(b);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bit_identical),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
