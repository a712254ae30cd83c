/*
 * safetensors_dims.c - the dimensions of a safetensors model (wf_safetensors_peek): the
 * family from the file's metadata, config.json beside it, or the tensors' names; the
 * sizes from the metadata and config.json where they say, else from the tensors' shapes;
 * RoPE scaling (config.json's rope_scaling). Reads through safetensors_read.c's source.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_int.h"

#define HEAD_SIZE 64 /* the head size when a file says nothing of the heads */

/* ---- dimensions ------------------------------------------------------------------------------ */

/* config.json beside path (NULL when there is none or it is not JSON). */
static json_t *config_beside(const char *path)
{
  char dir[WF_PATH_MAX], cfg[WF_PATH_MAX + 16];
  struct stat sb;
  wf__st_dir_of(dir, sizeof dir, path);
  snprintf(cfg, sizeof cfg, "%sconfig.json", dir);
  return stat(cfg, &sb) == 0 && S_ISREG(sb.st_mode) ? json_load_file(cfg, 0, NULL) : NULL;
}

/* Whether the model's files hold `name` (with or without the optional prefix). */
static bool src_has(wf__st_source *s, const wf_family *fam, const char *name)
{
  const char *pre = fam->hf_prefix;
  const char *alt = pre && !strncmp(name, pre, strlen(pre)) ? name + strlen(pre) : name;
  json_t *h = s->index ? s->index : s->files[0].header;
  return json_object_get(h, name) || json_object_get(h, alt);
}

/* The first Hugging Face name of the family's embedding (its first tensor). */
static void embedding_name(const wf_family *fam, char *out, size_t len)
{
  wf_model_dims d = {.fam = fam, .L = 1, .NH = 1, .C = 1, .maxT = 1, .V = 1, .Vp = 1};
  wf_model_desc desc;
  wf_model_describe(&d, &desc);
  snprintf(out, len, desc.t[0].hf[0].name, 0);
}

/* The family: config.json's model_type, else weft's __metadata__, else the one whose
 * embedding the file holds. */
static const wf_family *family_of(wf__st_source *s, json_t *meta, json_t *cfg)
{
  int n;
  const wf_family *const *all = wf_model_families(&n);
  const char *mt = json_string_value(json_object_get(cfg, "model_type"));
  const char *wf = json_string_value(json_object_get(meta, "weft_family"));
  for (int i = 0; i < n; i++)
    if ((mt && !strcmp(mt, all[i]->hf_model_type)) || (!mt && wf && !strcmp(wf, all[i]->name)))
      return all[i];
  for (int i = 0; !mt && i < n; i++) {
    char name[128];
    embedding_name(all[i], name, sizeof name);
    if (src_has(s, all[i], name))
      return all[i];
  }
  return NULL;
}

/* The metadata of the file (of a sharded model: of the first tensor's file). */
static json_t *src_metadata(wf__st_source *s)
{
  if (!s->index)
    return json_object_get(s->files[0].header, "__metadata__");
  const char *key;
  json_t *v;
  wf__st_file *f = NULL;
  char quiet[256]; /* a missing shard is the reader's to report */
  json_object_foreach(s->index, key, v)
  {
    if (json_is_string(v) &&
        wf__st_src_file(s, json_string_value(v), &f, quiet, sizeof quiet) == WF_OK)
      return json_object_get(f->header, "__metadata__");
    break;
  }
  return NULL;
}

/* The dims config.json and the metadata name (the metadata wins: weft writes it). */
static void dims_from_keys(wf_model_dims *d, json_t *meta, json_t *cfg)
{
  const wf_family *f = d->fam;
  for (int pass = 0; pass < 2; pass++) {
    json_t *obj = pass ? meta : cfg;
    for (int i = 0; obj && i < f->n_hf_keys; i++) {
      double x = wf__st_json_num(json_object_get(obj, f->hf_keys[i].key));
      if (!isnan(x))
        wf__st_field_set(d, f->hf_keys[i].field, x);
    }
  }
}

