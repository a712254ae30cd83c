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

#endif /* WF_KERNELS_ENCODER_H */
