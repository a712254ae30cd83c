/*
 * manifest.c - manifest.json: written by rank 0 from every rank's record of what it
 * wrote, read and checked before any data file is touched.
 *
 * A reader trusts nothing it has not checked: the manifest's own fields, every file
 * entry's name, range and geometry, and that the model files hold every parameter of
 * the whole model exactly once and the optimizer files cover every model file's state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt_int.h"
#include "wf_build_config.h"

/* ---- writing -------------------------------------------------------------------------------- */

/* The config as {key: value} from wf_config_print's "key = value  (source)" lines. */
json_t *wf__config_json(const wf_config *cfg)
{
  char *text = NULL, *save = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  json_t *o = json_object();
  if (!f || !o) {
    if (f)
      fclose(f);
    free(text);
    return o;
  }
  wf_config_print(cfg, f);
  fclose(f);
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    char *eq = strstr(line, " = "), *src = strrchr(line, '(');
    if (!eq || !src || src < eq)
      continue;
    char *end = src;
    while (end > eq + 3 && end[-1] == ' ')
      end--;
    *end = '\0';
    char *k = line;
    while (*k == ' ')
      k++;
    *eq = '\0';
    for (char *e = eq - 1; e >= k && *e == ' '; e--)
      *e = '\0';
    const char *v = strcmp(eq + 3, "\"\"") ? eq + 3 : ""; /* the printer's empty string */
    json_object_set_new(o, k, json_string(v));
  }
  free(text);
  return o;
}

static json_t *file_json(const char *name, const char *kind, int pp, int tp, int dp, uint64_t lo,
                         uint64_t hi, uint64_t bytes, uint64_t hash)
{
  char hex[17];
  wf__pathf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
  json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:I, s:s, s:[I,I]}", "name", name, "kind", kind, "pp",
                        pp, "tp", tp, "bytes", (json_int_t)bytes, "xxh3_64", hex, "range",
                        (json_int_t)lo, (json_int_t)hi);
  if (o)
    json_object_set_new(o, "dp", dp < 0 ? json_null() : json_integer(dp));
  return o;
}

/* A model file's entry: its format and the shard geometry it holds (n parameters). */
static json_t *model_json(const char *name, int pp, const wf_model_dims *d, const wf_model_shard *g,
                          uint64_t n, uint64_t bytes, uint64_t hash)
{
  json_t *o = file_json(name, "model", pp, g->tp_rank, -1, 0, n, bytes, hash);
  if (!o)
    return NULL;
  json_object_set_new(o, "format", json_string(wf__llmc_geo(d, g) ? WF__FMT_LLMC : WF__FMT_SHARD));
  json_object_set_new(o, "shard",
                      json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:I}", "tp", g->tp,
                                "tp_rank", g->tp_rank, "l0", g->l0, "l1", g->l1, "chunks",
                                g->chunks, "chunk_stride", g->chunk_stride, "first", g->first,
                                "last", g->last, "params", (json_int_t)n));
  return o;
}

/* What one rank wrote, as WF__REC_LEN uint64: status (unused, 0), pp, tp, dp,
 * has_model, model bytes, model hash, has_optim, sharded, optim bytes, optim hash, lo,
 * hi, then its shard's geometry (wf__saved_geo): tp size, l0, l1, chunks,
 * chunk_stride, first | last << 1, and its parameter count. */
void wf__pack_rec(uint64_t *x, const wf_ckpt_target *t, const wf__shard_rec *r)
{
  wf_model_shard g = wf__saved_geo(wf_model_get_shard(t->model));
  uint64_t v[WF__REC_LEN] = {0,
                             (uint64_t)t->pp_rank,
                             (uint64_t)t->tp_rank,
                             (uint64_t)wf__rank_of(t->dp_comm),
                             r->has_model,
                             r->model_bytes,
                             r->model_hash,
                             r->has_optim,
                             r->sharded,
                             r->optim_bytes,
                             r->optim_hash,
                             r->lo,
                             r->hi,
                             (uint64_t)g.tp,
                             (uint64_t)g.l0,
                             (uint64_t)g.l1,
                             (uint64_t)g.chunks,
                             (uint64_t)g.chunk_stride,
                             (uint64_t)g.first | (uint64_t)g.last << 1,
                             wf_model_local_params(t->model)};
  memcpy(x, v, sizeof v);
}

