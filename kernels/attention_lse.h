/*
 * attention_lse.h - causal self-attention with bf16 tensors: what tensor cores compute
 * (cuDNN's fused attention, weft's own flash kernel in kernels/cuda/flash_bf16.cu).
 * Part of the kernels module; include wf_kernels.h, which states the conventions. The
 * CPU code is kernels/cpu/attention_lse.c; the CUDA twin has the same arguments plus a
 * stream.
 *
 * Layout (grouped-query attention, as attention.h's GQA form): NH query heads share
 * NKV key/value heads, NKV dividing NH (NKV == NH is multi-head attention); query head
 * h reads kv head h / (NH / NKV). hs = C / NH. qkv (B,T,C + 2 NKV hs) holds the q heads,
 * then the k heads, then the v heads, head j of each part at [j*hs, (j+1)*hs). out and
 * dout (B,T,C); lse (B,NH,T) fp32: the natural log of each row's sum of exp(scores),
 * the scores being q.k / sqrt(hs) (the same convention as flash.cu's fp32 kernels and
 * cuDNN's softmax statistics).
 *
 * Precision, defined by what the CPU computes (the GPU kernels round at the same
 * points, summing in another order):
 *  - forward: scores s = q.k scale and their softmax in fp32 from the exact bf16
 *    inputs; with m the row's max and l = sum_j exp(s_j - m) (fp32), the output is
 *    o = sum_j bf16(exp(s_j - m)) v_j / l, stored rounded to bf16; lse = m + log l.
 *  - backward: p = exp(s - lse) in fp32; D = sum_d dout . out (bf16 values, fp32 sum);
 *    dp = dout . v; ds = p (dp - D); dv = sum bf16(p) dout, dq = scale sum bf16(ds) k,
 *    dk = scale sum bf16(ds) q, each summed in fp32 and stored rounded to bf16.
 *
 * Unlike the fp32 kernels, the backward WRITES dqkv (all of it, including the rows
 * of any kv head no query reads: none exist when NKV divides NH): a 16-bit gradient is
 * never an accumulator (FlashAttention and cuDNN write too); whoever needs a sum adds
 * the result into an fp32 buffer.
 */
#ifndef WF_KERNELS_ATTENTION_LSE_H
#define WF_KERNELS_ATTENTION_LSE_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

#include "bf16.h"

/* out (B,T,C), lse (B,NH,T); qkv (B,T,C + 2 NKV hs). */
void wf_attention_bf16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T, int C,
                               int NH, int NKV);
/* dqkv (B,T,C + 2 NKV hs) written; scratch: wf_attention_bf16_scratch floats, overwritten;
 * dout, out (B,T,C); lse (B,NH,T) from the forward. */
void wf_attention_bf16_backward(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                const wf_bf16 *qkv, const wf_bf16 *out, const float *lse, int B,
                                int T, int C, int NH, int NKV);
/* Floats of the CPU backward's scratch: D (B,NH,T) and fp32 accumulators for dqkv. */
size_t wf_attention_bf16_scratch(int B, int T, int C, int NH, int NKV);

/* ---- the op (wf_kreg.h): bf16 only (what tensor cores compute) ---- */
#define WF_OP_VERSION_attention_lse 1
typedef struct wf_attention_lse_op {
  void (*forward)(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int NKV,
                  wf_stream *s);
  void (*backward)(void *dqkv, float *scratch, const void *dout, const void *qkv, const void *out,
                   const float *lse, int B, int T, int C, int NH, int NKV, wf_stream *s);
  /* floats of backward's scratch */
  size_t (*scratch)(int B, int T, int C, int NH, int NKV);
} wf_attention_lse_op;

#endif /* WF_KERNELS_ATTENTION_LSE_H */
