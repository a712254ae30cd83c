/*
 * classifier.h - the fused classifier over bf16 logits (llm.c's): softmax cross-entropy
 * whose loss and logit gradient come from one pass over the logits, written in place,
 * so no fp32 (N, V) buffer ever exists.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The
 * CPU code is kernels/cpu/classifier.c; the CUDA twin has the same arguments plus a
 * stream.
 *
 * logits (N, ld) bf16 hold V real columns of the vocabulary starting at global column
 * v_offset; columns [V, ld) are padding, ignored, and 0 in the gradient (the tied
 * embedding's padding rows must get an exactly zero gradient). Statistics are fp32:
 * row max M, row sum S = sum exp(l - M), the target's logit; loss = log S + M - l[t];
 * dlogits = dloss (softmax - onehot(target)), computed in fp32 and stored rounded to
 * bf16.
 *
 * Two forms:
 *  - one rank holds the whole vocabulary (v_offset 0): wf_classifier_bf16 does
 *    everything in one call (on a GPU one kernel per row: the second read of the row
 *    comes from cache);
 *  - vocabulary parallelism: wf_xent_stats_bf16 gives this rank's row statistics, the
 *    ranks combine them as for fp32 logits (xent.h: xent_pack, an all-gather,
 *    xent_combine, xent_loss), and wf_xent_backward_bf16 writes the gradient in place
 *    from the global statistics.
 */
#ifndef WF_KERNELS_CLASSIFIER_H
#define WF_KERNELS_CLASSIFIER_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

#include "bf16.h"

/* logits (N,ld) in, dlogits out in place; losses (N) written; targets (N) in [0, V). */
void wf_classifier_bf16(wf_bf16 *logits, float *losses, const int *targets, float dloss, int N,
                        int V, int ld);
/* row_max, row_sumexp, target_logit (N) of this rank's slice, as wf_xent_stats. */
void wf_xent_stats_bf16(float *row_max, float *row_sumexp, float *target_logit,
                        const wf_bf16 *logits, const int *targets, int N, int V, int ld,
                        int v_offset);
/* dlogits (N,ld) = dloss (softmax - onehot) from the global row_max and row_sumexp;
 * dlogits may alias logits. */
void wf_xent_backward_bf16(wf_bf16 *dlogits, const wf_bf16 *logits, const float *row_max,
                           const float *row_sumexp, const int *targets, float dloss, int N, int V,
                           int ld, int v_offset);

/* ---- the op (wf_kreg.h): bf16 only ---- */
#define WF_OP_VERSION_classifier 1
typedef struct wf_classifier_op {
  void (*fused)(void *logits, float *losses, const int *targets, float dloss, int N, int V, int ld,
                wf_stream *s);
  void (*stats)(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                const int *targets, int N, int V, int ld, int v_offset, wf_stream *s);
  void (*backward)(void *dlogits, const void *logits, const float *row_max, const float *row_sumexp,
                   const int *targets, float dloss, int N, int V, int ld, int v_offset,
                   wf_stream *s);
} wf_classifier_op;

#endif /* WF_KERNELS_CLASSIFIER_H */
