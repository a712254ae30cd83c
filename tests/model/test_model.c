/*
 * test_model.c - the GPT-2 model on one rank: layout, initialisation, a whole-model
 * gradient check, gradient accumulation, a short training run and its determinism.
 *
 * Models here are tiny (C = 8..32) so each test takes milliseconds; the vocab is
 * padded with a few rows (Vp > V) so the padding invariants are exercised too.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wf_kernels.h"
#include "wf_model.h"
#include "../common/gpt2_kinds.h"
#include "wf_optim.h"

/* L=2, NH=2, C=8, maxT=8, V=11 padded to 16. */

/* The loss of a forward on the whole model, or NaN when the forward fails. */
static float forward_loss(wf_model *m, const int *in, const int *tg, int B, int T)
{
  float loss = 0;
  return wf_model_forward(m, in, tg, B, T, &loss) == WF_OK ? loss : NAN;
}

/* The global L2 norm of the gradients (host-visible on the CPU device). */
static float grad_norm(wf_model *m)
{
  return (float)sqrt(wf_sumsq(wf_model_grads(m), wf_model_local_params(m)));
}

static const wf_model_dims tiny = {.L = 2, .NH = 2, .C = 8, .maxT = 8, .V = 11, .Vp = 16};

static void make_batch(int *inputs, int *targets, int B, int T, int V, int salt)
{
  for (int i = 0; i < B * T; i++) {
    inputs[i] = (i * 7 + salt) % V;
    targets[i] = (i * 5 + 3 * salt + 1) % V;
  }
}

static void test_num_params(void **state)
{
  (void)state;
  /* GPT-2 124M with the vocab padded to 50304: llm.c's train_gpt2 prints
   * "num_parameters: 124475904" for this checkpoint. */
  wf_model_dims small = {.L = 12, .NH = 12, .C = 768, .maxT = 1024, .V = 50257, .Vp = 50304};
  assert_int_equal(wf_model_num_params(&small), 124475904);
  size_t sum = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    assert_int_equal(wf_model_tensor_offset(&small, k), sum);
    sum += wf_model_tensor_numel(&small, k);
  }
  assert_int_equal(sum, 124475904);
  /* qkvw is (L, 3C, C). */
  assert_int_equal(wf_model_tensor_numel(&small, WF_P_QKVW), 12u * 3 * 768 * 768);
  /* The family's description is llm.c's order, name by name (gpt2_kinds.h). */
  wf_model_desc desc;
  wf_model_describe(&small, &desc);
  assert_int_equal(desc.n, WF_GPT_NUM_KINDS);
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++)
    assert_string_equal(desc.t[k].name, gpt2_name(k));
  assert_true(desc.t[WF_P_WTE].decay && !desc.t[WF_P_LN1W].decay);
  assert_false(desc.t[WF_P_QKVB].decay);
}

static void test_dims_from_config(void **state)
{
  (void)state;
  wf_config cfg;
  char err[512];
  wf_config_init(&cfg);
  assert_int_equal(wf_config_set(&cfg, "model.preset", "gpt2-small", WF_SRC_CLI, err, sizeof err),
                   WF_OK);
  assert_int_equal(wf_config_validate(&cfg, 1, err, sizeof err), WF_OK);
  wf_model_dims d = wf_model_dims_from_config(&cfg);
  /* GPT-2 124M (the gpt2-small), vocab 50257 padded to 50304 = 393 * 128. */
  wf_model_dims want = {.L = 12, .NH = 12, .C = 768, .maxT = 1024, .V = 50257, .Vp = 50304};
  assert_true(wf_model_dims_same(&d, &want, NULL, NULL, NULL));
  assert_string_equal(wf_model_family_name(&d), "gpt2");
  assert_int_equal(d.KV, 12);
  assert_int_equal(d.F, 4 * 768);
  assert_int_equal(d.tie, WF_TIE_YES);
  assert_null(wf_model_dims_check(&d));
}

static void test_flops(void **state)
{
  (void)state;
  wf_model_dims small = {.L = 12, .NH = 12, .C = 768, .maxT = 1024, .V = 50257, .Vp = 50304};
  /* 6 * params * tokens + 12 * L * B * T * T * C (see wf_model_flops_per_step). */
  double want = 6.0 * 124475904.0 * 256 + 12.0 * 12 * 4 * 64 * 64 * 768;
  assert_true(fabs(wf_model_flops_per_step(&small, 4, 64) - want) < 1.0);
}

