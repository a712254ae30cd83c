/*
 * test_safetensors.c - the safetensors codec (worker/model/safetensors*.c) against an
 * independent writer and checker, tests/io/st_ref.py (Python's struct and json): files it
 * writes (F32, BF16, F16; with and without the "transformer." prefix; with the tied
 * lm_head and the attn.bias buffers) read into the llm.c layout this test states on its
 * own; files weft writes pass its checks; a round trip is bit for bit; and each malformed
 * file gets one message naming the file.
 *
 * usage: test_safetensors PYTHON st_ref.py
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "wf_model.h"
#include "../common/gpt2_kinds.h"

static char tmpdir[256];
static const char *python, *script;
/* A small GPT-2: 2 layers, 2 heads, 8 channels, context 16, vocabulary 50 (padded 128). */
static const wf_model_dims dims = {.L = 2, .NH = 2, .C = 8, .maxT = 16, .V = 50, .Vp = 128};

static int setup(void **state)
{
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/weft_test_st_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* st_ref.py's value(name, i): k/64, |k| <= 125, at flat index i of the Hugging Face layout. */
static float ref_value(const char *name, size_t i)
{
  unsigned tid = 0;
  for (const char *p = name; *p; p++)
    tid += (unsigned char)*p;
  tid %= 97;
  return (float)((long)((tid * 7 + i * 13) % 251) - 125) / 64.0f;
}

/* Where Hugging Face's tensors live in llm.c's layout, stated independently of the codec:
 * Conv1D weights are (in, out) in the file and (out, in) in llm.c. */
static const struct {
  wf_param_kind kind;
  const char *name;
  int out, in; /* multiples of C; in 0: a vector of out*C */
} layer_tensors[] = {
    {WF_P_LN1W, "ln_1.weight", 1, 0},
    {WF_P_LN1B, "ln_1.bias", 1, 0},
    {WF_P_QKVW, "attn.c_attn.weight", 3, 1},
    {WF_P_QKVB, "attn.c_attn.bias", 3, 0},
    {WF_P_ATTPROJW, "attn.c_proj.weight", 1, 1},
    {WF_P_ATTPROJB, "attn.c_proj.bias", 1, 0},
    {WF_P_LN2W, "ln_2.weight", 1, 0},
    {WF_P_LN2B, "ln_2.bias", 1, 0},
    {WF_P_FCW, "mlp.c_fc.weight", 4, 1},
    {WF_P_FCB, "mlp.c_fc.bias", 4, 0},
    {WF_P_FCPROJW, "mlp.c_proj.weight", 1, 4},
    {WF_P_FCPROJB, "mlp.c_proj.bias", 1, 0},
};

static void fill_expected(const wf_model_dims *d, float *full)
{
  size_t C = (size_t)d->C;
  float *wte = full + wf_model_tensor_offset(d, WF_P_WTE),
        *wpe = full + wf_model_tensor_offset(d, WF_P_WPE);
  for (size_t i = 0; i < (size_t)d->Vp * C; i++) /* padded rows [V, Vp) are zero */
    wte[i] = i < (size_t)d->V * C ? ref_value("transformer.wte.weight", i) : 0.0f;
  for (size_t i = 0; i < (size_t)d->maxT * C; i++)
    wpe[i] = ref_value("transformer.wpe.weight", i);
  char name[96];
  for (int l = 0; l < d->L; l++) {
    for (size_t k = 0; k < sizeof layer_tensors / sizeof *layer_tensors; k++) {
      wf_param_kind kind = layer_tensors[k].kind;
      float *t = full + wf_model_tensor_offset(d, kind) + (size_t)l * wf_model_layer_numel(d, kind);
      size_t out = layer_tensors[k].out * C, in = layer_tensors[k].in * C;
      snprintf(name, sizeof name, "transformer.h.%d.%s", l, layer_tensors[k].name);
      for (size_t o = 0; o < out; o++)
        for (size_t i = 0; i < (in ? in : 1); i++)
          t[o * (in ? in : 1) + i] = ref_value(name, in ? i * out + o : o);
    }
  }
  for (size_t i = 0; i < C; i++) {
    full[wf_model_tensor_offset(d, WF_P_LNFW) + i] = ref_value("transformer.ln_f.weight", i);
    full[wf_model_tensor_offset(d, WF_P_LNFB) + i] = ref_value("transformer.ln_f.bias", i);
  }
}

static void py(const char *mode, const char *file, const wf_model_dims *d, const char *opts)
{
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' '%s' %s '%s/%s' %d %d %d %d %d %s", python, script, mode, tmpdir,
           file, d->L, d->NH, d->C, d->maxT, d->V, opts);
  assert_int_equal(system(cmd), 0);
}

