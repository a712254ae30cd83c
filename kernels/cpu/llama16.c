/*
 * llama16.c - the 16-bit forms (storage.h) of Llama's RMSNorm, RoPE and SwiGLU: the
 * activations widened (exactly) into the calling thread's working memory, the fp32
 * kernel run on them, and its activation output stored rounded to nearest even. They
 * compute what the fp32 kernels compute on the widened activations, so the 16-bit
 * tables need no second copy of these kernels; the cost is one (N, C) working copy per
 * operand, which a row-wise form would avoid (these are small next to the GEMMs).
 * Gradients, rstd and the RoPE table stay fp32.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

/* Working slots, beside attention's (0..4), which never runs inside these. */
enum { W_IN = 5, W_OUT = 6 };

static float *widened(int slot, const void *src, size_t n, int fmt)
{
  float *w = wf__work(slot, n);
  if (w)
    wf_storage_load(w, src, n, fmt);
  return w;
}

void wf_rmsnorm_forward16(void *out, float *rstd, const void *inp, const float *weight, float eps,
                          int N, int C, int fmt)
{
  size_t n = (size_t)N * C;
  float *x = widened(W_IN, inp, n, fmt), *y = wf__work(W_OUT, n);
  if (!x || !y)
    return;
  wf_rmsnorm_forward(y, rstd, x, weight, eps, N, C);
  wf_storage_store(out, y, n, fmt);
}

void wf_rmsnorm_backward16(float *dinp, float *dweight, const float *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, int fmt)
{
  float *x = widened(W_IN, inp, (size_t)N * C, fmt);
  if (x)
    wf_rmsnorm_backward(dinp, dweight, dout, x, weight, rstd, N, C);
}

void wf_rope_forward16(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs, int fmt)
{
  size_t n = (size_t)B * T * (size_t)(NH + 2 * NKV) * hs;
  float *x = widened(W_IN, qkv, n, fmt);
  if (!x)
    return;
  wf_rope_forward(x, cs, B, T, NH, NKV, hs);
  wf_storage_store(qkv, x, n, fmt);
}

void wf_swiglu_forward16(void *out, const void *inp, int N, int F, int fmt)
{
  float *x = widened(W_IN, inp, (size_t)N * 2 * F, fmt), *y = wf__work(W_OUT, (size_t)N * F);
  if (!x || !y)
    return;
  wf_swiglu_forward(y, x, N, F);
  wf_storage_store(out, y, (size_t)N * F, fmt);
}

void wf_swiglu_backward16(float *dinp, const void *inp, const float *dout, int N, int F, int fmt)
{
  float *x = widened(W_IN, inp, (size_t)N * 2 * F, fmt);
  if (x)
    wf_swiglu_backward(dinp, x, dout, N, F);
}
