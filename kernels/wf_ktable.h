/*
 * wf_ktable.h - the kernel table: every op of the model as a function pointer, the same
 * for the CPU and the GPU.
 *
 * The CPU table (kernels/cpu/device.c) wraps the kernels of wf_kernels.h; the GPU table
 * lives in the dlopen()ed weft_cuda module (kernels/cuda/backend.cu) and holds their
 * CUDA twins. Code above the seam (the model, the parallel engines, the optimizer)
 * calls ops through the table of its wf_dev (wf_device.h) and never asks which one it
 * holds. Each entry has the CPU function's arguments plus a trailing stream (NULL: the
 * device's default stream); every pointer is memory of the table's device. Shapes and
 * semantics are exactly those of wf_kernels.h, including "backward adds into
 * gradients" and its exceptions (matmul's dinp, gelu's, swiglu's and attention's dqkv
 * are written).
 *
 * Storage formats. A device has one table per format its activations can be stored in
 * (storage.h: fp32, bf16, fp16); `storage(format)` gives the sibling table of another
 * format, and the model computes through the one of its precision. An argument typed
 * `void *` is an activation in the table's `format`: what a layer keeps for backward,
 * a GEMM's operands (its input, its weights from the model's 16-bit copy, the output
 * gradient it multiplies), the logits, and the input gradients that a GEMM or an
 * activation's backward reads next (matmul_backward's dinp, which GELU's, SwiGLU's and
 * attention's backward read as their dout; their own dinp and dqkv, which a GEMM's
 * backward reads), each the fp32 result rounded once, as PyTorch's autocast and llm.c
 * keep them. Everything else is fp32 in every table:
 * gradients that are accumulated, norm statistics, non-GEMM weights (norms' gains,
 * biases), the loss and the reductions' partial sums. A 16-bit table computes what the
 * fp32 table computes on the widened activations, in fp32, and rounds each activation
 * output to nearest even on store (storage.h); the fp32 table is the model at
 * precision no, unchanged. Entries that touch no activation are the same function in
 * every table.
 *
 * Launches are asynchronous on a GPU, so an op cannot return an error: each launcher
 * checks its launch (cudaGetLastError), logs a failure once with the kernel's name,
 * file and line, and keeps the first for last_error(), which the device reports at
 * the next wf_dev_check() (after every step, and before any result is read back).
 *
 * Ops that produce a scalar (loss_accumulate, sumsq_acc, tokens_check, checksum) write it into
 * device memory rather than returning it, so nothing here waits for the device; the
 * caller reads the scalar back through the device when it needs it.
 *
 * The table also answers what an implementation needs that its twin does not: how many
 * floats attention keeps between forward and backward and how much scratch its backward
 * takes (the CPU keeps the (T, T) probabilities, in the table's format; a flash-style
 * GPU kernel keeps one fp32 log-sum-exp per row), so the model sizes its buffers without
 * knowing which it holds.
 *
 * GEMMs take `lowp`, the precision their operands are representable in (a wf_precision):
 * in a 16-bit table its own format; in the fp32 table WF_PREC_NO, or BF16 / FP16 for
 * fp32 operands already rounded to that format (tests and benchmarks), which a GPU may
 * then multiply on 16-bit tensor cores: the same exact products, summed in another
 * order. Products always accumulate in fp32.
 * Fused ops (matmul_gelu_forward, residual_layernorm_forward, residual_rmsnorm_forward)
 * are defined as the composition of the unfused ones; the CPU computes exactly that
 * composition.
 */
#ifndef WF_KTABLE_H
#define WF_KTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "wf_gpu.h"
#include "wf_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bump when the table changes; the GPU module and the host must agree. */
#define WF_KTABLE_VERSION 13

/* Device memory the CUDA kernels keep per device besides what their callers allocate:
 * cuBLASLt's workspace (32 MiB) and the column reductions' partial sums (4 MiB),
 * allocated when the device is selected and counted with the rest (backend.cu). The
 * planner adds it to a GPU rank's memory; the CPU keeps none. */
#define WF_KTABLE_GPU_WORKSPACE ((size_t)36 << 20)

/* A stream of the device (a cudaStream_t on the GPU; the CPU has one, implicit). */
typedef struct wf_stream wf_stream;

