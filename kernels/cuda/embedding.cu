/*
 * embedding.cu - rows of a table picked by an index on the GPU (twin of
 * kernels/cpu/embedding.c), whole or split over the table's rows.
 *
 * Forward: one thread per output element, a copy (a lone nonzero term passes through bit
 * for bit, as the sum over a row split needs). Backward adds in the CPU twin's order, so
 * the gradient is the twin's bit for bit, run after run: a row is shared by every
 * occurrence of its index. Block y of ROW_PARTS owns the rows r with r % ROW_PARTS == y,
 * so no two blocks touch one element and no atomics are needed; each block reads the
 * indices in order (staged in shared memory, a tile at a time) and its threads, one per
 * channel, add dout into the rows it owns in that order, as the twin's loop does. Every
 * block reads all the indices, and a block adds one row's occurrences one after another:
 * an index that fills the batch makes one block do all the work. An index outside
 * [v_offset, v_offset + Vl) gives a zero row and touches no row of dtable.
 * Legend: N rows (B*T), C channels, Vl rows of this rank's slice.
 */
#include "cuda_int.h"

/* The local row of index `i`, or -1 when another rank holds it (64-bit, so the
 * subtraction cannot overflow). */
__device__ static long long local_row(int i, int v_offset, int Vl)
{
  long long r = (long long)i - v_offset;
  return r >= 0 && r < Vl ? r : -1;
}

/* out (N,C), idx (N), table (Vl,C) */
__global__ static void embedding_forward_kernel(float *out, const int *idx, const float *table,
                                                int v_offset, int Vl, int C, size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    long long r = local_row(idx[i / (size_t)C], v_offset, Vl);
    out[i] = r >= 0 ? table[(size_t)r * C + i % (size_t)C] : 0.0f;
  }
}

#define ROW_PARTS   64   /* blocks that split dwte's rows (grid y) */
#define TOKEN_TILE  1024 /* tokens staged in shared memory at a time */
#define WTE_THREADS 128  /* channels per block (grid x covers C) */

/* dwte (Vl,C) += dout (BT,C) at the local rows named by inp (BT), in order: block y adds
 * only into its own rows (r % ROW_PARTS == y). Block (WTE_THREADS). */
__global__ static void embedding_backward_kernel(float *__restrict__ dwte,
                                                 const float *__restrict__ dout,
                                                 const int *__restrict__ inp, int v_offset, int Vl,
                                                 int C, int BT)
{
  __shared__ int rows[TOKEN_TILE];
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  for (int t0 = 0; t0 < BT; t0 += TOKEN_TILE) {
    int nt = min(TOKEN_TILE, BT - t0);
    for (int i = threadIdx.x; i < nt; i += blockDim.x) {
      long long r = local_row(inp[t0 + i], v_offset, Vl);
      rows[i] = r >= 0 && r % ROW_PARTS == (long long)blockIdx.y ? (int)r : -1;
    }
    __syncthreads();
    if (c < C)
      for (int i = 0; i < nt; i++) /* rows[i] is the same for every thread: no divergence */
        if (rows[i] >= 0)
          dwte[(size_t)rows[i] * C + c] += dout[(size_t)(t0 + i) * C + c];
    __syncthreads();
  }
}

static void forward(float *out, const int *idx, const float *table, int v_offset, int Vl, int N,
                    int C, wf_stream *stream)
{
  size_t n = (size_t)N * C;
  if (N <= 0 || C <= 0)
    return;
  embedding_forward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(
      out, idx, table, v_offset, Vl, C, n);
  WF_CUDA_LAUNCHED("embedding_forward_kernel");
}

void wf__embedding_backward(float *dtable, const float *dout, const int *idx, int v_offset, int Vl,
                            int N, int C, wf_stream *stream)
{
  if (N <= 0 || C <= 0 || !dtable)
    return;
  dim3 grid((unsigned)((C + WTE_THREADS - 1) / WTE_THREADS), ROW_PARTS);
  embedding_backward_kernel<<<grid, WTE_THREADS, 0, (cudaStream_t)stream>>>(dtable, dout, idx,
                                                                            v_offset, Vl, C, N);
  WF_CUDA_LAUNCHED("embedding_backward_kernel");
}

/* ---- the op (wf_kreg.h): fp32 only, the same table for every element type ------------- */

static const wf_embedding_op op = {forward, wf__embedding_backward};
const wf_kvariants wf__cuda_embedding = WF_KV_ANY(embedding, WF_OP_VERSION_embedding, &op);
