/*
 * test_train.c - the trainer: learning-rate schedule, convergence to the synthetic
 * source's entropy floor, bit-identical determinism, gradient accumulation, the
 * metrics file, and file sources end to end.
 *
 * Each case runs in its own process (meson passes the case name as argv[1]), so they
 * run in parallel and a slow one cannot hide a fast one's failure.
 */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "wf_kernels.h"
#include "wf_model.h"
#include "wf_train.h"

enum { MAX_STEPS = 1000 };

typedef struct record {
  int n;
  double loss[MAX_STEPS], val[MAX_STEPS];
  double floor;
  int first_within; /* first evaluated step with val_loss < floor + 0.1; 0 = none */
} record;

static bool on_step(void *user, const wf_train_step_info *in)
{
  record *r = user;
  r->loss[r->n] = in->loss;
  r->val[r->n] = in->val_loss;
  r->floor = in->entropy_floor;
  if (!r->first_within && !isnan(in->val_loss) && in->val_loss < in->entropy_floor + 0.1)
    r->first_within = in->step;
  r->n++;
  return r->n < MAX_STEPS;
}

/* A small GPT on the synthetic source. Fields are set directly (no config parser) with
 * the values the parser's defaults would give for a one-rank run. */
static void tiny_config(wf_config *c, int steps, uint64_t seed)
{
  memset(c, 0, sizeof *c);
  snprintf(c->model.preset, sizeof c->model.preset, "test-tiny");
  c->model.layers = 2, c->model.heads = 4, c->model.d_model = 64, c->model.seq_len = 64;
  c->model.vocab = 256, c->model.padded_vocab = 256;
  c->mesh.dp = c->mesh.tp = c->mesh.pp = 1;
  c->train.steps = steps, c->train.batch_size = 16, c->train.microbatches = 1;
  c->train.seq_len = 64, c->train.seed = seed;
  c->train.lr = 1e-2, c->train.min_lr = 1e-3, c->train.warmup = 10;
  c->train.eval_every = 0, c->train.eval_batches = 8;
  c->optim.clip = 1.0, c->optim.weight_decay = 0.0;
  c->optim.beta1 = 0.9, c->optim.beta2 = 0.95, c->optim.eps = 1e-8;
  c->data.val_fraction = 0.1;
}

static void run(const wf_config *c, record *r)
{
  memset(r, 0, sizeof *r);
  wf_train_hooks h = {.user = r, .on_step = on_step, .quiet = true};
  assert_int_equal(wf_train_run(c, &h), WF_OK);
  assert_int_equal(r->n, c->train.steps);
}

/* ---- schedule ------------------------------------------------------------------------ */

static void test_lr_schedule(void **state)
{
  wf_config c;
  tiny_config(&c, 110, 1);
  /* Linear warm-up: step s of 10 gets lr * s / 10. */
  assert_true(fabs(wf_train_lr(&c, 1) - 1e-3) < 1e-15);
  assert_true(fabs(wf_train_lr(&c, 10) - 1e-2) < 1e-15);
  /* Cosine from 1e-2 to 1e-3 over steps 10..110: half-way (step 60) is the mean, the
   * last step is min_lr, and it never goes up. */
  assert_true(fabs(wf_train_lr(&c, 60) - 5.5e-3) < 1e-12);
  assert_true(fabs(wf_train_lr(&c, 110) - 1e-3) < 1e-15);
  for (int s = 11; s <= 110; s++)
    assert_true(wf_train_lr(&c, s) <= wf_train_lr(&c, s - 1));
}

/* ---- convergence ------------------------------------------------------------------------ */

/* The model: one layer, d_model 64, 4 heads, 32 x 32 tokens per step, lr 1e-2 (10
 * warm-up steps, cosine to 1e-3). One layer is enough for a first-order chain (the
 * model only has to learn P(next | current)); it halves the time of gpt2-tiny.
 *
 * The bound: measured on the 2-core development machine (one BLAS/OpenMP pool of 2
 * threads), a 150-step run first came within 0.1 nats of the floor at step 100-130 for
 * seeds 1-5 (final gaps 0.050-0.078); with this seed and 200 steps, at step 120 with a
 * final gap of 0.038. CONVERGE_STEPS = 200 gives ~60% headroom over the worst measured
 * crossing, and the cosine tail gives the final gap room against the 0.1 limit. */
