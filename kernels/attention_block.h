/*
 * attention_block.h - attention of a block of query rows against a block of key/value
 * rows that returns (forward) and takes (backward) the rows' log-sum-exp, and the merge
 * of partial outputs by it: what context parallelism's ring attention is built from
 * (worker/parallel/cp.c). Part of the kernels module; include wf_kernels.h, which states
 * the conventions. The CPU code is kernels/cpu/attention_block.c, the CUDA twin
 * kernels/cuda/attention_block.cu.
 *
 * A block pairs Tq query rows with Tk key/value rows. Either every query row sees every
 * key (a block of earlier positions), or the block is causal: Tq == Tk, both at the same
 * positions, and row i sees keys 0..i. Query head h reads kv head h / (NH / NKV)
 * (grouped-query attention; NKV == NH is multi-head). Scale 1/sqrt(hs).
 *
 * For row i of head h the block returns o_i = sum_j p_ij v_j with p_ij = exp(s_ij -
 * lse_i), s_ij = q_i . k_j / sqrt(hs), and lse_i = log sum_j exp(s_ij). Two blocks over
 * disjoint keys merge exactly into the attention over their union:
 *   lse = log(exp(lse_a) + exp(lse_b)),  o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b,
 * so the ring's blocks, in any order, give what one rank computes over all the keys.
 * Backward takes the final lse and D_i = dout_i . o_i (wf_attention_block_delta), after
 * which every block's gradients are independent: p_ij = exp(s_ij - lse_i), dp = dout .
 * v^T, ds = p (dp - D), dq += ds k / sqrt(hs), dk += ds^T q / sqrt(hs), dv += p^T dout.
 *
 * Layout: q, kv, out and dout are row-major with explicit element strides (a row, a
 * batch), so a block is a window of a larger buffer without a copy. q holds head h at
 * columns [h hs, (h+1) hs); kv holds the k heads then the v heads: k head j at [j hs,
 * (j+1) hs), v head j at [(NKV + j) hs, ...), so only kv heads travel between ranks. q,
 * kv and dout are in storage format fmt (storage.h); out, lse, D and every gradient are
 * fp32 (gradients are accumulated over the ring's blocks). lse and D are (B, NH, rows):
 * row i of head h of batch b at b l_batch + h l_head + i.
 */
#ifndef WF_KERNELS_ATTENTION_BLOCK_H
#define WF_KERNELS_ATTENTION_BLOCK_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_kreg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct wf_attn_block {
  int B, Tq, Tk;           /* batch, query rows, key/value rows */
  int NH, NKV, hs;         /* query heads, kv heads (dividing NH), head size */
  bool causal;             /* Tq == Tk at the same positions: row i sees keys <= i */
  size_t q_row, q_batch;   /* strides of q */
  size_t kv_row, kv_batch; /* of kv (and dkv) */
  size_t o_row, o_batch;   /* of out, dout and dq */
  size_t l_head, l_batch;  /* of lse and D */
  int fmt;                 /* storage format of q, kv, dout (and delta's out) */
} wf_attn_block;

/* out (fp32) and lse of the block's query rows, WRITTEN. */
void wf_attention_block_forward(float *out, float *lse, const void *q, const void *kv,
                                const wf_attn_block *g);
/* acc, acc_lse: the rows' attention so far (fp32; lse -inf where no key was seen yet)
 * merged with a block's out, lse over other keys (same strides), in place. */
void wf_attention_block_merge(float *acc, float *acc_lse, const float *out, const float *lse,
                              const wf_attn_block *g);
/* D (B, NH, Tq) = rowsum(dout * out) per head, WRITTEN; out and dout in fmt, both with
 * the o strides. */
void wf_attention_block_delta(float *D, const void *dout, const void *out, const wf_attn_block *g);
/* dq (o strides, fp32) and dkv (kv strides, fp32) ADDED to: the block's share of the
 * gradients, from the final lse and D. */
void wf_attention_block_backward(float *dq, float *dkv, const void *dout, const void *q,
                                 const void *kv, const float *lse, const float *D,
                                 const wf_attn_block *g);

/* Moving between the packed qkv rows the attention layers keep ((rows, C + KW), q then
 * the kv heads, KW = 2 NKV hs) and the block layout: kv (rows, KW) = qkv's kv columns
 * (copied in fmt); dqkv's rows (fmt) = [dq | dkv] (fp32, (rows, C) and (rows, KW))
 * rounded to fmt. */
void wf_attention_kv_extract(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt);
void wf_attention_grad_pack(void *dqkv, const float *dq, const float *dkv, size_t rows, int C,
                            int KW, int fmt);
/* dst (n) += src (n), fp32: a block's dk, dv added into the sum travelling the ring. */
void wf_attention_grad_add(float *dst, const float *src, size_t n);

/* ---- the op (wf_kreg.h): the storage format travels in the arguments (g->fmt, fmt), so
 * a device registers one table for every element type ---- */
#define WF_OP_VERSION_attention_block 1
typedef struct wf_attention_block_op {
  void (*forward)(float *out, float *lse, const void *q, const void *kv, const wf_attn_block *g,
                  wf_stream *s);
  void (*merge)(float *acc, float *acc_lse, const float *out, const float *lse,
                const wf_attn_block *g, wf_stream *s);
  void (*delta)(float *D, const void *dout, const void *out, const wf_attn_block *g, wf_stream *s);
  void (*backward)(float *dq, float *dkv, const void *dout, const void *q, const void *kv,
                   const float *lse, const float *D, const wf_attn_block *g, wf_stream *s);
  void (*kv_extract)(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt, wf_stream *s);
  void (*grad_pack)(void *dqkv, const float *dq, const float *dkv, size_t rows, int C, int KW,
                    int fmt, wf_stream *s);
  void (*grad_add)(float *dst, const float *src, size_t n, wf_stream *s);
} wf_attention_block_op;

#ifdef __cplusplus
}
#endif

#endif /* WF_KERNELS_ATTENTION_BLOCK_H */
