/*
 * rmsnorm.h - root-mean-square layer normalisation (Llama's norm).
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/rmsnorm.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_RMSNORM_H
#define WF_KERNELS_RMSNORM_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* RMSNorm as Hugging Face's LlamaRMSNorm computes it: per row,
 *     rstd = 1 / sqrt(mean(x^2) + eps),   out = weight * (x * rstd)
 * (no bias, no centring). The statistics are at least fp32 whatever the activations'
 * precision (the CPU sums squares in double, the GPU in fp32).
 * out (N,C), rstd (N) kept for backward (NULL when no backward follows), inp (N,C),
 * weight (C); eps > 0 (Llama: 1e-5 or 1e-6, config rms_norm_eps). out must not
 * overlap inp. */
void wf_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, float eps,
                        int N, int C);
/* With xhat = inp * rstd and g = dout * weight:
 *     dinp (N,C) += rstd * (g - xhat * mean(g * xhat))     (per row)
 *     dweight (C) += sum over rows of dout * xhat
 * Either output may be NULL (not wanted). rstd is the forward's. */
void wf_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, const float *rstd, int N, int C);

/* The same with inp and out stored in 16-bit format fmt (storage.h): the fp32 kernel on
 * the widened input, out rounded on store (kernels/cpu/rmsnorm.c). */
void wf_rmsnorm_forward16(void *out, float *rstd, const void *inp, const float *weight, float eps,
                          int N, int C, int fmt);
void wf_rmsnorm_backward16(float *dinp, float *dweight, const float *dout, const void *inp,
                           const float *weight, const float *rstd, int N, int C, int fmt);

/* ---- the op (wf_kreg.h): out, inp, res and a in the variant's element type ---- */
#define WF_OP_VERSION_rmsnorm 1
typedef struct wf_rmsnorm_op {
  void (*forward)(void *out, float *rstd, const void *inp, const float *weight, float eps, int N,
                  int C, wf_stream *s);
  void (*backward)(float *dinp, float *dweight, const float *dout, const void *inp,
                   const float *weight, const float *rstd, int N, int C, wf_stream *s);
  /* residual then RMSNorm: res = a + b (res may alias a), out = rmsnorm(res); b is fp32 (a
   * branch's output after the tp reduction). Exactly the two ops in a row. */
  void (*residual_forward)(void *res, void *out, float *rstd, const void *a, const float *b,
                           const float *weight, float eps, int N, int C, wf_stream *s);
} wf_rmsnorm_op;

#endif /* WF_KERNELS_RMSNORM_H */
