/*
 * act_int.h - private to the weft_cuda module: activations in a storage format (fp32,
 * bf16, fp16: storage.h) read and written element by element or eight at a time. The ops
 * that take activations instantiate their kernels for float, __nv_bfloat16 and __half
 * (their fp32, bf16 and fp16 variants: wf_kreg.h): one algorithm, so each 16-bit form
 * computes, bit for bit, what its fp32 kernel computes on the widened values, rounding
 * only what it stores (to nearest even, as wf_storage_store).
 */
#ifndef WF_CUDA_ACT_INT_H
#define WF_CUDA_ACT_INT_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_int.h"

/* Element i of an activation, widened (exact), and stored rounded to nearest even. */
__device__ __forceinline__ float wf__ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float wf__ld(const __nv_bfloat16 *p, size_t i)
{
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float wf__ld(const __half *p, size_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void wf__st(float *p, size_t i, float x) { p[i] = x; }
__device__ __forceinline__ void wf__st(__nv_bfloat16 *p, size_t i, float x)
{
  p[i] = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void wf__st(__half *p, size_t i, float x) { p[i] = __float2half_rn(x); }

/* ---- packs: eight consecutive elements [i, i + 8) in one 16-byte access --------------------
 * A 16-bit activation read element by element moves 2 bytes per load: the elementwise
 * kernels ran at about half the H100's memory bandwidth so (gelu_backward: 238 us for 400
 * MB, ncu). wf__ld8 / wf__st8 move eight elements of a 16-bit format in one 16-byte access
 * (two for fp32), widened and rounded exactly as wf__ld / wf__st, so a kernel computes
 * the same values either way. i must be a multiple of 8 and the tensor 16-byte aligned
 * (wf__aligned16). */
__device__ __forceinline__ void wf__ld8(const float *p, size_t i, float v[8])
{
  float4 a = *reinterpret_cast<const float4 *>(p + i),
         b = *reinterpret_cast<const float4 *>(p + i + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void wf__st8(float *p, size_t i, const float v[8])
{
  *reinterpret_cast<float4 *>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4 *>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void wf__ld8(const __nv_bfloat16 *p, size_t i, float v[8])
{
  uint4 u = *reinterpret_cast<const uint4 *>(p + i);
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
  for (int k = 0; k < 4; k++) {
    float2 f = __bfloat1622float2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void wf__st8(__nv_bfloat16 *p, size_t i, const float v[8])
{
  uint4 u;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
  for (int k = 0; k < 4; k++)
    h[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4 *>(p + i) = u;
}
__device__ __forceinline__ void wf__ld8(const __half *p, size_t i, float v[8])
{
  uint4 u = *reinterpret_cast<const uint4 *>(p + i);
  const __half2 *h = reinterpret_cast<const __half2 *>(&u);
  for (int k = 0; k < 4; k++) {
    float2 f = __half22float2(h[k]);
    v[2 * k] = f.x, v[2 * k + 1] = f.y;
  }
}
__device__ __forceinline__ void wf__st8(__half *p, size_t i, const float v[8])
{
  uint4 u;
  __half2 *h = reinterpret_cast<__half2 *>(&u);
  for (int k = 0; k < 4; k++)
    h[k] = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
  *reinterpret_cast<uint4 *>(p + i) = u;
}

/* Whether every pointer given is 16-byte aligned (NULL counts as aligned). */
static inline bool wf__aligned16(const void *a, const void *b = NULL, const void *c = NULL,
                                 const void *d = NULL)
{
  return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;
}

/* An elementwise kernel over n elements: WF_PACKS visits the whole packs (i = 8k) when
 * `vec` (every operand 16-byte aligned), then WF_PACK_TAIL the elements past them one by
 * one (all n when not vec); each grid thread takes every (grid size)-th pack, then
 * element. The grid: wf__pack_grid. */
#define WF_PACKS(i, n, vec)                                                                        \
  for (size_t i = 8 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); (vec) && i + 8 <= (n);      \
       i += 8 * (size_t)gridDim.x * blockDim.x)
#define WF_PACK_TAIL(i, n, vec)                                                                    \
  for (size_t i = ((vec) ? (n) / 8 * 8 : 0) + (size_t)blockIdx.x * blockDim.x + threadIdx.x;       \
       i < (n); i += (size_t)gridDim.x * blockDim.x)
static inline unsigned wf__pack_grid(size_t n, bool vec, unsigned block)
{
  return wf__grid_1d(vec ? (n + 7) / 8 : n, block);
}

/* A warp's columns of a row (the norms' kernels, a warp per row): WF_ROW_PACKS visits
 * packs of 8 (c = 8 lane, then + 256) when `vec` (wf__row_packs: C a multiple of 8 and
 * every tensor 16-byte aligned, so every row is), WF_ROW_ELEMS the columns one by one
 * (c = lane, then + 32) when not. */
#define WF_ROW_PACKS(c, C, vec)                                                                    \
  for (int c = 8 * (int)(threadIdx.x % 32); (vec) && c < (C); c += 256)
#define WF_ROW_ELEMS(c, C, vec)                                                                    \
  for (int c = (vec) ? (C) : (int)(threadIdx.x % 32); c < (C); c += 32)
static inline bool wf__row_packs(int C, const void *a, const void *b, const void *c,
                                 const void *d = NULL)
{
  return C % 8 == 0 && wf__aligned16(a, b, c, d);
}

/* A warp's row of a residual stream: res (C) = a + b, stored (res may alias a: each lane
 * reads, then writes, its own columns), then the warp synchronized, ready for the norm of
 * res that the norms' fused kernels take next. */
template <typename E>
__device__ __forceinline__ void wf__residual_row(E *res, const E *a, const float *b, int C,
                                                 bool vec)
{
  float x[8], y[8];
  WF_ROW_PACKS(c, C, vec)
  {
    wf__ld8(a, c, x), wf__ld8(b, c, y);
    for (int k = 0; k < 8; k++)
      x[k] += y[k];
    wf__st8(res, c, x);
  }
  WF_ROW_ELEMS(c, C, vec) { wf__st(res, c, wf__ld(a, c) + b[c]); }
  __syncwarp();
}

/* Column sums over rows (colsum.cu), reading E: dbias (OC) += the column sums of dout
 * (N, OC); a norm's dweight (C) += sum_n (x - mean) rstd dout (mean NULL: x rstd, RMSNorm)
 * and dbias (C) += sum_n dout, either gradient NULL when not wanted. Deterministic. */
template <typename E>
void wf__bias_grad(float *dbias, const E *dout, int N, int OC, cudaStream_t s);
template <typename E>
void wf__norm_param_grads(float *dweight, float *dbias, const float *dout, const E *inp,
                          const float *mean, const float *rstd, int N, int C, cudaStream_t s);

/* cast.cu: dst (n, type T) = src rounded, and dst (n) = src (type T) widened, on the
 * stream (T float copies): the cast op's entries, which the ops that widen or round whole
 * tensors call too. */
template <typename T> void wf__cast_store(void *dst, const float *src, size_t n, wf_stream *s);
template <typename T> void wf__cast_load(float *dst, const void *src, size_t n, wf_stream *s);

/* gelu.cu: out (n, type T) = the GELU of inp (type T), on the stream: the gelu op's
 * forward, which matmul.cu's GELU epilogue falls back to. */
template <typename T> void wf__gelu_forward(void *out, const void *inp, size_t n, wf_stream *s);

/* GELU, tanh form, and its derivative (gelu.cu, and matmul.cu's GELU epilogue). The
 * backward uses sech^2 = 1 - tanh^2, which cannot overflow as cosh^2 can. */
#define WF__GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
__device__ __forceinline__ float wf__gelu(float x)
{
  float u = WF__GELU_K * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float wf__gelu_grad(float x)
{
  float th = tanhf(WF__GELU_K * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * WF__GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif /* WF_CUDA_ACT_INT_H */