static void test_create_rejects_bad_dims(void **state)
{
  (void)state;
  wf_model *m = (wf_model *)1;
  wf_model_dims d = tiny;
  d.NH = 3; /* 8 is not a multiple of 3 */
  assert_int_equal(wf_model_create(&m, &d, 1, 4), WF_EINVAL);
  assert_null(m);
  d = tiny;
  d.C = 0;
  assert_int_equal(wf_model_create(&m, &d, 1, 4), WF_EINVAL);
  assert_int_equal(wf_model_create(&m, &tiny, 1, tiny.maxT + 1), WF_EINVAL);
  wf_model_destroy(NULL);
}

/* The initial values: GPT-2's distribution, zero padding, and any slice of any tensor
 * equal to the same range of the full initialisation. */
static void test_init_slice(void **state)
{
  (void)state;
  wf_model_dims d = {.L = 3, .NH = 4, .C = 32, .maxT = 16, .V = 50, .Vp = 64};
  wf_model *m;
  assert_int_equal(wf_model_create(&m, &d, 1, 4), WF_OK);
  wf_model_init(m, 1234);
  float buf[4096];
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    size_t n = wf_model_layer_numel(&d, k);
    int layers = gpt2_layered(k) ? d.L : 1;
    for (int l = 0; l < layers; l++) {
      const float *full = wf_model_param(m, k, l, 0);
      /* Ranges: a prefix, an odd middle piece, the tail, one element. */
      size_t ranges[4][2] = {{0, n / 3}, {n / 5 + 1, n / 2}, {n - n / 4, n / 4}, {n - 1, 1}};
      for (int r = 0; r < 4; r++) {
        size_t first = ranges[r][0], cnt = ranges[r][1];
        wf_model_init_slice(buf, k, l, &d, 1234, first, cnt);
        assert_memory_equal(buf, full + first, cnt * sizeof(float));
      }
    }
  }
  /* A slice of wte straddling the first padding row: real values then zeros. */
  const float *wte = wf_model_param(m, WF_P_WTE, 0, 0);
  size_t real = (size_t)d.V * d.C;
  wf_model_init_slice(buf, WF_P_WTE, 0, &d, 1234, real - 5, 10);
  assert_memory_equal(buf, wte + real - 5, 10 * sizeof(float));
  for (size_t i = real; i < (size_t)d.Vp * d.C; i++)
    assert_true(wte[i] == 0.0f);
  assert_true(wte[0] != 0.0f);
  /* Layernorm weights 1, biases 0. */
  assert_true(wf_model_param(m, WF_P_LN2W, 2, 0)[5] == 1.0f);
  assert_true(wf_model_param(m, WF_P_LNFB, 0, 0)[5] == 0.0f);
  assert_true(wf_model_param(m, WF_P_FCB, 1, 0)[7] == 0.0f);
  /* Standard deviations: 0.02, and 0.02/sqrt(2L) for the residual projections. Over
   * 3*4*32*32 = 12288 samples the sample std is within 3% of the true one with
   * overwhelming probability (its relative standard error is 1/sqrt(2n) = 0.6%). */
  wf_param_kind kinds[2] = {WF_P_FCW, WF_P_FCPROJW};
  double want[2] = {0.02, 0.02 / sqrt(6.0)};
  for (int i = 0; i < 2; i++) {
    const float *p = wf_model_param(m, kinds[i], 0, 0);
    size_t n = wf_model_tensor_numel(&d, kinds[i]);
    double s = 0;
    for (size_t j = 0; j < n; j++)
      s += (double)p[j] * p[j];
    assert_true(fabs(sqrt(s / n) / want[i] - 1.0) < 0.03);
  }
  /* Another seed gives other numbers. */
  wf_model_init_slice(buf, WF_P_QKVW, 1, &d, 1235, 0, 64);
  assert_memory_not_equal(buf, wf_model_param(m, WF_P_QKVW, 1, 0), 64 * sizeof(float));
  /* Different layers and kinds draw different numbers. */
  assert_true(wf_model_param(m, WF_P_QKVW, 0, 0)[0] != wf_model_param(m, WF_P_QKVW, 1, 0)[0]);
  wf_model_destroy(m);
}

/* Move every parameter away from the initial point (which has zero biases, unit
 * layernorm weights and tiny weights) so that every path of the backward carries a
 * gradient of order one; padding rows of wte stay zero. */
