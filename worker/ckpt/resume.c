/*
 * resume.c - restoring a checkpoint: rank 0 finds it and reads and checks its manifest
 * (every rank would reach the same verdict, so one reader speaks for all and the
 * others get the manifest from it); then, on the layout that saved it, each (pp, tp)
 * shard's dp rank 0 reads its model file and broadcasts it over dp, and each rank reads
 * the optimizer range it holds (re-sliced over dp): the bits come back unchanged. On
 * another layout the checkpoint is resharded (reshard.c).
 *
 * Invariant: the RNG is counter-based (Philox keyed by train.seed) and data batches and
 * the learning rate are pure functions of the step, so (seed, step) is the whole RNG
 * state and data position, but for a data.source stream, whose position the manifest
 * holds (datastate.c): parameters, AdamW m and v, the fp16 scaler, the step and that
 * position make the continuation bit-identical on the same mesh.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt_int.h"

/* ---- the manifest, read once --------------------------------------------------------- */

/* A checkpoint_dir resumed without naming a checkpoint holds another run: say what
 * differs and the two ways on. */
static wf_status another_run(const wf_ckpt_target *t, const char *dir, const char *key,
                             const char *saved, const char *now)
{
  WF_ERROR("train.checkpoint_dir=%s holds another run: its checkpoint %s has %s=%s, this run "
           "has %s=%s; use another train.checkpoint_dir, or add train.resume=never to start "
           "over there (its checkpoints are removed)",
           t->cfg->train.checkpoint_dir, dir, key, saved, key, now);
  return WF_ECONFIG;
}

/* A dims field's value as its config key takes it (rope_type by name). */
static void value_text(const char *field, double v, char *buf, size_t len)
{
  if (!strcmp(field, "rope_scaling.rope_type"))
    wf__pathf(buf, len, "%s", v == WF_ROPE_LLAMA3 ? "llama3" : "none");
  else
    wf__pathf(buf, len, "%g", v);
}

/* The model shape must match; name the first config key that differs. */
static wf_status check_compat(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  const char *field;
  double saved, now;
  if (wf_model_dims_same(&m->dims, wf_model_get_dims(t->model), &field, &saved, &now))
    return WF_OK;
  bool family = !strcmp(field, "family");
  char was[64], is[64];
  value_text(field, saved, was, sizeof was);
  value_text(field, now, is, sizeof is);
  if (wf__resume_implicit(t->cfg)) {
    char key[64];
    wf__pathf(key, sizeof key, "model.%s", field);
    if (family) {
      wf_strlcpy(was, wf_model_family_name(&m->dims), sizeof was);
      wf_strlcpy(is, wf_model_family_name(wf_model_get_dims(t->model)), sizeof is);
    }
    return another_run(t, dir, key, was, is);
  }
  if (family) {
    WF_ERROR("checkpoint %s is incompatible: it holds a %s, this run trains a %s; set "
             "model.family=%s to resume it, or start a fresh train.checkpoint_dir",
             dir, wf_model_family_name(&m->dims), wf_model_family_name(wf_model_get_dims(t->model)),
             wf_model_family_name(&m->dims));
    return WF_ECONFIG;
  }
  WF_ERROR("checkpoint %s is incompatible: it was saved with model.%s = %s, this run has "
           "model.%s = %s; set model.%s=%s to resume it, or start a fresh train.checkpoint_dir",
           dir, field, was, field, is, field, was);
  return WF_ECONFIG;
}

/* Resuming train.checkpoint_dir without naming a checkpoint continues the run it holds,
 * as torchtitan and Megatron-LM do, when that run trained this model family on this
 * data; another run's checkpoints are refused (a named train.resume may fine-tune). */
