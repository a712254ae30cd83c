/*
 * cuda_int.h - private to the weft_cuda module (kernels/cuda/): the launchers'
 * declarations, the launch and cuBLAS checks, and the device-side reductions.
 *
 * Invariants:
 *  - Launchers are `extern "C" wf_cuda_<op>` with the CPU kernel's arguments plus a
 *    trailing `wf_stream *stream` (a cudaStream_t). They return nothing, like the CPU
 *    kernels: each launch is checked with wf__cuda_check_launch(), which logs a
 *    failure with file and line and keeps the first one for last_error().
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
#include "wf_ktable.h"
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

/* One cuBLASLt GEMM's descriptors (matmul.cu's fp32-operand GEMMs, storage.cu's 16-bit
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

wf_status wf_cuda_last_error(void);

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

/* ---- attention that keeps (T, T) probabilities (attention.cu), the fallback of the
 * flash-style kernels (flash.cu) for heads larger than they handle ------------------- */
void wf__cuda_attention_forward_tt(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH, int NKV, wf_stream *stream);
void wf__cuda_attention_backward_tt(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C, int NH,
                                    int NKV, wf_stream *stream);

/* ---- launchers (one .cu per op) ----------------------------------------------- */

extern "C" {
void wf_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                             int T, int C, wf_stream *stream);
void wf_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                              int T, int C, wf_stream *stream);
void wf_cuda_encoder_forward_vp(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                                const float *wpe, int B, int T, int C, wf_stream *stream);
void wf_cuda_encoder_backward_vp(float *dwte, float *dwpe, const float *dout, const int *inp,
                                 int v_offset, int Vl, int B, int T, int C, wf_stream *stream);
void wf_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *weight, const float *bias, int N, int C,
                               wf_stream *stream);
void wf_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const float *weight, const float *mean,
                                const float *rstd, int N, int C, wf_stream *stream);
void wf_cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                            int N, int C, int OC, int lowp, wf_stream *stream);
void wf_cuda_matmul_gelu_forward(float *gelu_out, float *pre, const float *inp, const float *weight,
                                 const float *bias, int N, int C, int OC, int lowp,
                                 wf_stream *stream);
void wf_cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, int N, int C, int OC, int lowp,
                             wf_stream *stream);
void wf_cuda_set_tf32(int allow);
void wf_cuda_residual_layernorm_forward(float *res, float *ln, float *mean, float *rstd,
                                        const float *a, const float *b, const float *weight,
                                        const float *bias, int N, int C, wf_stream *stream);
size_t wf_cuda_attention_saved(int B, int T, int C, int NH);
size_t wf_cuda_attention_scratch(int B, int T, int C, int NH);
void wf_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                               int NH, wf_stream *stream);
void wf_cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                const float *att, int B, int T, int C, int NH, wf_stream *stream);
void wf_cuda_gelu_forward(float *out, const float *inp, size_t N, wf_stream *stream);
void wf_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t N,
                           wf_stream *stream);
void wf_cuda_residual_forward(float *out, const float *a, const float *b, size_t N,
                              wf_stream *stream);
void wf_cuda_residual_backward(float *da, float *db, const float *dout, size_t N,
                               wf_stream *stream);
void wf_cuda_xent_stats(float *row_max, float *row_sumexp, float *target_logit, const float *logits,
                        const int *targets, int N, int V, int ld, int v_offset, wf_stream *stream);
void wf_cuda_xent_loss(float *losses, const float *row_max, const float *row_sumexp,
                       const float *target_logit, int N, wf_stream *stream);
void wf_cuda_xent_backward(float *dlogits, const float *logits, const float *row_max,
                           const float *row_sumexp, const int *targets, float dloss, int N, int V,
                           int ld, int v_offset, wf_stream *stream);
void wf_cuda_adamw_update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                          float beta1, float beta2, float eps, float weight_decay, int t,
                          float grad_scale, wf_stream *stream);
void wf_cuda_adamw_update_store(float *params, void *low, float *m, float *v, const float *grads,
                                size_t n, float lr, float beta1, float beta2, float eps,
                                float weight_decay, int t, float grad_scale, wf_stream *stream);
