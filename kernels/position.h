/*
 * position.h - learned absolute positions (GPT-2's wpe) added to the embedded tokens.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/position.c, the CUDA twin kernels/cuda/position.cu.
 *
 * pos (B,T) gives each row's position: sequences split over ranks (context parallelism)
 * or packed documents (positions restarting at each document) pass their own; NULL
 * means the plain case, position t for row (b, t).
 */
#ifndef WF_KERNELS_POSITION_H
#define WF_KERNELS_POSITION_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* out[b,t,:] += wpe[p,:], p = pos ? pos[b,t] : t. out (B,T,C), wpe (maxT,C), positions in
 * [0, maxT). */
void wf_position_forward(float *out, const float *wpe, const int *pos, int B, int T, int C);
/* dwpe[p,:] += dout[b,t,:], summed in (b, t) order. */
void wf_position_backward(float *dwpe, const float *dout, const int *pos, int B, int T, int C);

/* ---- the op (wf_kreg.h): fp32 only, the same table for every element type ---- */
#define WF_OP_VERSION_position 1
typedef struct wf_position_op {
  void (*forward)(float *out, const float *wpe, const int *pos, int B, int T, int C, wf_stream *s);
  void (*backward)(float *dwpe, const float *dout, const int *pos, int B, int T, int C,
                   wf_stream *s);
} wf_position_op;

#endif /* WF_KERNELS_POSITION_H */
