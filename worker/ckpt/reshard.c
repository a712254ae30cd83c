/*
 * reshard.c - a checkpoint saved on another tensor or pipeline layout, and export.
 *
 * The ranks share out the files; each adds the counted runs (wf_model_shard_runs: tp
 * rank 0's copy of replicated tensors, the first stage's tied embedding) of its files into
 * whole-model parameters and AdamW m and v on the host, a sum over the job assembles
 * them, and every rank copies out its slices (and its ZeRO-1 range) into its device.
 * That costs three whole-model float32 vectors per rank while loading, plus one shard
 * file's worth: fine at the sizes this trains, to be streamed per tensor for models
 * near a rank's memory. Export assembles the parameters alone, from the files, with no
 * model at all.
 */
#include <stdlib.h>
#include <string.h>

#include "ckpt_int.h"

static float *alloc_floats(uint64_t n, const char *what, const char *dir)
{
  float *p = n <= SIZE_MAX / sizeof(float) ? wf_mem_alloc((size_t)n * sizeof(float)) : NULL;
  if (!p)
    WF_ERROR("checkpoint %s: out of memory for %s (%llu floats)", dir, what, (unsigned long long)n);
  return p;
}

/* The whole model's file is read straight in: its bits, a -0.0 included, as --save
 * writes them on one rank. */
wf_status wf__add_model_file(const char *dir, const wf__manifest *m, const wf__entry *e,
                             float *full)
{
  if (wf__whole_geo(&e->geo))
    return wf__read_model(dir, e, &m->dims, full);
  float *buf = alloc_floats(e->hi, e->name, dir);
  wf_status st = buf ? wf__read_model(dir, e, &m->dims, buf) : WF_ENOMEM;
  if (st == WF_OK)
    wf_model_shard_exchange(&m->dims, &e->geo, buf, 0, e->hi, full, true);
  wf_mem_free(buf);
  return st;
}

/* Read and verify optimizer file e; add its counted m and v into fm and fv. */
static wf_status add_optim_file(const char *dir, const wf__manifest *m, const wf__entry *e,
                                float *fm, float *fv)
{
  const wf__entry *model = wf__find_model(m, e->pp, e->tp); /* the cover check: there is one */
  wf__span sp = {e->lo, e->hi, alloc_floats(e->hi - e->lo, e->name, dir), NULL};
  sp.v = sp.m ? alloc_floats(e->hi - e->lo, e->name, dir) : NULL;
  wf_status st = sp.v ? wf__verify_optim(dir, e, model->hi, &sp) : WF_ENOMEM;
  if (st == WF_OK) {
    wf_model_shard_exchange(&m->dims, &model->geo, sp.m, e->lo, e->hi, fm, true);
    wf_model_shard_exchange(&m->dims, &model->geo, sp.v, e->lo, e->hi, fv, true);
  }
  wf_mem_free(sp.m);
  wf_mem_free(sp.v);
  return st;
}

/* Whole-model parameters and AdamW m and v, assembled from every file of a checkpoint. */
typedef struct whole_state {
  float *x[3]; /* parameters, m, v: (n) each, the model's layout, host memory */
} whole_state;

/* Rank r reads and verifies files r, r + W, ...; every element has exactly one
 * contributor (the cover checks), so the sums over the job are exact. */
static wf_status assemble(const wf_ckpt_target *t, const wf__manifest *m, const char *dir,
                          whole_state *w)
{
  wf_status st = WF_OK;
  wf_comm *c = wf__ckpt_world(t);
  int W = wf__size_of(c);
  for (int i = 0; i < 3 && st == WF_OK; i++)
    st = (w->x[i] = alloc_floats(m->n, "the whole model", dir)) ? WF_OK : WF_ENOMEM;
  for (int i = wf__rank_of(c); st == WF_OK && i < m->n_files; i += W) {
    const wf__entry *e = &m->files[i];
    st = e->optim ? add_optim_file(dir, m, e, w->x[1], w->x[2])
                  : wf__add_model_file(dir, m, e, w->x[0]);
  }
  WF_TRY(wf__ckpt_agree(t, st, "reading the checkpoint's shards"));
  for (int i = 0; i < 3 && W > 1; i++)
    WF_TRY(wf_comm_allreduce(c, w->x[i], w->x[i], (size_t)m->n, WF_COMM_F32, WF_COMM_SUM));
fail:
  return st;
}

/* This rank's range [lo, hi) of a whole-model vector into device memory at `dev_p`. */
static wf_status slice_into(const wf_ckpt_target *t, float *dev_p, size_t lo, size_t hi,
                            float *full)
{
  wf_dev *dev = wf_model_dev(t->model);
  wf_model_shard g = wf__saved_geo(wf_model_get_shard(t->model));
  wf_dev_view v;
  wf_status st = wf_dev_map(dev, &v, dev_p, (hi - lo) * sizeof(float), WF_MAP_WRITE);
  if (st != WF_OK)
    return st;
  wf_model_shard_exchange(wf_model_get_dims(t->model), &g, v.host, lo, hi, full, false);
  return wf_dev_unmap(dev, &v);
}

wf_status wf__load_resharded(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK;
  whole_state w = {{NULL}};
  size_t lo, hi;
  float *mb, *vb;
  wf_optim_state(t->optim, &lo, &hi, &mb, &vb);
  WF_TRY(assemble(t, m, dir, &w));
  if (t->param_shard) /* ZeRO-3: its dp shard, the optimizer's range */
    WF_TRY(slice_into(t, t->param_shard, lo, hi, w.x[0]));
  else
    WF_TRY(wf_model_import_full(t->model, 0, w.x[0]));
  WF_TRY(slice_into(t, mb, lo, hi, w.x[1]));
  WF_TRY(slice_into(t, vb, lo, hi, w.x[2]));
fail:
  for (int i = 0; i < 3; i++)
    wf_mem_free(w.x[i]);
  return st;
}

wf_status wf__ckpt_model_dims(const char *dir, wf_model_dims *d)
{
  wf__manifest m = {0};
  wf_status st = wf__manifest_read(dir, &m, NULL);
  if (st == WF_OK)
    *d = m.dims;
  free(m.files);
  return st;
}

wf_status wf__ckpt_model_read(const char *dir, const wf_model_dims *d, float *full)
{
  wf_status st = WF_OK;
  wf__manifest m = {0};
  WF_TRY(wf__manifest_read(dir, &m, NULL));
  WF_CHECK(!memcmp(&m.dims, d, sizeof *d), WF_EFORMAT,
           "checkpoint %s: its model (L=%d NH=%d C=%d maxT=%d V=%d) is not the one expected (L=%d "
           "NH=%d C=%d maxT=%d V=%d)",
           dir, m.dims.L, m.dims.NH, m.dims.C, m.dims.maxT, m.dims.V, d->L, d->NH, d->C, d->maxT,
           d->V);
  WF_TRY(wf__check_model_cover(&m, dir));
  memset(full, 0, m.n * sizeof *full);
  for (int i = 0; i < m.n_files; i++) /* the shards add into zeros, as --save's assembly does */
    if (!m.files[i].optim)
      WF_TRY(wf__add_model_file(dir, &m, &m.files[i], full));
fail:
  free(m.files);
  return st;
}