static wf_model_shard unpack_geo(const uint64_t *x)
{
  return (wf_model_shard){.tp = (int)x[13],
                          .tp_rank = (int)x[2],
                          .l0 = (int)x[14],
                          .l1 = (int)x[15],
                          .chunks = (int)x[16],
                          .chunk_stride = (int)x[17],
                          .first = x[18] & 1,
                          .last = (x[18] >> 1) & 1};
}

static json_t *files_json(const wf_model_dims *d, const uint64_t *recs, int n)
{
  json_t *a = json_array();
  for (int r = 0; a && r < n; r++) {
    const uint64_t *x = recs + (size_t)r * WF__REC_LEN;
    int pp = (int)x[1], tp = (int)x[2], dp = x[8] ? (int)x[3] : -1;
    wf_model_shard g = unpack_geo(x);
    char name[64];
    if (x[4]) {
      wf__model_name(name, sizeof name, pp, tp);
      json_array_append_new(a, model_json(name, pp, d, &g, x[19], x[5], x[6]));
    }
    if (x[7]) {
      wf__optim_name(name, sizeof name, pp, tp, dp);
      json_array_append_new(a, file_json(name, "optim", pp, tp, dp, x[11], x[12], x[9], x[10]));
    }
  }
  return a;
}

char *wf__manifest_text(const wf_ckpt_target *t, int step, const uint64_t *recs, int n,
                        json_t *stream)
{
  const wf_config *cfg = t->cfg;
  const wf_model_dims *d = wf_model_get_dims(t->model);
  const wf_optim_scaler *ls = wf_optim_get_scaler(t->optim);
  bool fp16 = cfg->precision == WF_PREC_FP16;
  uint64_t np = wf_model_num_params(d);
  int zero = t->optim_sharded ? cfg->optim.zero : 0;
  json_t *o = json_pack(
      "{s:s, s:i, s:s, s:f, s:i, s:i, s:{s:i, s:i, s:i, s:i}, s:{s:i, s:i, s:i, s:i, s:i, s:i, "
      "s:I}, s:{s:i, s:s, s:i}, s:{s:s, s:I}, s:{s:s, s:i, s:i, s:f, s:f, s:f, s:f}}",
      "format", WF__FORMAT_NAME, "version", WF__FORMAT_VERSION, "weft_version", WF_VERSION,
      "written_at", wf_wall_time(), "step", step, "steps", cfg->train.steps, "mesh", "dp",
      wf__size_of(t->dp_comm), "tp", cfg->mesh.tp, "pp", cfg->mesh.pp, "world",
      wf__size_of(wf__ckpt_world(t)), "model", "layers", d->L, "heads", d->NH, "d_model", d->C,
      "seq_len", d->maxT, "vocab", d->V, "padded_vocab", d->Vp, "params", (json_int_t)np, "data",
      "position_step", step, "path",
      cfg->data.n_source  ? "data.source"
      : cfg->data.path[0] ? cfg->data.path
                          : "synthetic",
      "batch_size", cfg->train.batch_size, "rng", "kind",
      "philox4x32-10 counter-based: the state is the seed", "seed", (json_int_t)cfg->train.seed,
      "optimizer", "kind", "adamw", "t", step - ls->skipped, "zero", zero, "beta1",
      cfg->optim.beta1, "beta2", cfg->optim.beta2, "eps", cfg->optim.eps, "weight_decay",
      cfg->optim.weight_decay);
  if (!o) {
    json_decref(stream);
    return NULL;
  }
  if (stream) /* a data.source stream's position (datastate.c) */
    json_object_set_new(json_object_get(o, "data"), "stream", stream);
  /* HSDP: mesh.dp is the fsdp group (the files are a dp = F run's), replicas its copies */
  json_object_set_new(json_object_get(o, "mesh"), "replicas",
                      json_integer(t->replicas > 0 ? t->replicas : 1));
  /* context parallelism: mesh.dp counts dp x cp ranks (the group the optimizer state is
   * sharded over); cp says how many of them split each sequence (for the reader: any mesh
   * reshards it as a dp x cp one) */
  json_object_set_new(json_object_get(o, "mesh"), "cp", json_integer(cfg->mesh.cp));
  json_object_set_new(o, "config", wf__config_json(cfg));
  /* the family and what GPT-2 leaves at its defaults (older manifests have neither) */
  json_t *mo = json_object_get(o, "model");
  json_object_set_new(mo, "family", json_string(wf_model_family_name(d)));
  json_object_set_new(mo, "kv_heads", json_integer(d->KV));
  json_object_set_new(mo, "ffn", json_integer(d->F));
  json_object_set_new(mo, "tie_embeddings", json_boolean(d->tie == WF_TIE_YES));
  json_object_set_new(mo, "rope_theta", json_real(d->rope_theta));
  json_object_set_new(mo, "norm_eps", json_real(d->norm_eps));
  json_object_set_new(mo, "rope_scaling", wf_rope_scaling_json(&d->rope_scaling));
  json_object_set_new(mo, "head_dim", json_integer(d->HD));
  if (d->E > 0) /* the mixture of experts' (older manifests and dense models have none) */
    json_object_set_new(mo, "moe",
                        json_pack("{s:i, s:i, s:b, s:f, s:f, s:f}", "experts", d->E,
                                  "experts_per_token", d->K, "norm_topk_prob",
                                  d->norm_topk == WF_SWITCH_ON, "router_aux_loss_coef", d->aux_coef,
                                  "router_z_loss_coef", d->z_coef, "capacity_factor", d->capacity));
  if (fp16) /* fp16 loss scaling: the scale and its counters go on with the run */
    json_object_set_new(o, "loss_scaler",
                        json_pack("{s:f, s:i, s:i}", "scale", ls->scale, "good_steps",
                                  ls->good_steps, "skipped", ls->skipped));
  json_object_set_new(o, "files", files_json(d, recs, n));
  char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(o);
  return text;
}