static void perturb(wf_model *m, uint64_t seed)
{
  const wf_model_dims *d = wf_model_get_dims(m);
  float *p = wf_model_params(m);
  size_t n = wf_model_num_params(d), wte_real = (size_t)d->V * d->C;
  size_t wte_end = (size_t)d->Vp * d->C;
  for (size_t i = 0; i < n; i++)
    if (i < wte_real || i >= wte_end)
      p[i] += 0.3f * wf_rng_normal(seed, 99, i);
}

static double loss_at(wf_model *m, const int *in, const int *tg, int B, int T)
{
  return forward_loss(m, in, tg, B, T);
}

/*
 * Whole-model gradient check by central differences in float32, on every parameter
 * kind and every layer (6 sampled elements each, plus the padding rows of wte whose
 * gradient must be exactly zero).
 *
 * Tolerance: |numeric - analytic| <= 5e-4 + 5e-3 * |analytic|.
 *  - The forward runs in float32: the loss (about 2.5) carries a rounding error of a
 *    few 1e-7 (relative 2^-24 per operation, with the kernels' reductions over
 *    C <= 32 terms). With step h = 1e-2 the difference quotient divides that by
 *    2h = 0.02, so it is off by up to about 5e-5.
 *  - The truncation error h^2/6 * f''' grows with the gradient; on these O(1)
 *    activations it measured at most 2.4e-4 relative (|diff| 8.6e-5 on a gradient
 *    of 0.36 with the reference kernels), so 5e-3 leaves a 20x margin.
 *  - Most sampled gradients are above 1e-2 (asserted), where a 2% error in the
 *    backward (2e-4 + 5e-5 allowed vs 2e-4 wrong at 1e-2, far more above) is caught;
 *    a missed term or wrong index is off by 100%.
 */
static void test_gradcheck(void **state)
{
  (void)state;
  enum { B = 2, T = 5 };
  int in[B * T], tg[B * T];
  wf_model *m;
  assert_int_equal(wf_model_create(&m, &tiny, B, T), WF_OK);
  wf_model_init(m, 7);
  perturb(m, 8);
  make_batch(in, tg, B, T, tiny.V, 1);
  wf_model_zero_grad(m);
  float loss = forward_loss(m, in, tg, B, T);
  assert_true(loss > 0.5f && loss < 20.0f);
  wf_model_backward(m, 1.0f);
  const float h = 1e-2f;
  int checked = 0, big = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    int layers = gpt2_layered(k) ? tiny.L : 1;
    size_t n = wf_model_layer_numel(&tiny, k);
    if (k == WF_P_WTE)
      n = (size_t)tiny.V * tiny.C; /* sample real rows; padding checked below */
    for (int l = 0; l < layers; l++) {
      float *p = wf_model_param(m, k, l, 0);
      const float *g = wf_model_param(m, k, l, 1);
      for (int s = 0; s < 6; s++) {
        size_t i = (size_t)(wf_rng_u64(5, (uint64_t)k * 64 + l, s) % n);
        float save = p[i];
        p[i] = save + h;
        double lp = loss_at(m, in, tg, B, T);
        p[i] = save - h;
        double lm = loss_at(m, in, tg, B, T);
        p[i] = save;
        double num = (lp - lm) / (2.0 * h), an = g[i];
        if (getenv("WF_GRADCHECK_VERBOSE"))
          printf("%-8s l%d %4zu num %+.6f an %+.6f diff %.2e\n", gpt2_name(k), l, i, num, an,
                 fabs(num - an));
        if (fabs(num - an) > 5e-4 + 5e-3 * fabs(an))
          fail_msg("%s layer %d [%zu]: numeric %.6g analytic %.6g", gpt2_name(k), l, i, num, an);
        checked++;
        big += fabs(an) > 1e-2;
      }
    }
  }
  /* The check is only meaningful if most gradients are well above the tolerance. */
  assert_true(checked == 6 * (4 + 12 * tiny.L));
  assert_true(big > checked / 2);
  const float *gwte = wf_model_param(m, WF_P_WTE, 0, 1);
  for (size_t i = (size_t)tiny.V * tiny.C; i < (size_t)tiny.Vp * tiny.C; i++)
    assert_true(gwte[i] == 0.0f);
  wf_model_destroy(m);
}

/* Backward adds, and dloss_scale scales what it adds: a pass with scale 1 then one
 * with scale 0.5 on the same batch give 1.5 times the gradient. So M micro-batches
 * with scale 1/M give the mean gradient. */
