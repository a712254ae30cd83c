/*
 * test_llmc.c - llm.c file formats: the GPT-2 checkpoint round trip, every
 * malformed-checkpoint error, and the debug state.
 *
 * Files live in a fresh mkdtemp() directory per test, removed afterwards.
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

#include "wf_kernels.h"
#include "wf_model.h"

#include "../common/capture.h"

/* L=2, NH=2, C=8, maxT=8, V=11 padded to 16. */
static const wf_model_dims tiny = {.L = 2, .NH = 2, .C = 8, .maxT = 8, .V = 11, .Vp = 16};

typedef struct fixture {
  char dir[64];
  char a[128], b[128]; /* two file names in dir */
  wf_model *m;
  char err[512];
} fixture;

static int setup(void **state)
{
  fixture *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  strcpy(f->dir, "/tmp/wf_llmc_XXXXXX");
  if (!mkdtemp(f->dir))
    return -1;
  snprintf(f->a, sizeof f->a, "%s/a.bin", f->dir);
  snprintf(f->b, sizeof f->b, "%s/b.bin", f->dir);
  if (wf_model_create(&f->m, &tiny, 2, 8) != WF_OK)
    return -1;
  wf_model_init(f->m, 11);
  *state = f;
  return 0;
}

static int teardown(void **state)
{
  fixture *f = *state;
  wf_model_destroy(f->m);
  remove(f->a);
  remove(f->b);
  rmdir(f->dir);
  free(f);
  return 0;
}

static unsigned char *slurp(const char *path, size_t *len)
{
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
  fclose(fp);
  *len = (size_t)n;
  return buf;
}

static void spit(const char *path, const void *buf, size_t len)
{
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(buf, 1, len, fp), len);
  assert_int_equal(fclose(fp), 0);
}

static void make_batch(int *in, int *tg, int n)
{
  for (int i = 0; i < n; i++) {
    in[i] = (i * 7 + 2) % tiny.V;
    tg[i] = (i * 3 + 5) % tiny.V;
  }
}

/* init -> save -> load into a new model -> save: identical bytes, identical loss. */
static void test_roundtrip(void **state)
{
  fixture *f = *state;
  assert_int_equal(wf_model_save_llmc(f->m, f->a), WF_OK);
  size_t la, lb;
  unsigned char *a = slurp(f->a, &la);
  /* 1024-byte header then every parameter (the llm.c layout is ours). */
  assert_int_equal(la, 1024 + 4 * wf_model_num_params(&tiny));
  int32_t h[8];
  memcpy(h, a, sizeof h);
  int32_t want[8] = {20240326, 3, 8, 11, 2, 2, 8, 16}; /* magic, version, maxT..Vp */
  assert_memory_equal(h, want, sizeof h);
  for (size_t i = 32; i < 1024; i++)
    assert_int_equal(a[i], 0);
  assert_memory_equal(a + 1024, wf_model_params(f->m), la - 1024);

  wf_model_dims d;
  assert_int_equal(wf_llmc_peek(f->a, &d), WF_OK);
  assert_true(wf_model_dims_same(&d, &tiny, NULL, NULL, NULL));
  wf_model *m2;
  assert_int_equal(wf_model_create(&m2, &d, 2, 8), WF_OK);
  assert_int_equal(wf_model_load_llmc(m2, f->a), WF_OK);
  assert_int_equal(wf_model_save_llmc(m2, f->b), WF_OK);
  unsigned char *b = slurp(f->b, &lb);
  assert_int_equal(la, lb);
  assert_memory_equal(a, b, la);

  int in[16], tg[16];
  make_batch(in, tg, 16);
  float l1 = -1, l2 = -2;
  assert_int_equal(wf_model_forward(f->m, in, tg, 2, 8, &l1), WF_OK);
  assert_int_equal(wf_model_forward(m2, in, tg, 2, 8, &l2), WF_OK);
  assert_true(l1 == l2);
  /* No temporary file (the atomic writer's ".NAME.tmp.PID") is left behind. */
  char tmp[200];
  snprintf(tmp, sizeof tmp, "%s/.b.bin.tmp.%ld", f->dir, (long)getpid());
  assert_int_not_equal(access(tmp, F_OK), 0);
  free(a);
  free(b);
  wf_model_destroy(m2);
}

/* Write a copy of a valid checkpoint with header int `idx` set to `val` (idx < 0:
 * unchanged) and cut to `len` bytes (0: full length). */
