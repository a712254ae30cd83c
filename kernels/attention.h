/*
 * attention.h - causal multi-head and grouped-query self-attention.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/attention.c; the CUDA twin has the same arguments plus a stream.
 *
 * Documents: packed rows hold several documents one after another (data.document_mask),
 * and starts (B,T) says where the document of each position begins in its row: query t
 * of row b attends to keys [starts[b,t], t] only. starts[b,t] <= t, and along a row it
 * stays or jumps to t (starts[b,t] is starts[b,t-1] or t): kernels may skip key blocks
 * before a query block's first start. NULL is one sequence per row (every start 0), the
 * plain causal attention, computed as it always was.
 */
#ifndef WF_KERNELS_ATTENTION_H
#define WF_KERNELS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* Causal multi-head self-attention.
 * out (B,T,C), att (B,NH,T,T) softmax probabilities kept for backward,
 * qkv (B,T,3C): q = qkv[..., 0:C], k = [C:2C], v = [2C:3C], head h owns columns
 * [h*hs, (h+1)*hs) of each. Scale 1/sqrt(hs); NH divides C. att entries above the
 * diagonal are written as 0. */
void wf_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) WRITTEN (it feeds only the qkv GEMM's backward, through RoPE's
 * in-place map for Llama: wf_kernels.h); scratch (B,NH,T,T) is overwritten. */
void wf_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH);

/* The same with out, qkv and att stored in 16-bit format fmt (storage.h): each head's
 * q, k and v loaded, the fp32 kernel's computation, out and the probabilities att
 * (B,NH,T,T) stored rounded. Backward loads them and dout (stored in fmt by the output
 * projection's backward), computes dqkv in fp32 exactly as the
 * fp32 backward does (a kv head's dk and dv summed over its query heads in head order)
 * and writes it in fmt, rounded (the form the qkv GEMM's backward reads; the GPU's
 * tensor-core attention writes it so too); its (T, T) scratch is this thread's (scratch
 * unused). */
void wf_attention_forward16(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                            int fmt);
void wf_attention_backward16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                             const void *att, int B, int T, int C, int NH, int fmt);
/* Grouped-query attention (Llama): NH query heads share NKV key/value heads, NKV
 * dividing NH; query head h reads kv head h / (NH / NKV). C = NH * hs is the width of
 * q and of out; qkv (B,T,C + 2 NKV hs) holds the q heads, then the k heads, then the
 * v heads: q = [0,C), k = [C, C + NKV hs), v = [C + NKV hs, C + 2 NKV hs), head j of
 * each at [j*hs, (j+1)*hs) of its part. Under tensor parallelism NH, NKV and C are the
 * rank's own (kv heads split with their query groups). out (B,T,C), att as in
 * wf_attention_forward ((B,NH,T,T): one softmax per query head). Scale 1/sqrt(hs).
 * With NKV == NH this is wf_attention_forward, which calls it: the same floats in the
 * same order, bit for bit. The table's attention_saved / attention_scratch size the
 * buffers of both (they depend on the query heads only). */
void wf_attention_gqa_forward(float *out, float *att, const float *qkv, const int *starts, int B,
                              int T, int C, int NH, int NKV);
/* dqkv (B,T,C + 2 NKV hs) WRITTEN: dk and dv of a kv head sum over its NH / NKV query
 * heads (in head order, from zero); scratch (B,NH,T,T) is overwritten. */
void wf_attention_gqa_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *att, const int *starts, int B, int T, int C, int NH,
                               int NKV);

/* Grouped-query attention with out, qkv and att stored in 16-bit format fmt, as the
 * multi-head 16-bit forms above (which call these with NKV = NH). */
void wf_attention_gqa_forward16(void *out, void *att, const void *qkv, const int *starts, int B,
                                int T, int C, int NH, int NKV, int fmt);
void wf_attention_gqa_backward16(void *dqkv, float *scratch, const void *dout, const void *qkv,
                                 const void *att, const int *starts, int B, int T, int C, int NH,
                                 int NKV, int fmt);

/* ---- the op (wf_kreg.h) ----
 * Grouped-query causal attention (NKV == NH: multi-head) as wf_attention_gqa_*: out, qkv,
 * dout, dqkv and what forward keeps in `att` in the variant's element type, scratch fp32.
 * dqkv is WRITTEN: the qkv GEMM's output gradient (through RoPE's in-place map). starts
 * (B,T) in device memory, or NULL (the documents above). Version 2: starts. */
#define WF_OP_VERSION_attention 2
typedef struct wf_attention_op {
  /* Floats forward keeps in `att` for backward, and floats of backward's scratch, for a
   * (B, T) batch of NH query heads over C channels (the CPU keeps the (T, T)
   * probabilities; a flash-style GPU kernel one log-sum-exp per row), so the model sizes
   * its buffers without knowing which it holds. */
  size_t (*saved)(int B, int T, int C, int NH);
  size_t (*scratch)(int B, int T, int C, int NH);
  void (*forward)(void *out, void *att, const void *qkv, const int *starts, int B, int T, int C,
                  int NH, int NKV, wf_stream *s);
  void (*backward)(void *dqkv, float *scratch, const void *dout, const void *qkv, const void *att,
                   const int *starts, int B, int T, int C, int NH, int NKV, wf_stream *s);
  /* How attention computes on this device, a wf_attention_impl (wf_config.h): a GPU's
   * fp32 variant runs the fp32 reference kernels (REFERENCE) or converts to bf16 and runs
   * attention_lse's paths (CUDNN, FLASH; AUTO: cuDNN where it loads and accepts the shape,
   * else the flash kernel where it applies, else the reference), falling back with one log
   * line per shape. Process-wide, and set before `saved` sizes the buffers (its answer
   * depends on it). The CPU has one implementation and ignores it. */
  void (*set_impl)(int impl);
  /* The implementation this shape takes under the current setting: WF_ATTN_CUDNN,
   * WF_ATTN_FLASH or WF_ATTN_REFERENCE (the CPU: REFERENCE). On a GPU the first call for a
   * shape may build cuDNN's plans to find out (they are cached). */
  int (*path)(int B, int T, int C, int NH, int NKV);
} wf_attention_op;

#endif /* WF_KERNELS_ATTENTION_H */
