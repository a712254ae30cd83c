/*
 * encoder.h - token + position embedding.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/encoder.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_ENCODER_H
#define WF_KERNELS_ENCODER_H

#include <stddef.h>
#include <stdint.h>

/* out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
 * out (B,T,C), inp (B,T), wte (V,C), wpe (maxT,C) */
void wf_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B,
                        int T, int C);
/* dwte (V,C) and dwpe (maxT,C) accumulated; either may be NULL. Tokens in [0, V). */
void wf_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T,
                         int C);

/* Vocabulary-parallel embedding (tensor parallelism over the vocabulary): this rank
 * holds rows [v_offset, v_offset + Vl) of wte, and `wte` points at local row 0.
 * out[b,t,:] = (v_offset <= inp[b,t] < v_offset + Vl ? wte[inp[b,t] - v_offset,:] : 0)
 *            + (wpe ? wpe[t,:] : 0)
 * Summing out over all ranks of the vocabulary split (wpe given on exactly one of
 * them) gives wf_encoder_forward exactly, since each element then has at most two
 * nonzero terms. With v_offset = 0, Vl = V and wpe given it is wf_encoder_forward.
 * out (B,T,C), inp (B,T), wte (Vl,C), wpe (maxT,C) or NULL */
void wf_encoder_forward_vp(float *out, const int *inp, const float *wte, int v_offset, int Vl,
                           const float *wpe, int B, int T, int C);
/* dwte (Vl,C): the rows of tokens in [v_offset, v_offset + Vl) accumulate dout; other
 * tokens touch nothing. dwpe (maxT,C) accumulated. Either may be NULL. */
void wf_encoder_backward_vp(float *dwte, float *dwpe, const float *dout, const int *inp,
                            int v_offset, int Vl, int B, int T, int C);

#endif /* WF_KERNELS_ENCODER_H */
