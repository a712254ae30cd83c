/*
 * encoder.cu - token + position embedding on the GPU (twin of wf_encoder_*), whole
 * or split over the vocabulary (wf_encoder_*_vp).
 *
 * Forward: one thread per output element. Backward: dwte rows are shared by every
 * occurrence of a token, so they take atomicAdd; dwpe[t] is summed over the batch
 * by one thread per (t, c), which needs no atomics and is deterministic.
 * The whole-vocabulary launchers are the split ones with v_offset = 0 and every
 * token in range. A token outside [v_offset, v_offset + Vl) contributes a zero row
 * to out and touches no row of dwte.
 * Legend: B batch, T time, C channels, V vocabulary, Vl rows of this rank's slice.
 */
#include <limits.h>

#include "cuda_int.h"

/* The local row of token `tok`, or -1 when another rank holds it (64-bit, so the
 * subtraction cannot overflow). */
__device__ static long long local_row(int tok, int v_offset, int Vl)
{
  long long r = (long long)tok - v_offset;
  return r >= 0 && r < Vl ? r : -1;
}

/* out (B,T,C), inp (B,T), wte (Vl,C), wpe (maxT,C) or NULL */
__global__ static void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                              int v_offset, int Vl, const float *wpe, int T, int C,
                                              size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    size_t bt = i / (size_t)C;
    size_t c = i % (size_t)C;
    size_t t = bt % (size_t)T;
    long long r = local_row(inp[bt], v_offset, Vl);
    float we = r >= 0 ? wte[(size_t)r * C + c] : 0.0f;
    /* a lone term is stored as is (not + 0.0f), as the CPU twin does */
    if (wpe)
      out[i] = r >= 0 ? we + wpe[t * C + c] : wpe[t * C + c];
    else
      out[i] = we;
  }
}

/* dwte (Vl,C) += dout (B,T,C) at the local rows named by inp (B,T) */
__global__ static void encoder_backward_wte_kernel(float *dwte, const float *dout, const int *inp,
                                                   int v_offset, int Vl, int C, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    size_t bt = i / (size_t)C;
    size_t c = i % (size_t)C;
    long long r = local_row(inp[bt], v_offset, Vl);
    if (r >= 0)
      atomicAdd(&dwte[(size_t)r * C + c], dout[i]);
  }
}

/* dwpe (maxT,C): rows 0..T-1 += sum over b of dout[b,t,:] */
__global__ static void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T,
                                                   int C)
{
  size_t n = (size_t)T * C;
  WF_GRID_STRIDE(i, n)
  {
    float acc = 0.0f;
    for (int b = 0; b < B; b++)
      acc += dout[(size_t)b * n + i];
    dwpe[i] += acc;
  }
}

extern "C" void wf_cuda_encoder_forward_vp(float *out, const int *inp, const float *wte,
                                           int v_offset, int Vl, const float *wpe, int B, int T,
                                           int C, wf_stream *stream)
{
  size_t n = (size_t)B * T * C;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  encoder_forward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(
      out, inp, wte, v_offset, Vl, wpe, T, C, n);
  WF_CUDA_LAUNCHED("encoder_forward_kernel");
}

extern "C" void wf_cuda_encoder_forward(float *out, const int *inp, const float *wte,
                                        const float *wpe, int B, int T, int C, wf_stream *stream)
{
  wf_cuda_encoder_forward_vp(out, inp, wte, 0, INT_MAX, wpe, B, T, C, stream);
}

extern "C" void wf_cuda_encoder_backward_vp(float *dwte, float *dwpe, const float *dout,
                                            const int *inp, int v_offset, int Vl, int B, int T,
                                            int C, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  size_t n = (size_t)B * T * C;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  if (dwte) {
    encoder_backward_wte_kernel<<<wf__grid_1d(n, 256), 256, 0, s>>>(dwte, dout, inp, v_offset, Vl,
                                                                    C, n);
    if (!WF_CUDA_LAUNCHED("encoder_backward_wte_kernel"))
      return;
  }
  if (dwpe) {
    encoder_backward_wpe_kernel<<<wf__grid_1d((size_t)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T,
                                                                                C);
    WF_CUDA_LAUNCHED("encoder_backward_wpe_kernel");
  }
}

extern "C" void wf_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                         const int *inp, int B, int T, int C, wf_stream *stream)
{
  wf_cuda_encoder_backward_vp(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C, stream);
}
