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
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wf_file.h"
#include "wf_model.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors files are little-endian; add byte swapping for this host"
#endif

#define HEADER_MAX  (100u << 20)    /* the reference reader's limit on the JSON header */
#define HEAD_SIZE   64              /* the head size when a file says nothing of the heads */
#define SHARD_BYTES (5000000000ull) /* save_pretrained's max_shard_size "5GB" */
#define MAX_FILES   4096

static wf_status failf(char *err, size_t len, wf_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static wf_status failf(char *err, size_t len, wf_status st, const char *fmt, ...)
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

static bool ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* ---- the mapping ----------------------------------------------------------------------- */

/* One Hugging Face tensor against the flat array: rows x cols of weft's layout from
 * `off` (a row group of a tensor, or all of it), the file's shape. */
typedef struct spec {
  char name[128];
  int ndim;
  int64_t shape[2]; /* the file's shape (transposed: (cols, rows)) */
  bool transpose;
  size_t off; /* first element in `full` */
  size_t rows, cols;
  int tensor;
} spec;

static size_t spec_numel(const spec *s) { return s->rows * s->cols; }

/* The spec of part p of tensor t, layer l, expert e (0 when not an expert tensor; d
 * resolved): an expert's copy follows the ones before it in the layer's tensor. */
static void make_spec(spec *s, const wf_model_dims *d, const wf_tensor_desc *t, int ti, int p,
                      int l, int e)
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
static int add_tensor(spec *out, int n, const wf_model_dims *d, const wf_model_desc *desc, int ti,
                      int l)
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
static int build_specs(const wf_model_dims *d, const wf_model_desc *desc, spec *out)
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
static spec *alloc_specs(const wf_model_dims *d, wf_model_dims *r, wf_model_desc *desc, int *n)
{
  *r = wf_model_dims_resolve(d);
  wf_model_describe(r, desc);
  *n = build_specs(r, desc, NULL);
  spec *s = calloc((size_t)*n + 1, sizeof *s);
  if (s)
    build_specs(r, desc, s);
  return s;
}

/* Index in the file's layout of weft element (r, c) of spec s. */
static size_t file_index(const spec *s, size_t r, size_t c)
{
  return s->transpose ? c * s->rows + r : r * s->cols + c;
}

/* The part's elements between weft's layout (w, from full) and the file's (f). */
static void to_file(const spec *s, const float *w, float *f)
{
  for (size_t r = 0; r < s->rows; r++)
    for (size_t c = 0; c < s->cols; c++)
      f[file_index(s, r, c)] = w[r * s->cols + c];
}

static void from_file(const spec *s, const float *f, float *w)
{
  for (size_t r = 0; r < s->rows; r++)
    for (size_t c = 0; c < s->cols; c++)
      w[r * s->cols + c] = f[file_index(s, r, c)];
}

static bool plain(const spec *s) { return !s->transpose; }

/* The largest part, in elements (the scratch a transpose or permutation needs). */
static size_t largest(const spec *s, int n)
{
  size_t big = 1;
  for (int i = 0; i < n; i++)
    big = WF_MAX(big, spec_numel(&s[i]));
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
static double json_num(json_t *v)
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

static void field_set(wf_model_dims *d, wf_hf_field f, double x)
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

static json_t *header_json(const wf_model_dims *d, const spec *specs, int n)
{
  json_t *h = json_object();
  json_object_set_new(h, "__metadata__", metadata_json(d));
  size_t at = 0;
  for (int i = 0; i < n; i++) {
    const spec *s = &specs[i];
    size_t bytes = spec_numel(s) * sizeof(float);
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
static wf_status write_tensor(wf_afile *f, const spec *s, const float *full, float *tmp)
{
  const float *src = full + s->off;
  if (plain(s))
    return wf_afile_write(f, src, spec_numel(s) * sizeof(float));
  to_file(s, src, tmp);
  return wf_afile_write(f, tmp, spec_numel(s) * sizeof(float));
}

static wf_status write_body(wf_afile *f, const char *js, const spec *specs, int n,
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
static wf_status write_file(const char *path, const wf_model_dims *d, const spec *specs, int n,
                            const float *full, float *tmp)
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
static void dir_of(char *out, size_t len, const char *path)
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
static wf_status write_sharded(const char *path, const wf_model_dims *d, const spec *specs, int n,
                               const float *full, float *tmp, size_t shard_bytes)
{
  wf_status st = WF_OK;
  char dir[WF_PATH_MAX], file[WF_PATH_MAX + 64], name[64];
  int first[MAX_FILES + 1], nf = 0;
  size_t bytes = 0, total = 0;
  dir_of(dir, sizeof dir, path);
  for (int i = 0; i < n; i++) {
    size_t b = spec_numel(&specs[i]) * sizeof(float);
    if (i == 0 || (bytes + b > shard_bytes && bytes > 0)) {
      if (nf == MAX_FILES)
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
    return failf(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path, bad);
  int n = 0;
  wf_model_dims d;
  wf_model_desc desc;
  spec *specs = alloc_specs(dd, &d, &desc, &n);
  float *tmp = specs ? malloc(largest(specs, n) * sizeof *tmp) : NULL;
  wf_status st = specs && tmp ? WF_OK : WF_ENOMEM;
  char dir[WF_PATH_MAX];
  dir_of(dir, sizeof dir, path);
  if (st == WF_OK && ends_with(path, ".index.json"))
    st = write_sharded(path, &d, specs, n, full, tmp, shard_bytes ? shard_bytes : SHARD_BYTES);
  else if (st == WF_OK)
    st = write_file(path, &d, specs, n, full, tmp);
  if (st == WF_OK && config)
    st = write_config(dir, &d);
  if (st != WF_OK)
    failf(err, len, st, "safetensors '%s': cannot write it: %s (see the log above)", path,
          wf_status_str(st));
  free(tmp);
  free(specs);
  return st;
}

/* ---- reading --------------------------------------------------------------------------------- */

typedef struct st_file {
  const char *path;
  int fd;
  uint64_t size, data_start; /* file size; first byte after the header */
  json_t *header;
} st_file;

static void st_close(st_file *f)
{
  if (f->fd >= 0)
    close(f->fd);
  json_decref(f->header);
  f->fd = -1, f->header = NULL;
}

static wf_status read_exact(st_file *f, void *buf, size_t n, uint64_t at)
{
  for (size_t got = 0; got < n;) {
    ssize_t r = pread(f->fd, (char *)buf + got, n - got, (off_t)(at + got));
    if (r <= 0)
      return WF_EIO;
    got += (size_t)r;
  }
  return WF_OK;
}

/* Open, check the length prefix against the file, parse the JSON header. */
static wf_status st_open(st_file *f, const char *path, char *err, size_t len)
{
  struct stat sb;
  *f = (st_file){.path = path, .fd = -1};
  if (stat(path, &sb) != 0)
    return failf(err, len, WF_EIO, "safetensors '%s': cannot open it: %s", path, strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return failf(err, len, WF_EIO, "safetensors '%s' is not a regular file", path);
  f->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f->fd < 0)
    return failf(err, len, WF_EIO, "safetensors '%s': cannot open it: %s", path, strerror(errno));
  f->size = (uint64_t)sb.st_size;
  uint64_t n = 0;
  if (f->size < 8 || read_exact(f, &n, 8, 0) != WF_OK)
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s' is truncated: %llu bytes, less than the 8-byte header length",
                 path, (unsigned long long)f->size);
  if (n > HEADER_MAX || 8 + n > f->size)
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s': the header length %llu runs past the file's %llu bytes (or "
                 "past the format's 100 MiB limit): truncated, or not a safetensors file",
                 path, (unsigned long long)n, (unsigned long long)f->size);
  char *js = malloc(n ? n : 1);
  if (!js)
    return WF_ENOMEM;
  wf_status st = read_exact(f, js, n, 8);
  json_error_t je;
  f->header = st == WF_OK ? json_loadb(js, n, JSON_REJECT_DUPLICATES, &je) : NULL;
  free(js);
  f->data_start = 8 + n;
  if (st != WF_OK)
    return failf(err, len, WF_EIO, "safetensors '%s': cannot read the header", path);
  if (!f->header)
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s': the header is not valid JSON: %s (at byte %d)", path, je.text,
                 je.position);
  if (!json_is_object(f->header))
    return failf(err, len, WF_EFORMAT, "safetensors '%s': the header is not a JSON object", path);
  return WF_OK;
}

typedef enum dtype { DT_F32 = 0, DT_BF16, DT_F16 } dtype;

typedef struct tinfo {
  dtype dt;
  int ndim;
  int64_t shape[4];
  uint64_t begin, end; /* byte range in the data section */
} tinfo;

static size_t dtype_size(dtype dt) { return dt == DT_F32 ? 4 : 2; }

static void shape_str(char *out, size_t len, int ndim, const int64_t *shape)
{
  int k = snprintf(out, len, "[");
  for (int i = 0; i < ndim && k > 0 && (size_t)k < len; i++)
    k += snprintf(out + k, len - (size_t)k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k > 0 && (size_t)k < len)
    snprintf(out + k, len - (size_t)k, "]");
}

static wf_status parse_shape(const st_file *f, const char *name, json_t *shape, tinfo *ti,
                             char *err, size_t len)
{
  size_t i;
  json_t *v;
  if (!json_is_array(shape) || json_array_size(shape) > 4)
    return failf(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' has no valid \"shape\"",
                 f->path, name);
  ti->ndim = (int)json_array_size(shape);
  json_array_foreach(shape, i, v)
  {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1ll << 40))
      return failf(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' has a bad dimension",
                   f->path, name);
    ti->shape[i] = json_integer_value(v);
  }
  return WF_OK;
}

/* dtype, shape and data range of one entry, checked against each other and the file. */
static wf_status parse_info(const st_file *f, const char *name, json_t *t, tinfo *ti, char *err,
                            size_t len)
{
  const char *dt = json_string_value(json_object_get(t, "dtype"));
  json_t *off = json_object_get(t, "data_offsets");
  if (!dt || (strcmp(dt, "F32") && strcmp(dt, "BF16") && strcmp(dt, "F16")))
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s': tensor '%s' has dtype %s; weft reads F32, BF16 and F16",
                 f->path, name, dt ? dt : "(none)");
  ti->dt = !strcmp(dt, "F32") ? DT_F32 : !strcmp(dt, "BF16") ? DT_BF16 : DT_F16;
  wf_status st = parse_shape(f, name, json_object_get(t, "shape"), ti, err, len);
  if (st != WF_OK)
    return st;
  if (json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
      !json_is_integer(json_array_get(off, 1)) || json_integer_value(json_array_get(off, 0)) < 0 ||
      json_integer_value(json_array_get(off, 1)) < json_integer_value(json_array_get(off, 0)))
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s': tensor '%s' has no valid \"data_offsets\" [begin, end]",
                 f->path, name);
  ti->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
  ti->end = (uint64_t)json_integer_value(json_array_get(off, 1));
  uint64_t numel = 1, have = f->size - f->data_start;
  for (int i = 0; i < ti->ndim; i++)
    numel *= (uint64_t)ti->shape[i];
  if (ti->end - ti->begin != numel * dtype_size(ti->dt))
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s': tensor '%s' spans %llu bytes, but %s x its shape needs %llu",
                 f->path, name, (unsigned long long)(ti->end - ti->begin), dt,
                 (unsigned long long)(numel * dtype_size(ti->dt)));
  if (ti->end > have)
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s' is truncated: tensor '%s' ends at byte %llu of the data, but "
                 "the file holds %llu bytes of data",
                 f->path, name, (unsigned long long)ti->end, (unsigned long long)have);
  return WF_OK;
}

