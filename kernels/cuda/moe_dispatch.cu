/*
 * moe_dispatch.cu - the expert-major order of (token, choice) pairs and the row moves into
 * it and back on the GPU: the twin of kernels/cpu/moe_dispatch.c (moe_dispatch.h), with
 * its arguments plus a stream.
 *
 * The order is a stable counting sort in three launches, none atomic: one block per
 * expert walks the pairs in order in tiles of 256, ranking its own pairs by a block-wide
 * prefix sum (the first `cap` keep their rank, the rest are dropped: -1); one thread
 * then writes the dropped count; and every kept pair adds its expert's first row (the
 * kept counts of the experts before it). The moves copy elements as they are stored
 * (permute) or add a token's K rows in choice order (unpermute), one thread an element.
 * counts, pos and dropped are device memory, as the CPU twin's are the device's.
 */
#include "fmt_int.h"
#include "moe_dispatch.h"

#define TILE 256

namespace
{

/* The inclusive prefix sum of v over the block (TILE threads), and the tile's total. */
__device__ int block_scan(int v, int *total)
{
  __shared__ int warp_sums[TILE / 32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 1; o < 32; o <<= 1) {
    int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o)
      v += u;
  }
  if (lane == 31)
    warp_sums[warp] = v;
  __syncthreads();
  int before = 0, all = 0;
  for (int i = 0; i < TILE / 32; i++) {
    before += i < warp ? warp_sums[i] : 0;
    all += warp_sums[i];
  }
  __syncthreads();
  *total = all;
  return v + before;
}

/* Block e: each of expert e's pairs gets its rank among them (-1 past the capacity);
 * counts[e] = the pairs it keeps. */
__global__ void rank_kernel(int *pos, int *counts, const int *idx, size_t pairs, int cap)
{
  int e = blockIdx.x, base = 0;
  for (size_t t = 0; t < pairs; t += TILE) {
    size_t i = t + threadIdx.x;
    int mine = i < pairs && idx[i] == e, total;
    int rank = base + block_scan(mine, &total) - 1;
    if (mine)
      pos[i] = cap <= 0 || rank < cap ? rank : -1;
    base += total;
  }
  if (threadIdx.x == 0)
    counts[e] = cap > 0 && base > cap ? cap : base;
}

__global__ void dropped_kernel(float *dropped, const int *counts, size_t pairs, int E)
{
  long kept = 0;
  for (int e = 0; e < E; e++)
    kept += counts[e];
  *dropped = (float)((long)pairs - kept);
}

/* A kept pair's row: its rank plus the rows of the experts before its own. */
__global__ void place_kernel(int *pos, const int *counts, const int *idx, size_t pairs)
{
  WF_GRID_STRIDE(i, pairs)
  {
    if (pos[i] < 0)
      continue;
    int first = 0;
    for (int e = 0; e < idx[i]; e++)
      first += counts[e];
    pos[i] += first;
  }
}

__global__ void permute_kernel(void *xp, const void *x, const int *pos, int N, int K, int C,
                               int fmt)
{
  size_t n_el = (size_t)N * K * C;
  WF_GRID_STRIDE(i, n_el)
  {
    size_t pair = i / C, c = i % C;
    int p = pos[pair];
    if (p < 0)
      continue;
    size_t from = pair / K * C + c, to = (size_t)p * C + c;
    if (wf__fmt_size(fmt) == 2)
      ((uint16_t *)xp)[to] = ((const uint16_t *)x)[from]; /* moved, not rounded */
    else
      ((uint32_t *)xp)[to] = ((const uint32_t *)x)[from];
  }
}

__global__ void unpermute_kernel(float *dx, const float *dxp, const int *pos, int N, int K, int C)
{
  size_t n_el = (size_t)N * C;
  WF_GRID_STRIDE(i, n_el)
  {
    size_t n = i / C, c = i % C;
    float s = dx[i];
    for (int j = 0; j < K; j++) { /* in choice order, as the CPU */
      int p = pos[n * K + j];
      if (p >= 0)
        s += dxp[(size_t)p * C + c];
    }
    dx[i] = s;
  }
}

} // namespace

static void cu_moe_dispatch(int *pos, int *counts, float *dropped, const int *idx, int N, int E,
                            int K, int cap, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  size_t pairs = (size_t)N * K;
  if (E <= 0)
    return;
  rank_kernel<<<E, TILE, 0, s>>>(pos, counts, idx, pairs, cap);
  if (!WF_CUDA_LAUNCHED("moe_dispatch rank"))
    return;
  dropped_kernel<<<1, 1, 0, s>>>(dropped, counts, pairs, E);
  if (!WF_CUDA_LAUNCHED("moe_dispatch dropped") || pairs == 0)
    return;
  place_kernel<<<wf__grid_1d(pairs, 256), 256, 0, s>>>(pos, counts, idx, pairs);
  WF_CUDA_LAUNCHED("moe_dispatch place");
}

static void cu_moe_permute(void *xp, const void *x, const int *pos, int N, int K, int C, int fmt,
                           wf_stream *stream)
{
  size_t n = (size_t)N * K * C;
  if (n == 0)
    return;
  permute_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(xp, x, pos, N, K, C, fmt);
  WF_CUDA_LAUNCHED("moe_permute");
}

static void cu_moe_unpermute(float *dx, const float *dxp, const int *pos, int N, int K, int C,
                             wf_stream *stream)
{
  size_t n = (size_t)N * C;
  if (n == 0)
    return;
  unpermute_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(dx, dxp, pos, N, K, C);
  WF_CUDA_LAUNCHED("moe_unpermute");
}

/* ---- the op (wf_kreg.h): one table for every element type (the format is an argument) -- */

static const wf_moe_dispatch_op moe_dispatch_op = {cu_moe_dispatch, cu_moe_permute,
                                                   cu_moe_unpermute};
const wf_kvariants wf__cuda_moe_dispatch =
    WF_KV_ANY(moe_dispatch, WF_OP_VERSION_moe_dispatch, &moe_dispatch_op);