/* ---- reading -----------------------------------------------------------------------------------
 */

/* A model entry's format and geometry. Entries written before shards existed have
 * neither: they are llm.c files of the whole model. */
static wf_status parse_model(json_t *o, wf__entry *e, const wf__manifest *m, const char *path,
                             int i)
{
  json_error_t je;
  json_t *fmt = json_object_get(o, "format"), *sh = json_object_get(o, "shard");
  int first = 1, last = 1;
  json_int_t n = (json_int_t)m->n;
  wf_model_shard *g = &e->geo;
  *g = wf__saved_geo(&(wf_model_shard){.tp = 1, .l1 = m->dims.L, .first = true, .last = true});
  const char *f = fmt ? json_string_value(fmt) : WF__FMT_LLMC; /* NULL: not a string */
  if (sh && json_unpack_ex(sh, &je, 0, "{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:I}", "tp",
                           &g->tp, "tp_rank", &g->tp_rank, "l0", &g->l0, "l1", &g->l1, "chunks",
                           &g->chunks, "chunk_stride", &g->chunk_stride, "first", &first, "last",
                           &last, "params", &n) != 0) {
    WF_ERROR("%s: files[%d] ('%s'): shard: %s", path, i, e->name, je.text);
    return WF_EFORMAT;
  }
  g->first = first, g->last = last;
  const char *bad = wf_model_shard_check(&m->dims, g);
  if (!bad && (uint64_t)n != wf_model_shard_params(&m->dims, g))
    bad = "its parameter count does not fit its geometry";
  if (!bad && (e->lo != 0 || e->hi != (uint64_t)n || e->tp != g->tp_rank))
    bad = "its range or tp coordinate disagrees with its geometry";
  e->llmc = wf__llmc_geo(&m->dims, g);
  if (!bad && (!f || strcmp(f, e->llmc ? WF__FMT_LLMC : WF__FMT_SHARD)))
    bad = e->llmc ? "the whole model's file must have format " WF__FMT_LLMC
                  : "a shard's file must have format " WF__FMT_SHARD;
  if (!bad)
    return WF_OK;
  WF_ERROR("%s: files[%d] ('%s'): %s", path, i, e->name, bad);
  return WF_EFORMAT;
}