static float bf16_to_f32(uint16_t h)
{
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static float f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
  if (e == 0x1f)
    u = sign | 0x7f800000u | m << 13; /* inf, NaN */
  else if (e)
    u = sign | (e + 112) << 23 | m << 13;
  else if (!m)
    u = sign;
  else { /* subnormal: m * 2^-24 */
    float x = (float)m * 0x1p-24f;
    return sign ? -x : x;
  }
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* n elements of the tensor as float32 into out; raw holds n * 2 bytes for 16-bit types. */
static wf_status read_values(st_file *f, const tinfo *ti, float *out, size_t n, uint16_t *raw)
{
  uint64_t at = f->data_start + ti->begin;
  if (ti->dt == DT_F32)
    return read_exact(f, out, n * sizeof *out, at);
  wf_status st = read_exact(f, raw, n * sizeof *raw, at);
  for (size_t i = 0; st == WF_OK && i < n; i++)
    out[i] = ti->dt == DT_BF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
  return st;
}

static wf_status check_shape(const st_file *f, const spec *s, const tinfo *ti,
                             const wf_model_dims *d, char *err, size_t len)
{
  if (ti->ndim == s->ndim && ti->shape[0] == s->shape[0] &&
      (s->ndim == 1 || ti->shape[1] == s->shape[1]))
    return WF_OK;
  char saw[96], want[96];
  shape_str(saw, sizeof saw, ti->ndim, ti->shape);
  shape_str(want, sizeof want, s->ndim, s->shape);
  return failf(err, len, WF_EFORMAT,
               "safetensors '%s': tensor '%s' has shape %s, but the model (%s: n_layer %d, n_embd "
               "%d, n_head %d, kv heads %d, ffn %d, n_ctx %d, vocab %d) expects %s",
               f->path, s->name, saw, d->fam->name, d->L, d->C, d->NH, d->KV, d->F, d->maxT, d->V,
               want);
}

/* A model's files: one, or a sharded model's (the index's weight_map names each
 * tensor's); opened on first use. */
typedef struct source {
  const char *path; /* what the caller named */
  const wf_family *fam;
  json_t *index; /* the weight_map, or NULL for one file */
  st_file files[MAX_FILES];
  char names[MAX_FILES][WF_PATH_MAX];
  int n;
} source;

static void src_close(source *s)
{
  for (int i = 0; i < s->n; i++)
    st_close(&s->files[i]);
  json_decref(s->index);
  free(s);
}

static bool is_index(const char *path) { return ends_with(path, ".index.json"); }

/* The file named `file` (relative to the index's folder), opened once. */
static wf_status src_file(source *s, const char *file, st_file **out, char *err, size_t len)
{
  char dir[WF_PATH_MAX];
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], file))
      return *out = &s->files[i], WF_OK;
  if (s->n == MAX_FILES || strchr(file, '/'))
    return failf(err, len, WF_EFORMAT, "safetensors index '%s': bad file name '%s'", s->path, file);
  dir_of(dir, sizeof dir, s->path);
  snprintf(s->names[s->n], sizeof s->names[s->n], "%s%s", dir, file);
  wf_status st = st_open(&s->files[s->n], s->names[s->n], err, len);
  if (st != WF_OK)
    return st;
  snprintf(s->names[s->n], sizeof s->names[s->n], "%s", file);
  *out = &s->files[s->n++];
  return WF_OK;
}