/* ---- RoPE scaling (config.json's rope_scaling) -------------------------------------------- */

json_t *wf_rope_scaling_json(const wf_rope_scaling *s)
{
  if (s->rope_type == WF_ROPE_NONE)
    return json_null();
  return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", s->factor,
                   "low_freq_factor", s->low_freq_factor, "high_freq_factor", s->high_freq_factor,
                   "original_max_position_embeddings", s->original_max_position_embeddings);
}

const char *wf_rope_scaling_parse(json_t *v, wf_rope_scaling *out, char *buf, size_t len)
{
  static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings"};
  double x[4];
  *out = (wf_rope_scaling){0};
  if (!v || json_is_null(v))
    return NULL;
  json_t *t = json_object_get(v, "rope_type"); /* "type" in configs before transformers 4.43 */
  const char *type = json_string_value(t ? t : json_object_get(v, "type"));
  if (!json_is_object(v) || !type) {
    snprintf(buf, len, "rope_scaling is not an object with a rope_type");
    return buf;
  }
  if (!strcmp(type, "default"))
    return NULL;
  if (strcmp(type, "llama3")) {
    snprintf(buf, len,
             "rope_scaling's rope_type '%s' is not one weft implements (only llama3, Llama 3.1's, "
             "and default): weft would rotate by other angles than the checkpoint was trained with",
             type);
    return buf;
  }
  for (int i = 0; i < 4; i++) {
    json_t *k = json_object_get(v, keys[i]);
    x[i] = json_is_number(k) ? json_number_value(k) : NAN;
    if (isnan(x[i])) {
      snprintf(buf, len, "rope_scaling (llama3) has no number %s", keys[i]);
      return buf;
    }
  }
  *out = (wf_rope_scaling){WF_ROPE_LLAMA3, x[0], x[1], x[2], (int)x[3]};
  if (x[3] != (int)x[3]) {
    snprintf(buf, len, "rope_scaling's original_max_position_embeddings %g is not an integer",
             x[3]);
    return buf;
  }
  return NULL;
}

/* d's rope_scaling from weft's __metadata__ (a JSON string, written by weft: it wins as
 * the other keys do), else config.json's object; NULL, or what is wrong with it. */
static const char *scaling_of(json_t *meta, json_t *cfg, wf_model_dims *d, char *buf, size_t len)
{
  const char *where = "config.json's";
  json_t *own = NULL, *v = json_object_get(cfg, "rope_scaling");
  const char *text = json_string_value(json_object_get(meta, "rope_scaling"));
  if (text) {
    own = json_loads(text, JSON_DECODE_ANY, NULL);
    where = "__metadata__'s";
    v = own ? own : json_true(); /* not JSON: refused below */
  }
  char why[224];
  const char *bad = wf_rope_scaling_parse(v, &d->rope_scaling, why, sizeof why);
  json_decref(own);
  if (bad)
    snprintf(buf, len, "%s %s", where, bad);
  return bad ? buf : NULL;
}

/* A tied model's file may leave its head out: a Llama without lm_head.weight ties. */
static void tie_from_tensors(wf__st_source *s, wf_model_dims *d)
{
  wf_model_dims u = *d;
  wf_model_desc desc;
  u.tie = WF_TIE_NO;
  wf_model_describe(&u, &desc);
  for (int t = 0; t < desc.n && d->fam->hf_head; t++)
    for (int p = 0; p < desc.t[t].n_hf; p++)
      if (!strcmp(desc.t[t].hf[p].name, d->fam->hf_head) && !src_has(s, d->fam, d->fam->hf_head))
        d->tie = WF_TIE_YES;
}