static wf_status check_same_run(const wf_ckpt_target *t, const char *text, const char *dir)
{
  static const char *const keys[] = {"model.family",   "data.path",   "data.val_path",
                                     "data.tokenizer", "data.source", "data.field"};
  wf_status st = WF_OK;
  json_t *o = json_loads(text, 0, NULL), *now = wf__config_json(t->cfg);
  json_t *was = o ? json_object_get(o, "config") : NULL;
  for (size_t i = 0; was && now && st == WF_OK && i < WF_ARRAY_LEN(keys); i++) {
    const char *a = json_string_value(json_object_get(was, keys[i]));
    const char *b = json_string_value(json_object_get(now, keys[i]));
    if (a && b && strcmp(a, b))
      st = another_run(t, dir, keys[i], a[0] ? a : "\"\"", b[0] ? b : "\"\"");
  }
  json_decref(o);
  json_decref(now);
  return st;
}

/* Rank 0: locate, read and check the manifest; its text (empty when there is no
 * checkpoint yet) into *text for the others. */
static wf_status read_rank0(const wf_ckpt_target *t, char *dir, size_t len, char **text)
{
  wf_status st = WF_OK;
  bool none = false;
  wf__manifest m = {0};
  *text = NULL;
  WF_TRY(wf__locate(t->cfg, dir, len, &none));
  if (none)
    return WF_OK;
  WF_TRY(wf__manifest_read(dir, &m, text));
  WF_TRY(check_compat(t, &m, dir));
  if (wf__resume_implicit(t->cfg))
    WF_TRY(check_same_run(t, *text, dir));
  WF_TRY(wf__check_model_cover(&m, dir));
  WF_TRY(wf__check_optim_cover(&m, dir));
fail:
  if (st != WF_OK) {
    free(*text);
    *text = NULL;
  }
  free(m.files);
  return st;
}

/* Rank 0's (dir, manifest text) on every rank: lengths first, then the bytes. */
static wf_status share(const wf_ckpt_target *t, char *dir, size_t dir_len, char **text)
{
  wf_status st = WF_OK;
  wf_comm *w = wf__ckpt_world(t);
  int64_t len[2] = {(int64_t)strlen(dir), *text ? (int64_t)strlen(*text) : -1};
  if (!w)
    return WF_OK;
  WF_TRY(wf_comm_bcast(w, len, 2, WF_COMM_I64, 0));
  WF_CHECK((size_t)len[0] < dir_len, WF_EINVAL, "checkpoint path of %lld bytes is too long",
           (long long)len[0]);
  WF_TRY(wf_comm_bcast(w, dir, (size_t)len[0] + 1, WF_COMM_U8, 0));
  if (wf__rank_of(w) != 0 && len[1] >= 0)
    WF_CHECK_ALLOC(*text = calloc((size_t)len[1] + 1, 1));
  if (len[1] >= 0)
    WF_TRY(wf_comm_bcast(w, *text, (size_t)len[1] + 1, WF_COMM_U8, 0));
fail:
  return st;
}

/* Every rank gets the manifest rank 0 checked, and must see the checkpoint's files
 * (a checkpoint_dir that is not on a shared filesystem would fail here, said plainly).
 * *none: train.resume=auto found no checkpoint yet. */
static wf_status read_manifest(const wf_ckpt_target *t, char *dir, size_t len, wf__manifest *m,
                               bool *none, char **text_out)
{
  wf_status st = WF_OK;
  wf_comm *w = wf__ckpt_world(t);
  char *text = NULL;
  int me = wf__rank_of(w);
  WF_TRY(wf__ckpt_agree(t, me == 0 ? read_rank0(t, dir, len, &text) : WF_OK,
                        "reading the checkpoint to resume from"));
  WF_TRY(share(t, dir, len, &text));
  *none = text == NULL;
  if (*none)
    goto fail;
  st = wf__manifest_parse(text, dir, m); /* rank 0 parsed these bytes already */
  if (st == WF_OK && !wf__has_manifest(dir)) {
    WF_ERROR("checkpoint %s: rank %d on %s cannot see it; train.checkpoint_dir must be on a "
             "filesystem every rank shares",
             dir, me, wf_rt_host());
    st = WF_EIO;
  }
  st = wf__ckpt_agree(t, st, "finding the checkpoint");
  if (st == WF_OK) {
    *text_out = text; /* the data position is read from it too */
    text = NULL;
  }
fail:
  free(text);
  return st;
}

