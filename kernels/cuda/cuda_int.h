/*
 * cuda_int.h - private to the weft_cuda module (kernels/cuda/): the launchers'
 * declarations, the launch and cuBLAS checks, and the device-side reductions.
 *
 * Invariants:
 *  - An op's entries (wf_kreg.h) have the CPU kernel's arguments plus a trailing
 *    `wf_stream *stream` (a cudaStream_t). They return nothing, like the CPU kernels:
 *    each launch is checked with wf__cuda_check_launch(), which logs a failure with
 *    file and line and keeps the first one for the registry's last_error().
 *  - A launcher with nothing to do (a zero size) launches nothing: a grid of 0
 *    blocks is itself an error.
 *  - Reductions assume blockDim.x is a multiple of 32 (full warps) and at most 1024.
 *  - Indices that can pass 2^31 (N*C, N*V, B*NH*T*T) are computed in size_t.
 */
#ifndef WF_CUDA_INT_H
#define WF_CUDA_INT_H

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

extern "C" {
#include "wf_config.h" /* wf_precision, the GEMMs' lowp */
#include "wf_gpu_module.h"
#include "wf_kernels.h" /* the ops' headers and their tables */
#include "wf_runtime.h"
}

#define WF_EXPORT __attribute__((visibility("default")))

/* ---- checks (backend.cu) ------------------------------------------------------- */

/* Record `err` as the module's first error unless one is already kept. */
void wf__cuda_record(int err);
/* cudaGetLastError after a launch; logs and records a failure. Returns true when
 * the launch is fine. */
bool wf__cuda_check_launch(const char *file, int line, const char *what);
/* Logs and records a failed CUDA runtime call; true when `e` is cudaSuccess. */
bool wf__cuda_check(cudaError_t e, const char *file, int line, const char *what);
/* Count one launch (or library call) for the table's launches(); check_launch and
 * wf__lt_end count theirs. */
void wf__cuda_count_launch(void);
#define WF_CUDA_LAUNCHED(what) wf__cuda_check_launch(__FILE__, __LINE__, (what))
#define WF_CUDA_OK(call)       wf__cuda_check((call), __FILE__, __LINE__, #call)

/* The current device's cuBLASLt handle and workspace, with the module's GEMM lock
 * held (begin returns false, error logged, lock released, on failure). Every
 * successful begin is paired with one end, which releases the lock, and logs and
 * records `st` (the status of the calls made in between) unless it is a success;
 * end returns whether it was. */
typedef struct wf__lt {
  cublasLtHandle_t handle;
  void *workspace;
  size_t workspace_bytes;
} wf__lt;
bool wf__lt_begin(wf__lt *lt, const char *file, int line);
bool wf__lt_end(cublasStatus_t st, const char *file, int line, const char *what);

/* One cuBLASLt GEMM's descriptors (matmul.cu's fp32-operand GEMMs, and its 16-bit
 * ones), destroyed in reverse order of creation (NULL ones skipped). */
typedef struct wf__lt_descs {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatmulPreference_t pref;
} wf__lt_descs;

static inline void wf__lt_descs_destroy(wf__lt_descs *x)
{
  if (x->pref)
    cublasLtMatmulPreferenceDestroy(x->pref);
  if (x->d)
    cublasLtMatrixLayoutDestroy(x->d);
  if (x->b)
    cublasLtMatrixLayoutDestroy(x->b);
  if (x->a)
    cublasLtMatrixLayoutDestroy(x->a);
  if (x->op)
    cublasLtMatmulDescDestroy(x->op);
}

/* One GEMM on descriptors x that `made` reports on: D = A.B (+ beta D) with the
 * heuristics' first algorithm, NOT_SUPPORTED when they find none; destroys x
 * (matmul.cu). */
cublasStatus_t wf__lt_run(const wf__lt *lt, wf__lt_descs *x, cublasStatus_t made, const void *A,
                          const void *B, const float *beta, void *D, cudaStream_t s);

/* A backward GEMM's dinp (`bytes` of it, NULL: none) is written, not added into
 * (matmul.h): whether its reduction over OC has terms; when it has none, dinp is written
 * with the empty sum, 0, and there is no GEMM to run (false). */
bool wf__dinp_nonempty(void *dinp, size_t bytes, int OC, cudaStream_t s);

/* Returns the status of a cuBLAS call from the enclosing function unless it succeeded. */
#define WF__LT_TRY(call)                                                                           \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                              \
      return st_;                                                                                  \
  } while (0)

/* The current device's room for partial sums in the module's workspace (backend.cu):
 * *floats floats at *part, used in stream order by the column reductions. */
bool wf__partials(float **part, size_t *floats, const char *file, int line);

wf_status wf__cuda_last_error(void);

/* ---- launch geometry ---------------------------------------------------------- */

/* Blocks for a grid-stride loop over n elements: enough to fill the GPU, capped so
 * that huge n loop inside the kernel instead. n must be > 0. */
static inline unsigned wf__grid_1d(size_t n, unsigned block)
{
  size_t g = (n + block - 1) / block;
  return (unsigned)(g < 65536 ? g : 65536);
}

#define WF_GRID_STRIDE(i, n)                                                                       \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

/* ---- reductions ----------------------------------------------------------------- */