/* The file's shape of `name` as weft's (rows, cols); false when absent. */
static bool weft_shape(wf__st_source *s, const char *name, bool transpose, int64_t *rows,
                       int64_t *cols)
{
  wf__st_file *f = NULL;
  wf__st_tinfo ti;
  char quiet[256]; /* a broken tensor is the reader's to report, once */
  json_t *t = wf__st_src_find(s, name, &f, quiet, sizeof quiet);
  if (!t || wf__st_parse_info(f, name, t, &ti, quiet, sizeof quiet) != WF_OK || ti.ndim < 1 ||
      ti.ndim > 2)
    return false;
  *rows = ti.shape[0], *cols = ti.ndim == 2 ? ti.shape[1] : 1;
  if (transpose && ti.ndim == 2)
    *rows = ti.shape[1], *cols = ti.shape[0];
  return true;
}

/* The extents of the dimension symbols read off the tensors' shapes (layer 0). */
static void extents_from_shapes(wf__st_source *s, const wf_model_dims *d, int64_t ext[WF_DIM_N_])
{
  wf_model_desc desc;
  wf_model_dims probe = *d;
  probe.L = probe.NH = probe.C = probe.maxT = probe.V = probe.Vp = 1;
  wf_model_describe(&probe, &desc);
  for (int t = 0; t < desc.n; t++) {
    const wf_tensor_desc *td = &desc.t[t];
    for (int p = 0; p < td->n_hf; p++) {
      char name[128];
      int64_t rows, cols;
      int g = td->hf[p].group >= 0 ? td->hf[p].group : td->n_groups == 1 ? 0 : -1;
      snprintf(name, sizeof name, td->hf[p].name, 0, 0);
      if (!weft_shape(s, name, td->hf[p].transpose, &rows, &cols))
        continue;
      if (g >= 0 && !ext[td->rows[g]])
        ext[td->rows[g]] = rows;
      if (!ext[td->cols])
        ext[td->cols] = cols;
    }
  }
}

/* Layers: one past the largest N of the first layered tensor's names. */
static int layers_of(wf__st_source *s, const wf_model_dims *d)
{
  wf_model_desc desc;
  wf_model_describe(d, &desc);
  const char *fmt = NULL;
  for (int t = 0; t < desc.n && !fmt; t++)
    if (desc.t[t].place == WF_PLACE_LAYER && desc.t[t].n_hf > 0)
      fmt = desc.t[t].hf[0].name;
  const char *at = fmt ? strstr(fmt, "%d") : NULL;
  if (!at)
    return 0;
  const char *pre = d->fam->hf_prefix;
  size_t np = (size_t)(at - fmt), pl = pre ? strlen(pre) : 0;
  long L = 0;
  const char *key;
  json_t *v, *h = s->index ? s->index : s->files[0].header;
  json_object_foreach(h, key, v)
  {
    for (int alt = 0; alt < (pl && !strncmp(fmt, pre, pl) ? 2 : 1); alt++) {
      const char *f = alt ? fmt + pl : fmt;
      size_t n = alt ? np - pl : np;
      char *end;
      if (strncmp(key, f, n))
        continue;
      long l = strtol(key + n, &end, 10);
      if (end != key + n && l >= 0 && l < (1 << 16) && !strcmp(end, at + 2))
        L = WF_MAX(L, l + 1);
    }
  }
  return (int)L;
}

/* ", experts E, top-k K" for a family with experts, else "". */
static const char *moe_str(const wf_model_dims *d, char *buf, size_t len)
{
  if (d->E <= 0 && d->K <= 0)
    return "";
  snprintf(buf, len, ", experts %d, top-k %d", d->E, d->K);
  return buf;
}

