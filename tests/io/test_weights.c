/*
 * test_weights.c - the weights dispatch (worker/ckpt/weights.c): every format written and
 * read back through the same calls model.init and --save use, told apart by content, and
 * the refusals of what is no model at all.
 *
 * A tiny GPT-2 (L=2, NH=2, C=8, maxT=8, V=11 padded to 16) with random parameters; the
 * padded rows of wte are zero, as the model keeps them (safetensors leaves them out).
 */
#include <glob.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "wf_ckpt.h"

#include "../common/capture.h"

static const wf_model_dims tiny = {.L = 2, .NH = 2, .C = 8, .maxT = 8, .V = 11, .Vp = 16};

typedef struct fixture {
  char dir[64], path[128];
  float *p, *q;
  size_t n;
  char err[1024];
} fixture;

static int setup(void **state)
{
  fixture *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  strcpy(f->dir, "/tmp/wf_weights_XXXXXX");
  if (!mkdtemp(f->dir))
    return -1;
  f->n = wf_model_num_params(&tiny);
  f->p = malloc(f->n * sizeof *f->p);
  f->q = malloc(f->n * sizeof *f->q);
  if (!f->p || !f->q)
    return -1;
  for (size_t i = 0; i < f->n; i++)
    f->p[i] = wf_rng_normal(5, 0, i) * 0.02f;
  memset(f->p + (size_t)tiny.V * tiny.C, 0, (size_t)(tiny.Vp - tiny.V) * tiny.C * sizeof(float));
  *state = f;
  return 0;
}

static int teardown(void **state)
{
  fixture *f = *state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  if (system(cmd) != 0)
    return -1;
  free(f->p);
  free(f->q);
  free(f);
  return 0;
}

/* Write p as `name` in format fmt, peek and read it back into q. */
static void roundtrip(fixture *f, const char *name, wf_weights_fmt fmt)
{
  snprintf(f->path, sizeof f->path, "%s/%s", f->dir, name);
  assert_int_equal(wf_weights_write(f->path, fmt, &tiny, f->p, 0), WF_OK);
  wf_model_dims d, want = tiny;
  /* safetensors holds no padded vocabulary: a reader pads V to a multiple of 128 */
  if (fmt == WF_WEIGHTS_SAFETENSORS)
    want.Vp = 128;
  assert_int_equal(wf_weights_peek(f->path, "model.init", &d), WF_OK);
  assert_true(wf_model_dims_same(&d, &want, NULL, NULL, NULL));
  assert_true(wf_weights_probe(f->path, &d));
  assert_true(wf_model_dims_same(&d, &want, NULL, NULL, NULL));
  memset(f->q, 0xff, f->n * sizeof *f->q);
  assert_int_equal(wf_weights_read(f->path, "model.init", &tiny, f->q), WF_OK);
}

static void test_llmc(void **state)
{
  fixture *f = *state;
  roundtrip(f, "m.bin", WF_WEIGHTS_LLMC);
  assert_memory_equal(f->p, f->q, f->n * sizeof *f->p); /* float32: bit for bit */
}

static void test_llmc_bf16(void **state)
{
  fixture *f = *state;
  roundtrip(f, "m5.bin", WF_WEIGHTS_LLMC_BF16);
  for (size_t i = 0; i < f->n; i++) {
    /* within half a bf16 ulp (8 significant bits: 2^-9 of the value's binade top) */
    int e;
    frexpf(f->p[i], &e);
    assert_true(fabsf(f->q[i] - f->p[i]) <= ldexpf(1.0f, e - 9));
    uint32_t u;
    memcpy(&u, &f->q[i], 4);
    assert_int_equal(u & 0xffffu, 0); /* a bf16 value */
  }
}

