/*
 * reshard.c - a checkpoint saved on another tensor or pipeline layout, a weft checkpoint
 * as model.init, and export.
 *
 * Resharding maps through the whole model's layout without holding it: a rank's runs
 * (wf_model_shard_runs) inside what it restores (its parameters, its ZeRO range of AdamW
 * m and v) are matched, by their place in the whole model, with each saved file's
 * counted runs (tp rank 0's copy of replicated tensors, the first stage's tied
 * embedding); the matches are copies out of that file. Rank r of W streams files r,
 * r + W, ... past in bounded chunks, every byte hashed against the manifest (each file
 * verified once over the job, as before), keeping what it needs of them, and reads just
 * its elements of the others: its own state plus a read chunk, never a whole-model
 * vector. Export assembles the parameters alone, from the files, with no model at all.
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

static int cmp_copy(const void *a, const void *b)
{
  uint64_t x = ((const wf__copy *)a)->off, y = ((const wf__copy *)b)->off;
  return (x > y) - (x < y);
}

/* The runs of shard g (dims d) inside [lo, hi), sorted; false when out of memory. */
static bool collect(wf__runs *s, const wf_model_dims *d, const wf_model_shard *g, uint64_t lo,
                    uint64_t hi, bool counted)
{
  *s = (wf__runs){0};
  bool ok = wf__runs_add(s, d, g, lo, hi, counted);
  wf__runs_sort(s);
  return ok;
}

/* Where a match lands: dst holds the wanted shard's local elements from dst_lo; the
 * saved elements from `base` sit in the file's data from byte `at`. */
typedef struct sink {
  char *dst;
  uint64_t dst_lo, base, at;
} sink;

/* Append the copies where `want`'s runs and the saved runs `have` hold the same whole-model
 * elements (both sorted) to c; returns the new count (c has room for the sum of both). */
static size_t match(const wf__runs *want, const wf__runs *have, const sink *k, wf__copy *c,
                    size_t nc)
{
  for (size_t i = 0, j = 0; i < want->len && j < have->len;) {
    uint64_t wa = want->r[i].full, wb = wa + want->r[i].n;
    uint64_t ha = have->r[j].full, hb = ha + have->r[j].n;
    uint64_t a = WF_MAX(wa, ha), b = WF_MIN(wb, hb);
    if (a < b)
      c[nc++] = (wf__copy){k->at + 4 * (have->r[j].local + (a - ha) - k->base), 4 * (b - a),
                           k->dst + 4 * (want->r[i].local + (a - wa) - k->dst_lo)};
    if (wb <= hb)
      i++;
    else
      j++;
  }
  return nc;
}

/* What a rank restores: its parameters' and its optimizer range's runs, into host
 * views (p from local element plo; m and v from lo). */
typedef struct wanted {
  wf__runs params, optim;
  float *p, *m, *v;
  uint64_t plo, lo;
} wanted;

/* The copies of file e (saved on m's mesh) that fill w, sorted; *c is allocated. */
static wf_status copies_of(const wf__manifest *m, const wf__entry *e, const wanted *w, wf__copy **c,
                           size_t *nc, const char *dir)
{
  const wf__entry *model = e->optim ? wf__find_model(m, e->pp, e->tp) : e;
  wf__runs have;
  uint64_t lo = e->optim ? e->lo : 0, hi = e->hi;
  const wf__runs *want = e->optim ? &w->optim : &w->params;
  bool ok = collect(&have, &m->dims, &model->geo, lo, hi, true);
  *nc = 0;
  *c = ok ? malloc((want->len + have.len + 1) * 2 * sizeof **c) : NULL;
  if (*c && !e->optim)
    *nc = match(want, &have, &(sink){(char *)w->p, w->plo, 0, 0}, *c, 0);
  else if (*c) { /* m's part of the file, then v's */
    *nc = match(want, &have, &(sink){(char *)w->m, w->lo, lo, 0}, *c, 0);
    *nc = match(want, &have, &(sink){(char *)w->v, w->lo, lo, 4 * (hi - lo)}, *c, *nc);
  }
  free(have.r);
  if (!*c) {
    WF_ERROR("checkpoint %s: out of memory mapping %s", dir, e->name);
    return WF_ENOMEM;
  }
  qsort(*c, *nc, sizeof **c, cmp_copy);
  return WF_OK;
}

/* File e's part of w: the whole file streamed past and verified, or (another rank
 * verifies it) the part alone read, when there is any. */
static wf_status read_part(const wf__manifest *m, const wf__entry *e, const wanted *w,
                           const char *dir, bool verify)
{
  wf__copy *c = NULL;
  size_t nc = 0;
  wf_status st = copies_of(m, e, w, &c, &nc, dir);
  if (st == WF_OK && verify)
    st = e->optim ? wf__read_optim_copies(dir, e, wf__find_model(m, e->pp, e->tp)->hi, c, nc)
                  : wf__read_model_copies(dir, e, &m->dims, c, nc);
  else if (st == WF_OK && nc)
    st = wf__read_copies(dir, e, &m->dims, c, nc);
  free(c);
  return st;
}

