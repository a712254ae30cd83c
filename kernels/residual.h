/*
 * residual.h - residual add.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/residual.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_RESIDUAL_H
#define WF_KERNELS_RESIDUAL_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* out = a + b; backward adds dout into da and db. */
void wf_residual_forward(float *out, const float *a, const float *b, size_t N);
void wf_residual_backward(float *da, float *db, const float *dout, size_t N);
/* out (N) = a + b with out and a stored in 16-bit format fmt (storage.h), b fp32: the
 * sum of the widened a and b, rounded on store. out may alias a. */
void wf_residual_forward16(void *out, const void *a, const float *b, size_t N, int fmt);

/* ---- the op (wf_kreg.h): out and a in the variant's element type ---- */
#define WF_OP_VERSION_residual 1
typedef struct wf_residual_op {
  /* out = a + b; b is fp32 (a branch's output after the tp reduction) */
  void (*forward)(void *out, const void *a, const float *b, size_t N, wf_stream *s);
  void (*backward)(float *da, float *db, const float *dout, size_t N, wf_stream *s);
} wf_residual_op;

#endif /* WF_KERNELS_RESIDUAL_H */
