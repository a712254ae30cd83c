/*
 * round.cu - float32 -> nearest bf16 / fp16 value, as float32, on the GPU (twin of
 * wf_round_bf16 / wf_round_fp16; see round.h).
 *
 * The conversions are CUDA's own round-to-nearest-even intrinsics, the ones a mixed-
 * precision GPU path uses to make its bf16/fp16 GEMM operands, so the CPU twin's
 * bit manipulation is checked against the hardware's rounding (tests/gpu).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_int.h"

/* dst (n), src (n); dst may equal src */
__global__ static void round_bf16_kernel(float *dst, const float *src, size_t n)
{
  WF_GRID_STRIDE(i, n) { dst[i] = __bfloat162float(__float2bfloat16_rn(src[i])); }
}

__global__ static void round_fp16_kernel(float *dst, const float *src, size_t n)
{
  WF_GRID_STRIDE(i, n) { dst[i] = __half2float(__float2half_rn(src[i])); }
}

static void round_bf16(float *dst, const float *src, size_t n, wf_stream *stream)
{
  if (n == 0)
    return;
  round_bf16_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(dst, src, n);
  WF_CUDA_LAUNCHED("round_bf16_kernel");
}

static void round_fp16(float *dst, const float *src, size_t n, wf_stream *stream)
{
  if (n == 0)
    return;
  round_fp16_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(dst, src, n);
  WF_CUDA_LAUNCHED("round_fp16_kernel");
}

static void round_f32(float *dst, const float *src, size_t n, wf_stream *stream)
{
  if (n > 0 && dst != src)
    WF_CUDA_OK(
        cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
}

/* ---- the op (wf_kreg.h): the variant's type is the one rounded to ---------------------- */

static const wf_round_op f32 = {round_f32}, bf16 = {round_bf16}, f16 = {round_fp16};
const wf_kvariants wf__cuda_round = WF_KV(round, WF_OP_VERSION_round, &f32, &bf16, &f16);
