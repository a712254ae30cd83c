/*
 * attn_int.h - private to the weft_cuda module: the pieces of attention that
 * attention_impl.cu (the table's entries and the choice among implementations) calls.
 *
 *  - flash_bf16.cu: weft's FlashAttention-2-style kernels (head sizes 64 and 128);
 *  - cudnn_sdpa.cu: cuDNN's fused attention through its graph API, cuDNN loaded with
 *    dlopen at the first use;
 *  - flash.cu / attention.cu: the fp32 reference kernels (wf_cuda_attention_*).
 *
 * All take the layout of attention_bf16.h: qkv (B,T,C + 2 NKV hs) bf16, out (B,T,C),
 * lse (B,NH,T) fp32 in the same convention everywhere (natural log, scaled scores), so
 * any forward pairs with any backward.
 */
#ifndef WF_CUDA_ATTN_INT_H
#define WF_CUDA_ATTN_INT_H

#include "cuda_int.h"

/* Where the bf16 output O (B,T,C) lies inside a saved buffer `att` that
 * wf_cuda_attn_saved sized for head sizes up to 128: after the lse (B,NH,T), 64-byte
 * aligned. */
wf_bf16 *wf__attn_saved_out(float *att, int B, int T, int NH);

/* Compute capability major of the current device; 0 when it cannot be read. */
int wf__cuda_cc_major(void);

/* Whether the flash kernels take this shape; if not, `why` says why. */
bool wf__flash16_applies(int B, int T, int C, int NH, int NKV, char *why, size_t len);
/* out, lse from qkv. */
void wf__flash16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T, int C, int NH,
                         int NKV, cudaStream_t s);
/* dqkv written; D is (B,NH,T) floats of scratch. */
void wf__flash16_backward(wf_bf16 *dqkv, float *D, const wf_bf16 *dout, const wf_bf16 *qkv,
                          const wf_bf16 *out, const float *lse, int B, int T, int C, int NH,
                          int NKV, cudaStream_t s);

/* Whether cuDNN loads and builds both plans (forward and backward) for this shape; the
 * plans are cached, so a later call is a lookup. If not, `why` says why (the library
 * missing, its version, a refused graph). */
bool wf__cudnn_sdpa_accepts(int B, int T, int C, int NH, int NKV, char *why, size_t len);
/* Run the cached plans (wf__cudnn_sdpa_accepts said yes for the shape). cuDNN's own
 * workspace comes from the stream-ordered pool. */
void wf__cudnn_sdpa_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, int B, int T, int C,
                            int NH, int NKV, cudaStream_t s);
void wf__cudnn_sdpa_backward(wf_bf16 *dqkv, const wf_bf16 *dout, const wf_bf16 *qkv,
                             const wf_bf16 *out, const float *lse, int B, int T, int C, int NH,
                             int NKV, cudaStream_t s);
/* Release the handles and plans (the module's last fini). */
void wf__cudnn_sdpa_release(void);

#endif /* WF_CUDA_ATTN_INT_H */
