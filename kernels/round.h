/*
 * round.h - rounding float32 values to bfloat16 and IEEE half precision (mixed
 * precision): each value becomes the nearest value of the narrow format, written back
 * as float32, so a GEMM fed with rounded operands computes what a bf16 or fp16 tensor
 * core computes (products of narrow operands, accumulated in fp32).
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The
 * CPU code is kernels/cpu/round.c; the CUDA twin has the same arguments plus a stream.
 *
 * Both round to nearest, ties to even (IEEE 754 roundTiesToEven), as CUDA's
 * __float2bfloat16_rn and __float2half_rn, PyTorch and XLA do:
 *  - bf16 (8 exponent bits, 8 significant bits): the exponent range is fp32's, so only
 *    values within half a bf16 ulp of FLT_MAX (|x| >= 0x7f7f8000 = 3.3961e38) round up
 *    to infinity; every other finite value stays finite. Subnormals round to bf16's
 *    (fp32's) subnormal grid.
 *  - fp16 (5 exponent bits, 11 significant bits): |x| >= 65520 (65504, the largest
 *    half, plus half its ulp of 32) becomes +-inf; that overflow is what loss scaling
 *    guards against. Below 2^-14 the grid is the subnormals' 2^-24; below 2^-25 a
 *    value becomes (signed) zero.
 * NaN stays NaN (quiet, its sign kept), +-inf stays +-inf, -0 stays -0.
 */
#ifndef WF_KERNELS_ROUND_H
#define WF_KERNELS_ROUND_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* dst (n) = src (n) rounded to the nearest bf16 value; dst may equal src. */
void wf_round_bf16(float *dst, const float *src, size_t n);
/* dst (n) = src (n) rounded to the nearest fp16 value; dst may equal src. */
void wf_round_fp16(float *dst, const float *src, size_t n);

/* ---- the op (wf_kreg.h) ----
 * dst (n) = src (n) rounded to the nearest value of the variant's element type, kept in
 * fp32 (dst may equal src): a GEMM fed with such operands computes what the 16-bit
 * tensor cores compute. The fp32 variant copies. */
#define WF_OP_VERSION_round 1
typedef struct wf_round_op {
  void (*round)(float *dst, const float *src, size_t n, wf_stream *s);
} wf_round_op;

#endif /* WF_KERNELS_ROUND_H */
