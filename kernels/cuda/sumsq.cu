/*
 * sumsq.cu - sum of squares in double on the GPU (twin of wf_sumsq), for the
 * global gradient norm.
 *
 * Two passes, deterministic for a given n: a fixed grid of blocks each reduces a
 * grid-stride share into one partial, then one block reduces the partials. The
 * partials live in stream-ordered memory (cudaMallocAsync), so concurrent calls
 * on different streams share nothing. Like the CPU twin it returns a host value,
 * so it synchronises `stream`; it is called once per step on the whole gradient.
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

/* out (1) = sum of partial (nparts); one block */
__global__ static void sumsq_final_kernel(double *out, const double *partial, unsigned nparts)
{
  __shared__ double red[32];
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < nparts; i += blockDim.x)
    acc += partial[i];
  acc = wf__block_sum(acc, red);
  if (threadIdx.x == 0)
    out[0] = acc;
}

/* Launch both passes into buf (grid partials, then the total). */
static bool sumsq_launch(double *buf, unsigned grid, const float *x, size_t n, cudaStream_t s)
{
  sumsq_partial_kernel<<<grid, SUMSQ_THREADS, 0, s>>>(buf, x, n);
  if (!WF_CUDA_LAUNCHED("sumsq_partial_kernel"))
    return false;
  sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, s>>>(buf + grid, buf, grid);
  return WF_CUDA_LAUNCHED("sumsq_final_kernel");
}

extern "C" double wf_cuda_sumsq(const float *x, size_t n, void *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (n == 0)
    return 0.0;
  unsigned grid = wf__grid_1d(n, SUMSQ_THREADS);
  if (grid > SUMSQ_BLOCKS)
    grid = SUMSQ_BLOCKS;
  void *mem = NULL;
  double total = NAN;
  if (!WF_CUDA_OK(cudaMallocAsync(&mem, (grid + 1) * sizeof(double), s)))
    return NAN;
  double *buf = (double *)mem;
  bool ok =
      sumsq_launch(buf, grid, x, n, s) &&
      WF_CUDA_OK(cudaMemcpyAsync(&total, buf + grid, sizeof total, cudaMemcpyDeviceToHost, s));
  WF_CUDA_OK(cudaFreeAsync(mem, s));
  if (!WF_CUDA_OK(cudaStreamSynchronize(s)) || !ok)
    return NAN;
  return total;
}
