/*
 * tokens.c - token ids checked against the vocabulary (see tokens.h). One pass, one
 * thread: a micro-batch has a few thousand tokens, and the first bad one is what the
 * error message names.
 */
#include "wf_kernels.h"

void wf_tokens_check(int *bad, const int *tokens, size_t n, int V)
{
  bad[0] = -1;
  bad[1] = 0;
  for (size_t i = 0; i < n; i++) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      bad[0] = (int)i;
      bad[1] = tokens[i];
      return;
    }
  }
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static void check(int *bad, const int *tokens, size_t n, int V, wf_stream *s)
{
  wf_tokens_check(bad, tokens, n, V);
}

static const wf_tokens_op op = {check};
const wf_kvariants wf__cpu_tokens = WF_KV_ANY(tokens, WF_OP_VERSION_tokens, &op);