static void test_safetensors(void **state)
{
  fixture *f = *state;
  roundtrip(f, "m.safetensors", WF_WEIGHTS_SAFETENSORS);
  assert_memory_equal(f->p, f->q, f->n * sizeof *f->p);
  /* told by its header too, under any name */
  char other[160];
  snprintf(other, sizeof other, "%s/weights.dat", f->dir);
  assert_int_equal(rename(f->path, other), 0);
  memset(f->q, 0, f->n * sizeof *f->q);
  assert_int_equal(wf_weights_read(other, "model.init", &tiny, f->q), WF_OK);
  assert_memory_equal(f->p, f->q, f->n * sizeof *f->p);
}

/* Not a model at all: one message naming the key, the file and the three formats. */
static void test_not_weights(void **state)
{
  fixture *f = *state;
  wf_model_dims d;
  snprintf(f->path, sizeof f->path, "%s/notes.txt", f->dir);
  FILE *fp = fopen(f->path, "w");
  assert_non_null(fp);
  fputs("just some text, no weights here\n", fp);
  fclose(fp);
  capture_begin();
  assert_int_equal(wf_weights_peek(f->path, "model.init", &d), WF_EFORMAT);
  capture_end(f->err, sizeof f->err);
  assert_non_null(strstr(f->err, "model.init="));
  assert_non_null(strstr(f->err, f->path));
  assert_non_null(strstr(f->err, "neither an llm.c GPT-2 checkpoint"));
  assert_false(wf_weights_probe(f->path, &d));
  snprintf(f->path, sizeof f->path, "%s/absent.bin", f->dir);
  capture_begin();
  assert_int_equal(wf_weights_read(f->path, "model.init", &tiny, f->q), WF_EIO);
  capture_end(f->err, sizeof f->err);
  assert_non_null(strstr(f->err, "cannot open it"));
  /* a directory that holds no checkpoint */
  capture_begin();
  assert_int_not_equal(wf_weights_peek(f->dir, "model.init", &d), WF_OK);
  capture_end(f->err, sizeof f->err);
  assert_non_null(strstr(f->err, "not a weft checkpoint"));
  assert_false(wf_weights_probe(f->dir, &d));
}

/* ---- ranged reads ------------------------------------------------------------------
 * wf_weights_read_shard of every format against the whole read sliced
 * (wf_model_shard_exchange), bit for bit: the whole model and shards of tp 2, pp 2
 * and both, each cut into the ranges ZeRO-3 gives dp 1 and dp 3. The models are big enough that a
 * tensor spans several of safetensors' pieces (2^20 elements): GPT-2's Conv1D weights
 * (transposed in the file) and its 3000-token embedding, Llama's untied head. */

static const struct wf_shard_case {
  int tp, tp_rank, l0, l1;
  bool first, last;
} shard_cases[] = {
    {1, 0, 0, 2, true, true},
    {2, 1, 0, 2, true, true},
    {1, 0, 0, 1, true, false},
    {2, 1, 1, 2, false, true},
};

/* Every shard and dp range of `path` read ranged equals `full` sliced. */
static void check_ranged(const char *path, const wf_model_dims *d, const float *full)
{
  for (size_t i = 0; i < sizeof shard_cases / sizeof *shard_cases; i++) {
    const struct wf_shard_case *c = &shard_cases[i];
    wf_model_shard s = {.tp = c->tp,
                        .tp_rank = c->tp_rank,
                        .l0 = c->l0,
                        .l1 = c->l1,
                        .first = c->first,
                        .last = c->last};
    size_t n = wf_model_shard_params(d, &s);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    assert_non_null(want);
    assert_non_null(got);
    wf_model_shard_exchange(d, &s, want, 0, n, (float *)full, false);
    for (size_t dp = 1; dp <= 3; dp += 2) {
      size_t per = (n + dp - 1) / dp;
      memset(got, 0xff, n * sizeof *got);
      for (size_t lo = 0; lo < n; lo += per) {
        size_t hi = lo + per < n ? lo + per : n;
        assert_int_equal(wf_weights_read_shard(path, "model.init", d, &s, lo, hi, got + lo), WF_OK);
      }
      if (memcmp(want, got, n * sizeof *got)) {
        size_t k = 0;
        while (!memcmp(&want[k], &got[k], sizeof *got))
          k++;
        fail_msg("%s: shard %zu at dp %zu: element %zu is %g, the whole read's %g", path, i, dp, k,
                 got[k], want[k]);
      }
    }
    free(want);
    free(got);
  }
}

