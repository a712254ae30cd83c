/*
 * init.c - GPT-2 initialisation of a model or any slice of it.
 *
 * Every element is a pure function of (seed, kind, layer, index in the full tensor):
 * normal std 0.02 (residual projections attprojw and fcprojw std 0.02/sqrt(2L)) from
 * the counter-based RNG, layernorm weights 1, biases 0, wte's padding rows 0. So a
 * shard initialises alone and equals the same slice of the one-rank model. The values
 * are made on the host (the RNG is the host's, so every device starts from the same
 * bits) in a view of the parameters, which the device takes back.
 */
#include <math.h>
#include <string.h>

#include "model_int.h"
#include "wf_kernels.h" /* the thread budget */

void wf_gpt_init_slice(float *dst, wf_param_kind k, int layer, const wf_gpt_dims *d, uint64_t seed,
                       size_t first, size_t n)
{
  switch (k) {
  case WF_P_LN1W:
  case WF_P_LN2W:
  case WF_P_LNFW:
    for (size_t i = 0; i < n; i++)
      dst[i] = 1.0f;
    return;
  case WF_P_LN1B:
  case WF_P_LN2B:
  case WF_P_LNFB:
  case WF_P_QKVB:
  case WF_P_ATTPROJB:
  case WF_P_FCB:
  case WF_P_FCPROJB: memset(dst, 0, n * sizeof *dst); return;
  default: break;
  }
  float std = 0.02f;
  if (k == WF_P_ATTPROJW || k == WF_P_FCPROJW)
    std = 0.02f / sqrtf(2.0f * (float)d->L);
  uint64_t stream = (uint64_t)k * 4096 + (uint64_t)(wf_gpt_kind_is_layered(k) ? layer : 0);
  size_t live = n;
  if (k == WF_P_WTE) { /* padding rows [V, Vp) stay zero */
    size_t real = (size_t)d->V * (size_t)d->C;
    live = first >= real ? 0 : WF_MIN(n, real - first);
  }
  wf_rng_fill_normal(dst, live, std, seed, stream, first);
  memset(dst + live, 0, (n - live) * sizeof *dst);
}

/* Initialise this rank's slice of tensor (k, layer), row by row of the local tensor
 * (each a contiguous run of the full tensor), spread over the kernels' thread budget;
 * each element is a pure function of its full index, so the result does not depend on
 * the split. */
static void init_tensor(wf_gpt *m, float *params, wf_param_kind k, int layer, uint64_t seed)
{
  /* the tensor in the host view `params` of the parameters */
  float *dst = params + (wf_gpt_param(m, k, layer, 0) - m->params);
  wf__geom g = wf__tensor_geom(&m->d, &m->s, k);
  const wf_gpt *cm = m;
  if (g.rows == 1) { /* one contiguous run: split it in chunks */
    enum { CHUNK = 65536 };
    long chunks = (long)((g.cols + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(dynamic, 1) num_threads(wf_kernels_threads()) if (chunks > 1)
    for (long c = 0; c < chunks; c++) {
      size_t first = (size_t)c * CHUNK;
      wf_gpt_init_slice(dst + first, k, layer, &cm->d, seed, first, WF_MIN(CHUNK, g.cols - first));
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(wf_kernels_threads()) if (g.rows > 64)
  for (long i = 0; i < (long)g.rows; i++)
    wf_gpt_init_slice(dst + (size_t)i * g.cols, k, layer, &cm->d, seed,
                      wf__full_index(&cm->d, &cm->s, k, &g, (size_t)i), g.cols);
}

wf_status wf_gpt_init(wf_gpt *m, uint64_t seed)
{
  wf_dev_view v;
  wf_status st = wf_dev_map(m->dev, &v, m->params, m->num_params * sizeof(float), WF_MAP_WRITE);
  if (st != WF_OK)
    return st;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    wf_param_kind kk = (wf_param_kind)k;
    if (!wf__kind_present(&m->s, kk))
      continue;
    if (!wf_gpt_kind_is_layered(kk))
      init_tensor(m, v.host, kk, 0, seed);
    else
      for (int i = 0; i < m->nl; i++)
        init_tensor(m, v.host, kk, wf__global_layer(m, i), seed);
  }
  st = wf_dev_unmap(m->dev, &v);
  return st == WF_OK ? wf_gpt_params_changed(m) : st;
}
