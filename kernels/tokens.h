/*
 * tokens.h - checking token ids before a lookup.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/tokens.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_TOKENS_H
#define WF_KERNELS_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* bad[0] = the first index i < n with tokens[i] outside [0, V), or -1 when every token
 * is valid; bad[1] = that token (0 when none). An embedding lookup of such a token
 * would read outside the table, so the model checks before it looks up. */
void wf_tokens_check(int *bad, const int *tokens, size_t n, int V);

/* ---- the op (wf_kreg.h): the same table for every element type ---- */
#define WF_OP_VERSION_tokens 1
typedef struct wf_tokens_op {
  /* bad (2 ints, device memory) as wf_tokens_check */
  void (*check)(int *bad, const int *tokens, size_t n, int V, wf_stream *s);
} wf_tokens_op;

#endif /* WF_KERNELS_TOKENS_H */