/* A model of dims d with random parameters (zero padding rows) written as safetensors
 * (one file, and a folder of shards of shard_bytes), each read ranged. */
static void ranged_safetensors(fixture *f, const wf_model_dims *dims, size_t shard_bytes)
{
  wf_model_dims d = wf_model_dims_resolve(dims);
  size_t n = wf_model_num_params(&d);
  float *p = malloc(n * sizeof *p), *whole = malloc(n * sizeof *whole);
  assert_non_null(p);
  assert_non_null(whole);
  for (size_t i = 0; i < n; i++)
    p[i] = wf_rng_normal(7, 0, i) * 0.02f;
  const char *names[] = {"r.safetensors", "folder/"};
  for (int k = 0; k < 2; k++) {
    snprintf(f->path, sizeof f->path, "%s/%s", f->dir, names[k]);
    assert_int_equal(wf_weights_write(f->path, WF_WEIGHTS_SAFETENSORS, &d, p, shard_bytes), WF_OK);
    if (k == 1) {
      char index[200];
      snprintf(index, sizeof index, "%s/model.safetensors.index.json", f->path);
      assert_true(access(index, F_OK) == 0); /* sharded */
    }
    assert_int_equal(wf_weights_read(f->path, "model.init", &d, whole), WF_OK);
    check_ranged(f->path, &d, whole);
    wf_model_dims got;
    assert_int_equal(wf_weights_check(f->path, "model.init", &got), WF_OK);
    assert_true(wf_model_dims_same(&got, &d, NULL, NULL, NULL));
  }
  /* the check opens every shard: one cut short (its last tensor's bytes missing) fails it */
  char pattern[200];
  glob_t g;
  struct stat sb;
  snprintf(pattern, sizeof pattern, "%s/model-00002-of-*.safetensors", f->path);
  assert_int_equal(glob(pattern, 0, NULL, &g), 0);
  assert_int_equal(stat(g.gl_pathv[0], &sb), 0);
  assert_int_equal(truncate(g.gl_pathv[0], sb.st_size - 4), 0);
  globfree(&g);
  wf_model_dims got;
  assert_int_not_equal(wf_weights_check(f->path, "model.init", &got), WF_OK);
  free(p);
  free(whole);
}

static void test_ranged_gpt2(void **state)
{
  wf_model_dims d = {.L = 2, .NH = 10, .C = 640, .maxT = 64, .V = 3000, .Vp = 3072};
  ranged_safetensors(*state, &d, 4000000);
}

static void test_ranged_llama(void **state)
{
  wf_model_dims d = {.fam = wf_model_family_find("llama"),
                     .L = 2,
                     .NH = 8,
                     .KV = 2,
                     .C = 640,
                     .maxT = 64,
                     .V = 3000,
                     .Vp = 3072,
                     .F = 1792};
  ranged_safetensors(*state, &d, 4000000);
}

static void test_format_names(void **state)
{
  (void)state;
  wf_weights_fmt fmt;
  assert_true(wf_weights_fmt_parse("llmc", &fmt) && fmt == WF_WEIGHTS_LLMC);
  assert_true(wf_weights_fmt_parse("llmc-bf16", &fmt) && fmt == WF_WEIGHTS_LLMC_BF16);
  assert_true(wf_weights_fmt_parse("safetensors", &fmt) && fmt == WF_WEIGHTS_SAFETENSORS);
  assert_false(wf_weights_fmt_parse("pt", &fmt));
}

int main(void)
{
#define T_(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T_(test_llmc),         T_(test_llmc_bf16),   T_(test_safetensors),  T_(test_not_weights),
      T_(test_format_names), T_(test_ranged_gpt2), T_(test_ranged_llama),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
