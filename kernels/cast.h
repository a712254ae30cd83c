/*
 * cast.h - activations between fp32 and their storage format: storing rounds, loading
 * widens (storage.h defines the formats and the rounding).
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The
 * CPU code is kernels/cpu/cast.c, the CUDA twin kernels/cuda/cast.cu.
 */
#ifndef WF_KERNELS_CAST_H
#define WF_KERNELS_CAST_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* dst (n, format fmt) = src (n) rounded; fmt WF_PREC_NO copies. */
void wf_storage_store(void *dst, const float *src, size_t n, int fmt);
/* dst (n) = src (n, format fmt) widened (exact). */
void wf_storage_load(float *dst, const void *src, size_t n, int fmt);

/* ---- the op (wf_kreg.h): the `void *` side in the variant's element type ---- */
#define WF_OP_VERSION_cast 1
typedef struct wf_cast_op {
  /* dst (n) = src rounded; in the fp32 variant a copy */
  void (*store)(void *dst, const float *src, size_t n, wf_stream *s);
  /* dst (n) = src widened (exact); in the fp32 variant a copy */
  void (*load)(float *dst, const void *src, size_t n, wf_stream *s);
} wf_cast_op;

#endif /* WF_KERNELS_CAST_H */
