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

/* AdamW on n contiguous parameters, bias-corrected, step t >= 1.
 * g is multiplied by grad_scale first (gradient clipping / loss scaling).
 * p -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * p) */
void wf_adamw_update(float *params, float *m, float *v, const float *grads, size_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int t,
                     float grad_scale);

#endif /* WF_KERNELS_ADAMW_H */
