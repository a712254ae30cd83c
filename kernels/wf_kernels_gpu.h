/*
 * wf_kernels_gpu.h - the CUDA twins of the kernels in wf_kernels.h, as seen from
 * host code.
 *
 * The launchers live in the GPU module (libweft_cuda.so, kernels/cuda/), which is
 * loaded at run time, so host code reaches them through this table rather than by
 * linking. Each entry has the CPU function's arguments plus a trailing stream
 * (a cudaStream_t; NULL is the default stream). All pointers are device pointers.
 * Shapes and semantics are exactly those of wf_kernels.h, including "backward
 * adds into gradients".
 *
 * Launches are asynchronous, so a launcher cannot return an error the way a CPU
 * kernel cannot: each checks its launch with cudaGetLastError, logs a failure
 * once with file and line, and keeps the first one for last_error(). Callers
 * check last_error() at a convenient point (after a step, say). sumsq is the one
 * launcher that synchronises its stream, because it returns a host value.
 *
 * Usage:
 *     const wf_gpu_kernels *k = wf_gpu_kernels_get(gpu);
 *     k->matmul_forward(out, inp, w, b, N, C, OC, stream);
 *     ...
 *     if (k->last_error() != WF_OK) ...
 */
#ifndef WF_KERNELS_GPU_H
#define WF_KERNELS_GPU_H

#include <stddef.h>

#include "wf_gpu.h"
#include "wf_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bump when the table changes; the module and the host must agree. */
#define WF_GPU_KERNELS_VERSION 3

typedef struct wf_gpu_kernels {
  int version; /* WF_GPU_KERNELS_VERSION */

  void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C, void *stream);
  void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C, void *stream);
  void (*encoder_forward_vp)(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                             const float *wpe, int B, int T, int C, void *stream);
  void (*encoder_backward_vp)(float *dwte, float *dwpe, const float *dout, const int *inp,
                              int v_offset, int Vl, int B, int T, int C, void *stream);

  void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C, void *stream);
  void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C, void *stream);

  void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC, void *stream);
  void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC,
                          void *stream);

  void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                            void *stream);
  void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float *att, int B, int T, int C, int NH, void *stream);

  void (*gelu_forward)(float *out, const float *inp, size_t N, void *stream);
  void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t N, void *stream);

  void (*residual_forward)(float *out, const float *a, const float *b, size_t N, void *stream);
  void (*residual_backward)(float *da, float *db, const float *dout, size_t N, void *stream);

  void (*xent_stats)(float *row_max, float *row_sumexp, float *target_logit, const float *logits,
                     const int *targets, int N, int V, int ld, int v_offset, void *stream);
  void (*xent_loss)(float *losses, const float *row_max, const float *row_sumexp,
                    const float *target_logit, int N, void *stream);
  void (*xent_backward)(float *dlogits, const float *logits, const float *row_max,
                        const float *row_sumexp, const int *targets, float dloss, int N, int V,
                        int ld, int v_offset, void *stream);

  void (*adamw_update)(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t,
                       float grad_scale, void *stream);

  /* Synchronises `stream` and returns the sum (NaN if a launch failed). */
  double (*sumsq)(const float *x, size_t n, void *stream);
  void (*scale)(float *x, float s, size_t n, void *stream);

  /* Mixed precision: dst = src rounded to the nearest bf16 / fp16 value (round.h). */
  void (*round_bf16)(float *dst, const float *src, size_t n, void *stream);
  void (*round_fp16)(float *dst, const float *src, size_t n, void *stream);

  /* The first launch or cuBLAS error since the last call (then cleared):
   * WF_OK or WF_ECUDA. The error itself was logged where it happened. */
  wf_status (*last_error)(void);
} wf_gpu_kernels;

/* The launchers of an open GPU, or NULL (no GPU, or a module built against
 * another version of this table). */
static inline const wf_gpu_kernels *wf_gpu_kernels_get(wf_gpu *g)
{
  const wf_gpu_kernels *k = (const wf_gpu_kernels *)wf_gpu_kernel_table(g);
  return k && k->version == WF_GPU_KERNELS_VERSION ? k : NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_GPU_H */
