/*
 * attention_block_ops.c - the block attention ops (attention_block.h) as a device's
 * table: the CPU's wraps kernels/cpu/attention_block.c (the stream is ignored: CPU
 * kernels finish before they return). Devices without the ops answer NULL.
 */
#include "attention_block.h"
#include "wf_device.h"

static void fwd(float *out, float *lse, const void *q, const void *kv, const wf_attn_block *g,
                wf_stream *s)
{
  (void)s;
  wf_attention_block_forward(out, lse, q, kv, g);
}

static void merge(float *acc, float *acc_lse, const float *out, const float *lse,
                  const wf_attn_block *g, wf_stream *s)
{
  (void)s;
  wf_attention_block_merge(acc, acc_lse, out, lse, g);
}

static void delta(float *D, const void *dout, const void *out, const wf_attn_block *g, wf_stream *s)
{
  (void)s;
  wf_attention_block_delta(D, dout, out, g);
}

static void bwd(float *dq, float *dkv, const void *dout, const void *q, const void *kv,
                const float *lse, const float *D, const wf_attn_block *g, wf_stream *s)
{
  (void)s;
  wf_attention_block_backward(dq, dkv, dout, q, kv, lse, D, g);
}

static void extract(void *kv, const void *qkv, size_t rows, int C, int KW, int fmt, wf_stream *s)
{
  (void)s;
  wf_attention_kv_extract(kv, qkv, rows, C, KW, fmt);
}

static void pack(void *dqkv, const float *dq, const float *dkv, size_t rows, int C, int KW, int fmt,
                 wf_stream *s)
{
  (void)s;
  wf_attention_grad_pack(dqkv, dq, dkv, rows, C, KW, fmt);
}

static void add(float *dst, const float *src, size_t n, wf_stream *s)
{
  (void)s;
  wf_attention_grad_add(dst, src, n);
}

static const wf_attn_block_ops cpu_ops = {
    .version = WF_ATTN_BLOCK_OPS_VERSION,
    .forward = fwd,
    .merge = merge,
    .delta = delta,
    .backward = bwd,
    .kv_extract = extract,
    .grad_pack = pack,
    .grad_add = add,
};

const wf_attn_block_ops *wf_attn_block_ops_of(const wf_dev *d)
{
  return d == wf_dev_cpu() ? &cpu_ops : NULL;
}
