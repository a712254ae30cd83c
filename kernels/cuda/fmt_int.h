/*
 * fmt_int.h - private to the weft_cuda module: an activation element in the storage
 * format named at run time (a wf_precision: fp32, bf16, fp16), widened exactly and stored
 * rounded to nearest even (storage.h's wf_storage_get reads the same). For ops whose work
 * per element is small beside the moves (context parallelism's block attention, the
 * mixture-of-experts ops).
 */
#ifndef WF_CUDA_FMT_INT_H
#define WF_CUDA_FMT_INT_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_int.h"

__device__ __forceinline__ float wf__ldf(const void *p, size_t i, int fmt)
{
  if (fmt == WF_PREC_BF16)
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (fmt == WF_PREC_FP16)
    return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

__device__ __forceinline__ void wf__stf(void *p, size_t i, float v, int fmt)
{
  if (fmt == WF_PREC_BF16)
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
  else if (fmt == WF_PREC_FP16)
    ((__half *)p)[i] = __float2half_rn(v);
  else
    ((float *)p)[i] = v;
}

/* Bytes of one element of format fmt. */
__host__ __device__ __forceinline__ size_t wf__fmt_size(int fmt)
{
  return fmt == WF_PREC_BF16 || fmt == WF_PREC_FP16 ? 2 : 4;
}

#endif /* WF_CUDA_FMT_INT_H */