static void write_variant(fixture *f, int idx, int32_t val, size_t len)
{
  size_t n;
  assert_int_equal(wf_model_save_llmc(f->m, f->a), WF_OK);
  unsigned char *buf = slurp(f->a, &n);
  if (idx >= 0)
    memcpy(buf + 4 * idx, &val, 4);
  spit(f->b, buf, len ? len : n);
  free(buf);
}

/* Load f->b into the model; it must fail with WF_EFORMAT (or `code`) and a message
 * naming the file and containing each of the given fragments. */
static void expect_error(fixture *f, wf_status code, const char *frag1, const char *frag2)
{
  capture_begin();
  wf_status st = wf_model_load_llmc(f->m, f->b);
  capture_end(f->err, sizeof f->err);
  if (st != code || !strstr(f->err, f->b) || !strstr(f->err, frag1) ||
      (frag2 && !strstr(f->err, frag2)))
    fail_msg("status %d, message \"%s\"; expected %d with \"%s\" and \"%s\"", st, f->err, code,
             frag1, frag2 ? frag2 : "");
}

static void test_bad_magic(void **state)
{
  fixture *f = *state;
  write_variant(f, 0, 20240327, 0); /* a debug-state magic */
  expect_error(f, WF_EFORMAT, "magic 20240327", "expected 20240326");
  wf_model_dims d;
  capture_begin();
  assert_int_equal(wf_llmc_peek(f->b, &d), WF_EFORMAT);
  assert_non_null(strstr(capture_end(f->err, sizeof f->err), "magic"));
  assert_false(wf_llmc_dims(f->b, &d)); /* the quiet probe agrees */
}

static void test_bad_version(void **state)
{
  fixture *f = *state;
  write_variant(f, 1, 2, 0); /* llm.c's older unpadded format */
  expect_error(f, WF_EFORMAT, "version 2", "weft reads version 3 (float32) and 5 (bf16)");
  assert_null(strstr(f->err, "expected 3")); /* the old, misleading reason */
  write_variant(f, 1, 4, 0);
  expect_error(f, WF_EFORMAT, "version 4", "weft reads version 3 (float32) and 5 (bf16)");
}

/* bf16 round to nearest, ties to even, on the bits (independent of the kernels' rounding
 * the writer uses): add 0x7fff plus the lowest kept bit, drop the low half. */
static float ref_bf16(float x)
{
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}

/* v3 -> v5 -> read: every parameter is its nearest bf16, within half a bf16 ulp. */
static void test_v5_roundtrip(void **state)
{
  fixture *f = *state;
  size_t n = wf_model_num_params(&tiny), len;
  float *p = malloc(n * sizeof *p), *q = malloc(n * sizeof *q);
  assert_non_null(p);
  assert_non_null(q);
  assert_int_equal(wf_model_save_llmc(f->m, f->a), WF_OK); /* version 3 */
  assert_int_equal(wf_llmc_read(f->a, &tiny, p), WF_OK);
  p[5] = 1.0f + 1.0f / 256; /* a tie (halfway between two bf16): to the even one, 1 */
  p[6] = 1.0f + 3.0f / 256; /* the other tie: up to the even 1 + 4/256 */
  assert_int_equal(wf_llmc_write_version(f->b, &tiny, p, WF_LLMC_VERSION_BF16), WF_OK);
  unsigned char *b = slurp(f->b, &len);
  assert_int_equal(len, 1024 + 2 * n); /* header, then two bytes a parameter */
  int32_t h[8], want[8] = {20240326, 5, 8, 11, 2, 2, 8, 16};
  memcpy(h, b, sizeof h);
  assert_memory_equal(h, want, sizeof h);
  free(b);
  wf_model_dims d;
  assert_int_equal(wf_llmc_peek(f->b, &d), WF_OK);
  assert_true(wf_model_dims_same(&d, &tiny, NULL, NULL, NULL));
  assert_true(wf_llmc_dims(f->b, &d));
  assert_int_equal(wf_llmc_read(f->b, &tiny, q), WF_OK);
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) {
    assert_true(q[i] == ref_bf16(p[i])); /* bit for bit the nearest bf16 */
    /* half a bf16 ulp: 8 significant bits, so 2^-8 of the value's power of two */
    int e;
    frexpf(p[i], &e);
    assert_true(fabsf(q[i] - p[i]) <= ldexpf(1.0f, e - 9));
    changed += q[i] != p[i];
  }
  assert_true(q[5] == 1.0f && q[6] == 1.0f + 4.0f / 256);
  assert_true(changed > n / 2); /* random init is not bf16: the rounding really happened */
  /* and the v5 file loads into a model like any checkpoint */
  assert_int_equal(wf_model_load_llmc(f->m, f->b), WF_OK);
  free(p);
  free(q);
}

