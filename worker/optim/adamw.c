/*
 * adamw.c - the optimizer's state and step: AdamW over the element range [lo, hi) of
 * the flat parameter vector, kind by kind, so weight decay follows each tensor's kind
 * (2-D weights decay; biases and layernorms do not).
 *
 * Invariant: AdamW's t counts the updates made (step - skipped), so a run with skipped
 * fp16 steps and its resumed continuation take the same steps.
 */
#include <math.h>
#include <stdlib.h>

#include "optim_int.h"
#include "storage.h" /* wf_storage_size */

wf_status wf_optim_create(wf_optim **out, const wf_optim_opts *oo)
{
  wf_status st = WF_OK;
  wf_optim *o = NULL;
  const wf_config *cfg = oo->cfg;
  *out = NULL;
  WF_CHECK(oo->lo <= oo->hi && oo->hi <= wf_model_local_params(oo->model), WF_EINVAL,
           "optimizer range [%zu, %zu) outside the %zu parameters", oo->lo, oo->hi,
           wf_model_local_params(oo->model));
  WF_CHECK_ALLOC(o = calloc(1, sizeof *o));
  o->cfg = cfg;
  o->model = oo->model;
  o->dev = wf_model_dev(oo->model);
  o->lo = oo->lo, o->hi = oo->hi;
  o->plo = oo->params;
  /* Updating every parameter of the model's own vector, the update writes the 16-bit
   * copy too; on a shard (ZeRO) the copy follows the all-gather instead. */
  if (!o->plo && o->lo == 0 && o->hi == wf_model_local_params(oo->model))
    o->low = wf_model_params_low(oo->model);
  o->D = oo->dp_size > 0 ? oo->dp_size : 1;
  o->fp16 = cfg->precision == WF_PREC_FP16;
  /* a fixed optim.loss_scale, or the dynamic one's start (a resumed checkpoint
   * restores its own) */
  o->ls.scale = !o->fp16                    ? 1.0
                : cfg->optim.loss_scale > 0 ? cfg->optim.loss_scale
                                            : cfg->optim.loss_scale_init;
  WF_TRY(wf_dev_alloc_floats(o->dev, &o->m, o->hi - o->lo));
  WF_TRY(wf_dev_alloc_floats(o->dev, &o->v, o->hi - o->lo));
  o->lo2 = oo->lo2, o->hi2 = oo->hi2, o->plo2 = oo->params2, o->grads2 = oo->grads2;
  WF_CHECK(o->lo2 <= o->hi2 && o->hi2 <= wf_model_local_params(oo->model) &&
               (o->hi2 == o->lo2 || (o->grads2 && !o->low)),
           WF_EINVAL, "optimizer's second range [%zu, %zu) outside the %zu parameters", o->lo2,
           o->hi2, wf_model_local_params(oo->model));
  WF_TRY(wf_dev_alloc_floats(o->dev, &o->m2, o->hi2 - o->lo2));
  WF_TRY(wf_dev_alloc_floats(o->dev, &o->v2, o->hi2 - o->lo2));
  *out = o;
  return WF_OK;
fail:
  wf_optim_destroy(o);
  return st;
}

void wf_optim_destroy(wf_optim *o)
{
  if (!o)
    return;
  wf_dev_free(o->dev, o->m);
  wf_dev_free(o->dev, o->v);
  wf_dev_free(o->dev, o->m2);
  wf_dev_free(o->dev, o->v2);
  free(o);
}

void wf_optim_state(wf_optim *o, size_t *lo, size_t *hi, float **m, float **v)
{
  *lo = o->lo, *hi = o->hi, *m = o->m, *v = o->v;
}

wf_optim_scaler *wf_optim_get_scaler(wf_optim *o) { return &o->ls; }
size_t wf_optim_mem_plan(size_t lo, size_t hi) { return 2 * (hi - lo) * sizeof(float); }

