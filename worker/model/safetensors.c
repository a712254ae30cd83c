/*
 * safetensors.c - a model's weights in Hugging Face's safetensors format, to and from
 * the whole model's flat float32 array (wf_model.h), read off the family's tensor
 * descriptions: which Hugging Face tensors a weft tensor holds, and how.
 *
 * The format (huggingface/safetensors): an unsigned 64-bit little-endian header length
 * N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}, then the raw little-endian tensors, offsets counted
 * from the end of the header. The writer pads the header with spaces to a multiple of 8
 * (the reference writer's alignment) and stores every tensor as F32. A model too large
 * for one file is sharded as transformers' save_pretrained does: model-0000N-of-0000M.
 * safetensors files and model.safetensors.index.json, whose weight_map names each
 * tensor's file.
 *
 * The mapping (wf_hf_part): a weft tensor is one Hugging Face tensor, or several, one
 * per row group (Llama's qkv = q_proj | k_proj | v_proj, gate_up = gate_proj | up_proj).
 * GPT-2's linear layers are Conv1D, stored (in, out): the transpose of weft's (out, in).
 * Llama's query and key rows are read as stored: Hugging Face's checkpoints are laid out
 * for rotate-half RoPE, which is how weft's kernel pairs them. A tied head is left out by
 * the writer and accepted by a reader only when it equals the embedding. Readers also
 * accept names without the family's optional prefix (GPT2Model's files) and skip the
 * buffers the family lists (old GPT-2 files' causal masks).
 *
 * Invariants: padded vocabulary rows [V, Vp) are zero in memory and absent from the
 * file; nothing is read past what the header and the file size agree on; every
 * malformed file is WF_EFORMAT with one message naming the file and the tensor.
 *
 * This file owns the mapping (spec), Hugging Face's names of the dimensions and the
 * writer; safetensors_read.c reads (whole or a shard's ranges) and safetensors_dims.c
 * finds a file's dimensions. Their shared declarations are in model_int.h.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_file.h"
#include "model_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors files are little-endian; add byte swapping for this host"
#endif

#define SHARD_BYTES (5000000000ull) /* save_pretrained's max_shard_size "5GB" */

wf_status wf__st_fail(char *err, size_t len, wf_status st, const char *fmt, ...)
{
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (err && len)
    wf_strlcpy(err, buf, len);
  else
    WF_ERROR("%s", buf);
  return st;
}

bool wf__st_ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* ---- the mapping ----------------------------------------------------------------------- */

size_t wf__st_numel(const wf__st_spec *s) { return s->rows * s->cols; }

/* The spec of part p of tensor t, layer l, expert e (0 when not an expert tensor; d
 * resolved): an expert's copy follows the ones before it in the layer's tensor. */
static void make_spec(wf__st_spec *s, const wf_model_dims *d, const wf_tensor_desc *t, int ti,
                      int p, int l, int e)
{
  const wf_hf_part *h = &t->hf[p];
  size_t cols = wf_tensor_cols(d, t), base = 0, rows = wf_tensor_rows(d, t);
  size_t expert = (size_t)e * rows * cols;
  for (int g = 0; h->group >= 0 && g < h->group; g++)
    base += wf_tensor_group_rows(d, t, g);
  if (h->group >= 0)
    rows = wf_tensor_group_rows(d, t, h->group);
  if (t->split == WF_SPLIT_VOCAB) /* the padding rows are not in the file */
    rows = (size_t)d->V;
  snprintf(s->name, sizeof s->name, h->name, l, e);
  s->tensor = ti;
  s->rows = rows, s->cols = cols;
  s->off = wf_model_tensor_offset(d, ti) + (size_t)l * wf_model_layer_numel(d, ti) + expert +
           base * cols;
  s->transpose = h->transpose && cols > 1;
  s->ndim = cols > 1 ? 2 : 1;
  s->shape[0] = (int64_t)(s->transpose ? cols : rows);
  s->shape[1] = cols > 1 ? (int64_t)(s->transpose ? rows : cols) : 0;
}

/* Tensor ti's parts of layer l, expert by expert for an expert tensor. */
static int add_tensor(wf__st_spec *out, int n, const wf_model_dims *d, const wf_model_desc *desc,
                      int ti, int l)
{
  int experts = desc->t[ti].experts ? d->E : 1;
  for (int e = 0; e < experts; e++)
    for (int p = 0; p < desc->t[ti].n_hf; p++)
      if (out)
        make_spec(&out[n++], d, &desc->t[ti], ti, p, l, e);
      else
        n++;
  return n;
}

/* Every Hugging Face tensor of the model, in file order (the embeddings, then layer by
 * layer, then the last stage's); returns how many. out NULL: just count. */