template <typename T> __device__ __forceinline__ T wf__warp_sum(T v)
{
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float wf__warp_max(float v)
{
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Sum over the block, returned to every thread. `shared` holds 32 T. Ends with a
 * barrier so `shared` can be reused at once. */
template <typename T> __device__ T wf__block_sum(T v, T *shared)
{
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  v = wf__warp_sum(v);
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : (T)0;
    v = wf__warp_sum(v);
    if (lane == 0)
      shared[0] = v;
  }
  __syncthreads();
  T r = shared[0];
  __syncthreads();
  return r;
}

/* Max over the block, returned to every thread; same contract as wf__block_sum. */
__device__ __forceinline__ float wf__block_max(float v, float *shared)
{
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = (blockDim.x + 31) / 32;
  v = wf__warp_max(v);
  if (lane == 0)
    shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : -INFINITY;
    v = wf__warp_max(v);
    if (lane == 0)
      shared[0] = v;
  }
  __syncthreads();
  float r = shared[0];
  __syncthreads();
  return r;
}

/* ---- column sums (colsum.cu) ------------------------------------------------------------ */

/* Stage 1 blocks are (WF__COLSUM_TILE, WF__COLSUM_LANES) threads: 32 columns, 8 lanes of
 * rows; the grid is (col_blocks, R). */
#define WF__COLSUM_TILE  32
#define WF__COLSUM_LANES 8

/* How a column sum over N rows of C columns is cut: R row blocks of `rows` rows, and
 * the partial sums (R, C) per summed array at part + a * R * C (NULL when R == 1:
 * stage 1 then adds into the gradient itself). */
typedef struct wf__colsum {
  int col_blocks, R, rows;
  float *part;
} wf__colsum;
/* The cut of an N x C sum of `arrays` gradients (see colsum.cu); false on an error
 * (logged and recorded). */
bool wf__colsum_plan(wf__colsum *p, int N, int C, int arrays, const char *file, int line);
/* Stage 2: dst (C) += the R partial sums at part (R, C) in order; nothing when dst is
 * NULL or R == 1. */
bool wf__colsum_finish(float *dst, const float *part, const wf__colsum *p, int C, cudaStream_t s);

/* Stage 1's epilogue: a block's 8 lanes' sums of one column, added in lane order, then
 * stored as the block's partial sum, or added into the gradient when R == 1 (nothing
 * when dst is NULL: that gradient is not wanted). `sh` holds WF__COLSUM_LANES x
 * (WF__COLSUM_TILE + 1) floats. Every thread of the block calls it. */
__device__ __forceinline__ void wf__colsum_store(float acc, float *sh, float *dst, float *part,
                                                 int R, int C, int c)
{
  sh[threadIdx.y * (WF__COLSUM_TILE + 1) + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C && dst) {
    for (int r = 1; r < WF__COLSUM_LANES; r++)
      acc += sh[r * (WF__COLSUM_TILE + 1) + threadIdx.x];
    if (R == 1)
      dst[c] += acc;
    else
      part[(size_t)blockIdx.y * C + c] = acc;
  }
  __syncthreads(); /* sh free again for the next array */
}

/* ---- attention that keeps (T, T) probabilities (attention_tt.cu), the fallback of the
 * flash-style kernels (flash.cu) for heads larger than they handle ------------------- */
void wf__cuda_attention_forward_tt(float *out, float *att, const float *qkv, const int *starts,
                                   int B, int T, int C, int NH, int NKV, wf_stream *stream);
void wf__cuda_attention_backward_tt(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, const int *starts, int B,
                                    int T, int C, int NH, int NKV, wf_stream *stream);

/* ---- the ops (one .cu per op: wf_kreg.h) ---------------------------------------- */

/* Each op's variants, by element type: the module's registry (backend.cu) lists them. */
#define WF__CUDA_OP_DECL(name) extern const wf_kvariants wf__cuda_##name;
WF_OP_LIST(WF__CUDA_OP_DECL)
#undef WF__CUDA_OP_DECL

/* Sums in double (dsum.cu): *acc += the sum of squares of x (n), and the mean of x (N)
 * rounded to float (wf_loss_accumulate's), on the stream. norm.cu's and xent.cu's. */
void wf__sumsq_acc(double *acc, const float *x, size_t n, wf_stream *stream);
void wf__mean_acc(double *acc, const float *x, int N, wf_stream *stream);

/* dtable (Vl,C) += dout (N,C) at the local rows the indices name, in order (embedding.cu):
 * the embedding op's backward, which the position op's takes for positions given. */
void wf__embedding_backward(float *dtable, const float *dout, const int *idx, int v_offset, int Vl,
                            int N, int C, wf_stream *stream);

/* The bf16 cross-entropy's row statistics and gradient (classifier.cu: a block per row,
 * 16-byte loads), which xent.cu's bf16 variant takes too. logits bf16. */
void wf__classifier_stats(float *row_max, float *row_sumexp, float *target_logit,
                          const void *logits, const int *targets, int N, int V, int ld,
                          int v_offset, wf_stream *stream);
void wf__classifier_backward(void *dlogits, const void *logits, const float *row_max,
                             const float *row_sumexp, const int *targets, float dloss, int N, int V,
                             int ld, int v_offset, wf_stream *stream);

#endif /* WF_CUDA_INT_H */
