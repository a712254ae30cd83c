/*
 * rmsnorm.cu - RMSNorm on the GPU (twin of wf_rmsnorm_*), laid out as layernorm.cu:
 *
 * Forward and the dinp part of backward: one warp per row, reductions with warp
 * shuffles, 4 rows per 128-thread block, the row read in packs of 8 where it allows
 * (act_int.h); statistics in fp32. The dweight part of
 * backward sums over rows, so it runs as a column reduction: a block of 32 x 8 threads
 * owns 32 columns, its 8 thread rows stride over the N rows, and the 8 partial sums are
 * combined in shared memory. No atomics, so the result is deterministic.
 * Legend: N rows (B*T), C channels. rstd = 1 / sqrt(mean(x^2) + eps),
 * out = weight * (x * rstd).
 * Activations (x, out, res) are of type E (act_int.h): fp32 for the fp32 launchers, bf16
 * or fp16 for the 16-bit variants (wf_kreg.h), loaded widened and stored rounded; dout,
 * dinp, dweight, rstd and the weight are fp32 in every form.
 */
#include "act_int.h"

#define ROWS_PER_BLOCK 4 /* warps per 128-thread block */

/* One warp normalizes row x (C) into o; lane 0 keeps its rstd when asked. */
template <typename E>
__device__ static void rms_row(E *o, float *rstd, const E *x, const float *weight, float eps, int C,
                               int row, bool vec)
{
  float ss = 0.0f, v[8], w[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v);
    for (int k = 0; k < 8; k++)
      ss += v[k] * v[k];
  }
  WF_ROW_ELEMS(c, C, vec) { ss += wf__ld(x, c) * wf__ld(x, c); }
  float rs = rsqrtf(wf__warp_sum(ss) / C + eps);
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v), wf__ld8(weight, c, w);
    for (int k = 0; k < 8; k++)
      v[k] = w[k] * (v[k] * rs);
    wf__st8(o, c, v);
  }
  WF_ROW_ELEMS(c, C, vec) { wf__st(o, c, weight[c] * (wf__ld(x, c) * rs)); }
  if (threadIdx.x % 32 == 0 && rstd)
    rstd[row] = rs;
}

/* out (N,C), rstd (N) or NULL, inp (N,C), weight (C) */
template <typename E>
__global__ static void rmsnorm_forward_kernel(E *out, float *rstd, const E *inp,
                                              const float *weight, float eps, int N, int C,
                                              bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N) /* uniform over the warp, so the shuffles stay full */
    return;
  size_t at = (size_t)row * C;
  rms_row(out + at, rstd, inp + at, weight, eps, C, row, vec);
}

/* res (N,C) = a + b (stored: rounded in a 16-bit format), then out = rmsnorm(res) of the
 * stored res. res may alias a or b: each lane reads then writes the same elements, and
 * reads back only what it wrote. */
template <typename E>
__global__ static void residual_rmsnorm_kernel(E *res, E *out, float *rstd, const E *a,
                                               const float *b, const float *weight, float eps,
                                               int N, int C, bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  size_t at = (size_t)row * C;
  wf__residual_row(res + at, a + at, b + at, C, vec);
  rms_row(out + at, rstd, res + at, weight, eps, C, row, vec);
}

/* dinp (N,C) += rstd (w dout - xhat mean(w dout xhat)), xhat = x rstd */
template <typename E>
__global__ static void rmsnorm_backward_dinp_kernel(float *dinp, const float *dout, const E *inp,
                                                    const float *weight, const float *rstd, int N,
                                                    int C, bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  const E *x = inp + (size_t)row * C;
  const float *dy = dout + (size_t)row * C;
  float *dx = dinp + (size_t)row * C;
  float rs = rstd[row], acc = 0.0f, xv[8], wv[8], dv[8], ov[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, xv), wf__ld8(weight, c, wv), wf__ld8(dy, c, dv);
    for (int k = 0; k < 8; k++)
      acc += wv[k] * dv[k] * (xv[k] * rs);
  }
  WF_ROW_ELEMS(c, C, vec) { acc += weight[c] * dy[c] * (wf__ld(x, c) * rs); }
  float mean_gx = wf__warp_sum(acc) / C;
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, xv), wf__ld8(weight, c, wv), wf__ld8(dy, c, dv), wf__ld8(dx, c, ov);
    for (int k = 0; k < 8; k++)
      ov[k] += rs * (wv[k] * dv[k] - (xv[k] * rs) * mean_gx);
    wf__st8(dx, c, ov);
  }
  WF_ROW_ELEMS(c, C, vec) { dx[c] += rs * (weight[c] * dy[c] - (wf__ld(x, c) * rs) * mean_gx); }
}

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

template <typename E>
static void rmsnorm_forward(void *out_, float *rstd, const void *inp_, const float *weight,
                            float eps, int N, int C, wf_stream *stream)
{
  E *out = (E *)out_;
  const E *inp = (const E *)inp_;
  if (N <= 0 || C <= 0)
    return;
  bool vec = wf__row_packs(C, out, inp, weight);
  rmsnorm_forward_kernel<E><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(
      out, rstd, inp, weight, eps, N, C, vec);
  WF_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

template <typename E>
static void residual_rmsnorm_forward(void *res_, void *out_, float *rstd, const void *a_,
                                     const float *b, const float *weight, float eps, int N, int C,
                                     wf_stream *stream)
{
  E *res = (E *)res_, *out = (E *)out_;
  const E *a = (const E *)a_;
  if (N <= 0 || C <= 0)
    return;
  bool vec = wf__row_packs(C, res, out, a, b) && wf__aligned16(weight);
  residual_rmsnorm_kernel<E><<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)stream>>>(
      res, out, rstd, a, b, weight, eps, N, C, vec);
  WF_CUDA_LAUNCHED("residual_rmsnorm_kernel");
}

template <typename E>
static void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const void *inp_,
                             const float *weight, const float *rstd, int N, int C,
                             wf_stream *stream)
{
  const E *inp = (const E *)inp_;
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || C <= 0)
    return;
  if (dinp) {
    bool vec = wf__row_packs(C, dinp, dout, inp, weight);
    rmsnorm_backward_dinp_kernel<E>
        <<<row_blocks(N), 32 * ROWS_PER_BLOCK, 0, s>>>(dinp, dout, inp, weight, rstd, N, C, vec);
    if (!WF_CUDA_LAUNCHED("rmsnorm_backward_dinp_kernel"))
      return;
  }
  wf__norm_param_grads(dweight, (float *)NULL, dout, inp, (const float *)NULL, rstd, N, C, s);
}

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E>
static const wf_rmsnorm_op op = {rmsnorm_forward<E>, rmsnorm_backward<E>,
                                 residual_rmsnorm_forward<E>};
const wf_kvariants wf__cuda_rmsnorm =
    WF_KV(rmsnorm, WF_OP_VERSION_rmsnorm, &op<float>, &op<__nv_bfloat16>, &op<__half>);
