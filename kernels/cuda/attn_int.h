/*
 * attn_int.h - private to the weft_cuda module: the pieces of attention that
 * attention_impl.cu (the choice among implementations) calls, and the entries it gives
 * the attention and attention_lse ops (attention.cu, attention_lse.cu).
 *
 *  - flash_bf16.cu: weft's FlashAttention-2-style kernels (head sizes 64 and 128);
 *  - cudnn_sdpa.cu: cuDNN's fused attention through its graph API, cuDNN loaded with
 *    dlopen at the first use;
 *  - flash.cu / attention_tt.cu: the fp32 reference kernels (wf__attn32_*).
 *
 * All take the layout of attention_lse.h: qkv (B,T,C + 2 NKV hs) bf16, out (B,T,C),
 * lse (B,NH,T) fp32 in the same convention everywhere (natural log, scaled scores), so
 * any forward pairs with any backward; and the document starts of attention.h, (B,T) in
 * device memory or NULL, which every implementation keeps to (cuDNN's graphs with one
 * more mask: a shape whose masked graph it refuses runs the flash kernels).
 */
#ifndef WF_CUDA_ATTN_INT_H
#define WF_CUDA_ATTN_INT_H

#include "cuda_int.h"

/* Where the bf16 output O (B,T,C) lies inside a saved buffer `att` that
 * wf_cuda_attn_saved sized for head sizes up to 128: after the lse (B,NH,T), 64-byte
 * aligned. */
wf_bf16 *wf__attn_saved_out(float *att, int B, int T, int NH);

/* The fp32 reference (flash.cu: a flash-style kernel keeping each row's lse up to head
 * size 128, attention_tt.cu's (T, T) kernels above): floats of the saved state and of
 * backward's scratch, forward, and backward writing dqkv. */
size_t wf__attn32_saved(int B, int T, int C, int NH);
size_t wf__attn32_scratch(int B, int T, int C, int NH);
void wf__attn32_forward(float *out, float *att, const float *qkv, const int *starts, int B, int T,
                        int C, int NH, int NKV, wf_stream *stream);
void wf__attn32_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                         const float *att, const int *starts, int B, int T, int C, int NH, int NKV,
                         wf_stream *stream);

/* attention_impl.cu: runtime.attention's setting, the path a shape takes under it, and
 * the attention op's fp32 entries (the path on bf16 copies, or the reference); `att`'s
 * size and backward's scratch for any setting. */
void wf__attention_set_impl(int impl);
int wf__attention_path(int B, int T, int C, int NH, int NKV);
size_t wf__attn_saved(int B, int T, int C, int NH);
size_t wf__attn_scratch(int B, int T, int C, int NH);
void wf__attn_forward(float *out, float *att, const float *qkv, const int *starts, int B, int T,
                      int C, int NH, int NKV, wf_stream *stream);
void wf__attn_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                       const float *att, const int *starts, int B, int T, int C, int NH, int NKV,
                       wf_stream *stream);
/* The bf16 path on bf16 operands (attention_lse.h): forward, backward writing dqkv, and
 * backward's scratch in floats. */
void wf__attention_bf16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts,
                                int B, int T, int C, int NH, int NKV, wf_stream *stream);
void wf__attention_bf16_backward(wf_bf16 *dqkv, float *scratch, const wf_bf16 *dout,
                                 const wf_bf16 *qkv, const wf_bf16 *out, const float *lse,
                                 const int *starts, int B, int T, int C, int NH, int NKV,
                                 wf_stream *stream);
size_t wf__attention_bf16_scratch(int B, int T, int C, int NH, int NKV);

/* Compute capability major of the current device; 0 when it cannot be read. */
int wf__cuda_cc_major(void);

/* Whether the flash kernels take this shape; if not, `why` says why. */
bool wf__flash16_applies(int B, int T, int C, int NH, int NKV, char *why, size_t len);
/* out, lse from qkv. */
void wf__flash16_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts, int B,
                         int T, int C, int NH, int NKV, cudaStream_t s);
/* dqkv written; D is (B,NH,T) floats of scratch. */
void wf__flash16_backward(wf_bf16 *dqkv, float *D, const wf_bf16 *dout, const wf_bf16 *qkv,
                          const wf_bf16 *out, const float *lse, const int *starts, int B, int T,
                          int C, int NH, int NKV, cudaStream_t s);

/* Whether cuDNN loads and builds both plans (forward and backward) for this shape, with
 * the document mask when docs; the plans are cached, so a later call is a lookup. If not,
 * `why` says why (the library missing, its version, a refused graph). */
bool wf__cudnn_sdpa_accepts(int B, int T, int C, int NH, int NKV, bool docs, char *why, size_t len);
/* Run the cached plans (wf__cudnn_sdpa_accepts said yes for the shape, with docs when
 * starts). cuDNN's own workspace comes from the stream-ordered pool. */
void wf__cudnn_sdpa_forward(wf_bf16 *out, float *lse, const wf_bf16 *qkv, const int *starts, int B,
                            int T, int C, int NH, int NKV, cudaStream_t s);
void wf__cudnn_sdpa_backward(wf_bf16 *dqkv, const wf_bf16 *dout, const wf_bf16 *qkv,
                             const wf_bf16 *out, const float *lse, const int *starts, int B, int T,
                             int C, int NH, int NKV, cudaStream_t s);
/* Release the handles and plans (the module's last fini). */
void wf__cudnn_sdpa_release(void);

#endif /* WF_CUDA_ATTN_INT_H */