typedef struct wf_ktable {
  int version; /* WF_KTABLE_VERSION */

  void (*encoder_forward)(float *out, const int *inp, const float *wte, const float *wpe, int B,
                          int T, int C, wf_stream *s);
  void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int *inp, int B,
                           int T, int C, wf_stream *s);
  void (*encoder_forward_vp)(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                             const float *wpe, int B, int T, int C, wf_stream *s);
  void (*encoder_backward_vp)(float *dwte, float *dwpe, const float *dout, const int *inp,
                              int v_offset, int Vl, int B, int T, int C, wf_stream *s);

  void (*layernorm_forward)(void *out, float *mean, float *rstd, const void *inp,
                            const float *weight, const float *bias, int N, int C, wf_stream *s);
  void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                             const void *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C, wf_stream *s);

  /* residual then layernorm: res = a + b (res may alias a), ln = layernorm(res); b is
   * fp32 (a branch's output after the tp reduction). */
  void (*residual_layernorm_forward)(void *res, void *ln, float *mean, float *rstd, const void *a,
                                     const float *b, const float *weight, const float *bias, int N,
                                     int C, wf_stream *s);

  /* In a 16-bit table the bias is rounded to the format before it is added (the value
   * the model's 16-bit weight copy holds, as llm.c and PyTorch's autocast add it, which
   * lets cuBLASLt's epilogue add it): out = round(sum + widen(round(bias))), one rounding
   * of the fp32 sum. matmul_gelu_forward's pre the same. */
  void (*matmul_forward)(void *out, const void *inp, const void *weight, const float *bias, int N,
                         int C, int OC, int lowp, wf_stream *s);
  /* The same product left in fp32, its fp32 bias added exactly: a row-parallel layer's
   * partial sums, which the tp reduction adds in fp32 before the residual stream stores
   * them. */
  void (*matmul_forward_f32)(float *out, const void *inp, const void *weight, const float *bias,
                             int N, int C, int OC, int lowp, wf_stream *s);
  /* pre = inp . weight^T + bias, gelu_out = gelu(pre) (the MLP's fc and its GELU). */
  void (*matmul_gelu_forward)(void *gelu_out, void *pre, const void *inp, const void *weight,
                              const float *bias, int N, int C, int OC, int lowp, wf_stream *s);
  /* dinp WRITTEN in the table's format: the output gradient of the activation before a
   * row-parallel layer (attention's, GELU's, SwiGLU's), which its backward reads as stored */
  void (*matmul_backward)(void *dinp, float *dweight, float *dbias, const void *dout,
                          const void *inp, const void *weight, int N, int C, int OC, int lowp,
                          wf_stream *s);
  /* The same with dinp WRITTEN in fp32: a column-parallel layer's input gradient, which the
   * tp reduction adds in fp32 before the norm's backward reads it. */
  void (*matmul_backward_f32)(float *dinp, float *dweight, float *dbias, const void *dout,
                              const void *inp, const void *weight, int N, int C, int OC, int lowp,
                              wf_stream *s);
  /* fp32 GEMMs (lowp = WF_PREC_NO) may use TF32 tensor cores: off unless allowed
   * (runtime.allow_tf32). Process-wide, like the math mode it sets. */
  void (*set_tf32)(int allow);

  /* Floats attention_forward keeps in `att` for backward, and floats of backward's
   * scratch, for a (B, T) batch of NH heads over C channels. */
  size_t (*attention_saved)(int B, int T, int C, int NH);
  size_t (*attention_scratch)(int B, int T, int C, int NH);
  /* Bytes of device memory the implementation keeps for itself per device (its
   * workspace, WF_KTABLE_GPU_WORKSPACE on a GPU, 0 on the CPU), counted with the rest
   * from the moment the device is selected. */
  size_t (*workspace_bytes)(void);
  void (*attention_forward)(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                            wf_stream *s);
  /* dqkv WRITTEN in the table's format (attention.h): the qkv GEMM's output gradient */
  void (*attention_backward)(void *dqkv, float *scratch, const void *dout, const void *qkv,
                             const void *att, int B, int T, int C, int NH, wf_stream *s);

  void (*gelu_forward)(void *out, const void *inp, size_t N, wf_stream *s);
  /* dinp WRITTEN in the table's format (gelu.h): the fc GEMM's output gradient */
  void (*gelu_backward)(void *dinp, const void *inp, const void *dout, size_t N, wf_stream *s);

  /* out = a + b; b is fp32 (a branch's output after the tp reduction) */
  void (*residual_forward)(void *out, const void *a, const float *b, size_t N, wf_stream *s);
  void (*residual_backward)(float *da, float *db, const float *dout, size_t N, wf_stream *s);

  void (*xent_stats)(float *row_max, float *row_sumexp, float *target_logit, const void *logits,
                     const int *targets, int N, int V, int ld, int v_offset, wf_stream *s);
  void (*xent_pack)(float *stats, const float *row_max, const float *row_sumexp,
                    const float *target_logit, int N, wf_stream *s);
  void (*xent_combine)(float *row_max, float *row_sumexp, float *target_logit, const float *all,
                       int N, int parts, wf_stream *s);
  void (*xent_loss)(float *losses, const float *row_max, const float *row_sumexp,
                    const float *target_logit, int N, wf_stream *s);
  void (*xent_backward)(void *dlogits, const void *logits, const float *row_max,
                        const float *row_sumexp, const int *targets, float dloss, int N, int V,
                        int ld, int v_offset, wf_stream *s);
  void (*loss_accumulate)(double *acc, const float *losses, int N, wf_stream *s);
  void (*tokens_check)(int *bad, const int *tokens, size_t n, int V, wf_stream *s);

  void (*adamw_update)(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int t,
                       float grad_scale, wf_stream *s);
  void (*sumsq_acc)(double *acc, const float *x, size_t n, wf_stream *s);
  void (*scale)(float *x, float f, size_t n, wf_stream *s);

  /* *out = the 64-bit checksum of x (n floats), negated when `negate` (checksum.h). */
  void (*checksum)(uint64_t *out, const float *x, size_t n, int negate, wf_stream *s);

  /* Mixed precision: dst = src rounded to the nearest bf16 / fp16 value (round.h). */
  void (*round_bf16)(float *dst, const float *src, size_t n, wf_stream *s);
  void (*round_fp16)(float *dst, const float *src, size_t n, wf_stream *s);

  /* The first launch or library error since the last call (then cleared): WF_OK or
   * WF_ECUDA (WF_ENOMEM: a CPU kernel's working rows). The error itself was logged where
   * it happened. */
  wf_status (*last_error)(void);

  /* ---- Llama's ops (rmsnorm.h, rope.h, swiglu.h, attention.h) ----
   * Activations (void *) in the table's format, as above, and so are the gradients
   * between a GEMM and an activation (the dout SwiGLU's and attention's backward read;
   * SwiGLU's dinp, attention's dqkv, which RoPE's backward maps in place); other
   * gradients, rstd and the RoPE table fp32. */
  void (*rmsnorm_forward)(void *out, float *rstd, const void *inp, const float *weight, float eps,
                          int N, int C, wf_stream *s);
  void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, wf_stream *s);
  /* residual then RMSNorm: res = a + b (res may alias a), out = rmsnorm(res); b is fp32
   * (a branch's output after the tp reduction). */
  void (*residual_rmsnorm_forward)(void *res, void *out, float *rstd, const void *a, const float *b,
                                   const float *weight, float eps, int N, int C, wf_stream *s);
  /* In place on the q and k heads of qkv; cs is the device copy of a wf_rope_table. */
  void (*rope_forward)(void *qkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                       wf_stream *s);
  void (*rope_backward)(void *dqkv, const float *cs, int B, int T, int NH, int NKV, int hs,
                        wf_stream *s);
  void (*swiglu_forward)(void *out, const void *inp, int N, int F, wf_stream *s);
  /* dinp WRITTEN in the table's format (swiglu.h): the gate/up GEMM's output gradient */
  void (*swiglu_backward)(void *dinp, const void *inp, const void *dout, int N, int F,
                          wf_stream *s);
  /* Grouped-query attention; attention_saved / attention_scratch size its buffers too,
   * and NKV == NH computes what attention_forward / attention_backward compute. */
  void (*attention_gqa_forward)(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                                int NKV, wf_stream *s);
  void (*attention_gqa_backward)(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                 const void *att, int B, int T, int C, int NH, int NKV,
                                 wf_stream *s);
  /* ---- Tensor-core attention and the fused classifier (docs/gpu-performance.md) ---- */

  /* How attention_forward / attention_backward (and attention_gqa_forward / _backward)
   * compute on this device, a
   * wf_attention_impl (wf_config.h): the GPU's fp32 entries run the fp32 reference
   * kernels (REFERENCE) or convert to bf16 and run the bf16 paths below (CUDNN, FLASH,
   * AUTO: cuDNN where it loads and accepts the shape, else the flash kernel where it
   * applies, else the reference), falling back with one log line per shape. Process-wide
   * like set_tf32, and set before attention_saved sizes the buffers (its answer depends
   * on it). The CPU has one implementation and ignores it. */
  void (*set_attention)(int impl);
  /* The implementation attention takes for this shape under the current setting:
   * WF_ATTN_CUDNN, WF_ATTN_FLASH or WF_ATTN_REFERENCE (the CPU: REFERENCE). On a GPU the
   * first call for a shape may build cuDNN's plans to find out (they are cached). */
  int (*attention_path)(int B, int T, int C, int NH, int NKV);
  /* Attention over bf16 tensors (attention_bf16.h): NKV kv heads (NKV == NH: multi-head),
   * lse (B,NH,T) kept from forward; backward WRITES dqkv. Scratch in floats. */
  void (*attention_bf16_forward)(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T, int C,
                                 int NH, int NKV, wf_stream *s);
  void (*attention_bf16_backward)(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                  const wf_bf16 *qkv, const wf_bf16 *out, const float *lse, int B,
                                  int T, int C, int NH, int NKV, wf_stream *s);
  size_t (*attention_bf16_scratch)(int B, int T, int C, int NH, int NKV);
  /* The fused classifier over bf16 logits (classifier.h). */
  void (*classifier_bf16)(wf_bf16 *logits, float *losses, const int *targets, float dloss, int N,
                          int V, int ld, wf_stream *s);
  void (*xent_stats_bf16)(float *row_max, float *row_sumexp, float *target_logit,
                          const wf_bf16 *logits, const int *targets, int N, int V, int ld,
                          int v_offset, wf_stream *s);
  void (*xent_backward_bf16)(wf_bf16 *dlogits, const wf_bf16 *logits, const float *row_max,
                             const float *row_sumexp, const int *targets, float dloss, int N, int V,
                             int ld, int v_offset, wf_stream *s);
  /* Kernel launches and library calls (cuBLASLt, cuDNN) issued since the module loaded,
   * for measuring launch overhead (bench); the CPU counts none. */
  uint64_t (*launches)(void);

  /* ---- storage formats (storage.h) ---- */
  int format; /* how this table's activation arguments are stored (a wf_precision) */
  /* The device's table for activations stored in `format`, or NULL when it has none. */
  const struct wf_ktable *(*storage)(int format);
  /* dst (n, this table's format) = src rounded; dst (n) = src widened (exact). In the
   * fp32 table both copy. */
  void (*store)(void *dst, const float *src, size_t n, wf_stream *s);
  void (*load)(float *dst, const void *src, size_t n, wf_stream *s);
  /* adamw_update, and low (n, this table's format) = the updated parameters as `store`
   * writes them, in the same pass (adamw.h's wf_adamw_update_store): mixed precision's
   * 16-bit copy of the weights written by the optimizer, bit for bit what adamw_update
   * then store give. low NULL: adamw_update alone. */
  void (*adamw_update_store)(float *params, void *low, float *m, float *v, const float *grads,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, int t, float grad_scale, wf_stream *s);
} wf_ktable;

/* The CUDA kernels of an open GPU, or NULL (no GPU, or a module built against another
 * version of this table). */
static inline const wf_ktable *wf_ktable_of_gpu(wf_gpu *g)
{
  const wf_ktable *k = (const wf_ktable *)wf_gpu_kernel_table(g);
  return k && k->version == WF_KTABLE_VERSION ? k : NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* WF_KTABLE_H */