#define CONVERGE_MEASURED 120
#define CONVERGE_STEPS    200

static void test_converges(void **state)
{
  wf_config c;
  tiny_config(&c, CONVERGE_STEPS, 1234);
  c.model.layers = 1, c.model.seq_len = 32, c.train.seq_len = 32, c.train.batch_size = 32;
  c.train.eval_every = 20;
  static record r;
  double t = wf_now();
  run(&c, &r);
  t = wf_now() - t;
  double val = r.val[r.n - 1];
  printf("entropy floor H = %.4f nats; val loss %.4f after %d steps (gap %.4f); first within "
         "0.1 nats at step %d (measured %d); %.1f s\n",
         r.floor, val, r.n, val - r.floor, r.first_within, CONVERGE_MEASURED, t);
  for (int i = 0; i < r.n; i++)
    if (!isnan(r.val[i]))
      printf("  step %4d loss %.4f val %.4f\n", i + 1, r.loss[i], r.val[i]);
  assert_true(isfinite(r.floor) && r.floor > 0);
  assert_true(val > r.floor - 0.05); /* no model can beat the entropy rate (0.05: noise) */
  assert_true(val < r.floor + 0.1);
  assert_true(r.first_within > 0 && r.first_within <= CONVERGE_STEPS);
}

/* ---- determinism ------------------------------------------------------------------------- */

static void test_deterministic(void **state)
{
  wf_config c;
  static record a, b;
  tiny_config(&c, 8, 42);
  run(&c, &a);
  run(&c, &b);
  /* Same seed: the same bits, step for step. */
  assert_memory_equal(a.loss, b.loss, sizeof(double) * 8);
  /* Another seed: another init and other data, so even the first loss differs. */
  c.train.seed = 43;
  run(&c, &b);
  for (int i = 0; i < 8; i++)
    assert_true(a.loss[i] != b.loss[i]);
}

/* Gradient accumulation: four micro-batches of 4 rows are the same mathematics as one
 * batch of 16 (the loss of each is scaled by 1/4), up to float summation order. */
static void test_microbatches(void **state)
{
  wf_config c;
  static record a, b;
  tiny_config(&c, 6, 7);
  run(&c, &a);
  c.train.microbatches = 4;
  run(&c, &b);
  for (int i = 0; i < 6; i++) {
    printf("step %d: M=1 %.7f  M=4 %.7f\n", i + 1, a.loss[i], b.loss[i]);
    assert_true(fabs(a.loss[i] - b.loss[i]) < 1e-4);
  }
}

/* ---- metrics ------------------------------------------------------------------------------- */

static void test_metrics(void **state)
{
  char path[] = "/tmp/weft_metrics_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  wf_config c;
  tiny_config(&c, 5, 3);
  c.train.eval_every = 2, c.train.eval_batches = 1;
  snprintf(c.train.metrics, sizeof c.train.metrics, "%s", path);
  static record r;
  run(&c, &r);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int n = 0;
  static const char *keys[] = {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms"};
  while (fgets(line, sizeof line, f)) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    assert_non_null(o);
    n++;
    assert_int_equal(json_integer_value(json_object_get(o, "step")), n);
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
      assert_true(json_is_number(json_object_get(o, keys[k])));
    assert_true(json_real_value(json_object_get(o, "loss")) == r.loss[n - 1]);
    /* Evaluated after steps 2 and 4 (eval_every) and 5 (the end). */
    bool evaluated = n == 2 || n == 4 || n == 5;
    assert_int_equal(json_is_number(json_object_get(o, "val_loss")), evaluated);
    json_decref(o);
  }
  fclose(f);
  unlink(path);
  assert_int_equal(n, 5);
}

/* ---- file sources ------------------------------------------------------------------------- */

