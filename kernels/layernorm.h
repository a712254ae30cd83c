/*
 * layernorm.h - layer normalisation.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/layernorm.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_LAYERNORM_H
#define WF_KERNELS_LAYERNORM_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* out (N,C), mean (N), rstd (N), inp (N,C), weight (C), bias (C); eps 1e-5.
 * mean and rstd may be NULL in the forward when no backward follows. */
void wf_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                          const float *weight, const float *bias, int N, int C);
/* dinp, dweight or dbias may be NULL (not wanted). */
void wf_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean,
                           const float *rstd, int N, int C);

/* The same with out and inp stored in 16-bit format fmt (storage.h): each row loaded,
 * normalised as above, stored rounded; mean, rstd and the gradients fp32. */
void wf_layernorm_forward16(void *out, float *mean, float *rstd, const void *inp,
                            const float *weight, const float *bias, int N, int C, int fmt);
void wf_layernorm_backward16(float *dinp, float *dweight, float *dbias, const float *dout,
                             const void *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C, int fmt);

/* ---- the op (wf_kreg.h): out, inp, res and a in the variant's element type ---- */
#define WF_OP_VERSION_layernorm 1
typedef struct wf_layernorm_op {
  void (*forward)(void *out, float *mean, float *rstd, const void *inp, const float *weight,
                  const float *bias, int N, int C, wf_stream *s);
  void (*backward)(float *dinp, float *dweight, float *dbias, const float *dout, const void *inp,
                   const float *weight, const float *mean, const float *rstd, int N, int C,
                   wf_stream *s);
  /* residual then layernorm: res = a + b (res may alias a), out = layernorm(res); b is fp32
   * (a branch's output after the tp reduction). Exactly the two ops in a row. */
  void (*residual_forward)(void *res, void *out, float *mean, float *rstd, const void *a,
                           const float *b, const float *weight, const float *bias, int N, int C,
                           wf_stream *s);
} wf_layernorm_op;

#endif /* WF_KERNELS_LAYERNORM_H */