void wf_cuda_sumsq_acc(double *acc, const float *x, size_t n, wf_stream *stream);
void wf_cuda_xent_pack(float *stats, const float *row_max, const float *row_sumexp,
                       const float *target_logit, int N, wf_stream *stream);
void wf_cuda_xent_combine(float *row_max, float *row_sumexp, float *target_logit, const float *all,
                          int N, int parts, wf_stream *stream);
void wf_cuda_loss_accumulate(double *acc, const float *losses, int N, wf_stream *stream);
void wf_cuda_tokens_check(int *bad, const int *tokens, size_t n, int V, wf_stream *stream);
void wf_cuda_scale(float *x, float s, size_t n, wf_stream *stream);
void wf_cuda_round_bf16(float *dst, const float *src, size_t n, wf_stream *stream);
void wf_cuda_round_fp16(float *dst, const float *src, size_t n, wf_stream *stream);
void wf_cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                             float eps, int N, int C, wf_stream *stream);
void wf_cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                              const float *weight, const float *rstd, int N, int C,
                              wf_stream *stream);
void wf_cuda_residual_rmsnorm_forward(float *res, float *out, float *rstd, const float *a,
                                      const float *b, const float *weight, float eps, int N, int C,
                                      wf_stream *stream);
void wf_cuda_rope_forward(float *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                          wf_stream *stream);
void wf_cuda_rope_backward(float *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                           wf_stream *stream);
void wf_cuda_swiglu_forward(float *out, const float *inp, int N, int F, wf_stream *stream);
void wf_cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int F,
                             wf_stream *stream);
void wf_cuda_attention_gqa_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                                   int NH, int NKV, wf_stream *stream);
void wf_cuda_attention_gqa_backward(float *dqkv, float *scratch, const float *dout,
                                    const float *qkv, const float *att, int B, int T, int C, int NH,
                                    int NKV, wf_stream *stream);
void wf_cuda_checksum(uint64_t *out, const float *x, size_t n, int negate, wf_stream *stream);
uint64_t wf_cuda_launches(void);

/* Attention as the table runs it (attention_impl.cu): the choice among cuDNN, the bf16
 * flash kernels and the fp32 reference above (wf_cuda_attention_*), and the bf16 entries. */
void wf_cuda_set_attention(int impl);
int wf_cuda_attention_path(int B, int T, int C, int NH, int NKV);
size_t wf_cuda_attn_saved(int B, int T, int C, int NH);
size_t wf_cuda_attn_scratch(int B, int T, int C, int NH);
void wf_cuda_attn_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                          wf_stream *stream);
void wf_cuda_attn_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH, wf_stream *stream);
void wf_cuda_attn_gqa_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                              int NKV, wf_stream *stream);
void wf_cuda_attn_gqa_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, int B, int T, int C, int NH, int NKV,
                               wf_stream *stream);
void wf_cuda_attention_bf16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T,
                                    int C, int NH, int NKV, wf_stream *stream);
void wf_cuda_attention_bf16_backward(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                     const wf_bf16 *qkv, const wf_bf16 *out, const float *lse,
                                     int B, int T, int C, int NH, int NKV, wf_stream *stream);
size_t wf_cuda_attention_bf16_scratch(int B, int T, int C, int NH, int NKV);

/* The fused classifier (classifier.cu). */
void wf_cuda_classifier_bf16(wf_bf16 *logits, float *losses, const int *targets, float dloss, int N,
                             int V, int ld, wf_stream *stream);
void wf_cuda_xent_stats_bf16(float *row_max, float *row_sumexp, float *target_logit,
                             const wf_bf16 *logits, const int *targets, int N, int V, int ld,
                             int v_offset, wf_stream *stream);
void wf_cuda_xent_backward_bf16(wf_bf16 *dlogits, const wf_bf16 *logits, const float *row_max,
                                const float *row_sumexp, const int *targets, float dloss, int N,
                                int V, int ld, int v_offset, wf_stream *stream);

