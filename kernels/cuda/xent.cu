/*
 * xent.cu - fused softmax + cross-entropy on the GPU (twin of wf_xent_*), in the
 * same three pieces as the CPU so vocabulary-parallel ranks can reduce between
 * them. One block per row for the row passes. The loss mean (loss_accumulate) is
 * dsum.cu's deterministic sum in double.
 *
 * Legend: N rows (B*T), V vocabulary columns present, ld row stride (>= V),
 * v_offset the global column of local column 0. Columns [V, ld) are padding:
 * ignored by the statistics and set to 0 in dlogits.
 */
#include "act_int.h"

#define XENT_THREADS 256

/* row_max, row_sumexp, target_logit (N); logits (N,ld) of type E (act_int.h: fp32, or
 * the 16-bit tables' bf16 / fp16, read widened); targets (N) */
template <typename E>
__global__ static void xent_stats_kernel(float *row_max, float *row_sumexp, float *target_logit,
                                         const E *logits, const int *targets, int V, int ld,
                                         int v_offset)
{
  __shared__ float red[32];
  const E *l = logits + (size_t)blockIdx.x * ld;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < V; c += blockDim.x)
    mx = fmaxf(mx, wf__ld(l, c));
  mx = wf__block_max(mx, red);
  float s = 0.0f;
  for (int c = threadIdx.x; c < V; c += blockDim.x)
    s += expf(wf__ld(l, c) - mx);
  s = wf__block_sum(s, red);
  if (threadIdx.x != 0)
    return;
  int tg = targets[blockIdx.x] - v_offset;
  row_max[blockIdx.x] = mx;
  row_sumexp[blockIdx.x] = s;
  target_logit[blockIdx.x] = tg >= 0 && tg < V ? wf__ld(l, tg) : 0.0f;
}

/* losses (N) */
__global__ static void xent_loss_kernel(float *losses, const float *row_max,
                                        const float *row_sumexp, const float *target_logit,
                                        size_t n)
{
  WF_GRID_STRIDE(i, n) { losses[i] = logf(row_sumexp[i]) + row_max[i] - target_logit[i]; }
}

/* dlogits (N,ld) = dloss (softmax - onehot), stored in E. dlogits may alias logits:
 * every element is read and then written by the same thread, hence no __restrict__. */
template <typename E>
__global__ static void xent_backward_kernel(E *dlogits, const E *logits, const float *row_max,
                                            const float *row_sumexp, const int *targets,
                                            float dloss, int V, int ld, int v_offset)
{
  size_t row = blockIdx.x;
  const E *l = logits + row * ld;
  E *d = dlogits + row * ld;
  float mx = row_max[row];
  float inv = 1.0f / row_sumexp[row];
  int tg = targets[row] - v_offset;
  for (int c = threadIdx.x; c < ld; c += blockDim.x) {
    float g = 0.0f;
    if (c < V)
      g = dloss * (expf(wf__ld(l, c) - mx) * inv - (c == tg ? 1.0f : 0.0f));
    wf__st(d, c, g);
  }
}

template <typename E>
static void xent_stats(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                       const int *targets, int N, int V, int ld, int v_offset, wf_stream *stream)
{
  if (N <= 0)
    return;
  xent_stats_kernel<E><<<(unsigned)N, XENT_THREADS, 0, (cudaStream_t)stream>>>(
      row_max, row_sumexp, target_logit, (const E *)logits, targets, V, ld, v_offset);
  WF_CUDA_LAUNCHED("xent_stats_kernel");
}

template <typename E>
static void xent_backward(void *dlogits, const void *logits, const float *row_max,
                          const float *row_sumexp, const int *targets, float dloss, int N, int V,
                          int ld, int v_offset, wf_stream *stream)
{
  if (N <= 0 || ld <= 0)
    return;
  xent_backward_kernel<E><<<(unsigned)N, XENT_THREADS, 0, (cudaStream_t)stream>>>(
      (E *)dlogits, (const E *)logits, row_max, row_sumexp, targets, dloss, V, ld, v_offset);
  WF_CUDA_LAUNCHED("xent_backward_kernel");
}

static void xent_loss(float *losses, const float *row_max, const float *row_sumexp,
                      const float *target_logit, int N, wf_stream *stream)
{
  if (N <= 0)
    return;
  xent_loss_kernel<<<wf__grid_1d((size_t)N, 256), 256, 0, (cudaStream_t)stream>>>(
      losses, row_max, row_sumexp, target_logit, (size_t)N);
  WF_CUDA_LAUNCHED("xent_loss_kernel");
}

/* stats (N,3) = {row_max, row_sumexp, target_logit} of each row */
__global__ static void xent_pack_kernel(float *stats, const float *row_max, const float *row_sumexp,
                                        const float *target_logit, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    stats[3 * i] = row_max[i];
    stats[3 * i + 1] = row_sumexp[i];
    stats[3 * i + 2] = target_logit[i];
  }
}

/* all (parts,N,3) -> the global row statistics, one thread per row, parts in order (as
 * the CPU twin combines them) */
__global__ static void xent_combine_kernel(float *row_max, float *row_sumexp, float *target_logit,
                                           const float *all, size_t n, int parts)
{
  WF_GRID_STRIDE(i, n)
  {
    float M = -INFINITY, S = 0.0f, tl = 0.0f;
    for (int r = 0; r < parts; r++)
      M = fmaxf(M, all[(size_t)r * 3 * n + 3 * i]);
    for (int r = 0; r < parts; r++) {
      const float *x = all + (size_t)r * 3 * n + 3 * i;
      if (x[1] > 0.0f)
        S += x[1] * expf(x[0] - M);
      tl += x[2];
    }
    row_max[i] = M, row_sumexp[i] = S, target_logit[i] = tl;
  }
}

static void xent_pack(float *stats, const float *row_max, const float *row_sumexp,
                      const float *target_logit, int N, wf_stream *stream)
{
  if (N <= 0)
    return;
  xent_pack_kernel<<<wf__grid_1d((size_t)N, 256), 256, 0, (cudaStream_t)stream>>>(
      stats, row_max, row_sumexp, target_logit, (size_t)N);
  WF_CUDA_LAUNCHED("xent_pack_kernel");
}

static void xent_combine(float *row_max, float *row_sumexp, float *target_logit, const float *all,
                         int N, int parts, wf_stream *stream)
{
  if (N <= 0)
    return;
  xent_combine_kernel<<<wf__grid_1d((size_t)N, 256), 256, 0, (cudaStream_t)stream>>>(
      row_max, row_sumexp, target_logit, all, (size_t)N, parts);
  WF_CUDA_LAUNCHED("xent_combine_kernel");
}

/* ---- the op (wf_kreg.h): one variant per element type of the logits -------------------
 * bf16 logits take the classifier's kernels (classifier.cu: a block per row, 16-byte
 * loads), which read the logits at about 3 TB/s on an H100 where the templated ones above
 * read them at 0.6 (GPT-2 small, B 16: 0.55 against 2.6 ms for the statistics, 1.1
 * against 2.7 for the gradient). The same sums to within their order; fp32 and fp16 keep
 * the templated kernels. */

template <typename E>
static const wf_xent_op op = {xent_stats<E>, xent_pack,        xent_combine,
                              xent_loss,     xent_backward<E>, wf__mean_acc};
static const wf_xent_op bf16 = {wf__classifier_stats,    xent_pack,   xent_combine, xent_loss,
                                wf__classifier_backward, wf__mean_acc};
const wf_kvariants wf__cuda_xent = WF_KV(xent, WF_OP_VERSION_xent, &op<float>, &bf16, &op<__half>);
