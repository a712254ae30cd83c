/*
 * moe_route.cu - the mixture-of-experts router on the GPU: the twin of
 * kernels/cpu/moe_route.c (moe_route.h).
 *
 * Forward: one warp per token: the max and the sum of exponentials over its E logits
 * (lanes stride the experts), the probabilities written over the logits in place (a lane
 * reads an expert's logit before it writes that expert's probability), then K rounds of
 * a warp arg-max over the experts not yet taken (a tie goes to the lower expert, as the
 * CPU's scan), and the K weights, renormalised when asked. The statistics then: one block
 * per expert counts its choices (exact) and sums its probabilities over the tokens in a
 * fixed order, and one more block sums lse^2 in double; no atomics, so every run gives the
 * same bits (the CPU sums serially: the two agree to fp32 rounding of a sum).
 * Backward: one warp per token, g[e] = aux cnt[e] plus the chosen experts' weight
 * gradients (through the renormalisation), dlogits = p (g - p.g) + z lse p.
 * K <= WF_MOE_MAX_K (the CPU takes any K; every released MoE uses at most 8).
 */
#include "fmt_int.h"
#include "moe_route.h"

#define WF_MOE_MAX_K 64
#define WARPS        4 /* tokens per 128-thread block */

namespace
{

/* The arg-max over the lane's experts e (lane, lane + 32, ...) not among sel[0..j), then
 * over the warp: the largest p, of equals the lowest expert. */
__device__ int pick(const float *p, int E, const int *sel, int j)
{
  float bv = -1.0f;
  int bi = E;
  for (int e = (int)(threadIdx.x % 32); e < E; e += 32) {
    bool taken = false;
    for (int i = 0; i < j && !taken; i++)
      taken = sel[i] == e;
    if (!taken && (p[e] > bv || (p[e] == bv && e < bi)))
      bv = p[e], bi = e;
  }
  for (int o = 16; o > 0; o >>= 1) {
    float v = __shfl_xor_sync(0xffffffffu, bv, o);
    int i = __shfl_xor_sync(0xffffffffu, bi, o);
    if (v > bv || (v == bv && i < bi))
      bv = v, bi = i;
  }
  return bi;
}

__global__ void forward_kernel(float *probs, float *lse, int *idx, float *w, const float *logits,
                               int N, int E, int K, bool renorm)
{
  int n = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N) /* uniform over the warp */
    return;
  const float *x = logits + (size_t)n * E;
  float *p = probs + (size_t)n * E, m = -INFINITY, sum = 0.0f;
  for (int e = lane; e < E; e += 32)
    m = fmaxf(m, x[e]);
  m = wf__warp_max(m);
  for (int e = lane; e < E; e += 32)
    sum += expf(x[e] - m);
  sum = wf__warp_sum(sum);
  for (int e = lane; e < E; e += 32)
    p[e] = expf(x[e] - m) / sum;
  __syncwarp();
  int sel[WF_MOE_MAX_K];
  float s = 0.0f;
  for (int j = 0; j < K; j++) {
    sel[j] = pick(p, E, sel, j);
    s += p[sel[j]];
  }
  if (lane != 0)
    return;
  lse[n] = m + logf(sum);
  for (int j = 0; j < K; j++) {
    idx[(size_t)n * K + j] = sel[j];
    w[(size_t)n * K + j] = renorm ? p[sel[j]] / s : p[sel[j]];
  }
}

/* Block e < E: cnt[e] and psum[e]; block E: zsum (double) and dropped = 0. */
__global__ void stats_kernel(float *stats, const float *probs, const float *lse, const int *idx,
                             int N, int E, int K)
{
  __shared__ double shd[32];
  __shared__ float shf[32];
  int e = blockIdx.x;
  if (e == E) {
    double z = 0;
    for (int n = threadIdx.x; n < N; n += blockDim.x)
      z += (double)lse[n] * lse[n];
    z = wf__block_sum(z, shd);
    if (threadIdx.x == 0)
      stats[2 * E] = (float)z, stats[2 * E + 1] = 0.0f;
    return;
  }
  float c = 0.0f, ps = 0.0f;
  for (size_t i = threadIdx.x; i < (size_t)N * K; i += blockDim.x)
    c += idx[i] == e ? 1.0f : 0.0f;
  for (int n = threadIdx.x; n < N; n += blockDim.x)
    ps += probs[(size_t)n * E + e];
  c = wf__block_sum(c, shf); /* counts below 2^24: exact in any order */
  ps = wf__block_sum(ps, shf);
  if (threadIdx.x == 0)
    stats[e] = c, stats[E + e] = ps;
}