static wf_status src_open(source **out, const char *path, char *err, size_t len)
{
  source *s = calloc(1, sizeof *s);
  wf_status st = s ? WF_OK : WF_ENOMEM;
  json_error_t je;
  *out = NULL;
  if (st != WF_OK)
    return failf(err, len, st, "safetensors '%s': out of memory", path);
  s->path = path;
  if (!is_index(path)) {
    snprintf(s->names[0], sizeof s->names[0], "%s", path);
    st = st_open(&s->files[0], path, err, len);
    s->n = st == WF_OK ? 1 : 0;
  } else {
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    s->index = j ? json_incref(json_object_get(j, "weight_map")) : NULL;
    json_decref(j);
    if (!s->index || !json_is_object(s->index))
      st = failf(err, len, WF_EFORMAT,
                 "safetensors index '%s': no \"weight_map\" object (%s); a sharded model's "
                 "model.safetensors.index.json maps every tensor to its file",
                 path, j ? "missing" : je.text);
  }
  if (st != WF_OK) {
    src_close(s);
    return st;
  }
  *out = s;
  return WF_OK;
}

/* The entry of `name` (or of it without the family's optional prefix) and its file. */
static json_t *src_find(source *s, const char *name, st_file **f, char *err, size_t len)
{
  const char *pre = s->fam ? s->fam->hf_prefix : NULL;
  const char *alt = pre && !strncmp(name, pre, strlen(pre)) ? name + strlen(pre) : NULL;
  if (!s->index) {
    *f = &s->files[0];
    json_t *t = json_object_get(s->files[0].header, name);
    return t || !alt ? t : json_object_get(s->files[0].header, alt);
  }
  json_t *file = json_object_get(s->index, name);
  if (!file && alt)
    file = json_object_get(s->index, alt), name = alt;
  if (!json_is_string(file) || src_file(s, json_string_value(file), f, err, len) != WF_OK)
    return NULL;
  return json_object_get((*f)->header, name);
}