static void path_of(char *out, size_t len, const char *file)
{
  snprintf(out, len, "%s/%s", tmpdir, file);
}

/* Read `file` with dims d and compare every element with fill_expected's. */
static void read_expect(const char *file, const wf_model_dims *d)
{
  size_t n = wf_model_num_params(d);
  float *got = malloc(n * sizeof *got), *want = malloc(n * sizeof *want);
  char path[512], err[1024] = "";
  path_of(path, sizeof path, file);
  for (size_t i = 0; i < n; i++)
    got[i] = 1e30f; /* the padded rows must be written too */
  fill_expected(d, want);
  wf_status st = wf_safetensors_read(path, d, got, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "%s\n", err);
  assert_int_equal(st, WF_OK);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    bad += got[i] != want[i];
  printf("%s: %zu of %zu parameters in their llm.c place\n", file, n - bad, n);
  assert_int_equal(bad, 0);
  free(got);
  free(want);
}

static void test_python_f32(void **state)
{
  (void)state;
  py("write", "f32.safetensors", &dims, "--lm-head tied --buffers --meta-heads 2");
  read_expect("f32.safetensors", &dims);
}

/* GPT2Model's bare names as on the Hub, 16-bit types. */
static void test_python_16bit(void **state)
{
  (void)state;
  py("write", "bf16.safetensors", &dims, "--dtype BF16 --bare --buffers");
  read_expect("bf16.safetensors", &dims);
  py("write", "f16.safetensors", &dims, "--dtype F16 --bare --lm-head tied");
  read_expect("f16.safetensors", &dims);
}

static void peek_expect(const char *file, int NH)
{
  char path[512], err[1024] = "";
  path_of(path, sizeof path, file);
  wf_model_dims d = {0};
  wf_status st = wf_safetensors_peek(path, &d, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "%s\n", err);
  assert_int_equal(st, WF_OK);
  printf("%s: L=%d NH=%d C=%d maxT=%d V=%d Vp=%d\n", file, d.L, d.NH, d.C, d.maxT, d.V, d.Vp);
  assert_int_equal(d.L, 2);
  assert_int_equal(d.C, 128);
  assert_int_equal(d.maxT, 16);
  assert_int_equal(d.V, 50);
  assert_int_equal(d.Vp, 128);
  assert_int_equal(d.NH, NH);
}

/* n_head: the file's metadata, else config.json beside it, else C / 64. */
static void test_peek(void **state)
{
  (void)state;
  wf_model_dims d = dims;
  d.C = 128, d.NH = 8;
  py("write", "meta.safetensors", &d, "--meta-heads 8");
  peek_expect("meta.safetensors", 8);
  py("write", "plain.safetensors", &d, "--bare");
  peek_expect("plain.safetensors", 2); /* 128 / 64 */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s/hf'", tmpdir);
  assert_int_equal(system(cmd), 0);
  py("write", "hf/model.safetensors", &d, "--config-heads 4");
  peek_expect("hf/model.safetensors", 4);
  d.NH = 4;
  read_expect("hf/model.safetensors", &d);
}

