/*
 * qknorm.cu - RMSNorm of the queries' and keys' groups inside packed [q | k | v] rows on
 * the GPU: the twin of kernels/cpu/qknorm.c (qknorm.h), with its arguments plus a stream.
 *
 * One warp per (row, group) for the sums of squares, the forward, the dot products and
 * the inputs' gradients (each group's elements walked by the lanes, summed with warp
 * shuffles); the weights' gradients one thread per weight element, summing its rows and
 * groups in order (the CPU's order; no atomics). Statistics in fp32, as the CPU's.
 */
#include "fmt_int.h"
#include "qknorm.h"

#define WARPS 4

namespace
{

typedef struct qk_geo {
  int N, ld, nq, gq, fq, nk, gk, fk, fmt;
} qk_geo;

typedef struct qk_group {
  int at, len, full;
  const float *w;
} qk_group;

__device__ __forceinline__ int n_groups(const qk_geo &g) { return g.nq / g.gq + g.nk / g.gk; }

__device__ __forceinline__ qk_group group_of(const qk_geo &g, int k, const float *wq,
                                             const float *wk)
{
  int gq = g.nq / g.gq;
  if (k < gq)
    return {k * g.gq, g.gq, g.fq, wq};
  return {g.nq + (k - gq) * g.gk, g.gk, g.fk, wk};
}

/* The (row, group) of this warp, false past the end (uniform over the warp). */
__device__ __forceinline__ bool warp_item(const qk_geo &g, size_t *n, int *k)
{
  size_t item = (size_t)blockIdx.x * WARPS + threadIdx.x / 32, G = (size_t)n_groups(g);
  if (item >= (size_t)g.N * G)
    return false;
  *n = item / G, *k = (int)(item % G);
  return true;
}

__global__ void sumsq_kernel(float *ss, const void *qkv, qk_geo g)
{
  size_t n;
  int k;
  if (!warp_item(g, &n, &k))
    return;
  qk_group q = group_of(g, k, NULL, NULL);
  float s = 0.0f;
  for (int i = threadIdx.x % 32; i < q.len; i += 32) {
    float x = wf__ldf(qkv, n * g.ld + q.at + i, g.fmt);
    s += x * x;
  }
  s = wf__warp_sum(s);
  if (threadIdx.x % 32 == 0)
    ss[n * n_groups(g) + k] = s;
}

__global__ void forward_kernel(void *qkv, void *raw, float *rstd, const float *ss, const float *wq,
                               const float *wk, float eps, qk_geo g)
{
  size_t n, w = (size_t)(g.nq + g.nk);
  int k;
  if (!warp_item(g, &n, &k))
    return;
  qk_group q = group_of(g, k, wq, wk);
  size_t at = n * n_groups(g) + k;
  float r = 1.0f / sqrtf(ss[at] / (float)q.full + eps);
  if (threadIdx.x % 32 == 0)
    rstd[at] = r;
  for (int i = threadIdx.x % 32; i < q.len; i += 32) {
    float x = wf__ldf(qkv, n * g.ld + q.at + i, g.fmt);
    wf__stf(raw, n * w + q.at + i, x, g.fmt); /* as it was: exact */
    wf__stf(qkv, n * g.ld + q.at + i, q.w[i] * (x * r), g.fmt);
  }
}

__global__ void dot_kernel(float *dot, const void *dqkv, const void *raw, const float *rstd,
                           const float *wq, const float *wk, qk_geo g)
{
  size_t n, w = (size_t)(g.nq + g.nk);
  int k;
  if (!warp_item(g, &n, &k))
    return;
  qk_group q = group_of(g, k, wq, wk);
  size_t at = n * n_groups(g) + k;
  float r = rstd[at], s = 0.0f;
  for (int i = threadIdx.x % 32; i < q.len; i += 32) {
    float d = wf__ldf(dqkv, n * g.ld + q.at + i, g.fmt);
    s += q.w[i] * d * (wf__ldf(raw, n * w + q.at + i, g.fmt) * r);
  }
  s = wf__warp_sum(s);
  if (threadIdx.x % 32 == 0)
    dot[at] = s;
}

/* dw[i] += the sum over rows, then groups, of dy x_hat at element i of every group of its
 * kind (queries for i < gq, keys after). */
__global__ void dw_kernel(float *dwq, float *dwk, const void *dqkv, const void *raw,
                          const float *rstd, qk_geo g)
{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= g.gq + g.gk)
    return;
  bool key = i >= g.gq;
  int e = key ? i - g.gq : i, G = n_groups(g), Gq = g.nq / g.gq;
  size_t w = (size_t)(g.nq + g.nk);
  float s = 0.0f;
  for (size_t n = 0; n < (size_t)g.N; n++)
    for (int k = key ? Gq : 0; k < (key ? G : Gq); k++) {
      qk_group q = group_of(g, k, NULL, NULL);
      size_t at = (size_t)q.at + e;
      float dy = wf__ldf(dqkv, n * g.ld + at, g.fmt);
      s += dy * wf__ldf(raw, n * w + at, g.fmt) * rstd[n * G + k];
    }
  (key ? dwk : dwq)[e] += s;
}

