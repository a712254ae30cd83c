/*
 * gelu.h - GELU (tanh form).
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/gelu.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_GELU_H
#define WF_KERNELS_GELU_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* GELU, tanh approximation. out (N), inp (N). out may alias inp. */
void wf_gelu_forward(float *out, const float *inp, size_t N);
/* dinp (N) = gelu'(inp) * dout, WRITTEN (it feeds only the fc GEMM's backward, so it is
 * not added into: matmul.h); dinp must not alias inp or dout. */
void wf_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N);
/* The same with out, inp, dout and dinp stored in 16-bit format fmt (storage.h): dout as
 * the fcproj GEMM's backward stored it; dinp stored rounded from the fp32 product, as the
 * fc GEMM's backward reads it. */
void wf_gelu_forward16(void *out, const void *inp, size_t N, int fmt);
void wf_gelu_backward16(void *dinp, const void *inp, const void *dout, size_t N, int fmt);

/* ---- the op (wf_kreg.h): every argument in the variant's element type ---- */
#define WF_OP_VERSION_gelu 1
typedef struct wf_gelu_op {
  void (*forward)(void *out, const void *inp, size_t N, wf_stream *s);
  /* dinp WRITTEN: the fc GEMM's output gradient */
  void (*backward)(void *dinp, const void *inp, const void *dout, size_t N, wf_stream *s);
} wf_gelu_op;

#endif /* WF_KERNELS_GELU_H */
