/*
 * partition.c - the split of the layers into pipeline stages: as parallel.pp_layers
 * says, or balanced by cost (exact min-max over contiguous splits).
 */
#include <math.h>
#include <stdlib.h>

#include "parallel_int.h"

/* Forward FLOPs per token of a layer (the family's count: its matmuls and attention over
 * the full square), and of the head (the vocabulary matmul 2 C Vp; the final norm is
 * noise). The embedding is a lookup (~0). Backward is twice forward for all of them, so
 * forward costs rank the splits as whole steps do. */
static double layer_cost(const wf_model_dims *d, int T) { return wf_model_layer_flops(d, T); }

static wf_status fixed_split(int L, int pp, const int *pp_layers, int n, int *bounds)
{
  wf_status st = WF_OK;
  int sum = 0;
  for (int s = 0; s < n; s++) {
    WF_REFUSE(n == pp && pp_layers[s] >= 1, WF_ECONFIG,
              "parallel.pp_layers must give mesh.pp=%d counts of at least 1 layer each", pp);
    sum += pp_layers[s];
    bounds[s + 1] = sum;
  }
  WF_REFUSE(sum == L, WF_ECONFIG, "parallel.pp_layers covers %d layers, the model has %d", sum, L);
fail:
  return st;
}

wf_status wf_pipe_partition(const wf_model_dims *d, int T, int pp, const int *pp_layers, int n,
                            int *bounds)
{
  wf_status st = WF_OK;
  int L = d->L;
  WF_REFUSE(pp >= 1 && pp <= L, WF_ECONFIG,
            "cannot split %d layers into %d pipeline stages: every stage needs a layer", L, pp);
  bounds[0] = 0;
  if (n > 0)
    return fixed_split(L, pp, pp_layers, n, bounds);
  /* Exact min-max over contiguous splits: f[s][l] = cheapest most expensive stage when
   * stages 0..s-1 hold layers [0, l). O(pp L^2) on a few hundred layers at most. */
  double lc = layer_cost(d, T), head = 2.0 * d->C * d->Vp;
  size_t w = (size_t)L + 1;
  double *f = malloc((size_t)(pp + 1) * w * sizeof *f);
  int *from = malloc((size_t)(pp + 1) * w * sizeof *from);
  if (!f || !from) {
    free(f), free(from);
    WF_ERROR("out of memory splitting %d layers", L);
    return WF_ENOMEM;
  }
  for (size_t i = 0; i < (size_t)(pp + 1) * w; i++)
    f[i] = INFINITY, from[i] = -1;
  f[0] = 0;
  for (int s = 1; s <= pp; s++)
    for (int l = s; l <= L - (pp - s); l++)
      for (int k = s - 1; k < l; k++) {
        double c = (l - k) * lc + (s == pp ? head : 0);
        double v = fmax(f[(size_t)(s - 1) * w + k], c);
        if (v < f[(size_t)s * w + l]) /* strict: the first (lightest-early) split wins ties */
          f[(size_t)s * w + l] = v, from[(size_t)s * w + l] = k;
      }
  for (int s = pp, l = L; s > 0; s--) {
    bounds[s] = l;
    l = from[(size_t)s * w + l];
  }
  free(f), free(from);
fail:
  return st;
}

/* The interleaved schedule's chunks: stage s = c * pp + r holds layers
 * [s * Lc, (s + 1) * Lc), Lc = L / (pp * v) (validation checked the division). */
static wf_status interleaved_bounds(const wf_pipe_stage_opts *o, int *l0, int *l1)
{
  wf_status st = WF_OK;
  int lc = o->dims->L / (o->pp * o->v);
  WF_REFUSE(o->pp >= 2, WF_ECONFIG,
            "train.schedule=interleaved needs mesh.pp >= 2: with one pipeline rank there is "
            "nothing to interleave; use train.schedule=1f1b");
  WF_REFUSE(o->n_pp_layers == 0, WF_ECONFIG,
            "parallel.pp_layers does not apply to train.schedule=interleaved, whose chunks all "
            "hold model.layers / (mesh.pp x parallel.virtual_stages) layers; remove it");
  *l0 = o->rank * lc;
  *l1 = (o->rank + 1) * lc;
fail:
  return st;
}

wf_status wf_pipe_stage_shard(const wf_pipe_stage_opts *o, wf_model_shard *out)
{
  wf_status st = WF_OK;
  int bounds[WF_MAX_STAGES + 1], l0, l1, v = 1;
  if (o->kind == WF_SCHED_INTERLEAVED) {
    WF_TRY(interleaved_bounds(o, &l0, &l1));
    v = o->v;
  } else {
    WF_TRY(wf_pipe_partition(o->dims, o->T, o->pp, o->pp_layers, o->n_pp_layers, bounds));
    l0 = bounds[o->rank], l1 = bounds[o->rank + 1];
  }
  *out = (wf_model_shard){.tp = o->tp,
                          .tp_rank = o->tp_rank,
                          .ep = o->ep > 1 ? o->ep : 1,
                          .ep_rank = o->ep > 1 ? o->ep_rank : 0,
                          .sequence = o->sequence && o->tp > 1,
                          .l0 = l0,
                          .l1 = l1,
                          .chunks = v,
                          .chunk_stride = o->pp * (l1 - l0),
                          .first = o->rank == 0,
                          .last = o->rank == o->pp - 1};
fail:
  return st;
}