static int build_specs(const wf_model_dims *d, const wf_model_desc *desc, wf__st_spec *out)
{
  int n = 0;
  for (int pass = 0; pass < 3; pass++) {
    for (int l = 0; l < (pass == 1 ? d->L : 1); l++) {
      for (int t = 0; t < desc->n; t++) {
        wf_place pl = desc->t[t].place;
        bool here = pass == 0   ? pl == WF_PLACE_FIRST || pl == WF_PLACE_TIED
                    : pass == 1 ? pl == WF_PLACE_LAYER
                                : pl == WF_PLACE_LAST;
        if (!here)
          continue;
        n = add_tensor(out, n, d, desc, t, l);
      }
    }
  }
  return n;
}

/* The specs of dims d (resolved into *r), allocated; NULL when out of memory. */
wf__st_spec *wf__st_alloc_specs(const wf_model_dims *d, wf_model_dims *r, wf_model_desc *desc,
                                int *n)
{
  *r = wf_model_dims_resolve(d);
  wf_model_describe(r, desc);
  *n = build_specs(r, desc, NULL);
  wf__st_spec *s = calloc((size_t)*n + 1, sizeof *s);
  if (s)
    build_specs(r, desc, s);
  return s;
}

/* Index in the file's layout of weft element (r, c) of spec s. */
static size_t file_index(const wf__st_spec *s, size_t r, size_t c)
{
  return s->transpose ? c * s->rows + r : r * s->cols + c;
}

/* The part's elements between weft's layout (w, from full) and the file's (f). */
static void to_file(const wf__st_spec *s, const float *w, float *f)
{
  for (size_t r = 0; r < s->rows; r++)
    for (size_t c = 0; c < s->cols; c++)
      f[file_index(s, r, c)] = w[r * s->cols + c];
}

void wf__st_from_file(const wf__st_spec *s, const float *f, float *w)
{
  for (size_t r = 0; r < s->rows; r++)
    for (size_t c = 0; c < s->cols; c++)
      w[r * s->cols + c] = f[file_index(s, r, c)];
}

bool wf__st_plain(const wf__st_spec *s) { return !s->transpose; }

/* The largest part, in elements (the scratch a transpose or permutation needs). */
size_t wf__st_largest(const wf__st_spec *s, int n)
{
  size_t big = 1;
  for (int i = 0; i < n; i++)
    big = WF_MAX(big, wf__st_numel(&s[i]));
  return big;
}

/* ---- Hugging Face's names for the dimensions ------------------------------------------- */

/* A float as the shortest decimal that reads back as it (1e-5f as 1e-05, not
 * 9.99999974738e-06), as Hugging Face's config.json writes its Python floats. */
static double float_decimal(float x)
{
  char buf[32];
  for (int digits = 1; digits <= 9; digits++) { /* 9 always does */
    snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
    if ((float)strtod(buf, NULL) == x)
      break;
  }
  return strtod(buf, NULL);
}

/* The value of field f of resolved dims d as JSON. */
static json_t *field_json(const wf_model_dims *d, wf_hf_field f)
{
  switch (f) {
  case WF_HF_L: return json_integer(d->L);
  case WF_HF_NH: return json_integer(d->NH);
  case WF_HF_KV: return json_integer(d->KV);
  case WF_HF_C: return json_integer(d->C);
  case WF_HF_F: return json_integer(d->F);
  case WF_HF_T: return json_integer(d->maxT);
  case WF_HF_V: return json_integer(d->V);
  case WF_HF_THETA: return json_real(d->rope_theta);
  case WF_HF_EPS: return json_real(float_decimal(d->norm_eps));
  case WF_HF_ROPE_SCALING: return wf_rope_scaling_json(&d->rope_scaling);
  case WF_HF_HD: return json_integer(d->HD);
  case WF_HF_E: return json_integer(d->E);
  case WF_HF_K: return json_integer(d->K);
  case WF_HF_NORM_TOPK: return json_boolean(d->norm_topk == WF_SWITCH_ON);
  case WF_HF_AUX: return json_real(d->aux_coef);
  default: return json_boolean(d->tie == WF_TIE_YES);
  }
}

/* A JSON value as a number: integers, reals, booleans and strings of them (weft's
 * __metadata__ holds strings); NAN when none. */
double wf__st_json_num(json_t *v)
{
  if (json_is_number(v))
    return json_number_value(v);
  if (json_is_boolean(v))
    return json_is_true(v);
  if (!json_is_string(v))
    return NAN;
  const char *s = json_string_value(v);
  char *end;
  double x = strtod(s, &end);
  if (end != s && *end == '\0')
    return x;
  return !strcmp(s, "true") ? 1 : !strcmp(s, "false") ? 0 : NAN;
}