/* ---- the same layout: files as they are ----------------------------------------------- */

/* The saved shard at this rank's coordinates. */
static const wf__entry *my_model(const wf_ckpt_target *t, const wf__manifest *m)
{
  return wf__find_model(m, t->pp_rank, t->tp_rank);
}

/* Whether every rank holds exactly the shard the checkpoint saved at its (pp, tp)
 * coordinates: then the files load as they are, bit for bit, re-sliced over dp only.
 * Agreed over the job, so all ranks take the same path. */
static wf_status same_layout(const wf_ckpt_target *t, const wf__manifest *m, bool *same)
{
  const wf__entry *e = my_model(t, m);
  wf_model_shard g = wf__saved_geo(wf_model_get_shard(t->model));
  int32_t mine = e && wf__same_geo(&e->geo, &g) && m->pp == t->cfg->mesh.pp && m->tp == g.tp;
  wf_comm *w = wf__ckpt_world(t);
  wf_status st = w ? wf_comm_allreduce(w, &mine, &mine, 1, WF_COMM_I32, WF_COMM_MIN) : WF_OK;
  *same = mine != 0;
  return st;
}

/* Elements whose AdamW state dp rank r (of D) restores: its ZeRO shard, or everything
 * on dp rank 0 (which then broadcasts it). */
static void restore_range(int r, int D, bool zero, uint64_t n, uint64_t *lo, uint64_t *hi)
{
  uint64_t shard = (n + (uint64_t)D - 1) / (uint64_t)D;
  *lo = zero ? WF_MIN((uint64_t)r * shard, n) : 0;
  *hi = zero ? WF_MIN(*lo + shard, n) : r == 0 ? n : 0;
}

/* Whether this rank reads file i (of the manifest) whole and checks its checksum, once
 * over the job: in HSDP's replica 0 alone (the others read the same files), the dp rank
 * of the (pp, tp) group that restores exactly the file's range (it reads it whole
 * anyway), else rank i mod D. The others read what they restore where it lies, and the
 * job agrees on the verdict (wf__ckpt_agree). */
static bool verifies(const wf_ckpt_target *t, const wf__entry *e, int i, bool zero, uint64_t n)
{
  int me = wf__rank_of(t->dp_comm), D = wf__size_of(t->dp_comm);
  if (t->replica > 0)
    return false;
  for (int r = 0; r < D; r++) {
    uint64_t lo, hi;
    restore_range(r, D, zero, n, &lo, &hi);
    if (lo == e->lo && hi == e->hi)
      return r == me;
  }
  return i % D == me;
}

/* ZeRO-3: each rank keeps the range of its (pp, tp) shard's model file that its dp shard
 * holds (the optimizer's range), straight into its parameter shard. One rank streams the
 * whole file past to check its XXH3 (verifies: once per job, as the optimizer files);
 * the others read their range alone, and a bad file fails every rank. */
static wf_status load_param_shard(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  wf_dev *dev = wf_model_dev(t->model);
  const wf__entry *e = my_model(t, m);
  size_t lo, hi;
  float *mb, *vb;
  wf_dev_view v;
  wf_optim_state(t->optim, &lo, &hi, &mb, &vb);
  bool verify = verifies(t, e, (int)(e - m->files), true, e->hi);
  wf_status st = wf_dev_map(dev, &v, t->param_shard, (hi - lo) * sizeof(float), WF_MAP_WRITE);
  if (st == WF_OK) {
    st = wf__read_model_range(dir, e, wf_model_get_dims(t->model), lo, hi, v.host, verify);
    wf_status u = wf_dev_unmap(dev, &v);
    st = st == WF_OK ? u : st;
  }
  return wf__ckpt_agree(t, st, "restoring the parameters");
}