/* The entry of spec s in src: its file and info, with the shape the model expects. */
static wf_status find_spec(source *src, const spec *s, const wf_model_dims *d, st_file **f,
                           tinfo *ti, char *err, size_t len)
{
  json_t *t = src_find(src, s->name, f, err, len);
  if (!t)
    return failf(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' is missing", src->path,
                 s->name);
  wf_status st = parse_info(*f, s->name, t, ti, err, len);
  return st == WF_OK ? check_shape(*f, s, ti, d, err, len) : st;
}

/* A tied model's head entry, found as find_spec finds a part (the embedding's shape,
 * emb), when the file holds one: *found says whether it does. */
static wf_status find_head(source *src, const wf_model_dims *d, const spec *emb, st_file **f,
                           tinfo *ti, bool *found, char *err, size_t len)
{
  const char *name = d->fam->hf_head;
  *found = false;
  if (!name || d->tie != WF_TIE_YES)
    return WF_OK;
  if (src->index ? !json_object_get(src->index, name)
                 : !json_object_get(src->files[0].header, name))
    return WF_OK;
  spec h = *emb;
  snprintf(h.name, sizeof h.name, "%s", name);
  wf_status st = find_spec(src, &h, d, f, ti, err, len);
  *found = st == WF_OK;
  return st;
}

