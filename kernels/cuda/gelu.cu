/*
 * gelu.cu - GELU, tanh approximation, on the GPU (twin of wf_gelu_*).
 *
 * gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
 * The backward uses sech^2 = 1 - tanh^2, which cannot overflow as cosh^2 can.
 * Backward writes dinp (gelu.h).
 */
#include "cuda_int.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

/* out (N), inp (N) */
__global__ static void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    float x = inp[i];
    float u = GELU_K * (x + 0.044715f * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

/* dinp (N) = gelu'(inp) * dout, written */
__global__ static void gelu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                            size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    float x = inp[i];
    float u = GELU_K * (x + 0.044715f * x * x * x);
    float th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = grad * dout[i];
  }
}

extern "C" void wf_cuda_gelu_forward(float *out, const float *inp, size_t N, wf_stream *stream)
{
  if (N == 0)
    return;
  gelu_forward_kernel<<<wf__grid_1d(N, 256), 256, 0, (cudaStream_t)stream>>>(out, inp, N);
  WF_CUDA_LAUNCHED("gelu_forward_kernel");
}

extern "C" void wf_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N,
                                      wf_stream *stream)
{
  if (N == 0)
    return;
  gelu_backward_kernel<<<wf__grid_1d(N, 256), 256, 0, (cudaStream_t)stream>>>(dinp, inp, dout, N);
  WF_CUDA_LAUNCHED("gelu_backward_kernel");
}
