/*
 * safetensors_read.c - reading Hugging Face safetensors weights (safetensors.c states the
 * format and the mapping): one file or a sharded model's index opened as a source, every
 * header entry checked against the family's tensor (shape, dtype F32/BF16/F16, the
 * range against the file's size), extras refused unless the family skips them, a tied
 * head accepted only when it equals the embedding; and the ranged read of one rank's
 * shard (wf_safetensors_read_shard), which reads only the rows the shard holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wf_file.h"
#include "model_int.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors files are little-endian; add byte swapping for this host"
#endif

#define HEADER_MAX (100u << 20) /* the reference reader's limit on the JSON header */

/* ---- reading --------------------------------------------------------------------------------- */

static void st_close(wf__st_file *f)
{
  if (f->fd >= 0)
    close(f->fd);
  json_decref(f->header);
  f->fd = -1, f->header = NULL;
}

static wf_status read_exact(wf__st_file *f, void *buf, size_t n, uint64_t at)
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
static wf_status st_open(wf__st_file *f, const char *path, char *err, size_t len)
{
  struct stat sb;
  *f = (wf__st_file){.path = path, .fd = -1};
  if (stat(path, &sb) != 0)
    return wf__st_fail(err, len, WF_EIO, "safetensors '%s': cannot open it: %s", path,
                       strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return wf__st_fail(err, len, WF_EIO, "safetensors '%s' is not a regular file", path);
  f->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f->fd < 0)
    return wf__st_fail(err, len, WF_EIO, "safetensors '%s': cannot open it: %s", path,
                       strerror(errno));
  f->size = (uint64_t)sb.st_size;
  uint64_t n = 0;
  if (f->size < 8 || read_exact(f, &n, 8, 0) != WF_OK)
    return wf__st_fail(
        err, len, WF_EFORMAT,
        "safetensors '%s' is truncated: %llu bytes, less than the 8-byte header length", path,
        (unsigned long long)f->size);
  if (n > HEADER_MAX || 8 + n > f->size)
    return wf__st_fail(
        err, len, WF_EFORMAT,
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
    return wf__st_fail(err, len, WF_EIO, "safetensors '%s': cannot read the header", path);
  if (!f->header)
    return wf__st_fail(err, len, WF_EFORMAT,
                       "safetensors '%s': the header is not valid JSON: %s (at byte %d)", path,
                       je.text, je.position);
  if (!json_is_object(f->header))
    return wf__st_fail(err, len, WF_EFORMAT, "safetensors '%s': the header is not a JSON object",
                       path);
  return WF_OK;
}

static size_t dtype_size(wf__st_dtype dt) { return dt == DT_F32 ? 4 : 2; }

static void shape_str(char *out, size_t len, int ndim, const int64_t *shape)
{
  int k = snprintf(out, len, "[");
  for (int i = 0; i < ndim && k > 0 && (size_t)k < len; i++)
    k += snprintf(out + k, len - (size_t)k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k > 0 && (size_t)k < len)
    snprintf(out + k, len - (size_t)k, "]");
}

static wf_status parse_shape(const wf__st_file *f, const char *name, json_t *shape,
                             wf__st_tinfo *ti, char *err, size_t len)
{
  size_t i;
  json_t *v;
  if (!json_is_array(shape) || json_array_size(shape) > 4)
    return wf__st_fail(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' has no valid \"shape\"",
                       f->path, name);
  ti->ndim = (int)json_array_size(shape);
  json_array_foreach(shape, i, v)
  {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1ll << 40))
      return wf__st_fail(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' has a bad dimension",
                         f->path, name);
    ti->shape[i] = json_integer_value(v);
  }
  return WF_OK;
}