void wf__st_field_set(wf_model_dims *d, wf_hf_field f, double x)
{
  switch (f) {
  case WF_HF_L: d->L = (int)x; return;
  case WF_HF_NH: d->NH = (int)x; return;
  case WF_HF_KV: d->KV = (int)x; return;
  case WF_HF_C: d->C = (int)x; return;
  case WF_HF_F: d->F = (int)x; return;
  case WF_HF_T: d->maxT = (int)x; return;
  case WF_HF_V: d->V = (int)x; return;
  case WF_HF_THETA: d->rope_theta = x; return;
  case WF_HF_EPS: d->norm_eps = (float)x; return;
  case WF_HF_ROPE_SCALING: return; /* not a number: scaling_of reads it */
  case WF_HF_HD: d->HD = (int)x; return;
  case WF_HF_E: d->E = (int)x; return;
  case WF_HF_K: d->K = (int)x; return;
  case WF_HF_NORM_TOPK: d->norm_topk = x != 0 ? WF_SWITCH_ON : WF_SWITCH_OFF; return;
  case WF_HF_AUX: d->aux_coef = x; return;
  default: d->tie = x != 0 ? WF_TIE_YES : WF_TIE_NO; return;
  }
}

/* ---- writing ------------------------------------------------------------------------------ */

/* __metadata__: format pt (transformers requires it), the producer, the family and its
 * dims under Hugging Face's names, all strings as the format wants. */
static json_t *metadata_json(const wf_model_dims *d)
{
  const wf_family *f = d->fam;
  json_t *meta = json_object();
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(meta, "producer", json_string("weft"));
  json_object_set_new(meta, "weft_family", json_string(f->name));
  for (int i = 0; i < f->n_hf_keys; i++) {
    json_t *v = field_json(d, f->hf_keys[i].field);
    char buf[64] = "";
    if (json_is_integer(v))
      snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
      snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
    else if (json_is_boolean(v))
      snprintf(buf, sizeof buf, "%s", json_is_true(v) ? "true" : "false");
    char *js = buf[0] ? NULL : json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_object_set_new(meta, f->hf_keys[i].key, json_string(js ? js : buf)); /* objects as JSON */
    free(js);
    json_decref(v);
  }
  return meta;
}

static json_t *header_json(const wf_model_dims *d, const wf__st_spec *specs, int n)
{
  json_t *h = json_object();
  json_object_set_new(h, "__metadata__", metadata_json(d));
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    const wf__st_spec *s = &specs[i];
    size_t bytes = wf__st_numel(s) * sizeof(float);
    json_t *shape = s->ndim == 2
                        ? json_pack("[II]", (json_int_t)s->shape[0], (json_int_t)s->shape[1])
                        : json_pack("[I]", (json_int_t)s->shape[0]);
    json_object_set_new(h, s->name,
                        json_pack("{s:s, s:o, s:[II]}", "dtype", "F32", "shape", shape,
                                  "data_offsets", (json_int_t)at, (json_int_t)(at + bytes)));
    at += bytes;
  }
  return h;
}

/* One part in the file's layout (through tmp unless it is stored as weft holds it). */
static wf_status write_tensor(wf_afile *f, const wf__st_spec *s, const float *full, float *tmp)
{
  const float *src = full + s->off;
  if (wf__st_plain(s))
    return wf_afile_write(f, src, wf__st_numel(s) * sizeof(float));
  to_file(s, src, tmp);
  return wf_afile_write(f, tmp, wf__st_numel(s) * sizeof(float));
}

static wf_status write_body(wf_afile *f, const char *js, const wf__st_spec *specs, int n,
                            const float *full, float *tmp)
{
  size_t len = strlen(js), padded = (len + 7) / 8 * 8;
  uint64_t n_le = padded;
  static const char spaces[8] = "        ";
  wf_status st = wf_afile_write(f, &n_le, sizeof n_le);
  if (st == WF_OK)
    st = wf_afile_write(f, js, len);
  if (st == WF_OK)
    st = wf_afile_write(f, spaces, padded - len);
  for (int i = 0; st == WF_OK && i < n; i++)
    st = write_tensor(f, &specs[i], full, tmp);
  return st;
}

/* One file of the parts specs[0 .. n), atomically. */
static wf_status write_file(const char *path, const wf_model_dims *d, const wf__st_spec *specs,
                            int n, const float *full, float *tmp)
{
  json_t *h = header_json(d, specs, n);
  char *js = h ? json_dumps(h, JSON_COMPACT) : NULL;
  wf_status st = js ? WF_OK : WF_ENOMEM;
  wf_afile f;
  if (st == WF_OK)
    st = wf_afile_open(&f, path, 0644, 0);
  if (st == WF_OK) {
    st = write_body(&f, js, specs, n, full, tmp);
    if (st == WF_OK)
      st = wf_afile_commit(&f, NULL, NULL);
    else
      wf_afile_abort(&f);
  }
  free(js);
  json_decref(h);
  return st;
}