static void test_backward_accumulates(void **state)
{
  (void)state;
  enum { B = 2, T = 6 };
  int in[B * T], tg[B * T];
  wf_model *m;
  assert_int_equal(wf_model_create(&m, &tiny, B, T), WF_OK);
  wf_model_init(m, 3);
  perturb(m, 4);
  make_batch(in, tg, B, T, tiny.V, 2);
  size_t n = wf_model_num_params(&tiny);
  float *one = malloc(n * sizeof(float));
  assert_non_null(one);
  wf_model_zero_grad(m);
  float l1 = forward_loss(m, in, tg, B, T);
  wf_model_backward(m, 1.0f);
  memcpy(one, wf_model_grads(m), n * sizeof(float));
  float norm1 = grad_norm(m);
  assert_true(norm1 > 0.0f);
  float l2 = forward_loss(m, in, tg, B, T);
  assert_true(l1 == l2); /* forward does not depend on the gradients */
  wf_model_backward(m, 0.5f);
  const float *g = wf_model_grads(m);
  float gmax = 0.0f;
  for (size_t i = 0; i < n; i++)
    gmax = fmaxf(gmax, fabsf(one[i]));
  /* Not bit-exact: the second pass adds its terms one at a time onto the first
   * pass's sums. Each element is a sum of at most B*T = 12 products of magnitude
   * <= gmax, rounded at 2^-24 each: 1e-5 * gmax bounds that with a 10x margin. */
  for (size_t i = 0; i < n; i++)
    assert_true(fabsf(g[i] - 1.5f * one[i]) <= 1e-5f * gmax);
  assert_true(fabsf(grad_norm(m) - 1.5f * norm1) <= 1e-5f * norm1);
  /* Backward without a forward with targets is refused and changes nothing. */
  forward_loss(m, in, NULL, B, T);
  memcpy(one, g, n * sizeof(float));
  assert_int_equal(wf_model_backward(m, 1.0f), WF_EINVAL);
  assert_memory_equal(one, g, n * sizeof(float));
  free(one);
  wf_model_destroy(m);
}

/* Loss normalisation: two micro-batches of 2 sequences with dloss_scale 1/2 give the
 * gradient (and mean loss) of the 4-sequence batch, up to summation order. */
static void test_microbatches_match_batch(void **state)
{
  (void)state;
  enum { B = 4, T = 6 };
  int in[B * T], tg[B * T];
  wf_model *m;
  assert_int_equal(wf_model_create(&m, &tiny, B, T), WF_OK);
  wf_model_init(m, 5);
  perturb(m, 6);
  make_batch(in, tg, B, T, tiny.V, 3);
  size_t n = wf_model_num_params(&tiny);
  float *full = malloc(n * sizeof(float));
  assert_non_null(full);
  wf_model_zero_grad(m);
  float loss = forward_loss(m, in, tg, B, T);
  wf_model_backward(m, 1.0f);
  memcpy(full, wf_model_grads(m), n * sizeof(float));
  wf_model_zero_grad(m);
  float l0 = forward_loss(m, in, tg, B / 2, T);
  wf_model_backward(m, 0.5f);
  float l1 = forward_loss(m, in + B * T / 2, tg + B * T / 2, B / 2, T);
  wf_model_backward(m, 0.5f);
  /* float32 means of 24 vs 2 x 12 terms: a few ulps of a loss of about 2.5. */
  assert_true(fabsf(0.5f * (l0 + l1) - loss) < 1e-5f);
  const float *g = wf_model_grads(m);
  float gmax = 0.0f;
  for (size_t i = 0; i < n; i++)
    gmax = fmaxf(gmax, fabsf(full[i]));
  /* Same terms, summed in another order: bounded as in test_backward_accumulates. */
  for (size_t i = 0; i < n; i++)
    assert_true(fabsf(g[i] - full[i]) <= 1e-5f * gmax);
  free(full);
  wf_model_destroy(m);
}

/* Out-of-vocabulary tokens are an error (WF_EINVAL, logged with the position and
 * value the device's check found), never an out-of-bounds read. */
static void test_forward_rejects_bad_tokens(void **state)
{
  (void)state;
  int in[4] = {0, 1, 2, 11}, tg[4] = {1, 2, 3, 4};
  float loss = -1;
  wf_model *m;
  assert_int_equal(wf_model_create(&m, &tiny, 1, 4), WF_OK);
  assert_int_equal(wf_model_init(m, 1), WF_OK);
  assert_int_equal(wf_model_forward(m, in, tg, 1, 4, &loss), WF_EINVAL);
  in[3] = 0, tg[2] = -1;
  assert_int_equal(wf_model_forward(m, in, tg, 1, 4, &loss), WF_EINVAL);
  tg[2] = 3;
  assert_int_equal(wf_model_forward(m, in, tg, 2, 4, &loss), WF_EINVAL); /* bigger than created */
  assert_int_equal(wf_model_forward(m, in, tg, 1, 4, &loss), WF_OK);
  assert_true(loss > 0 && isfinite(loss));
  wf_model_destroy(m);
}

