/*
 * attention_lse.cu - the attention_lse op on the GPU (attention_lse.h, twin of
 * kernels/cpu/attention_lse.c): causal attention over bf16 tensors keeping each row's
 * log-sum-exp, on runtime.attention's path for the shape (attention_impl.cu: cuDNN,
 * weft's flash kernels, or the fp32 reference on widened copies).
 */
#include "attn_int.h"

static void forward(void *out, float *lse, const void *qkv, int B, int T, int C, int NH, int NKV,
                    wf_stream *s)
{
  wf__attention_bf16_forward((wf_bf16 *)out, lse, (const wf_bf16 *)qkv, NULL, B, T, C, NH, NKV, s);
}

static void backward(void *dqkv, float *scratch, const void *dout, const void *qkv, const void *out,
                     const float *lse, int B, int T, int C, int NH, int NKV, wf_stream *s)
{
  wf__attention_bf16_backward((wf_bf16 *)dqkv, scratch, (const wf_bf16 *)dout, (const wf_bf16 *)qkv,
                              (const wf_bf16 *)out, lse, NULL, B, T, C, NH, NKV, s);
}

/* ---- the op (wf_kreg.h): bf16 only ---------------------------------------------------- */

static const wf_attention_lse_op bf16 = {forward, backward, wf__attention_bf16_scratch};
const wf_kvariants wf__cuda_attention_lse =
    WF_KV(attention_lse, WF_OP_VERSION_attention_lse, NULL, &bf16, NULL);
