/*
 * model_int.h - the communication of Megatron-style tensor parallelism, as named operators.
 *
 * A transformer block alternates replicated regions (layernorm, residual) and
 * tensor-parallel regions (column-parallel -> local op -> row-parallel). Crossing into
 * a tensor-parallel region and out of it are conjugate operators:
 *
 *   enter (Megatron's f):  forward identity,   backward all-reduce     (tp)
 *   leave (Megatron's g):  forward all-reduce, backward identity       (tp)
 *
 * With sequence parallelism the replicated regions hold only N/tp token rows per rank,
 * and the pair becomes
 *
 *   enter:  forward all-gather,      backward reduce-scatter            (tp + sequence)
 *   leave:  forward reduce-scatter,  backward all-gather                (tp + sequence)
 *
 * so a block's communication reads off its code: enter before each column-parallel
 * matmul, leave after each row-parallel one. Rank r of the tp group owns token rows
 * [r*N/tp, (r+1)*N/tp) of the (B*T, C) activations in the sequence-parallel regions
 * (contiguous blocks of the flattened batch x sequence, which is what the collectives
 * scatter and gather without a copy; layernorm and residuals are per token, so which
 * rows a rank holds does not change the mathematics).
 *
 * With tp = 1 every operator is the identity and communicates nothing. A failed
 * collective is remembered (wf_tp_status) and reported by the model.
 */
#ifndef WF_MODEL_INT_H
#define WF_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_collectives.h"
#include "wf_runtime.h"

typedef struct wf_tp {
  wf_comm *comm; /* the tp group; NULL when tp = 1 */
  int size, rank;
  bool sequence;          /* sequence parallelism */
  wf_status err;          /* first failed collective */
  double comm_s;          /* seconds spent in tp collectives (for the step log) */
  double comm_bytes;      /* bytes this rank sent into tp collectives */
  struct wf_trace *trace; /* spans of each collective while it records; NULL = none */
} wf_tp;

/* Rows of the replicated regions on this rank: N, or N / size with sequence parallelism. */
static inline size_t wf_tp_rows(const wf_tp *tp, size_t N)
{
  return tp->sequence ? N / (size_t)tp->size : N;
}

/* enter, forward: x (rows(N), C) -> the full (N, C) input of a column-parallel layer.
 * Returns x itself without sequence parallelism, else `full` after the all-gather. */
const float *wf_tp_enter_fwd(wf_tp *tp, const float *x, float *full, size_t N, size_t C);
/* enter, backward: dfull (N, C) holds this rank's partial input gradient; the result,
 * summed over tp, lands in dx (rows(N), C): all-reduce in place (dx == dfull allowed)
 * or reduce-scatter. */
void wf_tp_enter_bwd(wf_tp *tp, float *dx, float *dfull, size_t N, size_t C);
/* leave, forward: partial (N, C) outputs of a row-parallel layer -> their sum over tp
 * in y (rows(N), C): all-reduce or reduce-scatter. y may equal partial. */
void wf_tp_leave_fwd(wf_tp *tp, float *y, float *partial, size_t N, size_t C);
/* leave, backward: dy (rows(N), C) -> the full (N, C) output gradient. Returns dy
 * itself without sequence parallelism, else `full` after the all-gather. */
const float *wf_tp_leave_bwd(wf_tp *tp, const float *dy, float *full, size_t N, size_t C);
/* Sum n floats in place over the tp group (gradients of replicated parameters that
 * each rank computed from its own token rows). */
void wf_tp_allreduce(wf_tp *tp, float *x, size_t n);

#endif /* WF_MODEL_INT_H */