/* One spec into its place in `full` (through tmp unless the file holds it as weft does). */
static wf_status read_spec(source *src, const spec *s, const wf_model_dims *d, float *full,
                           float *tmp, uint16_t *raw, char *err, size_t len)
{
  st_file *f = NULL;
  tinfo ti;
  wf_status st = find_spec(src, s, d, &f, &ti, err, len);
  if (st != WF_OK)
    return st;
  st = read_values(f, &ti, plain(s) ? full + s->off : tmp, spec_numel(s), raw);
  if (st != WF_OK)
    return failf(err, len, WF_EIO, "safetensors '%s': cannot read tensor '%s'", f->path, s->name);
  if (!plain(s))
    from_file(s, tmp, full + s->off);
  return WF_OK;
}

/* A tensor the family lists as a buffer to skip. */
static bool skipped(const wf_family *fam, const char *name)
{
  for (int i = 0; i < 4 && fam->hf_skip[i]; i++)
    if (ends_with(name, fam->hf_skip[i]))
      return true;
  return false;
}

static bool known_name(const wf_family *fam, const spec *specs, int n, const char *key)
{
  const char *pre = fam->hf_prefix;
  size_t pl = pre ? strlen(pre) : 0;
  for (int i = 0; i < n; i++)
    if (!strcmp(specs[i].name, key) ||
        (pl && !strncmp(specs[i].name, pre, pl) && !strcmp(specs[i].name + pl, key)))
      return true;
  return false;
}

/* An entry a model of d may hold: one of its parts, a tied model's head, or a buffer the
 * family skips. */
static bool expected(const wf_model_dims *d, const spec *specs, int n, const char *key)
{
  const wf_family *fam = d->fam;
  bool head = fam->hf_head && !strcmp(key, fam->hf_head) && d->tie == WF_TIE_YES;
  return head || skipped(fam, key) || known_name(fam, specs, n, key);
}

/* Every entry of one file must be one weft reads, the tied head, or a skipped buffer: a
 * tensor of another architecture (or a layer past n_layer) is an error, not silently
 * dropped. */
static wf_status check_extras(const st_file *f, const wf_model_dims *d, const spec *specs, int n,
                              char *err, size_t len)
{
  const wf_family *fam = d->fam;
  const char *key;
  json_t *v;
  json_object_foreach(f->header, key, v)
  {
    if (!strcmp(key, "__metadata__") || expected(d, specs, n, key))
      continue;
    return failf(err, len, WF_EFORMAT,
                 "safetensors '%s': unexpected tensor '%s'; a %s of %d layers has %s ... %s "
                 "(Hugging Face's %s names)",
                 f->path, key, fam->name, d->L, specs[0].name, specs[n - 1].name,
                 fam->hf_architecture);
  }
  return WF_OK;
}

static wf_status check_all_extras(source *s, const wf_model_dims *d, const spec *specs, int n,
                                  char *err, size_t len)
{
  wf_status st = WF_OK;
  if (s->index) { /* every tensor the index names, in whichever shard */
    const char *key;
    json_t *v;
    json_object_foreach(s->index, key, v)
    {
      if (!expected(d, specs, n, key))
        return failf(err, len, WF_EFORMAT,
                     "safetensors index '%s': unexpected tensor '%s'; a %s of %d layers has %s "
                     "... %s",
                     s->path, key, d->fam->name, d->L, specs[0].name, specs[n - 1].name);
    }
    return WF_OK;
  }
  for (int i = 0; st == WF_OK && i < s->n; i++)
    st = check_extras(&s->files[i], d, specs, n, err, len);
  return st;
}

/* The head, when present in a tied model's file, must equal the embedding (rows V of
 * the embedding spec, which is specs[0]). */
static wf_status check_head(source *s, const wf_model_dims *d, const spec *emb, const float *full,
                            float *tmp, uint16_t *raw, char *err, size_t len)
{
  st_file *f = NULL;
  tinfo ti;
  bool found;
  wf_status st = find_head(s, d, emb, &f, &ti, &found, err, len);
  for (size_t r = 0; found && st == WF_OK && r < emb->rows; r++) {
    tinfo row = ti;
    row.begin = ti.begin + (uint64_t)r * (uint64_t)emb->cols * dtype_size(ti.dt);
    st = read_values(f, &row, tmp, emb->cols, raw);
    if (st == WF_OK && memcmp(tmp, full + emb->off + r * emb->cols, emb->cols * sizeof *tmp))
      return failf(err, len, WF_EFORMAT,
                   "safetensors '%s': %s differs from %s (row %zu); this model ties its head to "
                   "the embedding (model.tie_embeddings), so they must be equal",
                   f->path, d->fam->hf_head, emb->name, r);
  }
  return st;
}

