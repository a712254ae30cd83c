/*
 * bf16.h - bfloat16 tensors in the kernels' interfaces: the element type and its
 * conversions on the CPU.
 * Part of the kernels module; include wf_kernels.h, which states the conventions.
 *
 * A wf_bf16 is the 16 raw bits of a bfloat16 (the top half of a float32: sign, 8
 * exponent bits, 7 stored fraction bits), so public headers carry bf16 tensors without
 * CUDA's types; on the GPU the same bits are a __nv_bfloat16. Conversions round to
 * nearest, ties to even, exactly as round.h's wf_round_bf16 (and CUDA's
 * __float2bfloat16_rn); widening is exact.
 */
#ifndef WF_KERNELS_BF16_H
#define WF_KERNELS_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t wf_bf16;

/* dst (n) = src (n) rounded to bf16; NaN stays a (quiet) NaN. */
void wf_bf16_from_floats(wf_bf16 *dst, const float *src, size_t n);
/* dst (n) = src (n) widened to float32 (exact). */
void wf_bf16_to_floats(float *dst, const wf_bf16 *src, size_t n);

/* One value each way (the loops above, for one element). */
static inline float wf_bf16_to_float(wf_bf16 h)
{
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline wf_bf16 wf_bf16_from_float(float x)
{
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (wf_bf16)((u | 0x00400000u) >> 16); /* NaN: quiet, sign kept */
  return (wf_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* x rounded to the nearest bf16 value, as a float. */
static inline float wf_bf16_round(float x) { return wf_bf16_to_float(wf_bf16_from_float(x)); }

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_BF16_H */
