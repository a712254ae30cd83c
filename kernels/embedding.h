/*
 * embedding.h - rows of a table picked by an index: token embeddings, and learned
 * positions (position.h), whole or split over the table's rows.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/embedding.c, the CUDA twin kernels/cuda/embedding.cu.
 *
 * Row split (vocabulary parallelism under tensor parallelism): this rank holds rows
 * [v_offset, v_offset + Vl) of the table, and `table` points at local row 0. An index
 * outside that range gives a zero row, so summing the outputs of every rank of the
 * split gives the whole table's lookup exactly (each element has one nonzero term). The
 * whole table is v_offset 0, Vl >= its rows. Indices are checked before any lookup
 * (tokens.h).
 */
#ifndef WF_KERNELS_EMBEDDING_H
#define WF_KERNELS_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* out[n,:] = table[idx[n] - v_offset,:] when v_offset <= idx[n] < v_offset + Vl, else 0.
 * out (N,C), idx (N), table (Vl,C). */
void wf_embedding_forward(float *out, const int *idx, const float *table, int v_offset, int Vl,
                          int N, int C);
/* dtable (Vl,C): row idx[n] - v_offset accumulates dout[n,:] for every n whose index is
 * held here, in the order of n (so the result does not depend on the thread count). */
void wf_embedding_backward(float *dtable, const float *dout, const int *idx, int v_offset, int Vl,
                           int N, int C);

/* ---- the op (wf_kreg.h): fp32 only, the same table for every element type ---- */
#define WF_OP_VERSION_embedding 1
typedef struct wf_embedding_op {
  void (*forward)(float *out, const int *idx, const float *table, int v_offset, int Vl, int N,
                  int C, wf_stream *s);
  void (*backward)(float *dtable, const float *dout, const int *idx, int v_offset, int Vl, int N,
                   int C, wf_stream *s);
} wf_embedding_op;

#endif /* WF_KERNELS_EMBEDDING_H */