/* dp rank 0 of each (pp, tp) reads its model shard and broadcasts it over dp. */
static wf_status load_params(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK;
  if (t->param_shard)
    return load_param_shard(t, m, dir);
  wf_dev *dev = wf_model_dev(t->model);
  size_t n = wf_model_local_params(t->model);
  if (wf__rank_of(t->dp_comm) == 0) {
    wf_dev_view v;
    st = wf_dev_map(dev, &v, wf_model_params(t->model), n * sizeof(float), WF_MAP_WRITE);
    if (st == WF_OK) {
      st = wf__read_model(dir, my_model(t, m), wf_model_get_dims(t->model), v.host);
      wf_status u = wf_dev_unmap(dev, &v);
      st = st == WF_OK ? u : st;
    }
  }
  WF_TRY(wf__ckpt_agree(t, st, "restoring the parameters"));
  if (wf__size_of(t->dp_comm) > 1)
    WF_TRY(wf_comm_bcast(t->dp_comm, wf_model_params(t->model), n, WF_COMM_F32, 0));
  st = wf_model_params_changed(t->model); /* mixed precision's rounded weights follow */
fail:
  return st;
}

/* Read this rank's span of the (pp, tp) shard's optimizer files into host views. */
static wf_status read_span(const wf_ckpt_target *t, const wf__manifest *m, const char *dir,
                           const wf__span *sp, bool zero)
{
  wf_status st = WF_OK;
  uint64_t n = my_model(t, m)->hi; /* the shard's flat vector */
  for (int i = 0; i < m->n_files; i++) {
    const wf__entry *e = &m->files[i];
    if (!e->optim || e->pp != t->pp_rank || e->tp != t->tp_rank)
      continue;
    if (verifies(t, e, i, zero, n))
      WF_TRY(wf__verify_optim(dir, e, n, sp));
    else if (WF_MAX(e->lo, sp->lo) < WF_MIN(e->hi, sp->hi))
      WF_TRY(wf__read_optim_part(dir, e, n, sp));
  }
fail:
  return st;
}

static wf_status load_optim(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK, u = WF_OK;
  wf_dev *dev = wf_model_dev(t->model);
  size_t lo, hi;
  float *mb, *vb;
  wf_dev_view vm = {0}, vv = {0};
  bool zero = t->optim_sharded;
  wf_optim_state(t->optim, &lo, &hi, &mb, &vb);
  wf__span sp = {lo, hi, NULL, NULL};
  if (!zero && wf__rank_of(t->dp_comm) != 0)
    sp.lo = sp.hi = 0; /* dp 0 restores it all and broadcasts */
  size_t bytes = (size_t)(sp.hi - sp.lo) * sizeof(float);
  st = wf_dev_map(dev, &vm, mb, bytes, WF_MAP_WRITE);
  if (st == WF_OK)
    st = wf_dev_map(dev, &vv, vb, bytes, WF_MAP_WRITE);
  sp.m = vm.host, sp.v = vv.host;
  if (st == WF_OK)
    st = read_span(t, m, dir, &sp, zero);
  u = wf_dev_unmap(dev, &vm);
  st = st == WF_OK ? u : st;
  u = wf_dev_unmap(dev, &vv);
  st = st == WF_OK ? u : st;
  WF_TRY(wf__ckpt_agree(t, st, "restoring the optimizer state"));
  if (zero || wf__size_of(t->dp_comm) == 1)
    return WF_OK;
  WF_TRY(wf_comm_bcast(t->dp_comm, mb, hi - lo, WF_COMM_F32, 0));
  st = wf_comm_bcast(t->dp_comm, vb, hi - lo, WF_COMM_F32, 0);
fail:
  return st;
}

/* ---- resume ----------------------------------------------------------------------------- */

/* ZeRO-1, 2 and 3 keep the same optimizer shards (gradients are not saved, and ZeRO-3
 * writes the same whole model file, streamed from its shards). */
static const char *zero_name(int zero)
{
  return zero == 1 ? " (ZeRO-1)" : zero == 2 ? " (ZeRO-2)" : zero == 3 ? " (ZeRO-3)" : "";
}

/* "dp 4", or HSDP's "dp 2 x 2 replicas" (the fsdp group, then its copies). */
static const char *dp_name(char *buf, size_t len, int dp, int replicas)
{
  if (replicas > 1)
    wf__pathf(buf, len, "dp %d x %d replicas", dp, replicas);
  else
    wf__pathf(buf, len, "dp %d", dp);
  return buf;
}

