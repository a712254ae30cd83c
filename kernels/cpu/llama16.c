/*
 * llama16.c - the 16-bit forms (storage.h) of Llama's RMSNorm, RoPE and SwiGLU: a block
 * of rows at a time, the activations widened (exactly) into the calling thread's working
 * memory, the fp32 kernel run on the block, and its activation output stored rounded to
 * nearest even. Every op here is row by row (RMSNorm's dweight adds the rows in order),
 * so blocks compute what the fp32 kernel computes on the whole widened tensor, and the
 * 16-bit tables need no second copy of these kernels. Working memory stays at a block
 * (BLOCK_FLOATS per operand), whatever the batch. The gradients SwiGLU's backward reads
 * and writes are stored in the format, as the GEMMs beside it keep them; RMSNorm's
 * gradients, rstd and the RoPE table stay fp32.
 */
#include "cpu_int.h"
#include "wf_kernels.h"

/* Working slots (attention's 0..5 and the GEMMs' never run inside these). */
enum { W_DY = 4, W_IN = 5, W_OUT = 6 };

/* Floats of one operand's block: large enough for the fp32 kernel to split over the
 * threads, small next to the activations. */
#define BLOCK_FLOATS ((size_t)1 << 16)

/* Rows of `width` floats per block (at least one). */
static size_t block_rows(size_t width) { return width < BLOCK_FLOATS ? BLOCK_FLOATS / width : 1; }

/* Rows [r0, r0 + n) of src (rows of `width`) widened into working slot `slot`. */
static float *widened(int slot, const void *src, size_t r0, size_t n, size_t width, int fmt)
{
  float *w = wf__work(slot, n * width);
  if (w)
    wf__load(w, src, r0 * width, n * width, fmt);
  return w;
}

void wf_rmsnorm_forward16(void *out, float *rstd, const void *inp, const float *weight, float eps,
                          int N, int C, int fmt)
{
  size_t blk = block_rows((size_t)C);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = widened(W_IN, inp, r0, n, (size_t)C, fmt), *y = wf__work(W_OUT, n * C);
    if (!x || !y)
      return;
    wf_rmsnorm_forward(y, rstd ? rstd + r0 : NULL, x, weight, eps, (int)n, C);
    wf__store(out, r0 * C, y, n * C, fmt);
  }
}

void wf_rmsnorm_backward16(float *dinp, float *dweight, const float *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, int fmt)
{
  size_t blk = block_rows((size_t)C);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = widened(W_IN, inp, r0, n, (size_t)C, fmt);
    if (!x)
      return;
    wf_rmsnorm_backward(dinp ? dinp + r0 * C : NULL, dweight, dout + r0 * C, x, weight, rstd + r0,
                        (int)n, C);
  }
}

typedef void rope_fn(float *qkv, const float *cs, int B, int T, int NH, int NKV, int hs);

/* fn (RoPE's forward or backward) on rows [t0, t0 + n) of batch b at a time: a (1, n)
 * batch whose angles start at row t0 of cs. */
static void rope16(rope_fn *fn, void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                   int fmt)
{
  size_t width = (size_t)(NH + 2 * NKV) * hs, blk = block_rows(width);
  for (size_t b = 0; b < (size_t)B; b++)
    for (size_t t0 = 0; t0 < (size_t)T; t0 += blk) {
      size_t n = WF_MIN(blk, (size_t)T - t0), r0 = b * T + t0;
      float *x = widened(W_IN, qkv, r0, n, width, fmt);
      if (!x)
        return;
      fn(x, cs + t0 * hs, 1, (int)n, NH, NKV, hs);
      wf__store(qkv, r0 * width, x, n * width, fmt);
    }
}

void wf_rope_forward16(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs, int fmt)
{
  rope16(wf_rope_forward, qkv, cs, B, T, NH, NKV, hs, fmt);
}

void wf_rope_backward16(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs, int fmt)
{
  rope16(wf_rope_backward, dqkv, cs, B, T, NH, NKV, hs, fmt);
}

void wf_swiglu_forward16(void *out, const void *inp, int N, int F, int fmt)
{
  size_t blk = block_rows(2 * (size_t)F);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = widened(W_IN, inp, r0, n, 2 * (size_t)F, fmt), *y = wf__work(W_OUT, n * F);
    if (!x || !y)
      return;
    wf_swiglu_forward(y, x, (int)n, F);
    wf__store(out, r0 * F, y, n * F, fmt);
  }
}

void wf_swiglu_backward16(void *dinp, const void *inp, const void *dout, int N, int F, int fmt)
{
  size_t blk = block_rows(2 * (size_t)F);
  for (size_t r0 = 0; r0 < (size_t)N; r0 += blk) {
    size_t n = WF_MIN(blk, (size_t)N - r0);
    float *x = widened(W_IN, inp, r0, n, 2 * (size_t)F, fmt), *d = wf__work(W_OUT, n * 2 * F);
    float *dy = widened(W_DY, dout, r0, n, (size_t)F, fmt);
    if (!x || !d || !dy)
      return;
    wf_swiglu_backward(d, x, dy, (int)n, F);
    wf__store(dinp, r0 * 2 * F, d, n * 2 * F, fmt);
  }
}
