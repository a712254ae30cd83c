/*
 * tokens.cu - token ids checked against the vocabulary on the GPU (twin of
 * wf_tokens_check): one block finds the first out-of-range position with a block-wide
 * minimum, so the answer is the CPU twin's whatever the order threads run in.
 */
#include <limits.h>

#include "cuda_int.h"

#define TOKENS_THREADS 1024

/* bad (2) = {first bad index or -1, its token}; tokens (n); one block */
__global__ static void tokens_check_kernel(int *bad, const int *tokens, size_t n, int V)
{
  __shared__ long long red[32];
  long long first = LLONG_MAX;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x)
    if ((tokens[i] < 0 || tokens[i] >= V) && (long long)i < first)
      first = (long long)i;
  /* block minimum: warp shuffles, then the warps' minima */
  for (int o = 16; o > 0; o >>= 1) {
    long long other = __shfl_xor_sync(0xffffffffu, first, o);
    first = other < first ? other : first;
  }
  if (threadIdx.x % 32 == 0)
    red[threadIdx.x / 32] = first;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < (blockDim.x + 31) / 32; w++)
      first = red[w] < first ? red[w] : first;
    first = red[0] < first ? red[0] : first;
    bad[0] = first == LLONG_MAX ? -1 : (int)first;
    bad[1] = first == LLONG_MAX ? 0 : tokens[first];
  }
}

static void check(int *bad, const int *tokens, size_t n, int V, wf_stream *stream)
{
  tokens_check_kernel<<<1, TOKENS_THREADS, 0, (cudaStream_t)stream>>>(bad, tokens, n, V);
  WF_CUDA_LAUNCHED("tokens_check_kernel");
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static const wf_tokens_op op = {check};
const wf_kvariants wf__cuda_tokens = WF_KV_ANY(tokens, WF_OP_VERSION_tokens, &op);
