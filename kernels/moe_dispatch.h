/*
 * moe_dispatch.h - tokens to their experts and back: the expert-major order of a
 * micro-batch's (token, choice) pairs, the rows permuted into it and their gradients
 * gathered back.
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The code
 * is kernels/cpu/moe_dispatch.c and kernels/cuda/moe_dispatch.cu.
 *
 * Legend: N tokens, K experts per token, E experts, C row width. Pair i = n K + j is
 * token n's j-th choice, idx[i] its expert (moe_route.h). In expert-major order expert e
 * takes rows [off[e], off[e] + counts[e]) (off the counts' prefix sums), its pairs in
 * pair order, so experts held by one rank (consecutive ones) are consecutive rows: what
 * one all-to-all message carries and one grouped GEMM reads.
 *
 * Capacity (cap > 0): an expert takes at most cap pairs, the first in pair order (earlier
 * tokens first, as Megatron-Core's "position" policy drops); a refused pair is dropped:
 * pos -1, it reaches no expert and adds nothing to its token's output.
 */
#ifndef WF_KERNELS_MOE_DISPATCH_H
#define WF_KERNELS_MOE_DISPATCH_H

#include <stddef.h>

#include "wf_kreg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* pos (N K) = each pair's row in expert-major order (-1: dropped); counts (E) = the rows
 * each expert takes; *dropped = how many pairs were dropped (a float: it joins a layer's
 * statistics). idx (N K) < E. cap 0: dropless. All WRITTEN. */
void wf_moe_dispatch(int *pos, int *counts, float *dropped, const int *idx, int N, int E, int K,
                     int cap);

/* xp (rows, C) = x's rows in expert-major order: xp[pos[i]] = x[i / K] for every pair
 * kept; x and xp in format fmt (moved, not rounded). */
void wf_moe_permute(void *xp, const void *x, const int *pos, int N, int K, int C, int fmt);

/* Its backward: dx[n] (N,C) += sum over n's kept pairs j of dxp[pos[n K + j]] (fp32). */
void wf_moe_unpermute(float *dx, const float *dxp, const int *pos, int N, int K, int C);

/* ---- the op (wf_kreg.h): rows move unrounded in the format given, so one table serves
 * every element type. Entries: the functions above plus the stream. */
#define WF_OP_VERSION_moe_dispatch 1
typedef struct wf_moe_dispatch_op {
  void (*dispatch)(int *pos, int *counts, float *dropped, const int *idx, int N, int E, int K,
                   int cap, wf_stream *s);
  void (*permute)(void *xp, const void *x, const int *pos, int N, int K, int C, int fmt,
                  wf_stream *s);
  void (*unpermute)(float *dx, const float *dxp, const int *pos, int N, int K, int C, wf_stream *s);
} wf_moe_dispatch_op;

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_MOE_DISPATCH_H */