/* dtype, shape and data range of one entry, checked against each other and the file. */
wf_status wf__st_parse_info(const wf__st_file *f, const char *name, json_t *t, wf__st_tinfo *ti,
                            char *err, size_t len)
{
  const char *dt = json_string_value(json_object_get(t, "dtype"));
  json_t *off = json_object_get(t, "data_offsets");
  if (!dt || (strcmp(dt, "F32") && strcmp(dt, "BF16") && strcmp(dt, "F16")))
    return wf__st_fail(err, len, WF_EFORMAT,
                       "safetensors '%s': tensor '%s' has dtype %s; weft reads F32, BF16 and F16",
                       f->path, name, dt ? dt : "(none)");
  ti->dt = !strcmp(dt, "F32") ? DT_F32 : !strcmp(dt, "BF16") ? DT_BF16 : DT_F16;
  wf_status st = parse_shape(f, name, json_object_get(t, "shape"), ti, err, len);
  if (st != WF_OK)
    return st;
  if (json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
      !json_is_integer(json_array_get(off, 1)) || json_integer_value(json_array_get(off, 0)) < 0 ||
      json_integer_value(json_array_get(off, 1)) < json_integer_value(json_array_get(off, 0)))
    return wf__st_fail(err, len, WF_EFORMAT,
                       "safetensors '%s': tensor '%s' has no valid \"data_offsets\" [begin, end]",
                       f->path, name);
  ti->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
  ti->end = (uint64_t)json_integer_value(json_array_get(off, 1));
  uint64_t numel = 1, have = f->size - f->data_start;
  for (int i = 0; i < ti->ndim; i++)
    numel *= (uint64_t)ti->shape[i];
  if (ti->end - ti->begin != numel * dtype_size(ti->dt))
    return wf__st_fail(
        err, len, WF_EFORMAT,
        "safetensors '%s': tensor '%s' spans %llu bytes, but %s x its shape needs %llu", f->path,
        name, (unsigned long long)(ti->end - ti->begin), dt,
        (unsigned long long)(numel * dtype_size(ti->dt)));
  if (ti->end > have)
    return wf__st_fail(
        err, len, WF_EFORMAT,
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
static wf_status read_values(wf__st_file *f, const wf__st_tinfo *ti, float *out, size_t n,
                             uint16_t *raw)
{
  uint64_t at = f->data_start + ti->begin;
  if (ti->dt == DT_F32)
    return read_exact(f, out, n * sizeof *out, at);
  wf_status st = read_exact(f, raw, n * sizeof *raw, at);
  for (size_t i = 0; st == WF_OK && i < n; i++)
    out[i] = ti->dt == DT_BF16 ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
  return st;
}

static wf_status check_shape(const wf__st_file *f, const wf__st_spec *s, const wf__st_tinfo *ti,
                             const wf_model_dims *d, char *err, size_t len)
{
  if (ti->ndim == s->ndim && ti->shape[0] == s->shape[0] &&
      (s->ndim == 1 || ti->shape[1] == s->shape[1]))
    return WF_OK;
  char saw[96], want[96];
  shape_str(saw, sizeof saw, ti->ndim, ti->shape);
  shape_str(want, sizeof want, s->ndim, s->shape);
  return wf__st_fail(
      err, len, WF_EFORMAT,
      "safetensors '%s': tensor '%s' has shape %s, but the model (%s: n_layer %d, n_embd "
      "%d, n_head %d, kv heads %d, ffn %d, n_ctx %d, vocab %d) expects %s",
      f->path, s->name, saw, d->fam->name, d->L, d->C, d->NH, d->KV, d->F, d->maxT, d->V, want);
}

void wf__st_src_close(wf__st_source *s)
{
  for (int i = 0; i < s->n; i++)
    st_close(&s->files[i]);
  json_decref(s->index);
  free(s);
}

static bool is_index(const char *path) { return wf__st_ends_with(path, ".index.json"); }

/* The file named `file` (relative to the index's folder), opened once. */
wf_status wf__st_src_file(wf__st_source *s, const char *file, wf__st_file **out, char *err,
                          size_t len)
{
  char dir[WF_PATH_MAX];
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->names[i], file))
      return *out = &s->files[i], WF_OK;
  if (s->n == WF_ST_MAX_FILES || strchr(file, '/'))
    return wf__st_fail(err, len, WF_EFORMAT, "safetensors index '%s': bad file name '%s'", s->path,
                       file);
  wf__st_dir_of(dir, sizeof dir, s->path);
  snprintf(s->names[s->n], sizeof s->names[s->n], "%s%s", dir, file);
  wf_status st = st_open(&s->files[s->n], s->names[s->n], err, len);
  if (st != WF_OK)
    return st;
  snprintf(s->names[s->n], sizeof s->names[s->n], "%s", file);
  *out = &s->files[s->n++];
  return WF_OK;
}