static wf_status read_all(source *src, const wf_model_dims *d, const spec *specs, int n,
                          float *full, char *err, size_t len)
{
  size_t big = largest(specs, n);
  float *tmp = malloc(big * sizeof *tmp);
  uint16_t *raw = malloc(big * sizeof *raw);
  wf_status st =
      tmp && raw ? WF_OK : failf(err, len, WF_ENOMEM, "safetensors '%s': out of memory", src->path);
  if (st == WF_OK)
    st = check_all_extras(src, d, specs, n, err, len);
  memset(full, 0, wf_model_num_params(d) * sizeof *full); /* the padded vocabulary rows */
  for (int i = 0; st == WF_OK && i < n; i++)
    st = read_spec(src, &specs[i], d, full, tmp, raw, err, len);
  if (st == WF_OK && n > 0 && specs[0].tensor >= 0) /* the tied head, against the embedding */
    st = check_head(src, d, &specs[0], full, tmp, raw, err, len);
  free(tmp);
  free(raw);
  return st;
}

wf_status wf_safetensors_read(const char *path, const wf_model_dims *dd, float *full, char *err,
                              size_t len)
{
  const char *bad = wf_model_dims_check(dd);
  if (bad)
    return failf(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path, bad);
  source *src = NULL;
  wf_model_dims d;
  wf_model_desc desc;
  int n = 0;
  wf_status st = src_open(&src, path, err, len);
  spec *specs = st == WF_OK ? alloc_specs(dd, &d, &desc, &n) : NULL;
  if (st == WF_OK && !specs)
    st = failf(err, len, WF_ENOMEM, "safetensors '%s': out of memory", path);
  if (st == WF_OK) {
    src->fam = d.fam;
    st = read_all(src, &d, specs, n, full, err, len);
  }
  if (src)
    src_close(src);
  free(specs);
  return st;
}

/* ---- a ranged read ------------------------------------------------------------------------- */

/* wf_safetensors_read_shard: every tensor's header checked as read_all checks it, then
 * the shard's runs inside [lo, hi) filled from the file, a bounded piece of one part at
 * a time (PIECE elements of weft's layout: rows of a part, read straight, or for a
 * transposed part column by column), so no rank holds the whole model or a whole
 * tensor. A tied head is compared with the embedding over the pieces of it read. */
enum { PIECE = 1 << 20 };

typedef struct part_at {
  st_file *f;
  tinfo ti;
} part_at;

/* A part's offset in the flat vector, and its index (what the ranged read sorts). */
typedef struct by_off {
  size_t off;
  int k;
} by_off;

static int cmp_off(const void *a, const void *b)
{
  size_t x = ((const by_off *)a)->off, y = ((const by_off *)b)->off;
  return (x > y) - (x < y);
}

typedef struct ranged {
  source *src;
  const wf_model_dims *d;
  const spec *specs;
  int n;
  by_off *order; /* the parts by their offset in the flat vector */
  part_at *at, head;
  bool has_head;
  float *dst;
  size_t lo, hi;
  int cur; /* the part whose rows [r0, r1) buf holds (-1: none) */
  size_t r0, r1;
  float *buf, *col, *hbuf;
  uint16_t *raw;
  wf_status st;
  char *err;
  size_t len;
} ranged;

/* Rows [r0, r1) of part s (its entry ti in f), weft's layout, into out. */
static wf_status read_rows(st_file *f, const tinfo *ti, const spec *s, size_t r0, size_t r1,
                           float *out, float *col, uint16_t *raw)
{
  size_t es = dtype_size(ti->dt);
  tinfo p = *ti;
  if (plain(s)) {
    p.begin += (uint64_t)(r0 * s->cols * es);
    return read_values(f, &p, out, (r1 - r0) * s->cols, raw);
  }
  for (size_t c = 0; c < s->cols; c++) { /* the file's row c holds weft's column c */
    p.begin = ti->begin + (uint64_t)((c * s->rows + r0) * es);
    wf_status st = read_values(f, &p, col, r1 - r0, raw);
    if (st != WF_OK)
      return st;
    for (size_t r = 0; r < r1 - r0; r++)
      out[r * s->cols + c] = col[r];
  }
  return WF_OK;
}

/* Part k's rows from `row` (as many as a piece holds) into x->buf; the embedding's are
 * checked against a tied head's. */
