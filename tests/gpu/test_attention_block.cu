/*
 * test_attention_block.cu - the GPU's block attention ops (kernels/cuda/attention_block.cu,
 * included here, so the code tested is the module's) against their CPU twins
 * (kernels/cpu/attention_block.c) on random inputs: forward's output and log-sum-exp, the
 * merge of two blocks, D, and backward's dq and dk/dv, for a causal block and a window of
 * a larger buffer against another (strides beyond the heads), grouped-query attention (4
 * query heads over 2 kv heads), fp32 and bf16 operands. Exits 77 without a GPU.
 *
 * Tolerance: both compute in fp32 from the same (widened) operands, in another order: a
 * sum over at most 40 keys or 2 x 40 query rows of O(1) terms, error ~sqrt(80) x 6e-8
 * relative; TOL = 1e-4 absolute on values of order 1 leaves a wide margin, and a wrong
 * mask, stride or head mapping moves values by O(0.1).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/attention_block.cu"
#include "module_stubs.h"
#include "storage.h"

/* What the module's backend.cu provides, for this test alone. */
/* The module's table of the op (one for every element type: the format is an argument). */
static const wf_attention_block_op *ops(void)
{
  return (const wf_attention_block_op *)wf__cuda_attention_block.v[WF_DT_F32];
}

#define TOL 1e-4

static int failures;

static float urand(unsigned *s)
{
  *s = *s * 1664525u + 1013904223u;
  return ((*s >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

/* n random values stored in fmt, host and device copies. */
static void *rand_buf(size_t n, int fmt, unsigned *seed, void **dev)
{
  float *f = (float *)malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++)
    f[i] = urand(seed);
  size_t bytes = n * wf_storage_size(fmt);
  void *h = malloc(bytes);
  wf_storage_store(h, f, n, fmt);
  free(f);
  CK(cudaMalloc(dev, bytes));
  CK(cudaMemcpy(*dev, h, bytes, cudaMemcpyHostToDevice));
  return h;
}

static float *dev_floats(const float *h, size_t n)
{
  float *d;
  CK(cudaMalloc(&d, n * sizeof(float)));
  CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

static void compare(const char *what, const float *cpu, const float *gpu_dev, size_t n)
{
  float *g = (float *)malloc(n * sizeof(float));
  CK(cudaMemcpy(g, gpu_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (size_t i = 0; i < n; i++)
    worst = fmax(worst, fabs((double)cpu[i] - g[i]));
  printf("%s %s: max |gpu - cpu| %.2e over %zu\n", worst <= TOL ? "ok:" : "FAIL:", what, worst, n);
  failures += worst > TOL;
  free(g);
}

/* One block geometry: q rows of width ldq >= NH hs (a window), kv rows of width KW. */
static void check(const char *name, bool causal, int Tq, int Tk, int fmt)
{
  const int B = 2, NH = 4, NKV = 2, hs = 16, C = NH * hs, KW = 2 * NKV * hs, ldq = C + KW;
  wf_attn_block g = {B,
                     Tq,
                     Tk,
                     NH,
                     NKV,
                     hs,
                     causal,
                     (size_t)ldq,
                     (size_t)Tq * ldq,
                     (size_t)KW,
                     (size_t)Tk * KW,
                     (size_t)C,
                     (size_t)Tq * C,
                     (size_t)Tq,
                     (size_t)NH * Tq,
                     fmt};
  unsigned seed = 1234;
  size_t nq = (size_t)B * Tq * ldq, nkv = (size_t)B * Tk * KW, no = (size_t)B * Tq * C;
  size_t nl = (size_t)B * NH * Tq;
  void *dq_, *dkv_, *ddo;
  void *q = rand_buf(nq, fmt, &seed, &dq_), *kv = rand_buf(nkv, fmt, &seed, &dkv_);
  void *dout = rand_buf(no, fmt, &seed, &ddo);
  float *out = (float *)calloc(no, 4), *lse = (float *)calloc(nl, 4), *D = (float *)calloc(nl, 4);
  float *gq = (float *)calloc(no, 4), *gkv = (float *)calloc(nkv, 4);
  wf_attention_block_forward(out, lse, q, kv, &g);
  float *o_d = dev_floats(out, no), *l_d = dev_floats(lse, nl); /* overwritten below */
  CK(cudaMemset(o_d, 0, no * 4));
  ops()->forward(o_d, l_d, dq_, dkv_, &g, NULL);
  CK(cudaDeviceSynchronize());
  char what[128];
  snprintf(what, sizeof what, "%s forward out", name);
  compare(what, out, o_d, no);
  snprintf(what, sizeof what, "%s forward lse", name);
  compare(what, lse, l_d, nl);
  /* merge: the block into itself (lse + log 2, the same output) */
  float *acc = (float *)malloc(no * 4), *acc_l = (float *)malloc(nl * 4);
  memcpy(acc, out, no * 4), memcpy(acc_l, lse, nl * 4);
  wf_attention_block_merge(acc, acc_l, out, lse, &g);
  float *a_d = dev_floats(out, no), *al_d = dev_floats(lse, nl);
  ops()->merge(a_d, al_d, o_d, l_d, &g, NULL);
  snprintf(what, sizeof what, "%s merge lse", name);
  compare(what, acc_l, al_d, nl);
  /* D and backward, from the output stored in fmt (as the ring keeps it) */
  void *o16 = malloc(no * wf_storage_size(fmt)), *o16_d;
  wf_storage_store(o16, out, no, fmt);
  CK(cudaMalloc(&o16_d, no * wf_storage_size(fmt)));
  CK(cudaMemcpy(o16_d, o16, no * wf_storage_size(fmt), cudaMemcpyHostToDevice));
  wf_attention_block_delta(D, dout, o16, &g);
  float *D_d = dev_floats(D, nl);
  CK(cudaMemset(D_d, 0, nl * 4));
  ops()->delta(D_d, ddo, o16_d, &g, NULL);
  snprintf(what, sizeof what, "%s D", name);
  compare(what, D, D_d, nl);
  wf_attention_block_backward(gq, gkv, dout, q, kv, lse, D, &g);
  float *gq_d = dev_floats(gq, no), *gkv_d = dev_floats(gkv, nkv);
  CK(cudaMemset(gq_d, 0, no * 4));
  CK(cudaMemset(gkv_d, 0, nkv * 4));
  ops()->backward(gq_d, gkv_d, ddo, dq_, dkv_, l_d, D_d, &g, NULL);
  CK(cudaDeviceSynchronize());
  snprintf(what, sizeof what, "%s backward dq", name);
  compare(what, gq, gq_d, no);
  snprintf(what, sizeof what, "%s backward dk, dv", name);
  compare(what, gkv, gkv_d, nkv);
  free(q), free(kv), free(dout), free(out), free(lse), free(D), free(gq), free(gkv), free(acc);
  free(acc_l), free(o16);
  cudaFree(dq_), cudaFree(dkv_), cudaFree(ddo), cudaFree(o_d), cudaFree(l_d), cudaFree(a_d);
  cudaFree(al_d), cudaFree(o16_d), cudaFree(D_d), cudaFree(gq_d), cudaFree(gkv_d);
}

int main(void)
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no GPU: skipped\n");
    return 77;
  }
  check("causal 40 x 40 fp32", true, 40, 40, WF_PREC_NO);
  check("full 24 x 40 fp32", false, 24, 40, WF_PREC_NO);
  check("causal 40 x 40 bf16", true, 40, 40, WF_PREC_BF16);
  check("full 24 x 40 bf16", false, 24, 40, WF_PREC_BF16);
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
