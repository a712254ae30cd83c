/*
 * checksum.cu - the 64-bit checksum of checksum.h on the GPU (twin of wf_checksum).
 *
 * Each thread sums its grid-stride share of mixed elements, the block sums its threads,
 * and each block adds its sum (negated when asked: -(a + b) = -a + -b mod 2^64) into
 * *out with a 64-bit integer atomicAdd, after the launcher zeroed it. Integer addition
 * mod 2^64 is associative and commutative, so the result is the CPU twin's bit for bit
 * whatever the order the blocks arrive in.
 */
#include "cuda_int.h"

extern "C" {
#include "checksum.h"
}

__global__ static void checksum_kernel(unsigned long long *out, const float *x, size_t n,
                                       int negate)
{
  __shared__ unsigned long long part[32];
  unsigned long long s = 0;
  WF_GRID_STRIDE(i, n)
  {
    uint64_t bits = __float_as_uint(x[i]);
    s += wf_checksum_mix(wf_checksum_mix(i) ^ bits);
  }
  s = wf__block_sum(s, part);
  if (threadIdx.x == 0)
    atomicAdd(out, negate ? 0ull - s : s);
}

static void sum(uint64_t *out, const float *x, size_t n, int negate, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (!WF_CUDA_OK(cudaMemsetAsync(out, 0, sizeof *out, s)) || n == 0)
    return;
  checksum_kernel<<<wf__grid_1d(n, 256), 256, 0, s>>>((unsigned long long *)out, x, n, negate);
  WF_CUDA_LAUNCHED("checksum_kernel");
}

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static const wf_checksum_op op = {sum};
const wf_kvariants wf__cuda_checksum = WF_KV_ANY(checksum, WF_OP_VERSION_checksum, &op);
