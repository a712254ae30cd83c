/*
 * moe_combine.cu - a token's mixture-of-experts output as the weighted sum of its experts'
 * rows, and its backward, on the GPU: the twin of kernels/cpu/moe_combine.c
 * (moe_combine.h), with its arguments plus a stream.
 *
 * Forward: one thread an output element, the token's K rows added in choice order.
 * Backward: one block a (token, choice) pair: its row of dyp (w dout, stored in the
 * format), and dw, the dot product of dout with the pair's expert row, summed over the
 * block in a fixed order (no atomics: the same bits every run).
 */
#include "fmt_int.h"
#include "moe_combine.h"

#define NT 128

namespace
{

__global__ void combine_kernel(float *out, const float *y, const float *w, const int *pos, int N,
                               int K, int C)
{
  size_t n_el = (size_t)N * C;
  WF_GRID_STRIDE(i, n_el)
  {
    size_t n = i / C, c = i % C;
    float o = 0.0f;
    for (int j = 0; j < K; j++) {
      int p = pos[n * K + j];
      if (p >= 0)
        o += w[n * K + j] * y[(size_t)p * C + c];
    }
    out[i] = o;
  }
}

__global__ void backward_kernel(void *dyp, float *dw, const float *dout, const float *y,
                                const float *w, const int *pos, int K, int C, int fmt)
{
  __shared__ float sh[32];
  size_t pair = blockIdx.x, n = pair / K;
  int p = pos[pair];
  if (p < 0) { /* uniform over the block */
    if (threadIdx.x == 0)
      dw[pair] = 0.0f;
    return;
  }
  const float *d = dout + n * C, *yr = y + (size_t)p * C;
  float wp = w[pair], dot = 0.0f;
  for (int c = threadIdx.x; c < C; c += NT) {
    dot += d[c] * yr[c];
    wf__stf(dyp, (size_t)p * C + c, wp * d[c], fmt);
  }
  dot = wf__block_sum(dot, sh);
  if (threadIdx.x == 0)
    dw[pair] = dot;
}

} // namespace

static void cu_moe_combine(float *out, const float *y, const float *w, const int *pos, int N, int K,
                           int C, wf_stream *stream)
{
  size_t n = (size_t)N * C;
  if (n == 0)
    return;
  combine_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(out, y, w, pos, N, K, C);
  WF_CUDA_LAUNCHED("moe_combine");
}

static void cu_moe_combine_backward(void *dyp, float *dw, const float *dout, const float *y,
                                    const float *w, const int *pos, int N, int K, int C, int fmt,
                                    wf_stream *stream)
{
  size_t pairs = (size_t)N * K;
  if (pairs == 0)
    return;
  /* one block a pair: at most 2^31 - 1 of them, far above any micro-batch's N K */
  backward_kernel<<<(unsigned)pairs, NT, 0, (cudaStream_t)stream>>>(dyp, dw, dout, y, w, pos, K, C,
                                                                    fmt);
  WF_CUDA_LAUNCHED("moe_combine backward");
}

/* ---- the op (wf_kreg.h): one table for every element type (the format is an argument) -- */

static const wf_moe_combine_op moe_combine_op = {cu_moe_combine, cu_moe_combine_backward};
const wf_kvariants wf__cuda_moe_combine =
    WF_KV_ANY(moe_combine, WF_OP_VERSION_moe_combine, &moe_combine_op);