/* ---- storage formats (storage.cu) ---- */
/* The fp32 table (backend.cu), and the table of each storage format (storage.cu). */
extern const wf_ktable wf__cuda_kernels;
const wf_ktable *wf__cuda_storage(int format);
/* The fp32 table's entries that take activations (wf_ktable.h's `void *`): the fp32
 * launchers above. */
void wf__cuda32_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                  const float *w, const float *b, int N, int C, wf_stream *s);
void wf__cuda32_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                   const void *inp, const float *w, const float *mean,
                                   const float *rstd, int N, int C, wf_stream *s);
void wf__cuda32_residual_layernorm_forward(void *res, void *ln, float *mean, float *rstd,
                                           const void *a, const float *b, const float *w,
                                           const float *bias, int N, int C, wf_stream *s);
void wf__cuda32_matmul_forward(void *out, const void *inp, const void *w, const float *bias, int N,
                               int C, int OC, int lowp, wf_stream *s);
void wf__cuda32_matmul_forward_f32(float *out, const void *inp, const void *w, const float *bias,
                                   int N, int C, int OC, int lowp, wf_stream *s);
void wf__cuda32_matmul_gelu_forward(void *gelu_out, void *pre, const void *inp, const void *w,
                                    const float *bias, int N, int C, int OC, int lowp,
                                    wf_stream *s);
void wf__cuda32_matmul_backward(void *dinp, float *dw, float *db, const void *dout, const void *inp,
                                const void *w, int N, int C, int OC, int lowp, wf_stream *s);
void wf__cuda32_matmul_backward_f32(float *dinp, float *dw, float *db, const void *dout,
                                    const void *inp, const void *w, int N, int C, int OC, int lowp,
                                    wf_stream *s);
void wf__cuda32_attention_forward(void *out, void *att, const void *qkv, int B, int T, int C,
                                  int NH, wf_stream *s);
void wf__cuda32_attention_backward(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                   const void *att, int B, int T, int C, int NH, wf_stream *s);
void wf__cuda32_gelu_forward(void *out, const void *inp, size_t N, wf_stream *s);
void wf__cuda32_gelu_backward(void *dinp, const void *inp, const void *dout, size_t N,
                              wf_stream *s);
void wf__cuda32_residual_forward(void *out, const void *a, const float *b, size_t N, wf_stream *s);
void wf__cuda32_xent_stats(float *mx, float *se, float *tl, const void *logits, const int *targets,
                           int N, int V, int ld, int v0, wf_stream *s);
void wf__cuda32_xent_backward(void *dlogits, const void *logits, const float *mx, const float *se,
                              const int *targets, float dloss, int N, int V, int ld, int v0,
                              wf_stream *s);
void wf__cuda32_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *w, float eps,
                                int N, int C, wf_stream *s);
void wf__cuda32_rmsnorm_backward(float *dinp, float *dw, const float *dout, const void *inp,
                                 const float *w, const float *rstd, int N, int C, wf_stream *s);
void wf__cuda32_residual_rmsnorm_forward(void *res, void *out, float *rstd, const void *a,
                                         const float *b, const float *w, float eps, int N, int C,
                                         wf_stream *s);
void wf__cuda32_rope_forward(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                             wf_stream *s);
void wf__cuda32_rope_backward(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                              wf_stream *s);
void wf__cuda32_swiglu_forward(void *out, const void *inp, int N, int F, wf_stream *s);
void wf__cuda32_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F,
                                wf_stream *s);
void wf__cuda32_attention_gqa_forward(void *out, void *att, const void *qkv, int B, int T, int C,
                                      int NH, int NKV, wf_stream *s);
void wf__cuda32_attention_gqa_backward(void *dqkv, float *scratch, const void *dout,
                                       const void *qkv, const void *att, int B, int T, int C,
                                       int NH, int NKV, wf_stream *s);
void wf__cuda32_store(void *dst, const float *src, size_t n, wf_stream *s);
void wf__cuda32_load(float *dst, const void *src, size_t n, wf_stream *s);
}

#endif /* WF_CUDA_INT_H */
