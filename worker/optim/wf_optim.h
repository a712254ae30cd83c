/*
 * wf_optim.h - the optimizer: AdamW's state and update, gradient clipping, fp16 loss
 * scaling and the learning-rate schedule. It is the one owner of optimizer state: the
 * model holds parameters and gradients only.
 *
 * A rank's optimizer holds AdamW's m and v for one element range [lo, hi) of its flat
 * parameter vector (wf_model_params' layout): the whole vector, or, under ZeRO, the dp
 * shard the gradient path reduces onto this rank (under ZeRO-3 the parameters of that
 * range live in the gradient path's shard, wf_optim_opts.params). A step is
 *
 *   norm (the global gradient norm, from the gradient path)
 *     -> fp16: non-finite anywhere? skip the update, halve the scale
 *     -> clip factor clip / max(norm, clip), times 1/S under fp16 (unscaling)
 *     -> AdamW at t = step - skipped steps, with the scheduled learning rate,
 *        weight decay on the 2-D weights only.
 *
 * fp16 dynamic loss scaling (Megatron's and apex's): the loss gradient is multiplied by
 * S so that small activation gradients survive fp16's range. Each dp rank's backward
 * takes its loss over its 1/D of the batch and the dp average divides by D afterwards,
 * so its activation gradients are D times one rank's: it scales by S / D (exact for a
 * power-of-two D), and every mesh overflows exactly where one rank would. After
 * optim.loss_scale_window finite steps in a row S doubles.
 *
 * The state lives on the model's device; checkpoints read and restore it through
 * wf_optim_state (device pointers) and the scaler's fields.
 */
#ifndef WF_OPTIM_H
#define WF_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_config.h"
#include "wf_model.h"
#include "wf_runtime.h"

typedef struct wf_optim wf_optim;

/* precision=fp16 dynamic loss scaling's state: AdamW's step t is the training step
 * minus `skipped`. */
typedef struct wf_optim_scaler {
  double scale;   /* the loss scale S of the next step (1 without fp16) */
  int good_steps; /* consecutive finite steps since S last changed */
  int skipped;    /* optimizer steps skipped so far (non-finite gradients) */
} wf_optim_scaler;

typedef struct wf_optim_opts {
  const wf_config *cfg; /* optim.* and train.lr / warmup / min_lr / steps, precision */
  wf_model *model;      /* the parameters it updates (borrowed) */
  size_t lo, hi;        /* the element range whose state this rank holds */
  int dp_size;          /* D, for fp16's backward scale S / D */
  float *params;        /* ZeRO-3: where parameter lo lives (hi - lo floats, the rank's
                         * shard); NULL = the model's flat vector */
  /* A second range [lo2, hi2) (empty: none): under ZeRO with expert parallelism the
   * experts' edp shard beside the dense tensors' dp shard, its gradient at grads2 (its
   * reduction's shard, fixed for the run) and under ZeRO-3 its parameters at params2 */
  size_t lo2, hi2;
  const float *grads2;
  float *params2;
} wf_optim_opts;

wf_status wf_optim_create(wf_optim **out, const wf_optim_opts *o);
void wf_optim_destroy(wf_optim *o); /* accepts NULL */

/* Learning rate of step (1-based): linear warm-up over train.warmup steps, then cosine
 * decay from train.lr to train.min_lr, reached at the last step. */
double wf_optim_lr(const wf_config *cfg, int step);

/* The factor this rank's backward multiplies the loss gradient by: S / D under fp16,
 * else 1. Gradients come out scaled by it; wf_optim_step unscales. */
double wf_optim_backward_scale(const wf_optim *o);

/* The outcome of one step. */
typedef struct wf_optim_step_info {
  double lr;    /* the learning rate of this step */
  double scale; /* the loss scale this step's backward used (NAN without fp16) */
  bool skipped; /* fp16: the gradients overflowed, so no update was made */
} wf_optim_step_info;

/* One step with the global gradient norm `norm` (already unscaled, see the gradient
 * path): grads points at the gradient of element lo (device memory, hi - lo floats).
 * Updates the parameters [lo, hi) of the model on its device. A non-finite loss or norm
 * outside fp16's skipping is an error (the run diverged), logged with the step. */
wf_status wf_optim_step(wf_optim *o, int step, double loss, float norm, const float *grads,
                        wf_optim_step_info *info);

/* The state, for checkpoints: the (first) range, AdamW's m and v (device memory, hi - lo
 * floats each), and the loss scaler (its scale is 1 without fp16). */
void wf_optim_state(wf_optim *o, size_t *lo, size_t *hi, float **m, float **v);
wf_optim_scaler *wf_optim_get_scaler(wf_optim *o);
/* Bytes of optimizer state this rank holds; and what a rank holding the range [lo, hi)
 * holds (AdamW's m and v, as wf_optim_create allocates them; the planner's figure). */
size_t wf_optim_bytes(const wf_optim *o);
/* Whether a step's update also writes the model's 16-bit copy of the parameters
 * (wf_model_params_low: mixed precision, the optimizer holding the whole flat vector),
 * so that no wf_model_params_changed pass need follow it. */
bool wf_optim_writes_low(const wf_optim *o);
size_t wf_optim_mem_plan(size_t lo, size_t hi);

#endif /* WF_OPTIM_H */