/* Train a small model on one fixed batch of a repeating sequence; returns the losses. */
static void train_run(float *losses, int steps)
{
  enum { B = 4, T = 16 };
  wf_model_dims d = {.L = 2, .NH = 2, .C = 32, .maxT = 16, .V = 27, .Vp = 32};
  int in[B * T], tg[B * T];
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      in[b * T + t] = (b * 5 + t * 3) % d.V;
      tg[b * T + t] = (b * 5 + (t + 1) * 3) % d.V;
    }
  /* AdamW at a constant lr 1e-2 (min_lr = lr), betas 0.9 / 0.95, weight decay 0.1,
   * clipped at norm 1. */
  wf_config cfg;
  wf_config_init(&cfg);
  cfg.train.lr = cfg.train.min_lr = 1e-2, cfg.train.warmup = 0, cfg.train.steps = steps;
  cfg.optim.beta1 = 0.9, cfg.optim.beta2 = 0.95, cfg.optim.eps = 1e-8;
  cfg.optim.weight_decay = 0.1, cfg.optim.clip = 1.0, cfg.precision = WF_PREC_NO;
  wf_model *m;
  wf_optim *o;
  assert_int_equal(wf_model_create(&m, &d, B, T), WF_OK);
  assert_int_equal(wf_model_init(m, 42), WF_OK);
  wf_optim_opts oo = {.cfg = &cfg, .model = m, .hi = wf_model_local_params(m), .dp_size = 1};
  assert_int_equal(wf_optim_create(&o, &oo), WF_OK);
  for (int s = 0; s < steps; s++) {
    wf_optim_step_info oi;
    assert_int_equal(wf_model_zero_grad(m), WF_OK);
    losses[s] = forward_loss(m, in, tg, B, T);
    if (getenv("WF_TRAIN_VERBOSE"))
      printf("step %d loss %.5f\n", s, losses[s]);
    assert_int_equal(wf_model_backward(m, 1.0f), WF_OK);
    assert_int_equal(wf_optim_step(o, s + 1, losses[s], grad_norm(m), wf_model_grads(m), &oi),
                     WF_OK);
    assert_int_equal(wf_model_params_changed(m), WF_OK);
  }
  wf_optim_destroy(o);
  /* Padding rows of wte are still exactly zero after training. */
  const float *wte = wf_model_param(m, WF_P_WTE, 0, 0);
  for (size_t i = (size_t)d.V * d.C; i < (size_t)d.Vp * d.C; i++)
    assert_true(wte[i] == 0.0f);
  wf_model_destroy(m);
}

/* 30 AdamW steps memorise a batch whose next token is a fixed function of the
 * current one: the loss starts near ln(27) = 3.3 (uniform prediction) and must fall
 * below a twentieth of that (0.16; a correct model reaches about 0.05, and falls
 * smoothly all the way, so the bound is not sensitive to rounding). Two runs are bit-identical (no
 * hidden state, fixed reduction orders at a fixed thread count). */
static void test_train_tiny(void **state)
{
  (void)state;
  enum { STEPS = 30 };
  float a[STEPS], b[STEPS];
  train_run(a, STEPS);
  train_run(b, STEPS);
  assert_true(fabsf(a[0] - logf(27.0f)) < 0.2f);
  assert_true(a[STEPS - 1] < 0.05f * a[0]);
  assert_memory_equal(a, b, sizeof a);
}

int main(void)
{
  wf_kernels_set_threads(1);
  /* the model's rules on the model.* keys, as the worker's main sets them */
  wf_config_set_model_check(wf_model_config_check);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_num_params),
      cmocka_unit_test(test_dims_from_config),
      cmocka_unit_test(test_flops),
      cmocka_unit_test(test_create_rejects_bad_dims),
      cmocka_unit_test(test_init_slice),
      cmocka_unit_test(test_gradcheck),
      cmocka_unit_test(test_backward_accumulates),
      cmocka_unit_test(test_microbatches_match_batch),
      cmocka_unit_test(test_forward_rejects_bad_tokens),
      cmocka_unit_test(test_train_tiny),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
