/*
 * layernorm.cu - layer normalisation on the GPU (twin of wf_layernorm_*).
 *
 * Forward and the dinp part of backward: one warp per row, reductions with warp
 * shuffles, 4 rows per 128-thread block. The dweight/dbias part of backward sums
 * over rows, so it runs as a column reduction cut over rows and columns (colsum.cu): a
 * block of 32 x 8 threads owns 32 columns of a block of rows, its 8 thread rows stride
 * over them, the 8 sums are combined in shared memory into the block's partial sum,
 * and the partial sums are added in order. No atomics, so the result is deterministic.
 * Legend: N rows (B*T), C channels. eps = 1e-5.
 */
#include "act_int.h"

#define LN_EPS         1e-5f
#define ROWS_PER_BLOCK 4 /* warps per 128-thread block */

/* One warp normalizes row x (C) into o; lane 0 keeps its mean and rstd when asked. */
__device__ static void normalize_row(float *o, float *mean, float *rstd, const float *x,
                                     const float *weight, const float *bias, int C, int row)
{
  int lane = threadIdx.x % 32;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32)
    s += x[c];
  float m = wf__warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = x[c] - m;
    v += d * d;
  }
  float rs = rsqrtf(wf__warp_sum(v) / C + LN_EPS);
  for (int c = lane; c < C; c += 32)
    o[c] = (x[c] - m) * rs * weight[c] + bias[c];
  if (lane == 0 && mean)
    mean[row] = m;
  if (lane == 0 && rstd)
    rstd[row] = rs;
}

/* out (N,C), mean (N) or NULL, rstd (N) or NULL, inp (N,C), weight (C), bias (C) */
__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *weight,
                                                const float *bias, int N, int C)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N) /* uniform over the warp, so the shuffles stay full */
    return;
  size_t at = (size_t)row * C;
  normalize_row(out + at, mean, rstd, inp + at, weight, bias, C, row);
}

/* res (N,C) = a + b, then ln = layernorm(res). res may alias a or b: each lane reads
 * then writes the same elements, and reads back only what it wrote. */
__global__ static void residual_layernorm_kernel(float *res, float *ln, float *mean, float *rstd,
                                                 const float *a, const float *b,
                                                 const float *weight, const float *bias, int N,
                                                 int C)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  size_t at = (size_t)row * C;
  for (int c = threadIdx.x % 32; c < C; c += 32)
    res[at + c] = a[at + c] + b[at + c];
  normalize_row(ln + at, mean, rstd, res + at, weight, bias, C, row);
}

/* dinp (N,C) += rstd (w dout - mean(w dout) - norm mean(w dout norm)) */
__global__ static void layernorm_backward_dinp_kernel(float *dinp, const float *dout,
                                                      const float *inp, const float *weight,
                                                      const float *mean, const float *rstd, int N,
                                                      int C)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= N)
    return;
  const float *x = inp + (size_t)row * C;
  const float *dy = dout + (size_t)row * C;
  float m = mean[row], rs = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float wdy = weight[c] * dy[c];
    a += wdy;
    b += wdy * (x[c] - m) * rs;
  }
  float mean_wdy = wf__warp_sum(a) / C;
  float mean_wdy_norm = wf__warp_sum(b) / C;
  float *dx = dinp + (size_t)row * C;
  for (int c = lane; c < C; c += 32) {
    float norm = (x[c] - m) * rs;
    dx[c] += (weight[c] * dy[c] - mean_wdy - norm * mean_wdy_norm) * rs;
  }
}

extern "C" void wf_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                          const float *weight, const float *bias, int N, int C,
                                          wf_stream *stream)
{
  if (N <= 0 || C <= 0)
    return;
  unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
  layernorm_forward_kernel<<<grid, 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(
      out, mean, rstd, inp, weight, bias, N, C);
  WF_CUDA_LAUNCHED("layernorm_forward_kernel");
}

extern "C" void wf_cuda_residual_layernorm_forward(float *res, float *ln, float *mean, float *rstd,
                                                   const float *a, const float *b,
                                                   const float *weight, const float *bias, int N,
                                                   int C, wf_stream *stream)
{
  if (N <= 0 || C <= 0)
    return;
  unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
  residual_layernorm_kernel<<<grid, 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(
      res, ln, mean, rstd, a, b, weight, bias, N, C);
  WF_CUDA_LAUNCHED("residual_layernorm_kernel");
}

extern "C" void wf_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                           const float *dout, const float *inp, const float *weight,
                                           const float *mean, const float *rstd, int N, int C,
                                           wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || C <= 0)
    return;
  if (dinp) {
    unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    layernorm_backward_dinp_kernel<<<grid, 32 * ROWS_PER_BLOCK, 0, s>>>(dinp, dout, inp, weight,
                                                                        mean, rstd, N, C);
    if (!WF_CUDA_LAUNCHED("layernorm_backward_dinp_kernel"))
      return;
  }
  wf__norm_param_grads(dweight, dbias, dout, inp, mean, rstd, N, C, s);
}
