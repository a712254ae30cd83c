/*
 * test_weights.c - the weights dispatch (worker/ckpt/weights.c): every format written and
 * read back through the same calls model.init and --save use, told apart by content, and
 * the refusals of what is no model at all.
 *
 * A tiny GPT-2 (L=2, NH=2, C=8, maxT=8, V=11 padded to 16) with random parameters; the
 * padded rows of wte are zero, as the model keeps them (safetensors leaves them out).
 */
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
      T_(test_llmc),        T_(test_llmc_bf16),    T_(test_safetensors),
      T_(test_not_weights), T_(test_format_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
