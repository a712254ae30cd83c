/*
 * swiglu.h - the SwiGLU gate of Llama's MLP.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/swiglu.c; the CUDA twin has the same arguments plus a stream.
 *
 * Llama's MLP is down(silu(gate(x)) * up(x)). gate and up are one GEMM whose output
 * rows are [gate | up] (F columns each), which is what inp holds. Under tensor
 * parallelism gate and up are column-split separately, so a tp rank holds
 * [gate_local | up_local] with F = F_global / tp: the same layout with a smaller F.
 */
#ifndef WF_KERNELS_SWIGLU_H
#define WF_KERNELS_SWIGLU_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* out (N,F) = silu(gate) * up, silu(x) = x / (1 + exp(-x)); inp (N,2F) row n =
 * [gate (F) | up (F)]. out must not overlap inp. */
void wf_swiglu_forward(float *out, const float *inp, int N, int F);
/* dinp (N,2F) = [dout * up * silu'(gate) | dout * silu(gate)], WRITTEN (it feeds only
 * the gate/up GEMM's backward: matmul.h), with silu'(x) = s (1 + x (1 - s)),
 * s = sigmoid(x); dout (N,F). dinp must not overlap inp or dout. */
void wf_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F);

/* The same with inp, out, dout and dinp stored in 16-bit format fmt (storage.h), dout as
 * the down GEMM's backward stored it. */
void wf_swiglu_forward16(void *out, const void *inp, int N, int F, int fmt);
void wf_swiglu_backward16(void *dinp, const void *inp, const void *dout, int N, int F, int fmt);

/* ---- the op (wf_kreg.h): every argument in the variant's element type ---- */
#define WF_OP_VERSION_swiglu 1
typedef struct wf_swiglu_op {
  void (*forward)(void *out, const void *inp, int N, int F, wf_stream *s);
  /* dinp WRITTEN: the gate/up GEMM's output gradient */
  void (*backward)(void *dinp, const void *inp, const void *dout, int N, int F, wf_stream *s);
} wf_swiglu_op;

#endif /* WF_KERNELS_SWIGLU_H */
