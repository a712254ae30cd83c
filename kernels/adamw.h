/*
 * adamw.h - the AdamW update.
 * Part of the kernels module; include wf_kernels.h, which states the conventions
 * (outputs first, backward adds into gradients, shape legend). The CPU code is
 * kernels/cpu/adamw.c; the CUDA twin has the same arguments plus a stream.
 */
#ifndef WF_KERNELS_ADAMW_H
#define WF_KERNELS_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "wf_kreg.h"

/* AdamW on n contiguous parameters, bias-corrected, step t >= 1.
 * g is multiplied by grad_scale first (gradient clipping / loss scaling).
 * p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p) */
void wf_adamw_update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int t,
                     float grad_scale);

/* wf_adamw_update, and low (n, format fmt: storage.h) = the updated parameters stored,
 * in the same pass (a block of parameters updated, then stored while in cache): mixed
 * precision's 16-bit copy of the weights written by the optimizer. Bit for bit
 * wf_adamw_update followed by wf_storage_store(low, params, n, fmt); fmt WF_PREC_NO
 * copies; low NULL updates only. */
void wf_adamw_update_store(float *params, void *low, float *m, float *v, const float *grads,
                           size_t n, float lr, float beta1, float beta2, float eps,
                           float weight_decay, int t, float grad_scale, int fmt);

/* ---- the op (wf_kreg.h): low in the variant's element type ---- */
#define WF_OP_VERSION_adamw 1
typedef struct wf_adamw_op {
  void (*update)(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                 float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale,
                 wf_stream *s);
  /* update, and low (n) = the updated parameters stored in the variant's element type, in
   * the same pass: mixed precision's 16-bit copy of the weights written by the optimizer,
   * bit for bit what update then cast's store give. low NULL: update alone. */
  void (*update_store)(float *params, void *low, float *m, float *v, const float *grads, size_t n,
                       float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                       float grad_scale, wf_stream *s);
} wf_adamw_op;

#endif /* WF_KERNELS_ADAMW_H */