static wf_status peek_dims(wf__st_source *s, wf_model_dims *out, char *err, size_t len)
{
  json_t *cfg = config_beside(s->path), *meta = src_metadata(s);
  wf_model_dims d = {.fam = family_of(s, meta, cfg), .aux_coef = -1};
  wf_status st = WF_OK;
  char why[256], experts[64];
  const char *mt = json_string_value(json_object_get(cfg, "model_type"));
  if (!d.fam) {
    int n;
    const wf_family *const *all = wf_model_families(&n);
    char known[160] = "";
    for (int i = 0; i < n; i++)
      snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
               all[i]->hf_model_type);
    if (mt)
      st = wf__st_fail(err, len, WF_EFORMAT,
                       "safetensors '%s': config.json's model_type '%s' is not a model family weft "
                       "knows (%s)",
                       s->path, mt, known);
    else
      st = wf__st_fail(
          err, len, WF_EFORMAT,
          "safetensors '%s': not a model family weft knows (no config.json model_type, no "
          "embedding of %s among its tensors)",
          s->path, known);
    goto done;
  }
  if (d.fam->hf_refuse && d.fam->hf_refuse(cfg, why, sizeof why)) {
    st = wf__st_fail(err, len, WF_EFORMAT, "safetensors '%s': %s (config.json): %s", s->path,
                     d.fam->name, why);
    goto done;
  }
  s->fam = d.fam;
  dims_from_keys(&d, meta, cfg);
  if (d.tie == WF_TIE_AUTO)
    tie_from_tensors(s, &d);
  int64_t ext[WF_DIM_N_] = {0};
  extents_from_shapes(s, &d, ext);
  d.C = d.C ? d.C : (int)ext[WF_DIM_C];
  d.V = d.V ? d.V : (int)ext[WF_DIM_VP];
  d.maxT = d.maxT ? d.maxT : ext[WF_DIM_T] ? (int)ext[WF_DIM_T] : d.fam->hf_max_positions;
  d.F = d.F ? d.F : (int)ext[WF_DIM_F];
  d.E = d.E ? d.E : (int)ext[WF_DIM_E];
  if (!d.HD && d.fam->own_head_dim)
    d.HD = (int)ext[WF_DIM_HD];
  d.L = d.L ? d.L : layers_of(s, &d);
  int64_t q = ext[WF_DIM_Q] ? ext[WF_DIM_Q] : d.C;
  if (!d.NH && q % HEAD_SIZE == 0) /* every GPT-2 size has 64-wide heads */
    d.NH = (int)(q / HEAD_SIZE);
  if (!d.KV && d.NH && ext[WF_DIM_KV] && q % d.NH == 0)
    d.KV = (int)(ext[WF_DIM_KV] / (q / d.NH));
  d.Vp = (d.V + 127) / 128 * 128;
  json_t *hd = d.fam->own_head_dim ? NULL : json_object_get(cfg, "head_dim");
  const char *bad = scaling_of(meta, cfg, &d, why, sizeof why);
  if (!bad)
    bad = d.L > 0 && d.NH > 0 && d.C > 0 && d.maxT > 0 && d.V > 0
              ? wf_model_dims_check(&d)
              : "a dimension is missing (no config.json beside it?)";
  if (!bad && json_is_integer(hd) && json_integer_value(hd) * d.NH != d.C)
    bad = "config.json's head_dim is not hidden_size / num_attention_heads, as weft's heads are";
  if (bad)
    st = wf__st_fail(
        err, len, WF_EFORMAT,
        "safetensors '%s': %s with n_layer %d, n_head %d, kv heads %d, n_embd %d, ffn %d, "
        "n_ctx %d, vocab %d%s: %s",
        s->path, d.fam->name, d.L, d.NH, d.KV, d.C, d.F, d.maxT, d.V,
        moe_str(&d, experts, sizeof experts), bad);
  else
    *out = wf_model_dims_resolve(&d);
done:
  json_decref(cfg);
  return st;
}

wf_status wf_safetensors_peek(const char *path, wf_model_dims *d, char *err, size_t len)
{
  wf__st_source *s = NULL;
  wf_status st = wf__st_src_open(&s, path, err, len);
  if (st == WF_OK)
    st = peek_dims(s, d, err, len);
  if (s)
    wf__st_src_close(s);
  return st;
}
