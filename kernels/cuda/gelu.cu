/*
 * gelu.cu - GELU, tanh approximation, on the GPU (twin of kernels/cpu/gelu.c), one
 * variant per element type: gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),
 * k = sqrt(2/pi) (act_int.h's wf__gelu, wf__gelu_grad). Eight elements per 16-byte
 * access where every operand is 16-byte aligned. Backward writes dinp (gelu.h).
 */
#include "act_int.h"

template <typename T>
__global__ static void gelu_forward_kernel(T *out, const T *inp, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float x[8];
    wf__ld8(inp, i, x);
    for (int k = 0; k < 8; k++)
      x[k] = wf__gelu(x[k]);
    wf__st8(out, i, x);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(out, i, wf__gelu(wf__ld(inp, i))); }
}

/* dinp = gelu'(inp) * dout, written */
template <typename T>
__global__ static void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n,
                                            bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float x[8], dy[8];
    wf__ld8(inp, i, x);
    wf__ld8(dout, i, dy);
    for (int k = 0; k < 8; k++)
      x[k] = wf__gelu_grad(x[k]) * dy[k];
    wf__st8(dinp, i, x);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(dinp, i, wf__gelu_grad(wf__ld(inp, i)) * wf__ld(dout, i)); }
}

template <typename T> void wf__gelu_forward(void *out, const void *inp, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(out, inp);
  if (n == 0)
    return;
  gelu_forward_kernel<T>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>((T *)out, (const T *)inp, n, vec);
  WF_CUDA_LAUNCHED("gelu_forward_kernel");
}

template <typename T>
static void gelu_backward(void *dinp, const void *inp, const void *dout, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(dinp, inp, dout);
  if (n == 0)
    return;
  gelu_backward_kernel<T><<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>(
      (T *)dinp, (const T *)inp, (const T *)dout, n, vec);
  WF_CUDA_LAUNCHED("gelu_backward_kernel");
}

template void wf__gelu_forward<float>(void *, const void *, size_t, wf_stream *);
template void wf__gelu_forward<__nv_bfloat16>(void *, const void *, size_t, wf_stream *);
template void wf__gelu_forward<__half>(void *, const void *, size_t, wf_stream *);

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E> static const wf_gelu_op op = {wf__gelu_forward<E>, gelu_backward<E>};
const wf_kvariants wf__cuda_gelu =
    WF_KV(gelu, WF_OP_VERSION_gelu, &op<float>, &op<__nv_bfloat16>, &op<__half>);
