/*
 * residual.cu - residual add on the GPU (twin of kernels/cpu/residual.c).
 *
 * Forward: out = a + b, out and a of the variant's element type (out may alias a: each
 * element is read before it is written by the same thread), b fp32 (a branch's output
 * after the tp reduction). Backward adds dout into both da and db (fp32 in every
 * variant).
 */
#include "act_int.h"

template <typename T>
__global__ static void residual_kernel(T *out, const T *a, const float *b, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float x[8], y[8];
    wf__ld8(a, i, x);
    wf__ld8(b, i, y);
    for (int k = 0; k < 8; k++)
      x[k] += y[k];
    wf__st8(out, i, x);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(out, i, wf__ld(a, i) + b[i]); }
}

template <typename T>
static void residual_forward(void *out, const void *a, const float *b, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(out, a, b);
  if (n == 0)
    return;
  residual_kernel<T>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>((T *)out, (const T *)a, b, n, vec);
  WF_CUDA_LAUNCHED("residual_kernel");
}

/* da, db, dout (N) */
__global__ static void residual_backward_kernel(float *da, float *db, const float *dout, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    float d = dout[i];
    da[i] += d;
    db[i] += d;
  }
}

static void residual_backward(float *da, float *db, const float *dout, size_t N, wf_stream *stream)
{
  if (N == 0)
    return;
  residual_backward_kernel<<<wf__grid_1d(N, 256), 256, 0, (cudaStream_t)stream>>>(da, db, dout, N);
  WF_CUDA_LAUNCHED("residual_backward_kernel");
}

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E> static const wf_residual_op op = {residual_forward<E>, residual_backward};
const wf_kvariants wf__cuda_residual =
    WF_KV(residual, WF_OP_VERSION_residual, &op<float>, &op<__nv_bfloat16>, &op<__half>);