static wf_status parse_entry(json_t *o, wf__entry *e, const wf__manifest *m, const char *path,
                             int i)
{
  json_error_t je;
  const char *name, *kind, *hex;
  json_t *dp;
  json_int_t bytes, lo, hi;
  char *end;
  if (json_unpack_ex(o, &je, 0, "{s:s, s:s, s:i, s:i, s:o, s:I, s:s, s:[I,I]}", "name", &name,
                     "kind", &kind, "pp", &e->pp, "tp", &e->tp, "dp", &dp, "bytes", &bytes,
                     "xxh3_64", &hex, "range", &lo, &hi) != 0) {
    WF_ERROR("%s: files[%d]: %s", path, i, je.text);
    return WF_EFORMAT;
  }
  e->dp = json_is_integer(dp) ? (int)json_integer_value(dp) : -1;
  e->optim = !strcmp(kind, "optim");
  e->bytes = (uint64_t)bytes, e->lo = (uint64_t)lo, e->hi = (uint64_t)hi;
  e->hash = strtoull(hex, &end, 16);
  if (strlen(name) >= sizeof e->name || strchr(name, '/') || name[0] == '.' || *end ||
      strlen(hex) != 16 || (!e->optim && strcmp(kind, "model")) || lo < 0 || lo > hi ||
      (uint64_t)hi > m->n || bytes < 0 || e->pp < 0 || e->tp < 0) {
    WF_ERROR("%s: files[%d] ('%s') is malformed", path, i, name);
    return WF_EFORMAT;
  }
  wf_strlcpy(e->name, name, sizeof e->name);
  return e->optim ? WF_OK : parse_model(o, e, m, path, i);
}

static wf_status parse_files(json_t *files, wf__manifest *m, const char *path)
{
  wf_status st = WF_OK;
  WF_CHECK(json_is_array(files) && json_array_size(files) > 0, WF_EFORMAT,
           "%s: 'files' is not a non-empty list", path);
  m->n_files = (int)json_array_size(files);
  WF_CHECK_ALLOC(m->files = calloc((size_t)m->n_files, sizeof *m->files));
  for (int i = 0; i < m->n_files; i++)
    WF_TRY(parse_entry(json_array_get(files, (size_t)i), &m->files[i], m, path, i));
fail:
  return st;
}

/* A mixture of experts' dims (absent: a dense model). */
static wf_status parse_moe(json_t *o, wf_model_dims *d, const char *path)
{
  wf_status st = WF_OK;
  json_error_t je;
  int norm = 0;
  if (!o)
    return WF_OK;
  WF_CHECK(json_unpack_ex(o, &je, 0, "{s:i, s:i, s:b, s:F, s:F, s:F}", "experts", &d->E,
                          "experts_per_token", &d->K, "norm_topk_prob", &norm,
                          "router_aux_loss_coef", &d->aux_coef, "router_z_loss_coef", &d->z_coef,
                          "capacity_factor", &d->capacity) == 0,
           WF_EFORMAT, "%s: model.moe: %s", path, je.text);
  d->norm_topk = norm ? WF_SWITCH_ON : WF_SWITCH_OFF;
fail:
  return st;
}

/* The family and its dims beyond GPT-2's (absent in manifests written before families:
 * those are GPT-2's; a manifest without rope_scaling has none). */
static wf_status parse_family(json_t *mo, wf_model_dims *d, const char *path)
{
  wf_status st = WF_OK;
  json_error_t je;
  const char *fam = "gpt2";
  int tie = -1;
  double eps = 0;
  WF_CHECK(json_unpack_ex(mo, &je, 0, "{s?s, s?i, s?i, s?b, s?F, s?F}", "family", &fam, "kv_heads",
                          &d->KV, "ffn", &d->F, "tie_embeddings", &tie, "rope_theta",
                          &d->rope_theta, "norm_eps", &eps) == 0,
           WF_EFORMAT, "%s: model: %s", path, je.text);
  d->norm_eps = (float)eps;
  char why[256]; /* absent (written before scaling) or null: none */
  WF_CHECK(!wf_rope_scaling_parse(json_object_get(mo, "rope_scaling"), &d->rope_scaling, why,
                                  sizeof why),
           WF_EFORMAT, "%s: model: %s", path, why);
  d->fam = wf_model_family_find(fam);
  WF_CHECK(d->fam, WF_EFORMAT, "%s: model family '%s' is not one this weft knows", path, fam);
  d->tie = tie < 0 ? WF_TIE_AUTO : tie ? WF_TIE_YES : WF_TIE_NO;
  WF_CHECK(json_unpack_ex(mo, &je, 0, "{s?i}", "head_dim", &d->HD) == 0, WF_EFORMAT,
           "%s: model: %s", path, je.text);
  WF_TRY(parse_moe(json_object_get(mo, "moe"), d, path));
fail:
  return st;
}

