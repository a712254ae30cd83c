/*
 * storage.h - activations in a storage format: how mixed precision stores what a layer
 * keeps for its backward and what a pipeline stage sends.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The
 * CPU code is kernels/cpu/storage.c; the CUDA twins have the same arguments plus a
 * stream.
 *
 * A format is a wf_precision (wf_config.h): WF_PREC_NO stores fp32 (4 bytes an
 * element), WF_PREC_BF16 bfloat16 and WF_PREC_FP16 IEEE half (2 bytes: the 16 raw
 * bits, wf_bf16 and wf_f16). Storing rounds to the nearest value of the format, ties to
 * even, exactly as round.h's wf_round_bf16 / wf_round_fp16 (and CUDA's
 * __float2bfloat16_rn / __float2half_rn): bf16 overflows only within half an ulp of
 * FLT_MAX, fp16 above 65504 + 16 (to +-inf, which fp16 loss scaling detects); NaN
 * stays a quiet NaN. Loading widens exactly.
 *
 * The 16-bit kernels (the `*16` functions of each op's header) read their activation
 * arguments in a 16-bit format, compute exactly what the fp32 kernel computes on the
 * widened values, and round their activation outputs on store: each equals, bit for
 * bit, store(fp32 kernel(load(inputs))). Their other arguments (gradients that are
 * accumulated, norm statistics, weights that are not GEMM operands) stay fp32.
 */
#ifndef WF_KERNELS_STORAGE_H
#define WF_KERNELS_STORAGE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "wf_config.h" /* wf_precision: the formats */

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t wf_f16; /* the 16 bits of an IEEE half */

/* Bytes of one element of format fmt (a wf_precision): 4 for fp32, 2 for bf16 and fp16. */
static inline size_t wf_storage_size(int fmt) { return fmt == WF_PREC_NO ? 4 : 2; }
/* "fp32", "bf16", "fp16". */
const char *wf_storage_name(int fmt);

/* One fp16 value each way: round to nearest even (overflow to +-inf, the subnormal grid
 * 2^-24 below 2^-14, NaN kept and quiet), and exact widening. */
static inline wf_f16 wf_f16_from_float(float x)
{
  uint32_t u, sign, a, e, m;
  memcpy(&u, &x, sizeof u);
  sign = (u >> 16) & 0x8000u;
  a = u & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN: quiet, the payload's top bits kept */
    return (wf_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) /* 65520 and up (and inf): the tie at 65520 goes to inf */
    return (wf_f16)(sign | 0x7c00u);
  if (a < 0x38800000u) { /* below 2^-14: the subnormal grid, 2^-24 */
    float f;
    memcpy(&f, &a, sizeof f);
    f = (f + 0.5f) - 0.5f; /* rounds to a multiple of 2^-24, ties to even (round.c) */
    return (wf_f16)(sign | (uint32_t)(f * 16777216.0f));
  }
  e = (a >> 23) - 112; /* rebias 127 -> 15 */
  m = a & 0x7fffffu;
  uint32_t h = (e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fffu; /* the 13 dropped bits: nearest, ties to even */
  h += rest > 0x1000u || (rest == 0x1000u && (h & 1u));
  return (wf_f16)(sign | h); /* a carry into the exponent is the next binade */
}

static inline float wf_f16_to_float(wf_f16 h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
    float f = (float)m * 5.9604644775390625e-8f;
    memcpy(&u, &f, sizeof u);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Element i of a buffer of format fmt, and its address. */
static inline float wf_storage_get(const void *p, size_t i, int fmt)
{
  if (fmt == WF_PREC_NO)
    return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return fmt == WF_PREC_BF16 ? wf_bf16_to_float(h) : wf_f16_to_float(h);
}

static inline const void *wf_storage_at(const void *p, size_t i, int fmt)
{
  return (const char *)p + i * wf_storage_size(fmt);
}

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_STORAGE_H */
