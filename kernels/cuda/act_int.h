/*
 * act_int.h - private to the weft_cuda module: activations in a storage format (fp32,
 * bf16, fp16: storage.h) read and written element by element, and the launchers of the
 * kernels that take them in any format. rmsnorm.cu, rope.cu, swiglu.cu, xent.cu and adamw.cu
 * instantiate their kernels for float (the fp32 launchers of cuda_int.h), __nv_bfloat16 and __half
 * (storage.cu's 16-bit tables): one algorithm, so each 16-bit form computes, bit for
 * bit, what its fp32 kernel computes on the widened values, rounding only what it
 * stores (to nearest even, as wf_storage_store).
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

/* Column sums over rows (colsum.cu), reading E: dbias (OC) += the column sums of dout
 * (N, OC); a norm's dweight (C) += sum_n (x - mean) rstd dout (mean NULL: x rstd, RMSNorm)
 * and dbias (C) += sum_n dout, either gradient NULL when not wanted. Deterministic. */
template <typename E>
void wf__bias_grad(float *dbias, const E *dout, int N, int OC, cudaStream_t s);
template <typename E>
void wf__norm_param_grads(float *dweight, float *dbias, const float *dout, const E *inp,
                          const float *mean, const float *rstd, int N, int C, cudaStream_t s);

/* The table's arguments (wf_ktable.h), activations of type E; E is float, __nv_bfloat16
 * or __half. */
template <typename E>
void wf__rmsnorm_forward(E *out, float *rstd, const E *inp, const float *weight, float eps, int N,
                         int C, wf_stream *stream);
template <typename E>
void wf__residual_rmsnorm_forward(E *res, E *out, float *rstd, const E *a, const float *b,
                                  const float *weight, float eps, int N, int C, wf_stream *stream);
template <typename E>
void wf__rmsnorm_backward(float *dinp, float *dweight, const float *dout, const E *inp,
                          const float *weight, const float *rstd, int N, int C, wf_stream *stream);
template <typename E>
void wf__rope_forward(E *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                      wf_stream *stream);
template <typename E>
void wf__rope_backward(E *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                       wf_stream *stream);
template <typename E>
void wf__swiglu_forward(E *out, const E *inp, int N, int F, wf_stream *stream);
template <typename E>
void wf__swiglu_backward(E *dinp, const E *inp, const E *dout, int N, int F, wf_stream *stream);

/* Cross-entropy's row statistics and logit gradient (xent.cu), logits of type E. */
template <typename E>
void wf__xent_stats(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                    const int *targets, int N, int V, int ld, int v_offset, wf_stream *stream);
template <typename E>
void wf__xent_backward(void *dlogits, const void *logits, const float *row_max,
                       const float *row_sumexp, const int *targets, float dloss, int N, int V,
                       int ld, int v_offset, wf_stream *stream);

/* AdamW, the updated parameters also stored into low (E; NULL: not stored). */
template <typename E>
void wf__adamw_update_store(float *params, E *low, float *m, float *v, const float *grads, size_t n,
                            float lr, float beta1, float beta2, float eps, float weight_decay,
                            int t, float grad_scale, wf_stream *stream);

#endif /* WF_CUDA_ACT_INT_H */
