/*
 * sumsq.cu - sum of squares in double on the GPU (twin of wf_sumsq_acc), for the
 * global gradient norm.
 *
 * Two passes, deterministic for a given n: a fixed grid of blocks each reduces a
 * grid-stride share into one partial, then one block reduces the partials. The
 * partials live in the module's workspace (backend.cu), used in stream order like the
 * column sums', so nothing is allocated per call. The sum is added into a device
 * double (the CPU twin's *acc += wf_sumsq), so nothing waits for the device here.
 */
#include "cuda_int.h"

#define SUMSQ_THREADS 256
#define SUMSQ_BLOCKS  1024u

/* partial (gridDim.x) = per-block sums of x^2 over x (n) */
__global__ static void sumsq_partial_kernel(double *partial, const float *x, size_t n)
{
  __shared__ double red[32];
  double acc = 0.0;
  WF_GRID_STRIDE(i, n)
  {
    double v = x[i];
    acc += v * v;
  }
  acc = wf__block_sum(acc, red);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = acc;
}

/* *acc += sum of partial (nparts); one block */
__global__ static void sumsq_final_kernel(double *acc, const double *partial, unsigned nparts)
{
  __shared__ double red[32];
  double sum = 0.0;
  for (unsigned i = threadIdx.x; i < nparts; i += blockDim.x)
    sum += partial[i];
  sum = wf__block_sum(sum, red);
  if (threadIdx.x == 0)
    acc[0] += sum;
}

extern "C" void wf_cuda_sumsq_acc(double *acc, const float *x, size_t n, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (n == 0)
    return;
  unsigned grid = wf__grid_1d(n, SUMSQ_THREADS);
  if (grid > SUMSQ_BLOCKS)
    grid = SUMSQ_BLOCKS;
  float *room = NULL;
  size_t floats = 0;
  if (!wf__partials(&room, &floats, __FILE__, __LINE__))
    return;
  static_assert(SUMSQ_BLOCKS * sizeof(double) <= ((size_t)1 << 20), "partials outgrow the room");
  double *partial = (double *)room; /* 256-byte aligned: the workspace's offset is */
  sumsq_partial_kernel<<<grid, SUMSQ_THREADS, 0, s>>>(partial, x, n);
  if (WF_CUDA_LAUNCHED("sumsq_partial_kernel")) {
    sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(acc, partial, grid);
    WF_CUDA_LAUNCHED("sumsq_final_kernel");
  }
}
