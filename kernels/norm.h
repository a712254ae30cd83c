/*
 * norm.h - gradient-norm helpers: sum of squares and scaling.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/norm.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_NORM_H
#define WF_KERNELS_NORM_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* Sum of squares in double (for the global gradient norm; reduce across ranks
 * before taking the square root). */
double wf_sumsq(const float *x, size_t n);
/* *acc += wf_sumsq(x, n): gradient norms summed tensor by tensor on the device. */
void wf_sumsq_acc(double *acc, const float *x, size_t n);
/* x *= s */
void wf_scale(float *x, float s, size_t n);

/* ---- the op (wf_kreg.h): fp32 only, the same table for every element type ---- */
#define WF_OP_VERSION_norm 1
typedef struct wf_norm_op {
  void (*sumsq_acc)(double *acc, const float *x, size_t n, wf_stream *s);
  void (*scale)(float *x, float f, size_t n, wf_stream *s);
} wf_norm_op;

#endif /* WF_KERNELS_NORM_H */