static wf_status parse_fields(json_t *o, wf__manifest *m, const char *path, json_t **files)
{
  wf_status st = WF_OK;
  json_error_t je;
  const char *format;
  int version;
  json_int_t n, seed;
  wf_model_dims *d = &m->dims;
  WF_CHECK(json_unpack_ex(o, &je, 0,
                          "{s:s, s:i, s:i, s:{s:i, s:i, s:i}, s:{s:i, s:i, s:i, s:i, s:i, s:i, "
                          "s:I}, s:{s:I}, s:{s:i}, s:o}",
                          "format", &format, "version", &version, "step", &m->step, "mesh", "dp",
                          &m->dp, "tp", &m->tp, "pp", &m->pp, "model", "layers", &d->L, "heads",
                          &d->NH, "d_model", &d->C, "seq_len", &d->maxT, "vocab", &d->V,
                          "padded_vocab", &d->Vp, "params", &n, "rng", "seed", &seed, "optimizer",
                          "zero", &m->zero, "files", files) == 0,
           WF_EFORMAT, "%s: %s", path, je.text);
  WF_CHECK(!strcmp(format, WF__FORMAT_NAME) && version == WF__FORMAT_VERSION, WF_EFORMAT,
           "%s: format '%s' version %d; this weft reads '%s' version %d", path, format, version,
           WF__FORMAT_NAME, WF__FORMAT_VERSION);
  WF_TRY(parse_family(json_object_get(o, "model"), d, path));
  WF_CHECK(!wf_model_dims_check(d) && (uint64_t)n == wf_model_num_params(d) && m->step >= 0,
           WF_EFORMAT, "%s: inconsistent model dims or step", path);
  m->n = (uint64_t)n, m->seed = (uint64_t)seed;
  m->steps = 0;
  (void)json_unpack(o, "{s?i}", "steps", &m->steps);
  m->replicas = 1; /* written before HSDP had checkpoints: one replica */
  WF_CHECK(json_unpack(o, "{s:{s?i}}", "mesh", "replicas", &m->replicas) == 0 && m->replicas >= 1,
           WF_EFORMAT, "%s: mesh.replicas must be an integer >= 1", path);
  wf_optim_scaler *ls = &m->scaler;
  m->has_scaler = json_unpack(o, "{s:{s:F, s:i, s:i}}", "loss_scaler", "scale", &ls->scale,
                              "good_steps", &ls->good_steps, "skipped", &ls->skipped) == 0;
fail:
  return st;
}

wf_status wf__manifest_parse(const char *text, const char *path, wf__manifest *m)
{
  wf_status st = WF_OK;
  json_error_t je;
  json_t *files = NULL, *o = json_loads(text, 0, &je);
  memset(m, 0, sizeof *m);
  WF_CHECK(o, WF_EFORMAT, "%s: unreadable (line %d: %s); resume from an older checkpoint", path,
           je.line, je.text);
  WF_TRY(parse_fields(o, m, path, &files));
  st = parse_files(files, m, path);
fail:
  json_decref(o);
  return st;
}

wf_status wf__manifest_read(const char *dir, wf__manifest *m, char **text_out)
{
  wf_status st = WF_OK;
  char path[WF__PATH_LEN], *text = NULL;
  long len = -1;
  wf__pathf(path, sizeof path, "%s/" WF__MANIFEST, dir);
  FILE *f = fopen(path, "rb");
  memset(m, 0, sizeof *m);
  WF_CHECK(f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0, WF_EFORMAT,
           "%s: unreadable (cannot open it); resume from an older checkpoint", path);
  rewind(f);
  WF_CHECK_ALLOC(text = calloc((size_t)len + 1, 1));
  WF_CHECK(fread(text, 1, (size_t)len, f) == (size_t)len, WF_EFORMAT,
           "%s: unreadable (short read); resume from an older checkpoint", path);
  WF_TRY(wf__manifest_parse(text, path, m));
  if (text_out) {
    *text_out = text;
    text = NULL;
  }
fail:
  if (f)
    fclose(f);
  free(text);
  return st;
}

/* ---- checks -------------------------------------------------------------------------------- */

const wf__entry *wf__find_model(const wf__manifest *m, int pp, int tp)
{
  for (int i = 0; i < m->n_files; i++)
    if (!m->files[i].optim && m->files[i].pp == pp && m->files[i].tp == tp)
      return &m->files[i];
  return NULL;
}

