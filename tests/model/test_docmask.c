/*
 * test_docmask.c - packed documents (data.document_mask) on one rank: the loss and the
 * gradients of a packed batch equal those of its documents run one by one, for GPT-2
 * (learned positions) and Llama (RoPE, grouped-query attention), on the CPU.
 *
 * A batch of 2 rows x 32 positions packs 5 documents (lengths 5, 11, 16 | 1, 31); each
 * document is also run alone as a (1, n) batch with the same tokens and the same targets
 * at each position, positions 0 .. n-1. With document starts, attention keeps to each
 * document and positions restart, so position t of the packed row computes exactly what
 * position t - start computes alone: the loss sum over the 64 positions and every
 * parameter's gradient must agree.
 *
 * Tolerance, from where the two runs may round differently. The packed row's attention
 * GEMMs take a query block's keys from its first document's start (keys of earlier
 * documents of the block get probability 0) where the lone run takes the document's own
 * keys: the products agree, but a sum over k keys may round in another order, changing
 * it by at most k eps sum |terms| (eps = 2^-24, k <= 32): under 2e-6 of an attention
 * output. Everything else (LayerNorm/RMSNorm, GEMMs over channels, the loss per
 * position) sees the same rows in the same order. Through 2 layers and the head such a
 * perturbation moves a position's loss by the same order relative to it, and the
 * gradients' sums over positions by the same order relative to their size: the bound is
 * 1e-5 relative (the loss sum; each parameter tensor's gradient in L2 norm), five times
 * over the 2e-6 above. Without starts the packed loss differs by far more (asserted: the
 * test can fail).
 *
 * The 16-bit attention forms (activations stored in bf16, computed in fp32 in between):
 * a packed batch's out and dqkv rows against each document's own, kernel by kernel. The
 * fp32 values before the store differ as above (under 1e-5 relative); rounded to bf16 they
 * may then fall on either side of a rounding boundary, one bf16 step apart: the bound is
 * 2^-8 |value| (one step) + 1e-6.
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
#include "wf_runtime.h"

#define ROWS 2  /* B */
#define LEN  32 /* T */
#define VOC  64 /* V */
#define NT   (sizeof lens / sizeof *lens)

static const int lens[] = {5, 11, 16, 1, 31}; /* rows of 32: 5 + 11 + 16, 1 + 31 */
static const double BOUND = 1e-5;             /* relative; the header says why */

static wf_model_dims dims_of(const char *family)
{
  wf_model_dims d = {.fam = wf_model_family_find(family),
                     .L = 2,
                     .NH = 4,
                     .C = 32,
                     .maxT = LEN,
                     .V = VOC,
                     .Vp = VOC,
                     .KV = strcmp(family, "llama") ? 0 : 2,
                     .rope_theta = 10000};
  return wf_model_dims_resolve(&d);
}

static wf_model *make(const wf_model_dims *d)
{
  wf_model *m = NULL;
  wf_model_opts o = {
      .dims = *d, .shard = wf_model_shard_whole(d), .B = ROWS, .T = LEN, .slots = 1, .docs = true};
  assert_int_equal(wf_model_create_shard(&m, &o), WF_OK);
  assert_int_equal(wf_model_init(m, 11), WF_OK);
  /* away from the initial point (zero biases, unit norms): every path carries gradient */
  float *p = wf_model_params(m);
  for (size_t i = 0; i < wf_model_num_params(d); i++)
    p[i] += 0.2f * wf_rng_normal(5, 77, i);
  return m;
}

/* The packed batch: tokens, targets, and each position's document start. */
static void batch(int *in, int *tg, int *starts)
{
  for (int i = 0; i < ROWS * LEN; i++) {
    in[i] = (int)(wf_rng_u64(3, 1, (uint64_t)i) % VOC);
    tg[i] = (int)(wf_rng_u64(3, 2, (uint64_t)i) % VOC);
  }
  for (size_t d = 0, at = 0; d < NT; d++) /* documents fill the rows in order */
    for (int t = 0; t < lens[d]; t++, at++)
      starts[at] = (int)(at % LEN) - t;
}

