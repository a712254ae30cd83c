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

/* Initialise this rank's slice of tensor (t, layer), row by row of the local tensor
 * (each a contiguous run of the full tensor), spread over the kernels' thread budget;
 * each element is a pure function of its full index, so the result does not depend on
 * the split. */
static void init_tensor(wf_model *m, float *params, int t, int layer, uint64_t seed)
{
  /* the tensor in the host view `params` of the parameters */
  float *dst = params + (wf_model_param(m, t, layer, 0) - m->params);
  const wf_tensor_desc *td = &m->desc.t[t];
  wf__geom g = wf__tensor_geom(&m->d, td, &m->s);
  const wf_model *cm = m;
  if (g.rows == 1) { /* one contiguous run: split it in chunks */
    enum { CHUNK = 65536 };
    long chunks = (long)((g.cols + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(dynamic, 1) num_threads(wf_kernels_threads()) if (chunks > 1)
    for (long c = 0; c < chunks; c++) {
      size_t first = (size_t)c * CHUNK;
      init_desc(dst + first, td, t, layer, &cm->d, seed, first, WF_MIN(CHUNK, g.cols - first));
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(wf_kernels_threads()) if (g.rows > 64)
  for (long i = 0; i < (long)g.rows; i++)
    init_desc(dst + (size_t)i * g.cols, td, t, layer, &cm->d, seed,
              wf__full_index(&cm->d, td, &cm->s, &g, (size_t)i), g.cols);
}

wf_status wf_model_init(wf_model *m, uint64_t seed)
{
  wf_dev_view v;
  wf_status st = wf_dev_map(m->dev, &v, m->params, m->num_params * sizeof(float), WF_MAP_WRITE);
  if (st != WF_OK)
    return st;
  for (int t = 0; t < m->desc.n; t++) {
    const wf_tensor_desc *td = &m->desc.t[t];
    if (!wf__tensor_present(td, &m->s))
      continue;
    if (td->place != WF_PLACE_LAYER)
      init_tensor(m, v.host, t, 0, seed);
    else
      for (int i = 0; i < m->nl; i++)
        init_tensor(m, v.host, t, wf__global_layer(m, i), seed);
  }
  st = wf_dev_unmap(m->dev, &v);
  return st == WF_OK ? wf_model_params_changed(m) : st;
}
