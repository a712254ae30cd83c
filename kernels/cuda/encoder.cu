/*
 * encoder.cu - token + position embedding on the GPU (twin of wf_encoder_*), whole
 * or split over the vocabulary (wf_encoder_*_vp).
 *
 * Forward: one thread per output element. Backward adds in the CPU twin's order, so
 * the gradients are the twin's bit for bit, run after run:
 *  - dwte: a row is shared by every occurrence of its token. Block y of ROW_PARTS owns
 *    the rows r with r % ROW_PARTS == y, so no two blocks touch one element and no
 *    atomics are needed; each block reads the tokens in (b, t) order (staged in shared
 *    memory, a tile at a time) and its threads, one per channel, add dout into the rows
 *    it owns in that order, as the twin's loop over (b, t) does. Every block reads all
 *    the tokens (B*T ints from shared memory), and a block adds one row's occurrences
 *    one after another: a token that fills the batch makes one block do all the work.
 *  - dwpe[t] is summed over the batch by one thread per (t, c), starting from dwpe's
 *    value and adding b = 0, 1, ... as the twin does.
 * The whole-vocabulary launchers are the split ones with v_offset = 0 and every
 * token in range. A token outside [v_offset, v_offset + Vl) contributes a zero row
 * to out and touches no row of dwte.
 * Legend: B batch, T time, C channels, V vocabulary, Vl rows of this rank's slice.
 */
#include <limits.h>

#include "cuda_int.h"

/* The local row of token `tok`, or -1 when another rank holds it (64-bit, so the
 * subtraction cannot overflow). */
__device__ static long long local_row(int tok, int v_offset, int Vl)
{
  long long r = (long long)tok - v_offset;
  return r >= 0 && r < Vl ? r : -1;
}

/* out (B,T,C), inp (B,T), wte (Vl,C), wpe (maxT,C) or NULL */
__global__ static void encoder_forward_kernel(float *out, const int *inp, const float *wte,
                                              int v_offset, int Vl, const float *wpe, int T, int C,
                                              size_t n)
{
  WF_GRID_STRIDE(i, n)
  {
    size_t bt = i / (size_t)C;
    size_t c = i % (size_t)C;
    size_t t = bt % (size_t)T;
    long long r = local_row(inp[bt], v_offset, Vl);
    float we = r >= 0 ? wte[(size_t)r * C + c] : 0.0f;
    /* a lone term is stored as is (not + 0.0f), as the CPU twin does */
    if (wpe)
      out[i] = r >= 0 ? we + wpe[t * C + c] : wpe[t * C + c];
    else
      out[i] = we;
  }
}

#define ROW_PARTS   64   /* blocks that split dwte's rows (grid y) */
#define TOKEN_TILE  1024 /* tokens staged in shared memory at a time */
#define WTE_THREADS 128  /* channels per block (grid x covers C) */

/* dwte (Vl,C) += dout (B*T,C) at the local rows named by inp (B*T), in (b, t) order:
 * block y adds only into its own rows (r % ROW_PARTS == y). Block (WTE_THREADS). */
__global__ static void encoder_backward_wte_kernel(float *__restrict__ dwte,
                                                   const float *__restrict__ dout,
                                                   const int *__restrict__ inp, int v_offset,
                                                   int Vl, int C, int BT)
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

/* dwpe (maxT,C): rows 0..T-1 += dout[b,t,:] for b = 0, 1, ..., one add at a time */
__global__ static void encoder_backward_wpe_kernel(float *dwpe, const float *dout, int B, int T,
                                                   int C)
{
  size_t n = (size_t)T * C;
  WF_GRID_STRIDE(i, n)
  {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++)
      acc += dout[(size_t)b * n + i];
    dwpe[i] = acc;
  }
}

extern "C" void wf_cuda_encoder_forward_vp(float *out, const int *inp, const float *wte,
                                           int v_offset, int Vl, const float *wpe, int B, int T,
                                           int C, wf_stream *stream)
{
  size_t n = (size_t)B * T * C;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  encoder_forward_kernel<<<wf__grid_1d(n, 256), 256, 0, (cudaStream_t)stream>>>(
      out, inp, wte, v_offset, Vl, wpe, T, C, n);
  WF_CUDA_LAUNCHED("encoder_forward_kernel");
}

extern "C" void wf_cuda_encoder_forward(float *out, const int *inp, const float *wte,
                                        const float *wpe, int B, int T, int C, wf_stream *stream)
{
  wf_cuda_encoder_forward_vp(out, inp, wte, 0, INT_MAX, wpe, B, T, C, stream);
}

extern "C" void wf_cuda_encoder_backward_vp(float *dwte, float *dwpe, const float *dout,
                                            const int *inp, int v_offset, int Vl, int B, int T,
                                            int C, wf_stream *stream)
{
  cudaStream_t s = (cudaStream_t)stream;
  if (B <= 0 || T <= 0 || C <= 0)
    return;
  if (dwte) {
    dim3 grid((unsigned)((C + WTE_THREADS - 1) / WTE_THREADS), ROW_PARTS);
    encoder_backward_wte_kernel<<<grid, WTE_THREADS, 0, s>>>(dwte, dout, inp, v_offset, Vl, C,
                                                             B * T);
    if (!WF_CUDA_LAUNCHED("encoder_backward_wte_kernel"))
      return;
  }
  if (dwpe) {
    encoder_backward_wpe_kernel<<<wf__grid_1d((size_t)T * C, 256), 256, 0, s>>>(dwpe, dout, B, T,
                                                                                C);
    WF_CUDA_LAUNCHED("encoder_backward_wpe_kernel");
  }
}

extern "C" void wf_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                         const int *inp, int B, int T, int C, wf_stream *stream)
{
  wf_cuda_encoder_backward_vp(dwte, dwpe, dout, inp, 0, INT_MAX, B, T, C, stream);
}
