/*
 * optim_int.h - private to worker/optim: the optimizer's state.
 *
 * Error idiom: the worker's (WF_TRY / goto fail; errors logged where they arise).
 */
#ifndef WF_OPTIM_INT_H
#define WF_OPTIM_INT_H

#include "wf_check.h"
#include "wf_device.h"
#include "wf_optim.h"

struct wf_optim {
  const wf_config *cfg;
  wf_model *model;
  wf_dev *dev;
  size_t lo, hi;   /* the element range of the flat parameter vector held here */
  float *m, *v;    /* (hi - lo) AdamW moments, device memory */
  float *plo;      /* ZeRO-3: the parameter of element lo (the rank's shard); NULL = the model's */
  size_t lo2, hi2; /* a second range (wf_optim_opts), empty when none */
  float *m2, *v2, *plo2;
  const float *grads2;
  void *low; /* the model's 16-bit copy, written by the update (it covers the whole flat
              * vector), else NULL */
  int D;     /* dp size, for fp16's S / D */
  bool fp16; /* dynamic or fixed loss scaling */
  wf_optim_scaler ls;
};

/* scaler.c: fp16's reaction to an overflowed step (skip, halve) and to a finite one. */
wf_status wf__optim_skip(wf_optim *o, int step);
void wf__optim_good(wf_optim *o);

#endif /* WF_OPTIM_INT_H */