/* Rank `me` of W verifies files me, me + W, ... (each once over the job, its error said
 * once) and reads its part of the others. */
static wf_status read_wanted(const wf__manifest *m, const wanted *w, const char *dir, bool optim,
                             int me, int W)
{
  wf_status st = WF_OK;
  for (int i = 0; st == WF_OK && i < m->n_files; i++)
    if (optim || !m->files[i].optim)
      st = read_part(m, &m->files[i], w, dir, i % W == me);
  return st;
}

static wf_status map_views(wf_dev *dev, wf_dev_view v[3], float *const at[3], const size_t n[3])
{
  wf_status st = WF_OK;
  for (int i = 0; st == WF_OK && i < 3; i++)
    st = wf_dev_map(dev, &v[i], at[i], n[i] * sizeof(float), WF_MAP_WRITE);
  return st;
}

wf_status wf__load_resharded(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK, u;
  wf_dev *dev = wf_model_dev(t->model);
  const wf_model_dims *d = wf_model_get_dims(t->model);
  wf_model_shard g = wf__saved_geo(wf_model_get_shard(t->model));
  size_t lo, hi;
  float *mb, *vb;
  wf_optim_state(t->optim, &lo, &hi, &mb, &vb);
  /* ZeRO-3: its dp shard, the optimizer's range; else the whole local vector */
  size_t plo = t->param_shard ? lo : 0;
  size_t phi = t->param_shard ? hi : wf_model_local_params(t->model);
  float *at[3] = {t->param_shard ? t->param_shard : wf_model_params(t->model), mb, vb};
  wf_dev_view v[3] = {{0}};
  wanted w = {.plo = plo, .lo = lo};
  st = map_views(dev, v, at, (size_t[3]){phi - plo, hi - lo, hi - lo});
  if (st == WF_OK &&
      (!collect(&w.params, d, &g, plo, phi, false) || !collect(&w.optim, d, &g, lo, hi, false))) {
    WF_ERROR("checkpoint %s: out of memory mapping this rank's shard", dir);
    st = WF_ENOMEM;
  }
  w.p = v[0].host, w.m = v[1].host, w.v = v[2].host;
  if (st == WF_OK)
    st = read_wanted(m, &w, dir, true, wf__rank_of(wf__ckpt_world(t)),
                     wf__size_of(wf__ckpt_world(t)));
  for (int i = 0; i < 3; i++) {
    u = v[i].host ? wf_dev_unmap(dev, &v[i]) : WF_OK;
    st = st == WF_OK ? u : st;
  }
  free(w.params.r);
  free(w.optim.r);
  WF_TRY(wf__ckpt_agree(t, st, "reading the checkpoint's shards"));
  if (!t->param_shard) /* mixed precision's rounded weights follow */
    st = wf_model_params_changed(t->model);
fail:
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

/* dir's manifest, for a model of dims d: its model files hold every parameter once. */
static wf_status open_model(const char *dir, const wf_model_dims *d, wf__manifest *m)
{
  wf_status st = WF_OK;
  WF_TRY(wf__manifest_read(dir, m, NULL));
  WF_CHECK(!memcmp(&m->dims, d, sizeof *d), WF_EFORMAT,
           "checkpoint %s: its model (L=%d NH=%d C=%d maxT=%d V=%d) is not the one expected (L=%d "
           "NH=%d C=%d maxT=%d V=%d)",
           dir, m->dims.L, m->dims.NH, m->dims.C, m->dims.maxT, m->dims.V, d->L, d->NH, d->C,
           d->maxT, d->V);
  st = wf__check_model_cover(m, dir);
fail:
  return st;
}

wf_status wf__ckpt_model_read(const char *dir, const wf_model_dims *d, float *full)
{
  wf_status st = WF_OK;
  wf__manifest m = {0};
  WF_TRY(open_model(dir, d, &m));
  memset(full, 0, m.n * sizeof *full);
  for (int i = 0; i < m.n_files; i++) /* the shards add into zeros, as --save's assembly does */
    if (!m.files[i].optim)
      WF_TRY(wf__add_model_file(dir, &m, &m.files[i], full));
fail:
  free(m.files);
  return st;
}

wf_status wf__ckpt_model_read_shard(const char *dir, const wf_model_dims *d,
                                    const wf_model_shard *s, size_t lo, size_t hi, float *dst)
{
  wf_status st = WF_OK;
  wf__manifest m = {0};
  wanted w = {.p = dst, .plo = lo};
  if (!dst)
    hi = lo; /* a check: every file verified, nothing kept */
  WF_TRY(open_model(dir, d, &m));
  WF_CHECK(collect(&w.params, d, s, lo, hi, false), WF_ENOMEM,
           "checkpoint %s: out of memory mapping the shard", dir);
  st = read_wanted(&m, &w, dir, false, 0, 1); /* every model file verified, as a whole read */
fail:
  free(w.params.r);
  free(m.files);
  return st;
}
