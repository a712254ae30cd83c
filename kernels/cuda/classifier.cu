/*
 * classifier.cu - the fused classifier over bf16 logits on the GPU (twin of
 * kernels/cpu/classifier.c; classifier.h defines it), as llm.c's fused_classifier: one
 * block per row reads the row once for its statistics (an online max and sum of
 * exponentials per thread, then the block's), computes the loss, and reads the row a
 * second time (from L2 on a GPU of 50 MB of it: a block's row is V x 2 bytes) to
 * overwrite it with the gradient in bf16. No fp32 (N, V) buffer exists.
 *
 * Rows whose stride ld is a multiple of 8 elements (16 bytes; Vp is a multiple of 128)
 * go 8 bf16 per load; other strides element by element. The block's reductions run in
 * a fixed order, so a row's statistics are the same bits on every run.
 *
 * Legend: N rows (B*T), V vocabulary columns held here, ld the row stride (>= V),
 * v_offset the global column of local column 0; columns [V, ld) are padding.
 */
#include <cuda_bf16.h>

#include "cuda_int.h"

#define CLS_THREADS 512

typedef __nv_bfloat16 bf16;

namespace
{

/* A running max m and sum s of exp(x - m). */
struct online {
  float m = -INFINITY, s = 0.0f;

  /* Fold in n values at once: one rescale for the lot. */
  __device__ void add(const float *x, int n)
  {
    float mx = m;
    for (int i = 0; i < n; i++)
      mx = fmaxf(mx, x[i]);
    if (mx == -INFINITY)
      return;
    float t = s * expf(m - mx); /* m = -inf: s = 0, exp(-inf) = 0 */
    for (int i = 0; i < n; i++)
      t += expf(x[i] - mx);
    m = mx, s = t;
  }
};

/* Whether rows can be read 16 bytes at a time. */
__device__ __forceinline__ bool vec_ok(const bf16 *base, int ld)
{
  return ld % 8 == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0;
}

__device__ __forceinline__ void unpack8(float (&f)[8], uint4 u)
{
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x, f[2 * i + 1] = t.y;
  }
}

/* This thread's share of the row's statistics. */
__device__ online row_share(const bf16 *row, int V, bool vec)
{
  online o;
  int c0 = 0;
  if (vec) {
    for (int i = (int)threadIdx.x; i < V / 8; i += (int)blockDim.x) {
      float f[8];
      unpack8(f, *reinterpret_cast<const uint4 *>(row + (size_t)i * 8));
      o.add(f, 8);
    }
    c0 = V / 8 * 8;
  }
  for (int c = c0 + (int)threadIdx.x; c < V; c += (int)blockDim.x) {
    float f = __bfloat162float(row[c]);
    o.add(&f, 1);
  }
  return o;
}

/* The row's max M and sum S = sum exp(x - M), on every thread. */
__device__ void row_stats(float *M, float *S, const bf16 *row, int V, bool vec, float *red)
{
  online o = row_share(row, V, vec);
  float mx = wf__block_max(o.m, red);
  float part = o.m == -INFINITY ? 0.0f : o.s * expf(o.m - mx);
  *M = mx;
  *S = wf__block_sum(part, red);
}

/* dlogits of one row: dloss (exp(x - M) / S - onehot), padding 0; d may be x. */
__device__ void row_grad(bf16 *d, const bf16 *x, float M, float S, int target, float dloss, int V,
                         int ld, bool vec)
{
  const float inv = 1.0f / S;
  int c0 = 0;
  if (vec) {
    for (int i = (int)threadIdx.x; i < V / 8; i += (int)blockDim.x) {
      float f[8];
      unpack8(f, *reinterpret_cast<const uint4 *>(x + (size_t)i * 8));
      uint4 u;
      __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        int c = i * 8 + 2 * k;
        float g0 = (expf(f[2 * k] - M) * inv - (c == target ? 1.0f : 0.0f)) * dloss;
        float g1 = (expf(f[2 * k + 1] - M) * inv - (c + 1 == target ? 1.0f : 0.0f)) * dloss;
        h[k] = __floats2bfloat162_rn(g0, g1);
      }
      *reinterpret_cast<uint4 *>(d + (size_t)i * 8) = u;
    }
    c0 = V / 8 * 8;
  }
  for (int c = c0 + (int)threadIdx.x; c < ld; c += (int)blockDim.x) {
    float g = 0.0f;
    if (c < V)
      g = (expf(__bfloat162float(x[c]) - M) * inv - (c == target ? 1.0f : 0.0f)) * dloss;
    d[c] = __float2bfloat16_rn(g);
  }
}

