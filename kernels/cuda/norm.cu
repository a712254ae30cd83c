/*
 * norm.cu - the gradient norm's sum of squares (dsum.cu's sum in double, twin of
 * wf_sumsq_acc) and x *= s (twin of wf_scale, gradient clipping) on the GPU.
 */
#include "cuda_int.h"

/* x (n) */
__global__ static void scale_kernel(float *x, float s, size_t n)
{
  WF_GRID_STRIDE(i, n) { x[i] *= s; }
}

static void scale(float *x, float s, size_t n, wf_stream *stream)
{
  if (n == 0)
    return;
  scale_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(x, s, n);
  WF_CUDA_LAUNCHED("scale_kernel");
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static const wf_norm_op op = {wf__sumsq_acc, scale};
const wf_kvariants wf__cuda_norm = WF_KV_ANY(norm, WF_OP_VERSION_norm, &op);