__global__ void dx_kernel(void *dqkv, const void *raw, const float *rstd, const float *dot,
                          const float *wq, const float *wk, qk_geo g)
{
  size_t n, w = (size_t)(g.nq + g.nk);
  int k;
  if (!warp_item(g, &n, &k))
    return;
  qk_group q = group_of(g, k, wq, wk);
  size_t at = n * n_groups(g) + k;
  float r = rstd[at], m = dot[at] / (float)q.full;
  for (int i = threadIdx.x % 32; i < q.len; i += 32) {
    size_t d_at = n * g.ld + q.at + i;
    float d = wf__ldf(dqkv, d_at, g.fmt), x = wf__ldf(raw, n * w + q.at + i, g.fmt) * r;
    wf__stf(dqkv, d_at, r * (q.w[i] * d - x * m), g.fmt);
  }
}

unsigned warp_blocks(int N, int G) { return (unsigned)(((size_t)N * G + WARPS - 1) / WARPS); }

int groups_host(const qk_geo &g) { return g.nq / g.gq + g.nk / g.gk; }

} // namespace

static void cu_qknorm_sumsq(float *ss, const void *qkv, int N, int ld, int nq, int gq, int nk,
                            int gk, int fmt, wf_stream *stream)
{
  qk_geo g = {N, ld, nq, gq, 0, nk, gk, 0, fmt};
  if (N <= 0)
    return;
  sumsq_kernel<<<warp_blocks(N, groups_host(g)), 32 * WARPS, 0, (cudaStream_t)stream>>>(ss, qkv, g);
  WF_CUDA_LAUNCHED("qknorm sumsq");
}

static void cu_qknorm_forward(void *qkv, void *raw, float *rstd, const float *ss, const float *wq,
                              const float *wk, int N, int ld, int nq, int gq, int fq, int nk,
                              int gk, int fk, float eps, int fmt, wf_stream *stream)
{
  qk_geo g = {N, ld, nq, gq, fq, nk, gk, fk, fmt};
  if (N <= 0)
    return;
  forward_kernel<<<warp_blocks(N, groups_host(g)), 32 * WARPS, 0, (cudaStream_t)stream>>>(
      qkv, raw, rstd, ss, wq, wk, eps, g);
  WF_CUDA_LAUNCHED("qknorm forward");
}

static void cu_qknorm_dot(float *dot, const void *dqkv, const void *raw, const float *rstd,
                          const float *wq, const float *wk, int N, int ld, int nq, int gq, int nk,
                          int gk, int fmt, wf_stream *stream)
{
  qk_geo g = {N, ld, nq, gq, 0, nk, gk, 0, fmt};
  if (N <= 0)
    return;
  dot_kernel<<<warp_blocks(N, groups_host(g)), 32 * WARPS, 0, (cudaStream_t)stream>>>(
      dot, dqkv, raw, rstd, wq, wk, g);
  WF_CUDA_LAUNCHED("qknorm dot");
}

static void cu_qknorm_backward(void *dqkv, float *dwq, float *dwk, const void *raw,
                               const float *rstd, const float *dot, const float *wq,
                               const float *wk, int N, int ld, int nq, int gq, int fq, int nk,
                               int gk, int fk, int fmt, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  qk_geo g = {N, ld, nq, gq, fq, nk, gk, fk, fmt};
  if (N <= 0)
    return;
  /* the weights' gradients read dy before it becomes the inputs' gradient */
  dw_kernel<<<(unsigned)((gq + gk + 127) / 128), 128, 0, s>>>(dwq, dwk, dqkv, raw, rstd, g);
  if (!WF_CUDA_LAUNCHED("qknorm weight gradients"))
    return;
  dx_kernel<<<warp_blocks(N, groups_host(g)), 32 * WARPS, 0, s>>>(dqkv, raw, rstd, dot, wq, wk, g);
  WF_CUDA_LAUNCHED("qknorm backward");
}

/* ---- the op (wf_kreg.h): one table for every element type (the format is an argument) -- */

static const wf_qknorm_op qknorm_op = {cu_qknorm_sumsq, cu_qknorm_forward, cu_qknorm_dot,
                                       cu_qknorm_backward};
const wf_kvariants wf__cuda_qknorm = WF_KV_ANY(qknorm, WF_OP_VERSION_qknorm, &qknorm_op);
