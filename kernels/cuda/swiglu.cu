/*
 * swiglu.cu - the SwiGLU gate on the GPU (twin of wf_swiglu_*): out = silu(gate) * up
 * from rows [gate | up] of a packed (N, 2F) input.
 *
 * One thread per output element, grid-stride over N*F. silu(x) = x / (1 + exp(-x)),
 * with CUDA's expf (2 ulp); its derivative s (1 + x (1 - s)), s = sigmoid(x).
 * Backward writes dinp (N, 2F). The input, the forward's output and backward's dout and
 * dinp are of type E (act_int.h: fp32, or bf16 / fp16 for the 16-bit tables, loaded
 * widened and stored rounded), as the GEMMs beside them read and write them.
 */
#include "act_int.h"

/* out (N,F), inp (N,2F) */
template <typename E>
__global__ static void swiglu_forward_kernel(E *out, const E *inp, int F, size_t n)
{
  WF_GRID_STRIDE(k, n)
  {
    size_t row = k / (size_t)F, i = k % (size_t)F;
    const E *x = inp + row * 2 * F;
    float g = wf__ld(x, i);
    wf__st(out, k, g / (1.0f + expf(-g)) * wf__ld(x, F + i));
  }
}

/* dinp (N,2F) = [dout up silu'(gate) | dout silu(gate)], written in E; dout (N,F) */
template <typename E>
__global__ static void swiglu_backward_kernel(E *dinp, const E *inp, const E *dout, int F, size_t n)
{
  WF_GRID_STRIDE(k, n)
  {
    size_t row = k / (size_t)F, i = k % (size_t)F;
    const E *x = inp + row * 2 * F;
    E *d = dinp + row * 2 * F;
    float g = wf__ld(x, i), u = wf__ld(x, F + i), dy = wf__ld(dout, k),
          s = 1.0f / (1.0f + expf(-g));
    wf__st(d, i, dy * u * (s * (1.0f + g * (1.0f - s))));
    wf__st(d, F + i, dy * (g * s));
  }
}

template <typename E> void wf__swiglu_forward(E *out, const E *inp, int N, int F, wf_stream *stream)
{
  if (N <= 0 || F <= 0)
    return;
  size_t n = (size_t)N * F;
  swiglu_forward_kernel<E><<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(out, inp, F, n);
  WF_CUDA_LAUNCHED("swiglu_forward_kernel");
}

template <typename E>
void wf__swiglu_backward(E *dinp, const E *inp, const E *dout, int N, int F, wf_stream *stream)
{
  if (N <= 0 || F <= 0)
    return;
  size_t n = (size_t)N * F;
  swiglu_backward_kernel<E>
      <<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(dinp, inp, dout, F, n);
  WF_CUDA_LAUNCHED("swiglu_backward_kernel");
}

#define WF_SWIGLU_FORMS(E)                                                                         \
  template void wf__swiglu_forward<E>(E *, const E *, int, int, wf_stream *);                      \
  template void wf__swiglu_backward<E>(E *, const E *, const E *, int, int, wf_stream *);
WF_SWIGLU_FORMS(float)
WF_SWIGLU_FORMS(__nv_bfloat16)
WF_SWIGLU_FORMS(__half)

extern "C" void wf_cuda_swiglu_forward(float *out, const float *inp, int N, int F,
                                       wf_stream *stream)
{
  wf__swiglu_forward(out, inp, N, F, stream);
}

extern "C" void wf_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int N,
                                        int F, wf_stream *stream)
{
  wf__swiglu_backward(dinp, inp, dout, N, F, stream);
}