static void note_differences(const wf_ckpt_target *t, const wf__manifest *m, const char *dir,
                             bool same)
{
  const wf_config *cfg = t->cfg;
  int dp = wf__size_of(t->dp_comm), zero = t->optim_sharded ? cfg->optim.zero : 0;
  int reps = t->replicas > 0 ? t->replicas : 1;
  char was[48], now[48];
  dp_name(was, sizeof was, m->dp, m->replicas);
  dp_name(now, sizeof now, dp, reps);
  if (m->seed != cfg->train.seed)
    WF_WARN("checkpoint %s was trained with train.seed=%llu, this run has %llu: the data order "
            "changes from here on",
            dir, (unsigned long long)m->seed, (unsigned long long)cfg->train.seed);
  if (m->steps > 0 && m->steps != cfg->train.steps && m->step > cfg->train.warmup)
    WF_WARN("checkpoint %s was saved by a run of train.steps=%d, this run has %d: the "
            "learning-rate schedule (cosine decay to train.min_lr at the last step) differed "
            "before step %d, so this is not that run's continuation",
            dir, m->steps, cfg->train.steps, m->step);
  if (!same)
    WF_INFO("checkpoint: resharding the model and optimizer state from %s x tp %d x pp %d%s "
            "to %s x tp %d x pp %d%s",
            was, m->tp, m->pp, zero_name(m->zero), now, cfg->mesh.tp, cfg->mesh.pp,
            zero_name(zero));
  else if (m->dp != dp || m->zero != zero)
    WF_INFO("checkpoint: resharding the optimizer state from %s%s to %s%s", was, zero_name(m->zero),
            now, zero_name(zero));
  else if (m->replicas != reps)
    WF_INFO("checkpoint: the optimizer shards of %s%s load unchanged on %s%s (the same shard "
            "group)",
            was, zero_name(m->zero), now, zero_name(zero));
  WF_INFO("checkpoint: resumed from %s at step %d", dir, m->step);
}

/* Restore parameters and AdamW state from the checkpoint in dir. */
static wf_status load(const wf_ckpt_target *t, const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK;
  bool same;
  WF_TRY(same_layout(t, m, &same));
  if (same) {
    WF_TRY(load_params(t, m, dir));
    WF_TRY(load_optim(t, m, dir));
  } else {
    WF_TRY(wf__load_resharded(t, m, dir));
  }
  if (wf__rank_of(wf__ckpt_world(t)) == 0)
    note_differences(t, m, dir, same);
fail:
  return st;
}

wf_status wf_ckpt_resume(const wf_ckpt_target *t, int *step)
{
  wf_status st = WF_OK;
  const wf_config *cfg = t->cfg;
  char dir[WF__PATH_LEN] = "", *text = NULL;
  bool none = false;
  wf__manifest m = {0};
  *step = 0;
  if (wf__resume_never(cfg) || (!cfg->train.resume[0] && !cfg->train.checkpoint_dir[0]))
    return WF_OK;
  WF_TRY(read_manifest(t, dir, sizeof dir, &m, &none, &text));
  if (none) {
    if (wf__rank_of(wf__ckpt_world(t)) == 0 && cfg->train.resume[0])
      WF_INFO("checkpoint: train.resume=auto and no checkpoint in %s yet: starting fresh",
              cfg->train.checkpoint_dir);
    goto fail;
  }
  if (!cfg->train.resume[0] && wf__rank_of(wf__ckpt_world(t)) == 0)
    WF_INFO("checkpoint: %s holds this run (model and data match): resuming it; "
            "train.resume=never starts over",
            cfg->train.checkpoint_dir);
  WF_TRY(load(t, &m, dir));
  WF_TRY(wf__data_state_restore(t, text, dir));
  *step = m.step;
  if (cfg->precision == WF_PREC_FP16 && m.has_scaler) /* else fp16 starts its scaler afresh */
    *wf_optim_get_scaler(t->optim) = m.scaler;
fail:
  free(text);
  free(m.files);
  return st;
}
