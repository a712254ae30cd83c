/*
 * moe_combine.h - a token's MoE output: the weighted sum of its experts' outputs, and its
 * backward.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The code
 * is kernels/cpu/moe_combine.c and kernels/cuda/moe_combine.cu.
 *
 * Legend: N tokens, K choices each, C row width, rows of y in expert-major order
 * (moe_dispatch.h: pair n K + j is row pos[n K + j], -1 when dropped). y is fp32: under
 * tensor parallelism each rank's expert outputs are partial sums (its slice of the
 * experts' width) that the combined output carries into the tp reduction, as a
 * row-parallel GEMM's do.
 */
#ifndef WF_KERNELS_MOE_COMBINE_H
#define WF_KERNELS_MOE_COMBINE_H

#include <stddef.h>

#include "wf_kreg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (N,C) = sum over n's kept pairs j of w[n K + j] y[pos[n K + j]] (the pairs in
 * choice order), WRITTEN; a token whose pairs were all dropped gets 0. */
void wf_moe_combine(float *out, const float *y, const float *w, const int *pos, int N, int K,
                    int C);

/* Its backward from dout (N,C): dyp[pos[n K + j]] = w[n K + j] dout[n] (rows of C, stored
 * in format fmt: the down GEMM's backward reads them) and dw[n K + j] = <dout[n],
 * y[pos[n K + j]]> (0 for a dropped pair), both WRITTEN. */
void wf_moe_combine_backward(void *dyp, float *dw, const float *dout, const float *y,
                             const float *w, const int *pos, int N, int K, int C, int fmt);

/* ---- the op (wf_kreg.h): fp32 sums, dyp's format an argument; one table for every
 * element type. Entries: the functions above plus the stream. */
#define WF_OP_VERSION_moe_combine 1
typedef struct wf_moe_combine_op {
  void (*combine)(float *out, const float *y, const float *w, const int *pos, int N, int K, int C,
                  wf_stream *s);
  void (*backward)(void *dyp, float *dw, const float *dout, const float *y, const float *w,
                   const int *pos, int N, int K, int C, int fmt, wf_stream *s);
} wf_moe_combine_op;

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_MOE_COMBINE_H */
