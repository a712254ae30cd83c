/*
 * init.c - initialisation of a model or any slice of it, by each tensor's described rule.
 *
 * Every element is a pure function of (seed, tensor, layer, index in the full tensor):
 * the rule's normal from the counter-based RNG (stream tensor * 4096 + layer), ones or
 * zeros; the vocabulary's padding rows zero. So a shard initialises alone and equals
 * the same slice of the one-rank model. The values are made on the host (the RNG is the
 * host's, so every device starts from the same bits) in a view of the parameters, which
 * the device takes back.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model_int.h"
#include "wf_kernels.h" /* the thread budget */

/* From the description (resolved dims d). */
static void init_desc(float *dst, const wf_tensor_desc *t, int ti, int layer,
                      const wf_model_dims *d, uint64_t seed, size_t first, size_t n)
{
  switch (t->init) {
  case WF_INIT_ONES:
    for (size_t i = 0; i < n; i++)
      dst[i] = 1.0f;
    return;
  case WF_INIT_ZEROS: memset(dst, 0, n * sizeof *dst); return;
  default: break;
  }
  float std = t->std;
  if (t->init == WF_INIT_NORMAL_DEPTH)
    std = t->std / sqrtf(2.0f * (float)d->L);
  bool layered = t->place == WF_PLACE_LAYER;
  uint64_t stream = (uint64_t)ti * 4096 + (uint64_t)(layered ? layer : 0);
  size_t live = n;
  if (t->split == WF_SPLIT_VOCAB) { /* padding rows [V, Vp) stay zero */
    size_t real = (size_t)d->V * wf_tensor_cols(d, t);
    live = first >= real ? 0 : WF_MIN(n, real - first);
  }
  wf_rng_fill_normal(dst, live, std, seed, stream, first);
  memset(dst + live, 0, (n - live) * sizeof *dst);
}

void wf_model_init_slice(float *dst, int t, int layer, const wf_model_dims *dd, uint64_t seed,
                         size_t first, size_t n)
{
  wf_model_dims d = wf_model_dims_resolve(dd);
  wf_model_desc desc;
  d.fam->describe(&d, &desc);
  init_desc(dst, &desc.t[t], t, layer, &d, seed, first, n);
}

wf_status wf_model_init(wf_model *m, uint64_t seed)
{
  /* every element is a pure function of its full index: the whole local vector is the
   * range [0, n) of it */
  wf_status st = wf_model_init_range(m, seed, m->params, 0, m->num_params);
  return st == WF_OK ? wf_model_params_changed(m) : st;
}

/* ---- a range of the flat vector (ZeRO-3's shard) ------------------------------------ */

/* One piece of a range: n elements of tensor (t, layer) from index `first` of its full
 * layer, bound for dst. Pieces are at most CHUNK long, so the threads share them out. */
typedef struct piece {
  float *dst;
  int t, layer;
  size_t first, n;
} piece;

typedef struct ranged {
  const wf_model *m;
  float *dst; /* host view of [lo, hi) */
  size_t lo;
  piece *p; /* NULL: count only */
  size_t np;
  size_t off[WF_MAX_TENSORS], layer_n[WF_MAX_TENSORS]; /* each tensor in the whole model */
} ranged;

enum { CHUNK = 65536 };

/* A run inside [lo, hi), cut into pieces (wf_model_shard_runs_in's callback). */
static void range_run(void *user, const wf_model_run *r)
{
  ranged *x = user;
  size_t a = r->local, b = r->local + r->n;
  size_t base = x->off[r->tensor] + (size_t)r->layer * x->layer_n[r->tensor];
  for (size_t first = r->full - base; a < b;) {
    size_t n = WF_MIN((size_t)CHUNK, b - a);
    if (x->p)
      x->p[x->np] = (piece){x->dst + (a - x->lo), r->tensor, r->layer, first, n};
    x->np++, a += n, first += n;
  }
}

wf_status wf_model_init_range(wf_model *m, uint64_t seed, float *dst, size_t lo, size_t hi)
{
  wf_dev_view v;
  ranged x = {.m = m, .lo = lo};
  if (hi <= lo)
    return WF_OK;
  wf_status st = wf_dev_map(m->dev, &v, dst, (hi - lo) * sizeof(float), WF_MAP_WRITE);
  if (st != WF_OK)
    return st;
  x.dst = v.host;
  for (int t = 0; t < m->desc.n; t++) {
    x.off[t] = wf_model_tensor_offset(&m->d, t);
    x.layer_n[t] = wf_model_layer_numel(&m->d, t);
  }
  wf_model_shard_runs_in(&m->d, &m->s, lo, hi, range_run, &x); /* count */
  WF_CHECK_ALLOC(x.p = malloc((x.np ? x.np : 1) * sizeof *x.p));
  x.np = 0;
  wf_model_shard_runs_in(&m->d, &m->s, lo, hi, range_run, &x);
  const ranged *cx = &x;
#pragma omp parallel for schedule(dynamic, 1) num_threads(wf_kernels_threads()) if (x.np > 1)
  for (long i = 0; i < (long)cx->np; i++) {
    const piece *p = &cx->p[i];
    init_desc(p->dst, &cx->m->desc.t[p->t], p->t, p->layer, &cx->m->d, seed, p->first, p->n);
  }
fail:
  free(x.p);
  wf_status u = wf_dev_unmap(m->dev, &v);
  return st == WF_OK ? u : st;
}