static void add_run(void *user, const wf_model_run *r)
{
  wf__runs *s = user;
  if ((s->counted && !r->counted) || s->oom)
    return;
  if (s->len == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    void *p = realloc(s->r, cap * sizeof *s->r);
    if (!p) {
      s->oom = true;
      return;
    }
    s->r = p, s->cap = cap;
  }
  s->r[s->len++] = (wf__run){r->full, r->local, r->n};
}

static int cmp_full(const void *a, const void *b)
{
  uint64_t x = ((const wf__run *)a)->full, y = ((const wf__run *)b)->full;
  return (x > y) - (x < y);
}

bool wf__runs_add(wf__runs *s, const wf_model_dims *d, const wf_model_shard *g, uint64_t lo,
                  uint64_t hi, bool counted)
{
  s->counted = counted;
  wf_model_shard_runs_in(d, g, (size_t)lo, (size_t)hi, add_run, s);
  return !s->oom;
}

void wf__runs_sort(wf__runs *s)
{
  if (s->len)
    qsort(s->r, s->len, sizeof *s->r, cmp_full);
}

/* The name of the tensor holding full element x. */
static const char *kind_at(const wf_model_dims *d, uint64_t x)
{
  wf_model_desc desc;
  wf_model_describe(d, &desc); /* its names are the family's string constants */
  int k = desc.n - 1;
  while (k > 0 && wf_model_tensor_offset(d, k) > x)
    k--;
  return desc.t[k].name;
}

/* Whether the sorted runs tile [0, n); *where is the first element missing or held twice. */
static bool tiled(const wf__runs *l, uint64_t n, uint64_t *where, bool *twice)
{
  uint64_t at = 0;
  size_t i = 0;
  for (; i < l->len && l->r[i].full == at; i++)
    at += l->r[i].n;
  *twice = i < l->len && l->r[i].full < at;
  *where = *twice ? l->r[i].full : at;
  return i == l->len && at == n;
}

wf_status wf__check_model_cover(const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK;
  wf__runs l = {0};
  uint64_t where;
  bool twice;
  for (int i = 0; i < m->n_files; i++) {
    const wf__entry *e = &m->files[i];
    WF_CHECK(e->optim || wf__find_model(m, e->pp, e->tp) == e, WF_EFORMAT,
             "checkpoint %s: the manifest lists two model files of stage %d shard %d", dir, e->pp,
             e->tp);
    if (!e->optim)
      wf__runs_add(&l, &m->dims, &e->geo, 0, UINT64_MAX, true);
  }
  WF_CHECK(!l.oom, WF_ENOMEM, "checkpoint %s: out of memory checking its model files", dir);
  wf__runs_sort(&l);
  WF_CHECK(tiled(&l, m->n, &where, &twice), WF_EFORMAT,
           "checkpoint %s: its model files do not hold every parameter exactly once (parameter "
           "%llu, in %s, is %s): the manifest lists an incomplete or overlapping set of shards",
           dir, (unsigned long long)where, kind_at(&m->dims, WF_MIN(where, m->n - 1)),
           twice ? "held twice" : "missing");
fail:
  free(l.r);
  return st;
}

/* The optimizer files of (pp, tp) must cover [0, n) exactly once. */
static wf_status check_cover(const wf__manifest *m, int pp, int tp, uint64_t n, const char *dir)
{
  uint64_t at = 0;
  for (bool more = true; more;) {
    more = false;
    for (int i = 0; i < m->n_files; i++) {
      const wf__entry *e = &m->files[i];
      if (e->optim && e->pp == pp && e->tp == tp && e->lo == at && e->hi > at) {
        at = e->hi;
        more = true;
      }
    }
  }
  if (at == n)
    return WF_OK;
  WF_ERROR("checkpoint %s: no optimizer file holds elements [%llu, %llu) of stage %d shard %d", dir,
           (unsigned long long)at, (unsigned long long)n, pp, tp);
  return WF_EFORMAT;
}

wf_status wf__check_optim_cover(const wf__manifest *m, const char *dir)
{
  wf_status st = WF_OK;
  for (int i = 0; i < m->n_files; i++) {
    const wf__entry *e = &m->files[i];
    if (!e->optim)
      WF_TRY(check_cover(m, e->pp, e->tp, e->hi, dir));
    else
      WF_CHECK(wf__find_model(m, e->pp, e->tp), WF_EFORMAT,
               "checkpoint %s: %s belongs to stage %d shard %d, which has no model file", dir,
               e->name, e->pp, e->tp);
  }
fail:
  return st;
}