/* weft's own file: bit for bit back, and the independent checker accepts it. */
static void test_write(void **state)
{
  (void)state;
  size_t n = wf_model_num_params(&dims);
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    a[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
  }
  float *wte = a + wf_model_tensor_offset(&dims, WF_P_WTE);
  memset(wte + dims.V * dims.C, 0, (size_t)(dims.Vp - dims.V) * dims.C * sizeof *a);
  char path[512], err[1024] = "";
  path_of(path, sizeof path, "weft.safetensors");
  assert_int_equal(wf_safetensors_write(path, &dims, a, 0, false, err, sizeof err), WF_OK);
  assert_int_equal(wf_safetensors_read(path, &dims, b, err, sizeof err), WF_OK);
  assert_memory_equal(a, b, n * sizeof *a);
  wf_model_dims d = {0};
  assert_int_equal(wf_safetensors_peek(path, &d, err, sizeof err), WF_OK);
  assert_true(wf_model_dims_same(&d, &dims, NULL, NULL, NULL));
  fill_expected(&dims, a);
  assert_int_equal(wf_safetensors_write(path, &dims, a, 0, false, err, sizeof err), WF_OK);
  py("check", "weft.safetensors", &dims, "");
  free(a);
  free(b);
}

static void expect_error(const char *file, const wf_model_dims *d, const char *w1, const char *w2)
{
  size_t n = wf_model_num_params(d);
  float *buf = malloc(n * sizeof *buf);
  char path[512], err[1024] = "";
  path_of(path, sizeof path, file);
  assert_int_equal(wf_safetensors_read(path, d, buf, err, sizeof err), WF_EFORMAT);
  printf("%s\n", err);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, w1));
  if (w2)
    assert_non_null(strstr(err, w2));
  free(buf);
}

static void write_raw(const char *file, const void *buf, size_t n)
{
  char path[512];
  path_of(path, sizeof path, file);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
}

static void test_errors(void **state)
{
  (void)state;
  char path[512];
  /* truncated: the last tensor runs past the end */
  py("write", "cut.safetensors", &dims, "");
  path_of(path, sizeof path, "cut.safetensors");
  assert_int_equal(truncate(path, 8000), 0); /* header 2.7 kB, tensors 11.6 kB */
  expect_error("cut.safetensors", &dims, "truncated", "ends at byte");
  assert_int_equal(truncate(path, 5), 0);
  expect_error("cut.safetensors", &dims, "truncated", "8-byte header length");
  /* mismatched shapes: the model is wider, or has another vocabulary, than the file */
  py("write", "ok.safetensors", &dims, "");
  wf_model_dims wide = dims;
  wide.C = 16;
  expect_error("ok.safetensors", &wide, "transformer.wte.weight", "has shape [50, 8]");
  wf_model_dims one = dims;
  one.L = 1;
  expect_error("ok.safetensors", &one, "unexpected tensor 'transformer.h.1.", NULL);
  wf_model_dims three = dims;
  three.L = 3;
  expect_error("ok.safetensors", &three, "'transformer.h.2.ln_1.weight' is missing", NULL);
  /* a missing tensor */
  py("write", "drop.safetensors", &dims, "--drop transformer.h.1.mlp.c_fc.bias");
  expect_error("drop.safetensors", &dims, "'transformer.h.1.mlp.c_fc.bias' is missing", NULL);
  /* an untied head */
  py("write", "head.safetensors", &dims, "--lm-head diff");
  expect_error("head.safetensors", &dims, "lm_head.weight differs", "row 0");
  /* bad header JSON, and a header length past the file */
  static const char bad[] = "\x0c\0\0\0\0\0\0\0{\"a\": [1,}  ";
  write_raw("json.safetensors", bad, sizeof bad - 1);
  expect_error("json.safetensors", &dims, "not valid JSON", NULL);
  static const char huge[] = "\xff\xff\0\0\0\0\0\0{}";
  write_raw("len.safetensors", huge, sizeof huge - 1);
  expect_error("len.safetensors", &dims, "header length 65535 runs past", NULL);
  static const char dt[] = "\x52\0\0\0\0\0\0\0{\"transformer.wte.weight\": {\"dtype\": \"I64\", "
                           "\"shape\": [1], \"data_offsets\": [0, 8]}}01234567";
  write_raw("dtype.safetensors", dt, sizeof dt - 1);
  expect_error("dtype.safetensors", &dims, "dtype I64", "F32, BF16 and F16");
}

int main(int argc, char **argv)
{
  if (argc < 3) {
    fprintf(stderr, "usage: %s PYTHON st_ref.py\n", argv[0]);
    return 2;
  }
  python = argv[1], script = argv[2];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_python_f32), cmocka_unit_test(test_python_16bit),
      cmocka_unit_test(test_peek),       cmocka_unit_test(test_write),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