static void test_file_sources(void **state)
{
  char dir[] = "/tmp/weft_train_XXXXXX", path[64];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/a.txt", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int i = 0; i < 400; i++)
    fputs("the quick brown fox jumps over the lazy dog. ", f);
  fclose(f);
  wf_config c;
  tiny_config(&c, 4, 1);
  c.train.eval_every = 2, c.train.eval_batches = 2;
  snprintf(c.data.path, sizeof c.data.path, "%s", path);
  static record r;
  run(&c, &r);
  assert_true(isnan(r.floor)); /* no known floor for a file */
  assert_true(r.loss[3] < r.loss[0]);
  assert_true(isfinite(r.val[1]) && isfinite(r.val[3]));

  /* A shard with a token outside the model's vocabulary stops the run before step 1. */
  snprintf(path, sizeof path, "%s/s.bin", dir);
  f = fopen(path, "wb");
  int32_t h[256] = {20240520, 1, 1000};
  fwrite(h, sizeof h, 1, f);
  for (int i = 0; i < 1000; i++) {
    uint16_t t = (uint16_t)(i == 500 ? 300 : i % 200);
    fwrite(&t, sizeof t, 1, f);
  }
  fclose(f);
  snprintf(c.data.path, sizeof c.data.path, "%s", path);
  memset(&r, 0, sizeof r);
  wf_train_hooks hk = {.user = &r, .on_step = on_step, .quiet = true};
  assert_int_equal(wf_train_run(&c, &hk), WF_EFORMAT);
  assert_int_equal(r.n, 0);
  unlink(path);
  snprintf(path, sizeof path, "%s/a.txt", dir);
  unlink(path);
  rmdir(dir);
}

/* ---- llm.c checkpoints ---------------------------------------------------------------------- */

/* model.init: the checkpoint's dimensions win over the config's, and training from a
 * checkpoint of the seed's own initial weights is the same run, bit for bit. */
static void test_init_from_checkpoint(void **state)
{
  char path[] = "/tmp/weft_init_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  wf_config c;
  tiny_config(&c, 4, 11);
  wf_gpt_dims d = wf_gpt_dims_from_config(&c);
  wf_gpt *m = NULL;
  char err[512];
  assert_int_equal(wf_gpt_create(&m, &d, 1, 8), WF_OK);
  wf_gpt_init(m, 11);
  assert_int_equal(wf_gpt_save_llmc(m, path, err, sizeof err), WF_OK);
  wf_gpt_destroy(m);
  static record a, b;
  run(&c, &a);
  c.model.layers = 5; /* ignored: the checkpoint says 2 */
  snprintf(c.model.init, sizeof c.model.init, "%s", path);
  run(&c, &b);
  assert_memory_equal(a.loss, b.loss, sizeof(double) * 4);
  /* A missing checkpoint is an error before step 1. */
  unlink(path);
  wf_train_hooks h = {.quiet = true};
  assert_int_not_equal(wf_train_run(&c, &h), WF_OK);
}

/* --dump-state: llm.c's debug state for the first global batch, B x T from the config. */
static void test_dump_state(void **state)
{
  char path[] = "/tmp/weft_state_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  wf_config c;
  tiny_config(&c, 4, 11);
  c.train.microbatches = 4; /* the dump covers the whole global batch at once */
  assert_int_equal(wf_train_dump_state(&c, path, NULL), WF_OK);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  int32_t h[256];
  assert_int_equal(fread(h, sizeof h, 1, f), 1);
  fclose(f);
  assert_int_equal(h[0], 20240327); /* llm.c's debug-state magic and version */
  assert_int_equal(h[1], 2);
  assert_int_equal(h[2], 16);
  assert_int_equal(h[3], 64);
  unlink(path);
}

int main(int argc, char **argv)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lr_schedule),
      cmocka_unit_test(test_converges),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_microbatches),
      cmocka_unit_test(test_metrics),
      cmocka_unit_test(test_file_sources),
      cmocka_unit_test(test_init_from_checkpoint),
      cmocka_unit_test(test_dump_state),
  };
  wf_kernels_set_threads(2);
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
