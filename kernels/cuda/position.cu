/*
 * position.cu - learned absolute positions added to the embedded tokens on the GPU (twin
 * of kernels/cpu/position.c).
 *
 * Forward: one thread per output element, one float add. Backward adds in the twin's
 * order, so the gradient is the twin's bit for bit: with the plain positions (pos NULL)
 * one thread per (t, c) starts from dwpe's value and adds b = 0, 1, ...; with positions
 * given, which may repeat anywhere, the embedding op's ordered scatter (embedding.cu)
 * with the positions as the indices.
 * Legend: B batch, T time, C channels.
 */
#include <limits.h>

#include "cuda_int.h"

/* out (B,T,C) += wpe[p] with p = pos ? pos[b,t] : t */
__global__ static void position_forward_kernel(float *out, const float *wpe, const int *pos, int T,
                                               int C, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    size_t bt = i / (size_t)C, p = pos ? (size_t)pos[bt] : bt % (size_t)T;
    out[i] += wpe[p * C + i % (size_t)C];
  }
}

/* dwpe (maxT,C): rows 0..T-1 += dout[b,t,:] for b = 0, 1, ..., one add at a time */
__global__ static void position_backward_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
  size_t n = (size_t)T * C;
  WF_GRID_STRIDE(i, n)
  {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++)
      acc += dout[(size_t)b * n + i];
    dwpe[i] = acc;
  }
}

static void forward(float *out, const float *wpe, const int *pos, int B, int T, int C,
                    wf_stream *stream)
{
  size_t n = (size_t)B * T * C;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  position_forward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(out, wpe, pos, T,
                                                                                 C, n);
  WF_CUDA_LAUNCHED("position_forward_kernel");
}

static void backward(float *dwpe, const float *dout, const int *pos, int B, int T, int C,
                     wf_stream *stream)
{
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  if (pos) {
    wf__embedding_backward(dwpe, dout, pos, 0, INT_MAX, B * T, C, stream);
    return;
  }
  position_backward_kernel<<<wf__grid_1d((size_t)T * C, 256), 256, 0, (cudaStream_t)stream>>>(
      dwpe, dout, B, T, C);
  WF_CUDA_LAUNCHED("position_backward_kernel");
}

/* ---- the op (wf_kreg.h): fp32 only, the same table for every element type ------------- */

static const wf_position_op op = {forward, backward};
const wf_kvariants wf__cuda_position = WF_KV_ANY(position, WF_OP_VERSION_position, &op);