static wf_status load_rows(ranged *x, int k, size_t row)
{
  const spec *s = &x->specs[k];
  size_t r1 = WF_MIN(s->rows, row + WF_MAX((size_t)1, PIECE / s->cols));
  x->cur = -1;
  if (read_rows(x->at[k].f, &x->at[k].ti, s, row, r1, x->buf, x->col, x->raw) != WF_OK)
    return failf(x->err, x->len, WF_EIO, "safetensors '%s': cannot read tensor '%s'",
                 x->at[k].f->path, s->name);
  if (k == 0 && x->has_head) {
    if (read_rows(x->head.f, &x->head.ti, s, row, r1, x->hbuf, x->col, x->raw) != WF_OK)
      return failf(x->err, x->len, WF_EIO, "safetensors '%s': cannot read tensor '%s'",
                   x->head.f->path, x->d->fam->hf_head);
    for (size_t r = row; r < r1; r++)
      if (memcmp(x->hbuf + (r - row) * s->cols, x->buf + (r - row) * s->cols,
                 s->cols * sizeof *x->buf))
        return failf(x->err, x->len, WF_EFORMAT,
                     "safetensors '%s': %s differs from %s (row %zu); this model ties its head to "
                     "the embedding (model.tie_embeddings), so they must be equal",
                     x->head.f->path, x->d->fam->hf_head, s->name, r);
  }
  x->cur = k, x->r0 = row, x->r1 = r1;
  return WF_OK;
}

/* The first part (in offset order) that ends past flat element f; x->n when none. */
static int part_after(const ranged *x, size_t f)
{
  int a = 0, b = x->n;
  while (a < b) {
    int m = (a + b) / 2;
    const spec *s = &x->specs[x->order[m].k];
    if (s->off + spec_numel(s) <= f)
      a = m + 1;
    else
      b = m;
  }
  return a;
}

/* Flat elements [f, f + n) into out: the parts' values, zeros where no part lies (the
 * padded vocabulary's rows). out NULL: read and checked, not kept. */
static wf_status fill(ranged *x, size_t f, size_t n, float *out)
{
  while (n > 0) {
    int i = part_after(x, f), k = i < x->n ? x->order[i].k : -1;
    const spec *s = k >= 0 ? &x->specs[k] : NULL;
    size_t m;
    if (!s || s->off > f) {
      m = s ? WF_MIN(n, s->off - f) : n;
      if (out)
        memset(out, 0, m * sizeof *out);
    } else {
      size_t e = f - s->off, row = e / s->cols;
      if (x->cur != k || row < x->r0 || row >= x->r1) {
        wf_status st = load_rows(x, k, row);
        if (st != WF_OK)
          return st;
      }
      m = WF_MIN(n, x->r1 * s->cols - e);
      if (out)
        memcpy(out, x->buf + (e - x->r0 * s->cols), m * sizeof *out);
    }
    f += m, n -= m;
    out = out ? out + m : NULL;
  }
  return WF_OK;
}

static void ranged_run(void *user, const wf_model_run *r)
{
  ranged *x = user;
  if (x->st == WF_OK)
    x->st = fill(x, r->full, r->n, x->dst ? x->dst + (r->local - x->lo) : NULL);
}

/* Every part's entry found and checked (dtype, shape, extent), and the extras and the
 * tied head's entry, as read_all checks them before it reads. */
static wf_status check_parts(ranged *x)
{
  wf_status st = check_all_extras(x->src, x->d, x->specs, x->n, x->err, x->len);
  for (int i = 0; st == WF_OK && i < x->n; i++)
    st = find_spec(x->src, &x->specs[i], x->d, &x->at[i].f, &x->at[i].ti, x->err, x->len);
  if (st == WF_OK)
    st = find_head(x->src, x->d, &x->specs[0], &x->head.f, &x->head.ti, &x->has_head, x->err,
                   x->len);
  return st;
}

static wf_status read_ranged(ranged *x, const wf_model_shard *sh)
{
  size_t piece = WF_MIN((size_t)PIECE, largest(x->specs, x->n)), widest = 1;
  for (int i = 0; i < x->n; i++)
    widest = WF_MAX(widest, x->specs[i].cols); /* a piece is at least one row */
  piece = WF_MAX(piece, widest);
  x->order = malloc((size_t)x->n * sizeof *x->order);
  x->at = calloc((size_t)x->n, sizeof *x->at);
  x->buf = malloc(piece * sizeof *x->buf);
  x->hbuf = malloc(piece * sizeof *x->hbuf);
  x->col = malloc(piece * sizeof *x->col);
  x->raw = malloc(piece * sizeof *x->raw);
  if (!x->order || !x->at || !x->buf || !x->hbuf || !x->col || !x->raw)
    return failf(x->err, x->len, WF_ENOMEM, "safetensors '%s': out of memory", x->src->path);
  wf_status st = check_parts(x);
  if (st != WF_OK)
    return st;
  for (int i = 0; i < x->n; i++)
    x->order[i] = (by_off){x->specs[i].off, i};
  qsort(x->order, (size_t)x->n, sizeof *x->order, cmp_off);
  x->cur = -1;
  wf_model_shard_runs_in(x->d, sh, x->lo, x->hi, ranged_run, x);
  return x->st;
}

