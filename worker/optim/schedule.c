/*
 * schedule.c - the learning-rate schedule: linear warm-up, then cosine decay to
 * train.min_lr at the last step. A pure function of (config, step), so a resumed run
 * continues the same curve.
 */
#include <math.h>

#include "optim_int.h"

double wf_optim_lr(const wf_config *cfg, int step)
{
  double lr = cfg->train.lr, lo = cfg->train.min_lr;
  int warm = cfg->train.warmup, n = cfg->train.steps;
  if (step <= warm)
    return lr * step / warm;
  if (n <= warm)
    return lr;
  double progress = (double)(step - warm) / (n - warm);
  return lo + 0.5 * (lr - lo) * (1.0 + cos(M_PI * progress));
}
