/*
 * attention.h - causal multi-head self-attention.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/attention.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_ATTENTION_H
#define WF_KERNELS_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

/* Causal multi-head self-attention.
 * out (B,T,C), att (B,NH,T,T) softmax probabilities kept for backward,
 * qkv (B,T,3C): q = qkv[..., 0:C], k = [C:2C], v = [2C:3C], head h owns columns
 * [h*hs, (h+1)*hs) of each. Scale 1/sqrt(hs); NH divides C. att entries above the
 * diagonal are written as 0. */
void wf_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) accumulated; scratch (B,NH,T,T) is overwritten. */
void wf_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                           const float *att, int B, int T, int C, int NH);

/* The same with out, qkv and att stored in 16-bit format fmt (storage.h): each head's
 * q, k and v loaded, the fp32 kernel's computation, out and the probabilities att
 * (B,NH,T,T) stored rounded. Backward loads them and adds into dqkv (fp32) exactly what
 * the fp32 backward adds; its (T, T) scratch is this thread's (scratch unused). */
void wf_attention_forward16(void *out, void *att, const void *qkv, int B, int T, int C, int NH,
                            int fmt);
void wf_attention_backward16(float *dqkv, float *scratch, const float *dout, const void *qkv,
                             const void *att, int B, int T, int C, int NH, int fmt);

#endif /* WF_KERNELS_ATTENTION_H */