wf_status wf__st_src_open(wf__st_source **out, const char *path, char *err, size_t len)
{
  wf__st_source *s = calloc(1, sizeof *s);
  wf_status st = s ? WF_OK : WF_ENOMEM;
  json_error_t je;
  *out = NULL;
  if (st != WF_OK)
    return wf__st_fail(err, len, st, "safetensors '%s': out of memory", path);
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
      st = wf__st_fail(err, len, WF_EFORMAT,
                       "safetensors index '%s': no \"weight_map\" object (%s); a sharded model's "
                       "model.safetensors.index.json maps every tensor to its file",
                       path, j ? "missing" : je.text);
  }
  if (st != WF_OK) {
    wf__st_src_close(s);
    return st;
  }
  *out = s;
  return WF_OK;
}

/* The entry of `name` (or of it without the family's optional prefix) and its file. */
json_t *wf__st_src_find(wf__st_source *s, const char *name, wf__st_file **f, char *err, size_t len)
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
  if (!json_is_string(file) || wf__st_src_file(s, json_string_value(file), f, err, len) != WF_OK)
    return NULL;
  return json_object_get((*f)->header, name);
}

/* The entry of spec s in src: its file and info, with the shape the model expects. */
static wf_status find_spec(wf__st_source *src, const wf__st_spec *s, const wf_model_dims *d,
                           wf__st_file **f, wf__st_tinfo *ti, char *err, size_t len)
{
  json_t *t = wf__st_src_find(src, s->name, f, err, len);
  if (!t)
    return wf__st_fail(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' is missing", src->path,
                       s->name);
  wf_status st = wf__st_parse_info(*f, s->name, t, ti, err, len);
  return st == WF_OK ? check_shape(*f, s, ti, d, err, len) : st;
}

/* A tied model's head entry, found as find_spec finds a part (the embedding's shape,
 * emb), when the file holds one: *found says whether it does. */
static wf_status find_head(wf__st_source *src, const wf_model_dims *d, const wf__st_spec *emb,
                           wf__st_file **f, wf__st_tinfo *ti, bool *found, char *err, size_t len)
{
  const char *name = d->fam->hf_head;
  *found = false;
  if (!name || d->tie != WF_TIE_YES)
    return WF_OK;
  if (src->index ? !json_object_get(src->index, name)
                 : !json_object_get(src->files[0].header, name))
    return WF_OK;
  wf__st_spec h = *emb;
  snprintf(h.name, sizeof h.name, "%s", name);
  wf_status st = find_spec(src, &h, d, f, ti, err, len);
  *found = st == WF_OK;
  return st;
}

/* One spec into its place in `full` (through tmp unless the file holds it as weft does). */
static wf_status read_spec(wf__st_source *src, const wf__st_spec *s, const wf_model_dims *d,
                           float *full, float *tmp, uint16_t *raw, char *err, size_t len)
{
  wf__st_file *f = NULL;
  wf__st_tinfo ti;
  wf_status st = find_spec(src, s, d, &f, &ti, err, len);
  if (st != WF_OK)
    return st;
  st = read_values(f, &ti, wf__st_plain(s) ? full + s->off : tmp, wf__st_numel(s), raw);
  if (st != WF_OK)
    return wf__st_fail(err, len, WF_EIO, "safetensors '%s': cannot read tensor '%s'", f->path,
                       s->name);
  if (!wf__st_plain(s))
    wf__st_from_file(s, tmp, full + s->off);
  return WF_OK;
}

