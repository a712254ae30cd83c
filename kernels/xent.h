/*
 * xent.h - softmax cross-entropy, in two passes for vocabulary parallelism.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/xent.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_XENT_H
#define WF_KERNELS_XENT_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* Softmax + cross-entropy, split so vocabulary-parallel ranks can reduce between
 * the passes. logits (N, ld) hold V real columns of the vocabulary starting at
 * global column v_offset; columns >= V (padding) are ignored. V may be 0 (an empty
 * slice: row_max -inf, row_sumexp 0, which the combination below absorbs).
 *
 * Pass 1, per row: row_max = max over the V columns; row_sumexp = sum exp(l - row_max);
 * target_logit = logits[target - v_offset] if the target is in this slice, else 0.
 * (Across ranks: M = max row_max; S = sum row_sumexp * exp(row_max - M);
 *  target_logit summed; loss = log S + M - target_logit.) */
void wf_xent_stats(float *row_max, float *row_sumexp, float *target_logit, const float *logits,
                   const int *targets, int N, int V, int ld, int v_offset);
/* Across vocabulary-parallel ranks, the statistics travel as one (N, 3) buffer:
 * stats[3i .. 3i+2] = {row_max[i], row_sumexp[i], target_logit[i]} (one all-gather
 * moves every rank's). */
void wf_xent_pack(float *stats, const float *row_max, const float *row_sumexp,
                  const float *target_logit, int N);
/* all (parts, N, 3): every rank's packed statistics -> the global ones: row_max = M =
 * max over parts; row_sumexp = sum of sumexp * exp(max - M) over the parts whose sumexp
 * is > 0 (an empty slice contributes nothing); target_logit = the sum over parts (only
 * the part holding the target has it non-zero). */
void wf_xent_combine(float *row_max, float *row_sumexp, float *target_logit, const float *all,
                     int N, int parts);
/* loss[i] = log(sumexp[i]) + max[i] - target_logit[i] */
void wf_xent_loss(float *losses, const float *row_max, const float *row_sumexp,
                  const float *target_logit, int N);
/* Pass 2: dlogits = dloss * (softmax - onehot(target)) using the global row_max and
 * row_sumexp; padding columns [V, ld) are set to 0. dlogits may alias logits
 * (it is written, not accumulated, because logits are consumed here). */
void wf_xent_backward(float *dlogits, const float *logits, const float *row_max,
                      const float *row_sumexp, const int *targets, float dloss, int N, int V,
                      int ld, int v_offset);

/* The same with the logits (and dlogits, which may alias them) stored in 16-bit format
 * fmt (storage.h): each row loaded, computed as above in fp32, dlogits stored rounded. */
void wf_xent_stats16(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                     const int *targets, int N, int V, int ld, int v_offset, int fmt);
void wf_xent_backward16(void *dlogits, const void *logits, const float *row_max,
                        const float *row_sumexp, const int *targets, float dloss, int N, int V,
                        int ld, int v_offset, int fmt);

/* *acc += the mean of losses (N), computed in double and rounded to float first: the
 * micro-batch's loss as a float, summed over micro-batches in double. */
void wf_loss_accumulate(double *acc, const float *losses, int N);

/* ---- the op (wf_kreg.h): logits and dlogits in the variant's element type; the
 * statistics, losses and the accumulator fp32 (double) ---- */
#define WF_OP_VERSION_xent 1
typedef struct wf_xent_op {
  void (*stats)(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                const int *targets, int N, int V, int ld, int v_offset, wf_stream *s);
  void (*pack)(float *stats, const float *row_max, const float *row_sumexp,
               const float *target_logit, int N, wf_stream *s);
  void (*combine)(float *row_max, float *row_sumexp, float *target_logit, const float *all, int N,
                  int parts, wf_stream *s);
  void (*loss)(float *losses, const float *row_max, const float *row_sumexp,
               const float *target_logit, int N, wf_stream *s);
  void (*backward)(void *dlogits, const void *logits, const float *row_max, const float *row_sumexp,
                   const int *targets, float dloss, int N, int V, int ld, int v_offset,
                   wf_stream *s);
  /* wf_loss_accumulate; acc in device memory */
  void (*accumulate)(double *acc, const float *losses, int N, wf_stream *s);
} wf_xent_op;

#endif /* WF_KERNELS_XENT_H */