/* The folder of `path` (with its slash; "" for a bare name). */
void wf__st_dir_of(char *out, size_t len, const char *path)
{
  const char *slash = strrchr(path, '/');
  snprintf(out, len, "%.*s", slash ? (int)(slash - path + 1) : 0, path);
}

static wf_status write_json(const char *path, json_t *j)
{
  char *js = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  wf_status st = js ? WF_OK : WF_ENOMEM;
  if (st == WF_OK)
    st = wf_file_write_atomic(path, js, strlen(js), 0644);
  free(js);
  return st;
}

/* config.json of the model beside its weights: what transformers' from_pretrained reads. */
static wf_status write_config(const char *dir, const wf_model_dims *d)
{
  const wf_family *f = d->fam;
  char path[WF_PATH_MAX + 16];
  json_t *c = f->hf_config ? json_loads(f->hf_config, 0, NULL) : json_object();
  if (!c)
    return WF_ENOMEM;
  json_object_set_new(c, "model_type", json_string(f->hf_model_type));
  json_object_set_new(c, "architectures", json_pack("[s]", f->hf_architecture));
  json_object_set_new(c, "torch_dtype", json_string("float32"));
  for (int i = 0; i < f->n_hf_keys; i++)
    json_object_set_new(c, f->hf_keys[i].key, field_json(d, f->hf_keys[i].field));
  snprintf(path, sizeof path, "%sconfig.json", dir);
  wf_status st = write_json(path, c);
  json_decref(c);
  return st;
}

/* Shards of at most shard_bytes (a part larger than that is a shard alone) beside the
 * index at `path`, named model-0000N-of-0000M.safetensors, then the index. */
static wf_status write_sharded(const char *path, const wf_model_dims *d, const wf__st_spec *specs,
                               int n, const float *full, float *tmp, size_t shard_bytes)
{
  wf_status st = WF_OK;
  char dir[WF_PATH_MAX], file[WF_PATH_MAX + 64], name[64];
  int first[WF_ST_MAX_FILES + 1], nf = 0;
  size_t bytes = 0, total = 0;
  wf__st_dir_of(dir, sizeof dir, path);
  for (int i = 0; i < n; i++) {
    size_t b = wf__st_numel(&specs[i]) * sizeof(float);
    if (i == 0 || (bytes + b > shard_bytes && bytes > 0)) {
      if (nf == WF_ST_MAX_FILES)
        return WF_EINVAL;
      first[nf++] = i, bytes = 0;
    }
    bytes += b, total += b;
  }
  first[nf] = n;
  json_t *map = json_object();
  for (int k = 0; st == WF_OK && k < nf; k++) {
    snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nf);
    snprintf(file, sizeof file, "%s%s", dir, name);
    st = write_file(file, d, specs + first[k], first[k + 1] - first[k], full, tmp);
    for (int i = first[k]; i < first[k + 1]; i++)
      json_object_set_new(map, specs[i].name, json_string(name));
  }
  json_t *index =
      json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
  if (st == WF_OK)
    st = index ? write_json(path, index) : WF_ENOMEM;
  json_decref(index);
  return st;
}

wf_status wf_safetensors_write(const char *path, const wf_model_dims *dd, const float *full,
                               size_t shard_bytes, bool config, char *err, size_t len)
{
  const char *bad = wf_model_dims_check(dd);
  if (bad)
    return wf__st_fail(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path,
                       bad);
  int n = 0;
  wf_model_dims d;
  wf_model_desc desc;
  wf__st_spec *specs = wf__st_alloc_specs(dd, &d, &desc, &n);
  float *tmp = specs ? malloc(wf__st_largest(specs, n) * sizeof *tmp) : NULL;
  wf_status st = specs && tmp ? WF_OK : WF_ENOMEM;
  char dir[WF_PATH_MAX];
  wf__st_dir_of(dir, sizeof dir, path);
  if (st == WF_OK && wf__st_ends_with(path, ".index.json"))
    st = write_sharded(path, &d, specs, n, full, tmp, shard_bytes ? shard_bytes : SHARD_BYTES);
  else if (st == WF_OK)
    st = write_file(path, &d, specs, n, full, tmp);
  if (st == WF_OK && config)
    st = write_config(dir, &d);
  if (st != WF_OK)
    wf__st_fail(err, len, st, "safetensors '%s': cannot write it: %s (see the log above)", path,
                wf_status_str(st));
  free(tmp);
  free(specs);
  return st;
}