/* A tensor the family lists as a buffer to skip. */
static bool skipped(const wf_family *fam, const char *name)
{
  for (int i = 0; i < 4 && fam->hf_skip[i]; i++)
    if (wf__st_ends_with(name, fam->hf_skip[i]))
      return true;
  return false;
}

static bool known_name(const wf_family *fam, const wf__st_spec *specs, int n, const char *key)
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
static bool expected(const wf_model_dims *d, const wf__st_spec *specs, int n, const char *key)
{
  const wf_family *fam = d->fam;
  bool head = fam->hf_head && !strcmp(key, fam->hf_head) && d->tie == WF_TIE_YES;
  return head || skipped(fam, key) || known_name(fam, specs, n, key);
}

/* Every entry of one file must be one weft reads, the tied head, or a skipped buffer: a
 * tensor of another architecture (or a layer past n_layer) is an error, not silently
 * dropped. */
static wf_status check_extras(const wf__st_file *f, const wf_model_dims *d,
                              const wf__st_spec *specs, int n, char *err, size_t len)
{
  const wf_family *fam = d->fam;
  const char *key;
  json_t *v;
  json_object_foreach(f->header, key, v)
  {
    if (!strcmp(key, "__metadata__") || expected(d, specs, n, key))
      continue;
    return wf__st_fail(err, len, WF_EFORMAT,
                       "safetensors '%s': unexpected tensor '%s'; a %s of %d layers has %s ... %s "
                       "(Hugging Face's %s names)",
                       f->path, key, fam->name, d->L, specs[0].name, specs[n - 1].name,
                       fam->hf_architecture);
  }
  return WF_OK;
}

