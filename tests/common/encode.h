/*
 * encode.h - GPT-2's input as the model composes it from the embedding and position
 * ops (worker/model/ops.c), on the CPU, for the kernel tests and the GPU twin tests.
 */
#ifndef WF_TEST_ENCODE_H
#define WF_TEST_ENCODE_H

#include <limits.h>

#include "wf_kernels.h"

/* GPT-2's input: the token rows of wte (rows [v_offset, v_offset + Vl) held here; a
 * whole table is 0, INT_MAX) plus the positions' rows of wpe (when given), as the model
 * composes the embedding and position ops (worker/model/ops.c); and its backward. */
static inline void encode(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                          const float *wpe, int B, int T, int C)
{
  wf_embedding_forward(out, inp, wte, v_offset, Vl, B * T, C);
  if (wpe)
    wf_position_forward(out, wpe, NULL, B, T, C);
}

static inline void encode_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                                   int v_offset, int Vl, int B, int T, int C)
{
  if (dwte)
    wf_embedding_backward(dwte, dout, inp, v_offset, Vl, B * T, C);
  if (dwpe)
    wf_position_backward(dwpe, dout, NULL, B, T, C);
}

#endif /* WF_TEST_ENCODE_H */