/* Loss sum over the batch's positions and the gradients of one forward and backward;
 * starts NULL: no documents. */
static double run(wf_model *m, const int *in, const int *tg, const int *starts, int b, int t,
                  float dscale)
{
  double sum = 0;
  assert_int_equal(wf_model_chunk_forward(m, 0, 0, in, NULL, tg, starts, b, t), WF_OK);
  assert_int_equal(wf_model_take_loss(m, &sum), WF_OK);
  assert_int_equal(wf_model_backward(m, dscale), WF_OK);
  return sum * b * t; /* the micro-batch's mean, back to a sum */
}

static double rel_diff(const float *a, const float *b, size_t n)
{
  double d = 0, s = 0;
  for (size_t i = 0; i < n; i++) {
    d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    s += (double)b[i] * b[i];
  }
  return s > 0 ? sqrt(d / s) : sqrt(d);
}

static void check_family(const char *family)
{
  wf_model_dims d = dims_of(family);
  wf_model *m = make(&d);
  size_t np = wf_model_num_params(&d);
  int in[ROWS * LEN], tg[ROWS * LEN], starts[ROWS * LEN];
  batch(in, tg, starts);
  float *packed = malloc(np * sizeof *packed);
  /* the same batch without starts is another computation */
  assert_int_equal(wf_model_zero_grad(m), WF_OK);
  double lw = run(m, in, tg, NULL, ROWS, LEN, 1.0f);
  /* packed, with starts: loss gradient 1 / (B T) per position (wf_model_backward) */
  assert_int_equal(wf_model_zero_grad(m), WF_OK);
  double lp = run(m, in, tg, starts, ROWS, LEN, 1.0f);
  memcpy(packed, wf_model_grads(m), np * sizeof *packed);
  /* each document alone, its gradient scaled to the same 1 / (B T) per position */
  assert_int_equal(wf_model_zero_grad(m), WF_OK);
  double ls = 0;
  for (size_t k = 0, at = 0; k < NT; at += (size_t)lens[k], k++)
    ls += run(m, in + at, tg + at, NULL, 1, lens[k], (float)lens[k] / (ROWS * LEN));
  double dl = fabs(lp - ls) / fabs(ls);
  printf("%s: loss sum packed %.9g, documents alone %.9g: relative %.2e (bound %.0e); "
         "without starts %.9g (%.2e)\n",
         family, lp, ls, dl, BOUND, lw, fabs(lw - ls) / fabs(ls));
  assert_true(dl <= BOUND);
  assert_true(fabs(lw - ls) / fabs(ls) > 100 * BOUND);
  const wf_model_desc *desc = wf_model_get_desc(m);
  const float *alone = wf_model_grads(m);
  double worst = 0;
  for (int t = 0; t < desc->n; t++) {
    size_t off = wf_model_tensor_offset(&d, t), n = wf_model_tensor_numel(&d, t);
    double r = rel_diff(packed + off, alone + off, n);
    worst = r > worst ? r : worst;
    if (r > BOUND)
      fail_msg("%s: gradient of %s differs by %.2e relative (bound %.0e)", family, desc->t[t].name,
               r, BOUND);
  }
  printf("%s: gradients of all %d tensors within %.2e relative\n", family, desc->n, worst);
  free(packed);
  wf_model_destroy(m);
}

static void test_gpt2(void **state)
{
  (void)state;
  check_family("gpt2");
}

static void test_llama(void **state)
{
  (void)state;
  check_family("llama");
}

/* rows [r0, r0 + n) of x (rows of w floats, stored in fmt) widened into y. */
static void rows_of(float *y, const void *x, size_t r0, size_t n, size_t w, int fmt)
{
  wf_storage_load(y, (const char *)x + r0 * w * wf_storage_size(fmt), n * w, fmt);
}