static wf_status check_all_extras(wf__st_source *s, const wf_model_dims *d,
                                  const wf__st_spec *specs, int n, char *err, size_t len)
{
  wf_status st = WF_OK;
  if (s->index) { /* every tensor the index names, in whichever shard */
    const char *key;
    json_t *v;
    json_object_foreach(s->index, key, v)
    {
      if (!expected(d, specs, n, key))
        return wf__st_fail(
            err, len, WF_EFORMAT,
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
static wf_status check_head(wf__st_source *s, const wf_model_dims *d, const wf__st_spec *emb,
                            const float *full, float *tmp, uint16_t *raw, char *err, size_t len)
{
  wf__st_file *f = NULL;
  wf__st_tinfo ti;
  bool found;
  wf_status st = find_head(s, d, emb, &f, &ti, &found, err, len);
  for (size_t r = 0; found && st == WF_OK && r < emb->rows; r++) {
    wf__st_tinfo row = ti;
    row.begin = ti.begin + (uint64_t)r * (uint64_t)emb->cols * dtype_size(ti.dt);
    st = read_values(f, &row, tmp, emb->cols, raw);
    if (st == WF_OK && memcmp(tmp, full + emb->off + r * emb->cols, emb->cols * sizeof *tmp))
      return wf__st_fail(
          err, len, WF_EFORMAT,
          "safetensors '%s': %s differs from %s (row %zu); this model ties its head to "
          "the embedding (model.tie_embeddings), so they must be equal",
          f->path, d->fam->hf_head, emb->name, r);
  }
  return st;
}

static wf_status read_all(wf__st_source *src, const wf_model_dims *d, const wf__st_spec *specs,
                          int n, float *full, char *err, size_t len)
{
  size_t big = wf__st_largest(specs, n);
  float *tmp = malloc(big * sizeof *tmp);
  uint16_t *raw = malloc(big * sizeof *raw);
  wf_status st =
      tmp && raw ? WF_OK
                 : wf__st_fail(err, len, WF_ENOMEM, "safetensors '%s': out of memory", src->path);
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
    return wf__st_fail(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path,
                       bad);
  wf__st_source *src = NULL;
  wf_model_dims d;
  wf_model_desc desc;
  int n = 0;
  wf_status st = wf__st_src_open(&src, path, err, len);
  wf__st_spec *specs = st == WF_OK ? wf__st_alloc_specs(dd, &d, &desc, &n) : NULL;
  if (st == WF_OK && !specs)
    st = wf__st_fail(err, len, WF_ENOMEM, "safetensors '%s': out of memory", path);
  if (st == WF_OK) {
    src->fam = d.fam;
    st = read_all(src, &d, specs, n, full, err, len);
  }
  if (src)
    wf__st_src_close(src);
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
  wf__st_file *f;
  wf__st_tinfo ti;
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
  wf__st_source *src;
  const wf_model_dims *d;
  const wf__st_spec *specs;
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
static wf_status read_rows(wf__st_file *f, const wf__st_tinfo *ti, const wf__st_spec *s, size_t r0,
                           size_t r1, float *out, float *col, uint16_t *raw)
{
  size_t es = dtype_size(ti->dt);
  wf__st_tinfo p = *ti;
  if (wf__st_plain(s)) {
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
  const wf__st_spec *s = &x->specs[k];
  size_t r1 = WF_MIN(s->rows, row + WF_MAX((size_t)1, PIECE / s->cols));
  x->cur = -1;
  if (read_rows(x->at[k].f, &x->at[k].ti, s, row, r1, x->buf, x->col, x->raw) != WF_OK)
    return wf__st_fail(x->err, x->len, WF_EIO, "safetensors '%s': cannot read tensor '%s'",
                       x->at[k].f->path, s->name);
  if (k == 0 && x->has_head) {
    if (read_rows(x->head.f, &x->head.ti, s, row, r1, x->hbuf, x->col, x->raw) != WF_OK)
      return wf__st_fail(x->err, x->len, WF_EIO, "safetensors '%s': cannot read tensor '%s'",
                         x->head.f->path, x->d->fam->hf_head);
    for (size_t r = row; r < r1; r++)
      if (memcmp(x->hbuf + (r - row) * s->cols, x->buf + (r - row) * s->cols,
                 s->cols * sizeof *x->buf))
        return wf__st_fail(
            x->err, x->len, WF_EFORMAT,
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
    const wf__st_spec *s = &x->specs[x->order[m].k];
    if (s->off + wf__st_numel(s) <= f)
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
    const wf__st_spec *s = k >= 0 ? &x->specs[k] : NULL;
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
  size_t piece = WF_MIN((size_t)PIECE, wf__st_largest(x->specs, x->n)), widest = 1;
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
    return wf__st_fail(x->err, x->len, WF_ENOMEM, "safetensors '%s': out of memory", x->src->path);
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
    return wf__st_fail(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path,
                       bad);
  wf_model_dims d;
  wf_model_desc desc;
  ranged x = {.d = &d, .dst = dst, .lo = lo, .hi = hi, .err = err, .len = len};
  wf_status st = wf__st_src_open(&x.src, path, err, len);
  wf__st_spec *specs = st == WF_OK ? wf__st_alloc_specs(dd, &d, &desc, &x.n) : NULL;
  if (st == WF_OK && !specs)
    st = wf__st_fail(err, len, WF_ENOMEM, "safetensors '%s': out of memory", path);
  x.specs = specs;
  if (st == WF_OK) {
    x.src->fam = d.fam;
    st = read_ranged(&x, sh);
  }
  if (x.src)
    wf__st_src_close(x.src);
  free(specs);
  free(x.order);
  free(x.at);
  free(x.buf);
  free(x.hbuf);
  free(x.col);
  free(x.raw);
  return st;
}