wf_status wf_safetensors_read_shard(const char *path, const wf_model_dims *dd,
                                    const wf_model_shard *sh, size_t lo, size_t hi, float *dst,
                                    char *err, size_t len)
{
  const char *bad = wf_model_dims_check(dd);
  if (bad)
    return failf(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path, bad);
  wf_model_dims d;
  wf_model_desc desc;
  ranged x = {.d = &d, .dst = dst, .lo = lo, .hi = hi, .err = err, .len = len};
  wf_status st = src_open(&x.src, path, err, len);
  spec *specs = st == WF_OK ? alloc_specs(dd, &d, &desc, &x.n) : NULL;
  if (st == WF_OK && !specs)
    st = failf(err, len, WF_ENOMEM, "safetensors '%s': out of memory", path);
  x.specs = specs;
  if (st == WF_OK) {
    x.src->fam = d.fam;
    st = read_ranged(&x, sh);
  }
  if (x.src)
    src_close(x.src);
  free(specs);
  free(x.order);
  free(x.at);
  free(x.buf);
  free(x.hbuf);
  free(x.col);
  free(x.raw);
  return st;
}

/* ---- dimensions ------------------------------------------------------------------------------ */

/* config.json beside path (NULL when there is none or it is not JSON). */
static json_t *config_beside(const char *path)
{
  char dir[WF_PATH_MAX], cfg[WF_PATH_MAX + 16];
  struct stat sb;
  dir_of(dir, sizeof dir, path);
  snprintf(cfg, sizeof cfg, "%sconfig.json", dir);
  return stat(cfg, &sb) == 0 && S_ISREG(sb.st_mode) ? json_load_file(cfg, 0, NULL) : NULL;
}

/* Whether the model's files hold `name` (with or without the optional prefix). */
static bool src_has(source *s, const wf_family *fam, const char *name)
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
static const wf_family *family_of(source *s, json_t *meta, json_t *cfg)
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
static json_t *src_metadata(source *s)
{
  if (!s->index)
    return json_object_get(s->files[0].header, "__metadata__");
  const char *key;
  json_t *v;
  st_file *f = NULL;
  char quiet[256]; /* a missing shard is the reader's to report */
  json_object_foreach(s->index, key, v)
  {
    if (json_is_string(v) && src_file(s, json_string_value(v), &f, quiet, sizeof quiet) == WF_OK)
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
      double x = json_num(json_object_get(obj, f->hf_keys[i].key));
      if (!isnan(x))
        field_set(d, f->hf_keys[i].field, x);
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
static void tie_from_tensors(source *s, wf_model_dims *d)
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
static bool weft_shape(source *s, const char *name, bool transpose, int64_t *rows, int64_t *cols)
{
  st_file *f = NULL;
  tinfo ti;
  char quiet[256]; /* a broken tensor is the reader's to report, once */
  json_t *t = src_find(s, name, &f, quiet, sizeof quiet);
  if (!t || parse_info(f, name, t, &ti, quiet, sizeof quiet) != WF_OK || ti.ndim < 1 || ti.ndim > 2)
    return false;
  *rows = ti.shape[0], *cols = ti.ndim == 2 ? ti.shape[1] : 1;
  if (transpose && ti.ndim == 2)
    *rows = ti.shape[1], *cols = ti.shape[0];
  return true;
}

/* The extents of the dimension symbols read off the tensors' shapes (layer 0). */
static void extents_from_shapes(source *s, const wf_model_dims *d, int64_t ext[WF_DIM_N_])
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
static int layers_of(source *s, const wf_model_dims *d)
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

static wf_status peek_dims(source *s, wf_model_dims *out, char *err, size_t len)
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
      st = failf(err, len, WF_EFORMAT,
                 "safetensors '%s': config.json's model_type '%s' is not a model family weft "
                 "knows (%s)",
                 s->path, mt, known);
    else
      st = failf(err, len, WF_EFORMAT,
                 "safetensors '%s': not a model family weft knows (no config.json model_type, no "
                 "embedding of %s among its tensors)",
                 s->path, known);
    goto done;
  }
  if (d.fam->hf_refuse && d.fam->hf_refuse(cfg, why, sizeof why)) {
    st = failf(err, len, WF_EFORMAT, "safetensors '%s': %s (config.json): %s", s->path, d.fam->name,
               why);
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
    st = failf(err, len, WF_EFORMAT,
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
  source *s = NULL;
  wf_status st = src_open(&s, path, err, len);
  if (st == WF_OK)
    st = peek_dims(s, d, err, len);
  if (s)
    src_close(s);
  return st;
}
