/*
 * scaler.c - fp16 dynamic loss scaling (see wf_optim.h): what a step does to the scale
 * S. An overflowed step is skipped (parameters, m, v and AdamW's t stay) and S halves;
 * after optim.loss_scale_window finite steps in a row S doubles. optim.loss_scale fixes
 * S instead (overflowed steps are still skipped).
 */
#include <math.h>

#include "optim_int.h"

double wf_optim_backward_scale(const wf_optim *o) { return o->fp16 ? o->ls.scale / o->D : 1.0; }

/* At S <= 1 no smaller scale can help: that is divergence, not overflow. */
wf_status wf__optim_skip(wf_optim *o, int step)
{
  double old = o->ls.scale;
  bool fixed = o->cfg->optim.loss_scale > 0;
  if (old <= 1.0) {
    WF_ERROR("step %d: gradients are not finite at loss scale %g: training diverged; lower "
             "train.lr or set optim.clip",
             step, old);
    return WF_EINVAL;
  }
  o->ls.skipped++;
  o->ls.good_steps = 0;
  if (!fixed)
    o->ls.scale = fmax(1.0, old / 2);
  if (wf_rt_rank() <= 0)
    WF_INFO("step %d: gradient overflow at loss scale %g: optimizer step skipped (%d so far), "
            "loss scale %s %g",
            step, old, o->ls.skipped, fixed ? "stays" : "now", o->ls.scale);
  return WF_OK;
}

/* Up to 2^64, far beyond where fp16 activation gradients overflow, which bounds it first. */
void wf__optim_good(wf_optim *o)
{
  if (!o->fp16 || o->cfg->optim.loss_scale > 0)
    return;
  if (++o->ls.good_steps < o->cfg->optim.loss_scale_window)
    return;
  o->ls.good_steps = 0;
  o->ls.scale = fmin(o->ls.scale * 2, 0x1p64);
}
