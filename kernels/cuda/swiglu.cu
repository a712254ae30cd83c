/*
 * swiglu.cu - the SwiGLU gate on the GPU (twin of wf_swiglu_*): out = silu(gate) * up
 * from rows [gate | up] of a packed (N, 2F) input.
 *
 * One thread per output element, grid-stride over N*F. silu(x) = x / (1 + exp(-x)),
 * with CUDA's expf (2 ulp); its derivative s (1 + x (1 - s)), s = sigmoid(x).
 * Backward adds into dinp (N, 2F).
 */
#include "cuda_int.h"

/* out (N,F), inp (N,2F) */
__global__ static void swiglu_forward_kernel(float *out, const float *inp, int F, size_t n)
{
  WF_GRID_STRIDE(k, n)
  {
    size_t row = k / (size_t)F, i = k % (size_t)F;
    const float *x = inp + row * 2 * F;
    float g = x[i];
    out[k] = g / (1.0f + expf(-g)) * x[F + i];
  }
}

/* dinp (N,2F) += [dout up silu'(gate) | dout silu(gate)], dout (N,F) */
__global__ static void swiglu_backward_kernel(float *dinp, const float *inp, const float *dout,
                                              int F, size_t n)
{
  WF_GRID_STRIDE(k, n)
  {
    size_t row = k / (size_t)F, i = k % (size_t)F;
    const float *x = inp + row * 2 * F;
    float *d = dinp + row * 2 * F;
    float g = x[i], u = x[F + i], dy = dout[k], s = 1.0f / (1.0f + expf(-g));
    d[i] += dy * u * (s * (1.0f + g * (1.0f - s)));
    d[F + i] += dy * (g * s);
  }
}

extern "C" void wf_cuda_swiglu_forward(float *out, const float *inp, int N, int F,
                                       wf_stream *stream)
{
  if (N <= 0 || F <= 0)
    return;
  size_t n = (size_t)N * F;
  swiglu_forward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(out, inp, F, n);
  WF_CUDA_LAUNCHED("swiglu_forward_kernel");
}

extern "C" void wf_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int N,
                                        int F, wf_stream *stream)
{
  if (N <= 0 || F <= 0)
    return;
  size_t n = (size_t)N * F;
  swiglu_backward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(dinp, inp, dout, F,
                                                                                n);
  WF_CUDA_LAUNCHED("swiglu_backward_kernel");
}
