/*
 * dsum.cu - sums in double over float arrays on the GPU, deterministic: the sum of
 * squares for the global gradient norm (norm.cu's sumsq_acc, twin of wf_sumsq_acc) and
 * the mean of a micro-batch's losses (xent.cu's accumulate, twin of wf_loss_accumulate).
 *
 * Two passes whose order depends on n alone (never on the device, the SM count or
 * timing), so a given input gives the same bits on every run and every GPU: a grid of
 * at most SUM_BLOCKS blocks each reduces a grid-stride share into one partial (16-byte
 * loads where the array is 16-byte aligned), then one block adds the partials in a
 * fixed tree. SUM_BLOCKS x SUM_THREADS threads (1024 x 256) keep every SM of a
 * 132-SM Hopper busy (about 8 blocks each) on a model-sized array; an array of up to
 * SMALL_N elements takes one block and one launch instead (a bias, a layernorm
 * weight, a micro-batch's losses), which is what most of the gradient norm's calls are.
 * The partials live in the module's workspace (backend.cu), used in stream order like
 * the column sums', so nothing is allocated per call. The result is added into a
 * device double (the CPU twin's *acc += ...), so nothing waits for the device here.
 */
#include "cuda_int.h"

#define SUM_THREADS 256
#define SUM_BLOCKS  1024u
#define SMALL_N     ((size_t)SUM_THREADS * 64) /* one block: 64 elements per thread */

enum sum_op { SUM_SQUARES, SUM_MEAN };

template <int OP> __device__ __forceinline__ double term(float x)
{
  return OP == SUM_SQUARES ? (double)x * x : (double)x;
}

/* This thread's share of x (n) over a grid of `threads` threads; `first` is its index. */
template <int OP> __device__ double share(const float *x, size_t n, size_t first, size_t threads)
{
  double acc = 0.0;
  size_t start = 0;
  if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (size_t i = first; i < n / 4; i += threads) {
      float4 v = x4[i];
      acc += term<OP>(v.x) + term<OP>(v.y) + term<OP>(v.z) + term<OP>(v.w);
    }
    start = n / 4 * 4;
  }
  for (size_t i = start + first; i < n; i += threads)
    acc += term<OP>(x[i]);
  return acc;
}

/* What the sum adds into *acc: itself, or the mean rounded to float (the loss). */
template <int OP> __device__ __forceinline__ double result(double sum, size_t n)
{
  return OP == SUM_SQUARES ? sum : (double)(float)(sum / (double)n);
}

/* partial (gridDim.x) = each block's sum over its grid-stride share of x (n) */
template <int OP> __global__ static void partial_kernel(double *partial, const float *x, size_t n)
{
  __shared__ double red[32];
  size_t threads = (size_t)gridDim.x * blockDim.x;
  double acc = share<OP>(x, n, (size_t)blockIdx.x * blockDim.x + threadIdx.x, threads);
  acc = wf__block_sum(acc, red);
  if (threadIdx.x == 0)
    partial[blockIdx.x] = acc;
}

/* *acc += result of the partials (nparts) of an array of n; one block */
template <int OP>
__global__ static void final_kernel(double *acc, const double *partial, unsigned nparts, size_t n)
{
  __shared__ double red[32];
  double sum = 0.0;
  for (unsigned i = threadIdx.x; i < nparts; i += blockDim.x)
    sum += partial[i];
  sum = wf__block_sum(sum, red);
  if (threadIdx.x == 0)
    acc[0] += result<OP>(sum, n);
}

/* *acc += result of x (n <= SMALL_N) in one block and one launch */
template <int OP> __global__ static void small_kernel(double *acc, const float *x, size_t n)
{
  __shared__ double red[32];
  double sum = wf__block_sum(share<OP>(x, n, threadIdx.x, blockDim.x), red);
  if (threadIdx.x == 0)
    acc[0] += result<OP>(sum, n);
}

template <int OP> static void sum_acc(double *acc, const float *x, size_t n, cudaStream_t s)
{
  if (n <= SMALL_N) {
    small_kernel<OP><<<1, SUM_THREADS, 0, s>>>(acc, x, n);
    WF_CUDA_LAUNCHED("small_kernel (sum in double)");
    return;
  }
  unsigned grid = wf__grid_1d((n + 3) / 4, SUM_THREADS);
  grid = grid < SUM_BLOCKS ? grid : SUM_BLOCKS;
  float *room = NULL;
  size_t floats = 0;
  if (!wf__partials(&room, &floats, __FILE__, __LINE__))
    return;
  static_assert(SUM_BLOCKS * sizeof(double) <= ((size_t)1 << 20), "partials outgrow the room");
  double *partial = (double *)room; /* 256-byte aligned: the workspace's offset is */
  partial_kernel<OP><<<grid, SUM_THREADS, 0, s>>>(partial, x, n);
  if (WF_CUDA_LAUNCHED("partial_kernel (sum in double)")) {
    final_kernel<OP><<<1, SUM_THREADS, 0, s>>>(acc, partial, grid, n);
    WF_CUDA_LAUNCHED("final_kernel (sum in double)");
  }
}

void wf__sumsq_acc(double *acc, const float *x, size_t n, wf_stream *stream)
{
  if (n == 0)
    return;
  sum_acc<SUM_SQUARES>(acc, x, n, (cudaStream_t)stream);
}

void wf__mean_acc(double *acc, const float *x, int N, wf_stream *stream)
{
  if (N <= 0)
    return;
  sum_acc<SUM_MEAN>(acc, x, (size_t)N, (cudaStream_t)stream);
}