size_t wf_optim_bytes(const wf_optim *o)
{
  return wf_optim_mem_plan(o->lo, o->hi) + wf_optim_mem_plan(o->lo2, o->hi2);
}

/* One range of the state: [lo, hi), its parameters (plo, or the model's), moments and
 * gradients. */
typedef struct range {
  size_t lo, hi;
  float *plo, *m, *v;
  const float *grads;
} range;

/* AdamW at step t over a range, gradients multiplied by grad_scale first; with the
 * model's 16-bit copy (o->low) the same kernel stores the updated parameters into it
 * (the format's table). */
static void adamw(wf_optim *o, const range *r, float lr, float grad_scale, int step)
{
  const wf_config *cfg = o->cfg;
  const wf_kset *k = wf_dev_kernels(o->dev, WF_DT_F32);
  /* the format's table: with o->low its 16-bit copy written in the same pass, else
   * (fp32, or a copy refreshed after the gather) adamw_update alone */
  const wf_kset *kl = wf_kset_as(k, (int)wf_model_precision(o->model));
  float b1 = (float)cfg->optim.beta1, b2 = (float)cfg->optim.beta2, eps = (float)cfg->optim.eps;
  const wf_model_desc *desc = wf_model_get_desc(o->model);
  for (int t = 0; t < desc->n; t++) {
    size_t off = wf_model_local_offset(o->model, t);
    size_t a = WF_MAX(r->lo, off);
    size_t b = WF_MIN(r->hi, off + wf_model_local_numel(o->model, t));
    if (a >= b)
      continue;
    float wd = desc->t[t].decay ? (float)cfg->optim.weight_decay : 0.0f;
    float *p = r->plo ? r->plo + (a - r->lo) : wf_model_params(o->model) + a;
    void *low = o->low ? (char *)o->low + a * wf_storage_size(kl->dt) : NULL;
    WF_K(kl, adamw)->update_store(p, low, r->m + (a - r->lo), r->v + (a - r->lo),
                                  r->grads + (a - r->lo), b - a, lr, b1, b2, eps, wd, step,
                                  grad_scale, NULL);
  }
}

/* Clip by the global norm (and unscale by 1/S in the same factor), AdamW at step t. */
static wf_status update(wf_optim *o, int step, float norm, const float *grads, double lr)
{
  float clip = (float)o->cfg->optim.clip;
  float scale = clip > 0 && norm > clip ? clip / norm : 1.0f;
  if (o->fp16)
    scale = (float)(scale / wf_optim_backward_scale(o));
  int t = step - o->ls.skipped; /* AdamW counts the updates it made */
  wf__optim_good(o);
  range first = {o->lo, o->hi, o->plo, o->m, o->v, grads};
  range second = {o->lo2, o->hi2, o->plo2, o->m2, o->v2, o->grads2};
  adamw(o, &first, (float)lr, scale, t);
  if (second.hi > second.lo)
    adamw(o, &second, (float)lr, scale, t);
  return wf_dev_check(o->dev);
}

bool wf_optim_writes_low(const wf_optim *o) { return o->low != NULL; }

wf_status wf_optim_step(wf_optim *o, int step, double loss, float norm, const float *grads,
                        wf_optim_step_info *info)
{
  info->scale = o->fp16 ? o->ls.scale : NAN;
  info->lr = wf_optim_lr(o->cfg, step);
  /* fp16 overflow anywhere in the job: the norm sums every counted gradient's square
   * over dp, tp and pp, so one inf or NaN makes it non-finite on every rank alike. */
  info->skipped = o->fp16 && !isfinite(norm);
  if (info->skipped)
    return wf__optim_skip(o, step);
  if (!isfinite(loss) || !isfinite(norm)) {
    WF_ERROR("step %d: loss %g, gradient norm %g: training diverged; lower train.lr or set "
             "optim.clip",
             step, loss, (double)norm);
    return WF_EINVAL;
  }
  return update(o, step, norm, grads, info->lr);
}