/* logits (N,ld) -> dlogits in place, losses (N); grid N, block CLS_THREADS. */
__global__ void classifier_kernel(bf16 *logits, float *losses, const int *targets, float dloss,
                                  int V, int ld)
{
  __shared__ float red[32];
  bf16 *row = logits + (size_t)blockIdx.x * ld;
  const bool vec = vec_ok(logits, ld);
  const int t = targets[blockIdx.x];
  /* Read before the barriers of row_stats, so before any thread overwrites the row. */
  const float xt = t >= 0 && t < V ? __bfloat162float(row[t]) : 0.0f;
  float M, S;
  row_stats(&M, &S, row, V, vec, red);
  if (threadIdx.x == 0)
    losses[blockIdx.x] = logf(S) + M - xt;
  row_grad(row, row, M, S, t, dloss, V, ld, vec);
}

/* row_max, row_sumexp, target_logit (N) of logits (N,ld); grid N. */
__global__ void stats_kernel(float *row_max, float *row_sumexp, float *target_logit,
                             const bf16 *logits, const int *targets, int V, int ld, int v_offset)
{
  __shared__ float red[32];
  const bf16 *row = logits + (size_t)blockIdx.x * ld;
  float M, S;
  row_stats(&M, &S, row, V, vec_ok(logits, ld), red);
  if (threadIdx.x != 0)
    return;
  int t = targets[blockIdx.x] - v_offset;
  row_max[blockIdx.x] = M;
  row_sumexp[blockIdx.x] = S;
  target_logit[blockIdx.x] = t >= 0 && t < V ? __bfloat162float(row[t]) : 0.0f;
}

/* dlogits (N,ld) from the global statistics; may alias logits (each element is read and
 * then written by one thread). grid N. */
__global__ void grad_kernel(bf16 *dlogits, const bf16 *logits, const float *row_max,
                            const float *row_sumexp, const int *targets, float dloss, int V, int ld,
                            int v_offset)
{
  size_t r = blockIdx.x;
  bool vec = vec_ok(logits, ld) && vec_ok(dlogits, ld);
  row_grad(dlogits + r * ld, logits + r * ld, row_max[r], row_sumexp[r], targets[r] - v_offset,
           dloss, V, ld, vec);
}

} /* namespace */

static void fused(void *logits, float *losses, const int *targets, float dloss, int N, int V,
                  int ld, wf_stream *stream)
{
  if (N <= 0 || ld <= 0)
    return;
  classifier_kernel<<<(unsigned)N, CLS_THREADS, 0, (cudaStream_t)stream>>>(
      reinterpret_cast<bf16 *>(logits), losses, targets, dloss, V, ld);
  WF_CUDA_LAUNCHED("classifier_kernel");
}

void wf__classifier_stats(float *row_max, float *row_sumexp, float *target_logit,
                          const void *logits, const int *targets, int N, int V, int ld,
                          int v_offset, wf_stream *stream)
{
  if (N <= 0)
    return;
  stats_kernel<<<(unsigned)N, CLS_THREADS, 0, (cudaStream_t)stream>>>(
      row_max, row_sumexp, target_logit, reinterpret_cast<const bf16 *>(logits), targets, V, ld,
      v_offset);
  WF_CUDA_LAUNCHED("stats_kernel (bf16 cross-entropy)");
}

void wf__classifier_backward(void *dlogits, const void *logits, const float *row_max,
                             const float *row_sumexp, const int *targets, float dloss, int N, int V,
                             int ld, int v_offset, wf_stream *stream)
{
  if (N <= 0 || ld <= 0)
    return;
  grad_kernel<<<(unsigned)N, CLS_THREADS, 0, (cudaStream_t)stream>>>(
      reinterpret_cast<bf16 *>(dlogits), reinterpret_cast<const bf16 *>(logits), row_max,
      row_sumexp, targets, dloss, V, ld, v_offset);
  WF_CUDA_LAUNCHED("grad_kernel (bf16 cross-entropy)");
}

/* ---- the op (wf_kreg.h): bf16 only ---------------------------------------------------- */

static const wf_classifier_op bf16_op = {fused, wf__classifier_stats, wf__classifier_backward};
const wf_kvariants wf__cuda_classifier =
    WF_KV(classifier, WF_OP_VERSION_classifier, NULL, &bf16_op, NULL);
