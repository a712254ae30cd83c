/*
 * llama_ops.c - runs one of Llama's CPU kernels on inputs from files, for
 * tests/kernels/llama_ops.py, which compares the results with the PyTorch reference
 * (tests/model/llama_ref.py).
 *
 *   llama_ops DIR rmsnorm N C EPS          x, w, dout    -> out, rstd, dinp, dweight
 *   llama_ops DIR rope_table T HS THETA [FACTOR LOW HIGH OLD]  -> cs
 *       (with the four numbers: rope_scaling llama3, factor, low_freq_factor,
 *       high_freq_factor, original_max_position_embeddings)
 *   llama_ops DIR rope B T NH NKV HS       qkv, cs, dout -> out, dinp
 *   llama_ops DIR swiglu N F               x, dout       -> out, dinp
 *   llama_ops DIR gqa B T NH NKV HS        qkv, dout     -> out, dqkv
 *
 * Each array NAME is the raw little-endian float32 file DIR/NAME.f32 of the size the
 * kernel's shape comment gives. Gradients start from zero (the kernels add into them).
 * Exit status 0, or 2 with a message on bad arguments or files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_kernels.h"

static const char *dir;

static float *load(const char *name, size_t n)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.f32", dir, name);
  float *p = calloc(n ? n : 1, sizeof *p);
  FILE *f = fopen(path, "rb");
  size_t got = f && p ? fread(p, sizeof *p, n, f) : 0;
  int extra = f ? fgetc(f) : EOF;
  if (f)
    fclose(f);
  if (got != n || extra != EOF) {
    fprintf(stderr, "llama_ops: %s: expected %zu float32 values\n", path, n);
    exit(2);
  }
  return p;
}

static void save(const char *name, const float *p, size_t n)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.f32", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, sizeof *p, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "llama_ops: cannot write %s\n", path);
    exit(2);
  }
}

static float *zeros(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static void rmsnorm(int N, int C, float eps)
{
  const size_t NC = (size_t)N * C;
  float *x = load("x", NC), *w = load("w", C), *dout = load("dout", NC);
  float *out = zeros(NC), *rstd = zeros(N), *dinp = zeros(NC), *dw = zeros(C);
  wf_rmsnorm_forward(out, rstd, x, w, eps, N, C);
  wf_rmsnorm_backward(dinp, dw, dout, x, w, rstd, N, C);
  save("out", out, NC), save("rstd", rstd, N), save("dinp", dinp, NC), save("dweight", dw, C);
  free(x), free(w), free(dout), free(out), free(rstd), free(dinp), free(dw);
}

static void rope_table(int T, int hs, double theta, const wf_rope_scaling *scaling)
{
  float *cs = zeros((size_t)T * hs);
  wf_rope_table(cs, T, hs, theta, scaling);
  save("cs", cs, (size_t)T * hs);
  free(cs);
}

static void rope(int B, int T, int NH, int NKV, int hs)
{
  const size_t n = (size_t)B * T * (NH + 2 * NKV) * hs;
  float *x = load("qkv", n), *cs = load("cs", (size_t)T * hs), *d = load("dout", n);
  wf_rope_forward(x, cs, NULL, B, T, NH, NKV, hs);
  wf_rope_backward(d, cs, NULL, B, T, NH, NKV, hs);
  save("out", x, n), save("dinp", d, n);
  free(x), free(cs), free(d);
}

static void swiglu(int N, int F)
{
  const size_t NI = (size_t)N * 2 * F, NO = (size_t)N * F;
  float *x = load("x", NI), *dout = load("dout", NO), *out = zeros(NO), *dinp = zeros(NI);
  wf_swiglu_forward(out, x, N, F);
  wf_swiglu_backward(dinp, x, dout, N, F);
  save("out", out, NO), save("dinp", dinp, NI);
  free(x), free(dout), free(out), free(dinp);
}

static void gqa(int B, int T, int NH, int NKV, int hs)
{
  const int C = NH * hs;
  const size_t nq = (size_t)B * T * (C + 2 * NKV * hs), no = (size_t)B * T * C;
  const size_t na = (size_t)B * NH * T * T;
  float *qkv = load("qkv", nq), *dout = load("dout", no), *out = zeros(no), *att = zeros(na);
  float *scratch = zeros(na), *dqkv = zeros(nq);
  wf_attention_gqa_forward(out, att, qkv, NULL, B, T, C, NH, NKV);
  wf_attention_gqa_backward(dqkv, scratch, dout, qkv, att, NULL, B, T, C, NH, NKV);
  save("out", out, no), save("dqkv", dqkv, nq);
  free(qkv), free(dout), free(out), free(att), free(scratch), free(dqkv);
}

int main(int argc, char **argv)
{
  const char *op = argc > 2 ? argv[2] : "";
  int n = argc - 3, v[7] = {0};
  for (int i = 0; i < n && i < 7; i++)
    v[i] = atoi(argv[3 + i]);
  dir = argc > 1 ? argv[1] : ".";
  if (!strcmp(op, "rmsnorm") && n == 3)
    rmsnorm(v[0], v[1], strtof(argv[5], NULL));
  else if (!strcmp(op, "rope_table") && n == 3)
    rope_table(v[0], v[1], strtod(argv[5], NULL), NULL);
  else if (!strcmp(op, "rope_table") && n == 7) {
    wf_rope_scaling sc = {WF_ROPE_LLAMA3, strtod(argv[6], NULL), strtod(argv[7], NULL),
                          strtod(argv[8], NULL), atoi(argv[9])};
    rope_table(v[0], v[1], strtod(argv[5], NULL), &sc);
  } else if (!strcmp(op, "rope") && n == 5)
    rope(v[0], v[1], v[2], v[3], v[4]);
  else if (!strcmp(op, "swiglu") && n == 2)
    swiglu(v[0], v[1]);
  else if (!strcmp(op, "gqa") && n == 5)
    gqa(v[0], v[1], v[2], v[3], v[4]);
  else {
    fprintf(stderr, "usage: llama_ops DIR rmsnorm N C EPS | rope_table T HS THETA [F LO HI OLD] |\n"
                    "       rope B T NH NKV HS | swiglu N F | gqa B T NH NKV HS\n");
    return 2;
  }
  return 0;
}
