/*
 * cast.cu - activations between fp32 and their storage format on the GPU (twin of
 * kernels/cpu/cast.c): each element rounded to nearest even on store (__float2bfloat16_rn,
 * __float2half_rn), widened exactly on load, eight at a time where the buffers are
 * 16-byte aligned. The fp32 variant copies.
 */
#include "act_int.h"

template <typename T>
__global__ static void store_kernel(T *dst, const float *src, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float v[8];
    wf__ld8(src, i, v);
    wf__st8(dst, i, v);
  }
  WF_PACK_TAIL(i, n, vec) { wf__st(dst, i, src[i]); }
}

template <typename T>
__global__ static void load_kernel(float *dst, const T *src, size_t n, bool vec)
{
  WF_PACKS(i, n, vec)
  {
    float v[8];
    wf__ld8(src, i, v);
    wf__st8(dst, i, v);
  }
  WF_PACK_TAIL(i, n, vec) { dst[i] = wf__ld(src, i); }
}

static void copy(void *dst, const void *src, size_t bytes, wf_stream *s)
{
  if (bytes > 0 && dst != src)
    WF_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)s));
}

template <typename T> void wf__cast_store(void *dst, const float *src, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(dst, src);
  if (n == 0)
    return;
  store_kernel<T><<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>((T *)dst, src, n, vec);
  WF_CUDA_LAUNCHED("store_kernel");
}

template <typename T> void wf__cast_load(float *dst, const void *src, size_t n, wf_stream *s)
{
  bool vec = wf__aligned16(dst, src);
  if (n == 0)
    return;
  load_kernel<T>
      <<<wf__pack_grid(n, vec, 256), 256, 0, (cudaStream_t)s>>>(dst, (const T *)src, n, vec);
  WF_CUDA_LAUNCHED("load_kernel");
}

template <> void wf__cast_store<float>(void *dst, const float *src, size_t n, wf_stream *s)
{
  copy(dst, src, n * sizeof(float), s);
}

template <> void wf__cast_load<float>(float *dst, const void *src, size_t n, wf_stream *s)
{
  copy(dst, src, n * sizeof(float), s);
}

template void wf__cast_store<__nv_bfloat16>(void *, const float *, size_t, wf_stream *);
template void wf__cast_store<__half>(void *, const float *, size_t, wf_stream *);
template void wf__cast_load<__nv_bfloat16>(float *, const void *, size_t, wf_stream *);
template void wf__cast_load<__half>(float *, const void *, size_t, wf_stream *);

/* ---- the op (wf_kreg.h): one variant per element type --------------------------------- */

template <typename E> static const wf_cast_op op = {wf__cast_store<E>, wf__cast_load<E>};
const wf_kvariants wf__cuda_cast =
    WF_KV(cast, WF_OP_VERSION_cast, &op<float>, &op<__nv_bfloat16>, &op<__half>);