static const char *python, *v5_script;

/* A version-5 file from an independent writer (llmc_v5_ref.py) reads back exactly. */
static void test_v5_reference(void **state)
{
  fixture *f = *state;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s %s %d %d %d %d %d %d", python, v5_script, f->b, tiny.L, tiny.NH,
           tiny.C, tiny.maxT, tiny.V, tiny.Vp);
  assert_int_equal(system(cmd), 0);
  wf_model_dims d;
  assert_int_equal(wf_llmc_peek(f->b, &d), WF_OK);
  assert_true(wf_model_dims_same(&d, &tiny, NULL, NULL, NULL));
  size_t n = wf_model_num_params(&tiny);
  float *q = malloc(n * sizeof *q);
  assert_non_null(q);
  assert_int_equal(wf_llmc_read(f->b, &tiny, q), WF_OK);
  for (size_t i = 0; i < n; i++) /* the script's value(i), exact in bf16 */
    assert_true(q[i] == (float)(((long)(i * 13 + 7) % 251 - 125) / 64.0));
  free(q);
}

/* A version-5 file cut short, or grown, is refused with its version and sizes. */
static void test_v5_truncated(void **state)
{
  fixture *f = *state;
  size_t n = wf_model_num_params(&tiny), len;
  assert_int_equal(wf_model_save_llmc(f->m, f->a), WF_OK);
  float *p = malloc(n * sizeof *p);
  assert_non_null(p);
  assert_int_equal(wf_llmc_read(f->a, &tiny, p), WF_OK);
  assert_int_equal(wf_llmc_write_version(f->b, &tiny, p, WF_LLMC_VERSION_BF16), WF_OK);
  unsigned char *b = slurp(f->b, &len);
  spit(f->b, b, len - 2); /* one bf16 short */
  char want[64];
  snprintf(want, sizeof want, "expected %zu", 1024 + 2 * n);
  expect_error(f, WF_EFORMAT, "truncated llm.c checkpoint (version 5, bf16)", want);
  free(b);
  free(p);
}

static void test_truncated(void **state)
{
  fixture *f = *state;
  size_t full = 1024 + 4 * wf_model_num_params(&tiny);
  write_variant(f, -1, 0, full - 4); /* one float short */
  char want[64];
  snprintf(want, sizeof want, "expected %zu", full);
  expect_error(f, WF_EFORMAT, "truncated", want);
  write_variant(f, -1, 0, 100); /* not even a header */
  expect_error(f, WF_EFORMAT, "truncated", "header");
  write_variant(f, -1, 0, 0);
  FILE *fp = fopen(f->b, "ab"); /* one float too many */
  assert_non_null(fp);
  float x = 0;
  assert_int_equal(fwrite(&x, 4, 1, fp), 1);
  fclose(fp);
  expect_error(f, WF_EFORMAT, "oversized", want);
}

static void test_sizes_disagree(void **state)
{
  fixture *f = *state;
  write_variant(f, 6, 16, 0); /* C = 16: the header promises more than the file has */
  expect_error(f, WF_EFORMAT, "truncated", "C=16");
}

static void test_nonpositive_dims(void **state)
{
  fixture *f = *state;
  write_variant(f, 4, 0, 0); /* L = 0 */
  expect_error(f, WF_EFORMAT, "L=0", "positive");
  write_variant(f, 5, -2, 0); /* NH = -2 */
  expect_error(f, WF_EFORMAT, "NH=-2", "positive");
  write_variant(f, 7, 5, 0); /* Vp < V */
  expect_error(f, WF_EFORMAT, "Vp=5", "padded vocab");
}

static void test_dims_mismatch(void **state)
{
  fixture *f = *state;
  wf_model_dims d = tiny;
  d.maxT = 16; /* a valid checkpoint of a model with a longer context */
  wf_model *m2;
  assert_int_equal(wf_model_create(&m2, &d, 1, 4), WF_OK);
  assert_int_equal(wf_model_save_llmc(m2, f->b), WF_OK);
  wf_model_destroy(m2);
  expect_error(f, WF_EFORMAT, "context length (maxT) = 16", "model has 8");
}

