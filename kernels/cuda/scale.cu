/*
 * scale.cu - x *= s on the GPU (twin of wf_scale), used for gradient clipping.
 */
#include "cuda_int.h"

/* x (n) */
__global__ static void scale_kernel(float *x, float s, size_t n)
{
  WF_GRID_STRIDE(i, n) { x[i] *= s; }
}

extern "C" void wf_cuda_scale(float *x, float s, size_t n, wf_stream *stream)
{
  if (n == 0)
    return;
  scale_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(x, s, n);
  WF_CUDA_LAUNCHED("scale_kernel");
}
