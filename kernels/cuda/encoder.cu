/*
 * encoder.cu - token + position embedding on the GPU (twin of wf_encoder_*).
 *
 * Forward: one thread per output element. Backward: dwte rows are shared by every
 * occurrence of a token, so they take atomicAdd; dwpe[t] is summed over the batch
 * by one thread per (t, c), which needs no atomics and is deterministic.
 * Legend: B batch, T time, C channels, V vocabulary.
 */
#include "cuda_int.h"

/* out (B,T,C), inp (B,T), wte (V,C), wpe (maxT,C) */
__global__ static void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                              const float *wpe, int T, int C, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    size_t bt = i / (size_t)C;
    size_t c = i % (size_t)C;
    size_t t = bt % (size_t)T;
    out[i] = wte[(size_t)inp[bt] * C + c] + wpe[t * C + c];
  }
}

/* dwte (V,C) += dout (B,T,C) at the rows named by inp (B,T) */
__global__ static void encoder_backward_wte_kernel(float *dwte, const float *dout, const int *inp,
                                                   int C, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    size_t bt = i / (size_t)C;
    size_t c = i % (size_t)C;
    atomicAdd(&dwte[(size_t)inp[bt] * C + c], dout[i]);
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

extern "C" void wf_cuda_encoder_forward(float *out, const int *inp, const float *wte,
                                        const float *wpe, int B, int T, int C, void *stream)
{
  size_t n = (size_t)B * T * C;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  encoder_forward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(out, inp, wte, wpe,
                                                                                T, C, n);
  WF_CUDA_LAUNCHED("encoder_forward_kernel");
}

extern "C" void wf_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                         const int *inp, int B, int T, int C, void *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  size_t n = (size_t)B * T * C;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  encoder_backward_wte_kernel<<<wf__grid_1d(n, 256), 256, 0, s>>>(dwte, dout, inp, C, n);
  if (!WF_CUDA_LAUNCHED("encoder_backward_wte_kernel"))
    return;
  encoder_backward_wpe_kernel<<<wf__grid_1d((size_t)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T, C);
  WF_CUDA_LAUNCHED("encoder_backward_wpe_kernel");
}
