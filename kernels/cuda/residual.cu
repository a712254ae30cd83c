/*
 * residual.cu - residual add on the GPU (twin of wf_residual_*).
 *
 * Forward: out = a + b. Backward adds dout into both da and db (da and db are
 * distinct buffers; out may alias a or b because each element is read before it
 * is written by the same thread).
 */
#include "cuda_int.h"

/* out, a, b (N) */
__global__ static void residual_forward_kernel(float *out, const float *a, const float *b, size_t n)
{
  WF_GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
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

extern "C" void wf_cuda_residual_forward(float *out, const float *a, const float *b, size_t N,
                                         wf_stream *stream)
{
  if (N == 0)
    return;
  residual_forward_kernel<<<wf__grid_1d(N, 256), 256, 0, (cudaStream_t)stream>>>(out, a, b, N);
  WF_CUDA_LAUNCHED("residual_forward_kernel");
}

extern "C" void wf_cuda_residual_backward(float *da, float *db, const float *dout, size_t N,
                                          wf_stream *stream)
{
  if (N == 0)
    return;
  residual_backward_kernel<<<wf__grid_1d(N, 256), 256, 0, (cudaStream_t)stream>>>(da, db, dout, N);
  WF_CUDA_LAUNCHED("residual_backward_kernel");
}