/* One bf16 step (8 significant bits) of a value v in [2^e, 2^(e+1)) is 2^(e-7): up to
 * 2^-7 of |v| near the bottom of its binade (0.003326 and 0.003342 are one step apart,
 * 1.5e-5 = 2^-16, 0.46% of the value), so one step is bounded by 2^-7 |v|, not 2^-8. */
static void within_a_step(const char *what, const float *packed, const float *alone, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (fabsf(packed[i] - alone[i]) > 0x1p-7f * fabsf(alone[i]) + 1e-6f)
      fail_msg("%s[%zu]: packed %.7g, alone %.7g: more than one bf16 step", what, i, packed[i],
               alone[i]);
}

/* The bf16 attention kernels: a packed batch's rows against each document run alone. */
static void test_attention16(void **state)
{
  (void)state;
  enum { NH = 4, NKV = 2, hs = 8, C = NH * hs, W = C + 2 * NKV * hs, F = WF_PREC_BF16 };
  const size_t N = ROWS * LEN;
  int starts[ROWS * LEN], in[ROWS * LEN], tg[ROWS * LEN];
  batch(in, tg, starts);
  float *x = malloc(N * W * sizeof *x), *dy = malloc(N * C * sizeof *dy);
  for (size_t i = 0; i < N * W; i++)
    x[i] = wf_rng_normal(9, 1, i);
  for (size_t i = 0; i < N * C; i++)
    dy[i] = wf_rng_normal(9, 2, i);
  uint16_t *qkv = malloc(N * W * 2), *dout = malloc(N * C * 2), *out = malloc(N * C * 2);
  uint16_t *dqkv = malloc(N * W * 2), *o1 = malloc(N * C * 2), *d1 = malloc(N * W * 2);
  uint16_t *att = malloc((size_t)ROWS * NH * LEN * LEN * 2);
  float *a = malloc(N * W * sizeof *a), *b = malloc(N * W * sizeof *b);
  wf_storage_store(qkv, x, N * W, F);
  wf_storage_store(dout, dy, N * C, F);
  wf_attention_gqa_forward16(out, att, qkv, starts, ROWS, LEN, C, NH, NKV, F);
  wf_attention_gqa_backward16(dqkv, NULL, dout, qkv, att, starts, ROWS, LEN, C, NH, NKV, F);
  for (size_t k = 0, at = 0; k < NT; at += (size_t)lens[k], k++) {
    const size_t n = (size_t)lens[k];
    wf_attention_gqa_forward16(o1, att, (const char *)qkv + at * W * 2, NULL, 1, (int)n, C, NH, NKV,
                               F);
    wf_attention_gqa_backward16(d1, NULL, (const char *)dout + at * C * 2,
                                (const char *)qkv + at * W * 2, att, NULL, 1, (int)n, C, NH, NKV,
                                F);
    rows_of(a, out, at, n, C, F), rows_of(b, o1, 0, n, C, F);
    within_a_step("out", a, b, n * C);
    rows_of(a, dqkv, at, n, W, F), rows_of(b, d1, 0, n, W, F);
    within_a_step("dqkv", a, b, n * W);
  }
  printf("bf16 attention (grouped-query): %zu documents' out and dqkv within one bf16 step\n", NT);
  free(x), free(dy), free(qkv), free(dout), free(out), free(dqkv), free(o1), free(d1), free(att);
  free(a), free(b);
}

/* Starts that are no document starts are refused, naming the position. */
static void test_bad_starts(void **state)
{
  (void)state;
  wf_model_dims d = dims_of("gpt2");
  wf_model *m = make(&d);
  int in[ROWS * LEN] = {0}, tg[ROWS * LEN] = {0}, starts[ROWS * LEN] = {0};
  starts[LEN + 7] = 3; /* row 1: position 7 claims a start at 3, inside the one document */
  assert_int_equal(wf_model_chunk_forward(m, 0, 0, in, NULL, tg, starts, ROWS, LEN), WF_EINVAL);
  wf_model_destroy(m);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt2),
      cmocka_unit_test(test_llama),
      cmocka_unit_test(test_attention16),
      cmocka_unit_test(test_bad_starts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
