/*
 * swiglu.cu - the SwiGLU gate on the GPU (twin of wf_swiglu_*): out = silu(gate) * up
 * from rows [gate | up] of a packed (N, 2F) input.
 *
 * One thread per output element (or pack of 8: act_int.h), grid-stride over N*F.
 * silu(x) = x / (1 + exp(-x)), with CUDA's expf (2 ulp); its derivative
 * s (1 + x (1 - s)), s = sigmoid(x). Backward writes dinp (N, 2F). The input, the
 * forward's output and backward's dout and dinp are of type E (act_int.h: fp32, or bf16 /
 * fp16 for the 16-bit tables, loaded widened and stored rounded), as the GEMMs beside
 * them read and write them.
 */
#include "act_int.h"

__device__ __forceinline__ float swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* The gate's and up's gradients of one output's dy. */
__device__ __forceinline__ void swiglu_grads(float g, float u, float dy, float *dg, float *du)
{
  float s = 1.0f / (1.0f + expf(-g));
  *dg = dy * u * (s * (1.0f + g * (1.0f - s)));
  *du = dy * (g * s);
}

/* out (N,F), inp (N,2F); in packs of 8 when vec (F a multiple of 8, so a pack stays in
 * its row: act_int.h) */
template <typename E>
__global__ static void swiglu_forward_kernel(E *out, const E *inp, int F, size_t n, bool vec)
{
  WF_PACKS(k, n, vec)
  {
    const E *x = inp + k / (size_t)F * 2 * F;
    size_t i = k % (size_t)F;
    float g[8], u[8];
    wf__ld8(x, i, g), wf__ld8(x, F + i, u);
    for (int j = 0; j < 8; j++)
      g[j] = swiglu(g[j], u[j]);
    wf__st8(out, k, g);
  }
  WF_PACK_TAIL(k, n, vec)
  {
    const E *x = inp + k / (size_t)F * 2 * F;
    size_t i = k % (size_t)F;
    wf__st(out, k, swiglu(wf__ld(x, i), wf__ld(x, F + i)));
  }
}

/* dinp (N,2F) = [dout up silu'(gate) | dout silu(gate)], written in E; dout (N,F) */
template <typename E>
__global__ static void swiglu_backward_kernel(E *dinp, const E *inp, const E *dout, int F, size_t n,
                                              bool vec)
{
  WF_PACKS(k, n, vec)
  {
    size_t at = k / (size_t)F * 2 * F, i = k % (size_t)F;
    float g[8], u[8], dy[8];
    wf__ld8(inp + at, i, g), wf__ld8(inp + at, F + i, u), wf__ld8(dout, k, dy);
    for (int j = 0; j < 8; j++)
      swiglu_grads(g[j], u[j], dy[j], &g[j], &u[j]);
    wf__st8(dinp + at, i, g), wf__st8(dinp + at, F + i, u);
  }
  WF_PACK_TAIL(k, n, vec)
  {
    size_t at = k / (size_t)F * 2 * F, i = k % (size_t)F;
    float dg, du;
    swiglu_grads(wf__ld(inp + at, i), wf__ld(inp + at, F + i), wf__ld(dout, k), &dg, &du);
    wf__st(dinp + at, i, dg), wf__st(dinp + at, F + i, du);
  }
}

template <typename E>
static void swiglu_forward(void *out_, const void *inp_, int N, int F, wf_stream *stream)
{
  E *out = (E *)out_;
  const E *inp = (const E *)inp_;
  if (N <= 0 || F <= 0)
    return;
  size_t n = (size_t)N * F;
  bool vec = F % 8 == 0 && wf__aligned16(out, inp);
  swiglu_forward_kernel<E>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)stream>>>(out, inp, F, n, vec);
  WF_CUDA_LAUNCHED("swiglu_forward_kernel");
}

template <typename E>
static void swiglu_backward(void *dinp_, const void *inp_, const void *dout_, int N, int F,
                            wf_stream *stream)
{
  E *dinp = (E *)dinp_;
  const E *inp = (const E *)inp_, *dout = (const E *)dout_;
  if (N <= 0 || F <= 0)
    return;
  size_t n = (size_t)N * F;
  bool vec = F % 8 == 0 && wf__aligned16(dinp, inp, dout);
  swiglu_backward_kernel<E>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)stream>>>(dinp, inp, dout, F, n, vec);
  WF_CUDA_LAUNCHED("swiglu_backward_kernel");
}

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E> static const wf_swiglu_op op = {swiglu_forward<E>, swiglu_backward<E>};
const wf_kvariants wf__cuda_swiglu =
    WF_KV(swiglu, WF_OP_VERSION_swiglu, &op<float>, &op<__nv_bfloat16>, &op<__half>);
