/*
 * layernorm.cu - layer normalisation on the GPU (twin of kernels/cpu/layernorm.c), one
 * variant per element type of the activations (wf_kreg.h).
 *
 * Forward and the dinp part of backward: one warp per row, reductions with warp
 * shuffles, 4 rows per 128-thread block, eight elements per 16-byte access where the
 * row allows (act_int.h's packs). The dweight/dbias part of backward sums over rows, so
 * it runs as a column reduction cut over rows and columns (colsum.cu), added in a fixed
 * order: deterministic, no atomics. The activations (out, inp, res, a) are of the
 * variant's type, loaded exactly and stored rounded; statistics, weights and gradients
 * fp32.
 * Legend: N rows (B*T), C channels. eps = 1e-5.
 */
#include "act_int.h"

#define LN_EPS         1e-5f
#define ROWS_PER_BLOCK 4 /* warps per 128-thread block */

static unsigned rows_grid(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

template <typename T>
__device__ static void normalize_row(T *o, float *mean, float *rstd, const T *x, const float *w,
                                     const float *b, int C, int row, bool vec)
{
  float s = 0.0f, q = 0.0f, v[8], wv[8], bv[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v);
    for (int k = 0; k < 8; k++)
      s += v[k];
  }
  WF_ROW_ELEMS(c, C, vec) { s += wf__ld(x, c); }
  float m = wf__warp_sum(s) / C;
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v);
    for (int k = 0; k < 8; k++)
      q += (v[k] - m) * (v[k] - m);
  }
  WF_ROW_ELEMS(c, C, vec) { q += (wf__ld(x, c) - m) * (wf__ld(x, c) - m); }
  float rs = rsqrtf(wf__warp_sum(q) / C + LN_EPS);
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, v), wf__ld8(w, c, wv), wf__ld8(b, c, bv);
    for (int k = 0; k < 8; k++)
      v[k] = (v[k] - m) * rs * wv[k] + bv[k];
    wf__st8(o, c, v);
  }
  WF_ROW_ELEMS(c, C, vec) { wf__st(o, c, (wf__ld(x, c) - m) * rs * w[c] + b[c]); }
  if (threadIdx.x % 32 == 0 && mean)
    mean[row] = m;
  if (threadIdx.x % 32 == 0 && rstd)
    rstd[row] = rs;
}

template <typename T>
__global__ static void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp,
                                                const float *w, const float *b, int N, int C,
                                                bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  size_t at = (size_t)row * C;
  normalize_row(out + at, mean, rstd, inp + at, w, b, C, row, vec);
}

/* res = store(a + b) (res may alias a: each lane reads then writes its own elements),
 * then the layernorm of the stored res. */
template <typename T>
__global__ static void residual_layernorm_kernel(T *res, T *ln, float *mean, float *rstd,
                                                 const T *a, const float *b, const float *w,
                                                 const float *bias, int N, int C, bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  size_t at = (size_t)row * C;
  wf__residual_row(res + at, a + at, b + at, C, vec);
  normalize_row(ln + at, mean, rstd, res + at, w, bias, C, row, vec);
}

template <typename T>
__global__ static void layernorm_backward_dinp_kernel(float *dinp, const float *dout, const T *inp,
                                                      const float *w, const float *mean,
                                                      const float *rstd, int N, int C, bool vec)
{
  int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
  if (row >= N)
    return;
  const T *x = inp + (size_t)row * C;
  const float *dy = dout + (size_t)row * C;
  float *dx = dinp + (size_t)row * C;
  float m = mean[row], rs = rstd[row], a = 0.0f, bb = 0.0f, xv[8], wv[8], dv[8], ov[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, xv), wf__ld8(w, c, wv), wf__ld8(dy, c, dv);
    for (int k = 0; k < 8; k++) {
      a += wv[k] * dv[k];
      bb += wv[k] * dv[k] * (xv[k] - m) * rs;
    }
  }
  WF_ROW_ELEMS(c, C, vec)
  {
    float wdy = w[c] * dy[c];
    a += wdy;
    bb += wdy * (wf__ld(x, c) - m) * rs;
  }
  float mean_wdy = wf__warp_sum(a) / C, mean_wdy_norm = wf__warp_sum(bb) / C;
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(x, c, xv), wf__ld8(w, c, wv), wf__ld8(dy, c, dv), wf__ld8(dx, c, ov);
    for (int k = 0; k < 8; k++)
      ov[k] += (wv[k] * dv[k] - mean_wdy - (xv[k] - m) * rs * mean_wdy_norm) * rs;
    wf__st8(dx, c, ov);
  }
  WF_ROW_ELEMS(c, C, vec)
  {
    float norm = (wf__ld(x, c) - m) * rs;
    dx[c] += (w[c] * dy[c] - mean_wdy - norm * mean_wdy_norm) * rs;
  }
}

template <typename T>
static void layernorm_forward(void *out, float *mean, float *rstd, const void *inp, const float *w,
                              const float *b, int N, int C, wf_stream *s)
{
  if (N <= 0 || C <= 0)
    return;
  bool vec = wf__row_packs(C, out, inp, w, b);
  layernorm_forward_kernel<T><<<rows_grid(N), 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)s>>>(
      (T *)out, mean, rstd, (const T *)inp, w, b, N, C, vec);
  WF_CUDA_LAUNCHED("layernorm_forward_kernel");
}

template <typename T>
static void residual_layernorm_forward(void *res, void *ln, float *mean, float *rstd, const void *a,
                                       const float *b, const float *w, const float *bias, int N,
                                       int C, wf_stream *s)
{
  if (N <= 0 || C <= 0)
    return;
  bool vec = wf__row_packs(C, res, ln, a, b) && wf__aligned16(w, bias);
  residual_layernorm_kernel<T><<<rows_grid(N), 32 * ROWS_PER_BLOCK, 0, (cudaStream_t)s>>>(
      (T *)res, (T *)ln, mean, rstd, (const T *)a, b, w, bias, N, C, vec);
  WF_CUDA_LAUNCHED("residual_layernorm_kernel");
}

template <typename T>
static void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const void *inp, const float *w, const float *mean,
                               const float *rstd, int N, int C, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (N <= 0 || C <= 0)
    return;
  if (dinp) {
    bool vec = wf__row_packs(C, dinp, dout, inp, w);
    layernorm_backward_dinp_kernel<T><<<rows_grid(N), 32 * ROWS_PER_BLOCK, 0, s>>>(
        dinp, dout, (const T *)inp, w, mean, rstd, N, C, vec);
    if (!WF_CUDA_LAUNCHED("layernorm_backward_dinp_kernel"))
      return;
  }
  wf__norm_param_grads(dweight, dbias, dout, (const T *)inp, mean, rstd, N, C, s);
}

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E>
static const wf_layernorm_op op = {layernorm_forward<E>, layernorm_backward<E>,
                                   residual_layernorm_forward<E>};
const wf_kvariants wf__cuda_layernorm =
    WF_KV(layernorm, WF_OP_VERSION_layernorm, &op<float>, &op<__nv_bfloat16>, &op<__half>);