static void test_missing_file(void **state)
{
  fixture *f = *state;
  expect_error(f, WF_EIO, "cannot open", "No such file");
  /* Saving where no directory can be made (under a regular file) fails cleanly too; a
   * missing directory would be created. */
  char path[160];
  snprintf(path, sizeof path, "%s/plain", f->dir);
  FILE *plain = fopen(path, "w");
  assert_non_null(plain);
  fclose(plain);
  snprintf(path, sizeof path, "%s/plain/x.bin", f->dir);
  capture_begin();
  assert_int_equal(wf_model_save_llmc(f->m, path), WF_EIO);
  assert_non_null(strstr(capture_end(f->err, sizeof f->err), path));
  snprintf(path, sizeof path, "%s/plain", f->dir);
  remove(path);
}

/* The debug state: header, sizes, unpadded logits, loss and gradients as computed. */
static void test_dump_state(void **state)
{
  fixture *f = *state;
  enum { B = 2, T = 7 };
  int in[B * T], tg[B * T];
  make_batch(in, tg, B * T);
  float loss = -1;
  assert_int_equal(wf_model_forward(f->m, in, tg, B, T, &loss), WF_OK);
  size_t V = (size_t)tiny.V, Vp = (size_t)tiny.Vp, n = wf_model_num_params(&tiny);
  float *logits = malloc(B * T * Vp * sizeof(float));
  assert_non_null(logits);
  memcpy(logits, wf_model_logits(f->m), B * T * Vp * sizeof(float));
  /* Gradients already there must not leak into the dump. */
  wf_model_backward(f->m, 1.0f);
  assert_int_equal(wf_model_dump_state(f->m, f->a, in, tg, B, T), WF_OK);

  size_t len;
  unsigned char *buf = slurp(f->a, &len);
  assert_int_equal(len, 1024 + 4 * (2 * B * T + B * T * V + 1 + n));
  int32_t h[256];
  memcpy(h, buf, sizeof h);
  assert_int_equal(h[0], 20240327);
  assert_int_equal(h[1], 2);
  assert_int_equal(h[2], B);
  assert_int_equal(h[3], T);
  for (int i = 4; i < 256; i++)
    assert_int_equal(h[i], 0);
  unsigned char *p = buf + 1024;
  assert_memory_equal(p, in, sizeof in);
  p += sizeof in;
  assert_memory_equal(p, tg, sizeof tg);
  p += sizeof tg;
  for (size_t r = 0; r < B * T; r++, p += V * 4)
    assert_memory_equal(p, logits + r * Vp, V * 4);
  float stored;
  memcpy(&stored, p, 4);
  p += 4;
  assert_true(stored == loss); /* same forward, same numbers */
  assert_memory_equal(p, wf_model_grads(f->m), n * 4);
  /* ... and those gradients are one batch's: a fresh zero_grad + backward agrees. */
  wf_model_zero_grad(f->m);
  assert_int_equal(wf_model_forward(f->m, in, tg, B, T, NULL), WF_OK);
  wf_model_backward(f->m, 1.0f);
  assert_memory_equal(p, wf_model_grads(f->m), n * 4);
  free(buf);
  free(logits);
  /* Bad requests fail with a message naming the file. */
  capture_begin();
  assert_int_equal(wf_model_dump_state(f->m, f->b, in, NULL, B, T), WF_EINVAL);
  assert_non_null(strstr(capture_end(f->err, sizeof f->err), f->b));
  capture_begin();
  assert_int_equal(wf_model_dump_state(f->m, f->b, in, tg, 4, 8), WF_EINVAL);
  assert_non_null(strstr(capture_end(f->err, sizeof f->err), f->b));
  assert_int_not_equal(access(f->b, F_OK), 0);
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: %s PYTHON llmc_v5_ref.py\n", argv[0]);
    return 2;
  }
  python = argv[1], v5_script = argv[2];
  wf_kernels_set_threads(1);
#define T_(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T_(test_roundtrip),     T_(test_bad_magic),      T_(test_bad_version),
      T_(test_truncated),     T_(test_sizes_disagree), T_(test_nonpositive_dims),
      T_(test_dims_mismatch), T_(test_missing_file),   T_(test_dump_state),
      T_(test_v5_roundtrip),  T_(test_v5_reference),   T_(test_v5_truncated),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