__global__ void backward_kernel(void *dlogits, const float *dw, const float *probs,
                                const float *lse, const int *idx, const float *w, const float *cnt,
                                float aux_scale, float z_scale, int N, int E, int K, bool renorm,
                                int fmt)
{
  int n = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (n >= N)
    return;
  const float *p = probs + (size_t)n * E, *dwn = dw + (size_t)n * K, *wn = w + (size_t)n * K;
  const int *in = idx + (size_t)n * K;
  float s = 0.0f, dot = 0.0f, pg = 0.0f, zl = z_scale * lse[n];
  for (int j = 0; j < K; j++)
    s += p[in[j]], dot += dwn[j] * wn[j];
  for (int e = lane; e < E; e += 32) {
    float g = aux_scale * cnt[e];
    for (int j = 0; j < K; j++)
      if (in[j] == e)
        g += renorm ? (dwn[j] - dot) / s : dwn[j];
    pg += p[e] * g;
  }
  pg = wf__warp_sum(pg);
  for (int e = lane; e < E; e += 32) {
    float g = aux_scale * cnt[e];
    for (int j = 0; j < K; j++)
      if (in[j] == e)
        g += renorm ? (dwn[j] - dot) / s : dwn[j];
    wf__stf(dlogits, (size_t)n * E + e, p[e] * (g - pg) + zl * p[e], fmt);
  }
}

__global__ void aux_kernel(double *acc, const float *sums, int E, double R)
{
  double a = 0;
  for (int e = 0; e < E; e++) /* serially, as the CPU */
    a += (double)sums[e] * sums[E + e];
  acc[0] += (double)E * a / (R * R);
  acc[1] += sums[2 * E] / R;
  acc[2] += sums[2 * E + 1];
}

unsigned token_blocks(int N) { return (unsigned)((N + WARPS - 1) / WARPS); }

} // namespace

static void cu_moe_route_forward(float *probs, float *lse, int *idx, float *w, float *stats,
                                 const float *logits, int N, int E, int K, bool renorm,
                                 wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || E <= 0)
    return;
  if (K < 1 || K > WF_MOE_MAX_K || K > E) {
    WF_ERROR("moe_route_forward: top-%d of %d experts: the GPU takes 1 <= K <= %d", K, E,
             WF_MOE_MAX_K);
    wf__cuda_record((int)cudaErrorInvalidValue);
    return;
  }
  forward_kernel<<<token_blocks(N), 32 * WARPS, 0, s>>>(probs, lse, idx, w, logits, N, E, K,
                                                        renorm);
  if (!WF_CUDA_LAUNCHED("moe_route forward"))
    return;
  stats_kernel<<<E + 1, 256, 0, s>>>(stats, probs, lse, idx, N, E, K);
  WF_CUDA_LAUNCHED("moe_route statistics");
}

static void cu_moe_route_backward(void *dlogits, const float *dw, const float *probs,
                                  const float *lse, const int *idx, const float *w,
                                  const float *cnt, float aux_scale, float z_scale, int N, int E,
                                  int K, bool renorm, int fmt, wf_stream *stream)
{
  if (N <= 0 || E <= 0)
    return;
  backward_kernel<<<token_blocks(N), 32 * WARPS, 0, (cudaStream_t)stream>>>(
      dlogits, dw, probs, lse, idx, w, cnt, aux_scale, z_scale, N, E, K, renorm, fmt);
  WF_CUDA_LAUNCHED("moe_route backward");
}

static void cu_moe_aux_accumulate(double *acc, const float *sums, int E, double R,
                                  wf_stream *stream)
{
  aux_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(acc, sums, E, R);
  WF_CUDA_LAUNCHED("moe_aux_accumulate");
}

/* ---- the op (wf_kreg.h): one table for every element type (the format is an argument) -- */

static const wf_moe_route_op moe_route_op = {cu_moe_route_forward, cu_moe_route_backward,
                                             cu_moe_aux_accumulate};
const wf_kvariants wf__cuda_moe_route =
    WF_KV_ANY(moe_route, WF_OP_VERSION_moe_route, &moe_route_op);
