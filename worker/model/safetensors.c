/*
 * safetensors.c - GPT-2 weights in Hugging Face's safetensors format, to and from the
 * whole model's flat float32 array in llm.c layout (wf_model.h).
 *
 * The format (huggingface/safetensors): an unsigned 64-bit little-endian header length
 * N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
 * "__metadata__": {string: string}}, then the raw little-endian tensors, offsets counted
 * from the end of the header. The writer pads the header with spaces to a multiple of 8
 * (the reference writer's alignment) and stores every tensor as F32.
 *
 * Names are GPT2LMHeadModel's: transformer.wte.weight (V, C), transformer.wpe.weight
 * (maxT, C), transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
 * mlp.c_proj}.{weight, bias}, transformer.ln_f.{weight, bias}. GPT-2's linear layers are
 * Conv1D, stored (in, out): the transpose of llm.c's (out, in). lm_head.weight is the tied
 * wte: the writer leaves it out; a reader accepts it only when it equals wte. Readers also
 * accept the names without "transformer." (GPT2Model's, as on the Hub) and skip the
 * causal-mask buffers attn.bias and attn.masked_bias that old files carry.
 *
 * Invariants: llm.c's padded vocabulary rows [V, Vp) are zero in memory and absent from
 * the file; nothing is read past what the header and the file size agree on; every
 * malformed file is WF_EFORMAT with one message naming the file and the tensor.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

#define HEADER_MAX (100u << 20) /* the reference reader's limit on the JSON header */
#define HEAD_SIZE  64           /* GPT-2's head size: n_head = C / 64 when a file does not say */

/* One tensor of the file, against the llm.c layout. */
typedef struct spec {
  char name[96];
  int ndim;
  int64_t shape[2]; /* the file's shape (Conv1D: (in, out)) */
  bool transpose;   /* the file holds the transpose of llm.c's (out, in) */
  size_t off;       /* first element in the full llm.c array */
} spec;

static const struct {
  wf_param_kind kind;
  const char *name;
} layer_names[] = {
    {WF_P_LN1W, "ln_1.weight"},
    {WF_P_LN1B, "ln_1.bias"},
    {WF_P_QKVW, "attn.c_attn.weight"},
    {WF_P_QKVB, "attn.c_attn.bias"},
    {WF_P_ATTPROJW, "attn.c_proj.weight"},
    {WF_P_ATTPROJB, "attn.c_proj.bias"},
    {WF_P_LN2W, "ln_2.weight"},
    {WF_P_LN2B, "ln_2.bias"},
    {WF_P_FCW, "mlp.c_fc.weight"},
    {WF_P_FCB, "mlp.c_fc.bias"},
    {WF_P_FCPROJW, "mlp.c_proj.weight"},
    {WF_P_FCPROJB, "mlp.c_proj.bias"},
};

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

/* llm.c's (rows, cols) of one layer's tensor of kind k; cols 0 for vectors. */
static void llmc_shape(const wf_gpt_dims *d, wf_param_kind k, int64_t *rows, int64_t *cols)
{
  int64_t C = d->C;
  *cols = C;
  switch (k) {
  case WF_P_QKVW: *rows = 3 * C; return;
  case WF_P_ATTPROJW: *rows = C; return;
  case WF_P_FCW: *rows = 4 * C; return;
  case WF_P_FCPROJW: *rows = C, *cols = 4 * C; return;
  default: *rows = (int64_t)wf_gpt_layer_numel(d, k), *cols = 0; return;
  }
}

static void global_spec(spec *s, const wf_gpt_dims *d, const char *name, wf_param_kind k,
                        int64_t rows, int64_t cols)
{
  snprintf(s->name, sizeof s->name, "transformer.%s", name);
  s->ndim = cols ? 2 : 1;
  s->shape[0] = rows, s->shape[1] = cols;
  s->transpose = false;
  s->off = wf_gpt_kind_offset(d, k);
}

/* Every tensor of the model, in file order; returns how many (4 + 12 L). */
static int build_specs(const wf_gpt_dims *d, spec *out)
{
  int n = 0;
  global_spec(&out[n++], d, "wte.weight", WF_P_WTE, d->V, d->C);
  global_spec(&out[n++], d, "wpe.weight", WF_P_WPE, d->maxT, d->C);
  for (int l = 0; l < d->L; l++) {
    for (size_t i = 0; i < WF_ARRAY_LEN(layer_names); i++) {
      spec *s = &out[n++];
      wf_param_kind k = layer_names[i].kind;
      int64_t rows, cols;
      llmc_shape(d, k, &rows, &cols);
      snprintf(s->name, sizeof s->name, "transformer.h.%d.%s", l, layer_names[i].name);
      s->ndim = cols ? 2 : 1;
      s->transpose = cols != 0;
      s->shape[0] = cols ? cols : rows, s->shape[1] = cols ? rows : 0;
      s->off = wf_gpt_kind_offset(d, k) + (size_t)l * wf_gpt_layer_numel(d, k);
    }
  }
  global_spec(&out[n++], d, "ln_f.weight", WF_P_LNFW, d->C, 0);
  global_spec(&out[n++], d, "ln_f.bias", WF_P_LNFB, d->C, 0);
  return n;
}

static size_t spec_numel(const spec *s)
{
  return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
}

static spec *alloc_specs(const wf_gpt_dims *d, int *n)
{
  spec *s = calloc(4 + 12 * (size_t)d->L, sizeof *s);
  if (s)
    *n = build_specs(d, s);
  return s;
}

/* ---- writing ------------------------------------------------------------------------------ */

static json_t *header_json(const wf_gpt_dims *d, const spec *specs, int n)
{
  json_t *h = json_object(), *meta = json_object();
  char v[32];
  json_object_set_new(meta, "format", json_string("pt")); /* transformers requires "pt" */
  json_object_set_new(meta, "producer", json_string("weft"));
  const struct {
    const char *k;
    int v;
  } dims[] = {{"n_layer", d->L},
              {"n_head", d->NH},
              {"n_embd", d->C},
              {"n_ctx", d->maxT},
              {"vocab_size", d->V}};
  for (size_t i = 0; i < WF_ARRAY_LEN(dims); i++) {
    snprintf(v, sizeof v, "%d", dims[i].v);
    json_object_set_new(meta, dims[i].k, json_string(v));
  }
  json_object_set_new(h, "__metadata__", meta);
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

/* One tensor in the file's layout: Conv1D weights transposed through `tmp`. */
static wf_status write_tensor(wf_afile *f, const spec *s, const float *full, float *tmp)
{
  const float *src = full + s->off;
  if (!s->transpose)
    return wf_afile_write(f, src, spec_numel(s) * sizeof(float));
  size_t in = (size_t)s->shape[0], out = (size_t)s->shape[1]; /* llm.c: (out, in) */
  for (size_t o = 0; o < out; o++)
    for (size_t i = 0; i < in; i++)
      tmp[i * out + o] = src[o * in + i];
  return wf_afile_write(f, tmp, in * out * sizeof(float));
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

wf_status wf_safetensors_write(const char *path, const wf_gpt_dims *d, const float *full, char *err,
                               size_t len)
{
  const char *bad = wf_gpt_dims_check(d);
  if (bad)
    return failf(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path, bad);
  int n = 0;
  spec *specs = alloc_specs(d, &n);
  float *tmp = malloc(4 * (size_t)d->C * (size_t)d->C * sizeof *tmp); /* largest weight */
  json_t *h = specs ? header_json(d, specs, n) : NULL;
  char *js = h ? json_dumps(h, JSON_COMPACT) : NULL;
  wf_status st = specs && tmp && js ? WF_OK : WF_ENOMEM;
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
  if (st != WF_OK)
    failf(err, len, st, "safetensors '%s': cannot write it: %s (see the log above)", path,
          wf_status_str(st));
  free(js);
  json_decref(h);
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

/* The entry of `name`, with or without GPT2LMHeadModel's "transformer." prefix. */
static json_t *find_tensor(const st_file *f, const char *name)
{
  json_t *t = json_object_get(f->header, name);
  static const char prefix[] = "transformer.";
  if (!t && !strncmp(name, prefix, sizeof prefix - 1))
    t = json_object_get(f->header, name + sizeof prefix - 1);
  return t;
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

static wf_status check_shape(const st_file *f, const spec *s, const tinfo *ti, const wf_gpt_dims *d,
                             char *err, size_t len)
{
  if (ti->ndim == s->ndim && ti->shape[0] == s->shape[0] &&
      (s->ndim == 1 || ti->shape[1] == s->shape[1]))
    return WF_OK;
  char saw[96], want[96];
  shape_str(saw, sizeof saw, ti->ndim, ti->shape);
  shape_str(want, sizeof want, s->ndim, s->shape);
  return failf(err, len, WF_EFORMAT,
               "safetensors '%s': tensor '%s' has shape %s, but the model (n_layer %d, n_embd %d, "
               "n_ctx %d, vocab %d) expects %s",
               f->path, s->name, saw, d->L, d->C, d->maxT, d->V, want);
}

/* One spec into its place in `full`, transposing Conv1D weights through tmp. */
static wf_status read_spec(st_file *f, const spec *s, const wf_gpt_dims *d, float *full, float *tmp,
                           uint16_t *raw, char *err, size_t len)
{
  json_t *t = find_tensor(f, s->name);
  if (!t)
    return failf(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' is missing", f->path,
                 s->name);
  tinfo ti;
  wf_status st = parse_info(f, s->name, t, &ti, err, len);
  if (st == WF_OK)
    st = check_shape(f, s, &ti, d, err, len);
  if (st != WF_OK)
    return st;
  size_t n = spec_numel(s);
  st = read_values(f, &ti, s->transpose ? tmp : full + s->off, n, raw);
  if (st != WF_OK)
    return failf(err, len, WF_EIO, "safetensors '%s': cannot read tensor '%s'", f->path, s->name);
  if (s->transpose) {
    size_t in = (size_t)s->shape[0], out = (size_t)s->shape[1];
    float *dst = full + s->off;
    for (size_t i = 0; i < in; i++)
      for (size_t o = 0; o < out; o++)
        dst[o * in + i] = tmp[i * out + o];
  }
  return WF_OK;
}

static bool ends_with(const char *s, const char *suffix)
{
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* Layer index of "h.N.rest" (after the optional prefix) and rest; -1 when not a layer. */
static long layer_of(const char *name, const char **rest)
{
  if (!strncmp(name, "transformer.", 12))
    name += 12;
  if (strncmp(name, "h.", 2))
    return -1;
  char *end;
  long l = strtol(name + 2, &end, 10);
  if (end == name + 2 || *end != '.' || l < 0)
    return -1;
  *rest = end + 1;
  return l;
}

/* A tensor that is GPT-2's but not weft's to read: the causal-mask buffers. */
static bool skipped(const char *name)
{
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

/* Every entry must be one weft reads, the tied head, or a skipped buffer: a tensor of
 * another architecture (or a layer past n_layer) is an error, not silently dropped. */
static wf_status check_extras(const st_file *f, const spec *specs, int n, char *err, size_t len)
{
  const char *key;
  json_t *v;
  json_object_foreach(f->header, key, v)
  {
    if (!strcmp(key, "__metadata__") || !strcmp(key, "lm_head.weight") || skipped(key))
      continue;
    bool known = false;
    for (int i = 0; i < n && !known; i++)
      known = !strcmp(specs[i].name, key) || !strcmp(specs[i].name + 12, key);
    if (!known)
      return failf(err, len, WF_EFORMAT,
                   "safetensors '%s': unexpected tensor '%s'; a GPT-2 of %d layers has "
                   "transformer.{wte, wpe, h.0-%d, ln_f} (Hugging Face's GPT2LMHeadModel names)",
                   f->path, key, (n - 4) / 12, (n - 4) / 12 - 1);
  }
  return WF_OK;
}

/* lm_head.weight, when present, must be the tied wte (llm.c and weft tie them). */
static wf_status check_head(st_file *f, const wf_gpt_dims *d, const float *full, float *tmp,
                            uint16_t *raw, char *err, size_t len)
{
  json_t *t = json_object_get(f->header, "lm_head.weight");
  if (!t)
    return WF_OK;
  tinfo ti;
  spec s = {.name = "lm_head.weight", .ndim = 2, .shape = {d->V, d->C}};
  wf_status st = parse_info(f, s.name, t, &ti, err, len);
  if (st == WF_OK)
    st = check_shape(f, &s, &ti, d, err, len);
  for (int64_t r = 0; st == WF_OK && r < d->V; r++) {
    tinfo row = ti;
    row.begin = ti.begin + (uint64_t)r * (uint64_t)d->C * dtype_size(ti.dt);
    st = read_values(f, &row, tmp, (size_t)d->C, raw);
    if (st == WF_OK && memcmp(tmp, full + (size_t)r * (size_t)d->C, (size_t)d->C * sizeof *tmp))
      return failf(err, len, WF_EFORMAT,
                   "safetensors '%s': lm_head.weight differs from transformer.wte.weight (row "
                   "%lld); weft ties the output head to the embedding, as GPT-2 does",
                   f->path, (long long)r);
  }
  return st;
}

wf_status wf_safetensors_read(const char *path, const wf_gpt_dims *d, float *full, char *err,
                              size_t len)
{
  const char *bad = wf_gpt_dims_check(d);
  if (bad)
    return failf(err, len, WF_EINVAL, "safetensors '%s': bad model dimensions: %s", path, bad);
  st_file f;
  wf_status st = st_open(&f, path, err, len);
  int n = 0;
  spec *specs = st == WF_OK ? alloc_specs(d, &n) : NULL;
  size_t big = (size_t)WF_MAX((int64_t)d->V, 4 * (int64_t)d->C) * (size_t)d->C; /* wte, fc */
  big = WF_MAX(big, (size_t)d->maxT * (size_t)d->C);
  float *tmp = st == WF_OK ? malloc(big * sizeof *tmp) : NULL;
  uint16_t *raw = st == WF_OK ? malloc(big * sizeof *raw) : NULL;
  if (st == WF_OK && (!specs || !tmp || !raw))
    st = failf(err, len, WF_ENOMEM, "safetensors '%s': out of memory", path);
  if (st == WF_OK)
    st = check_extras(&f, specs, n, err, len);
  for (int i = 0; st == WF_OK && i < n; i++)
    st = read_spec(&f, &specs[i], d, full, tmp, raw, err, len);
  if (st == WF_OK) /* llm.c's padded vocabulary rows */
    memset(full + (size_t)d->V * (size_t)d->C, 0,
           (size_t)(d->Vp - d->V) * (size_t)d->C * sizeof *full);
  if (st == WF_OK)
    st = check_head(&f, d, full, tmp, raw, err, len);
  st_close(&f);
  free(specs);
  free(tmp);
  free(raw);
  return st;
}

/* ---- dimensions ------------------------------------------------------------------------------ */

static int meta_int(json_t *obj, const char *key)
{
  json_t *v = json_object_get(obj, key);
  if (json_is_integer(v))
    return (int)json_integer_value(v);
  return json_is_string(v) ? atoi(json_string_value(v)) : 0;
}

/* n_head: the file's __metadata__ (weft writes it), else a Hugging Face config.json beside
 * the file, else C / 64 (every GPT-2 size has 64-wide heads). */
static int heads_of(const st_file *f, int C)
{
  int nh = meta_int(json_object_get(f->header, "__metadata__"), "n_head");
  if (nh > 0)
    return nh;
  char cfg[WF_PATH_MAX + 16];
  const char *slash = strrchr(f->path, '/');
  snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - f->path + 1) : 0, f->path);
  struct stat sb;
  json_t *c = stat(cfg, &sb) == 0 && S_ISREG(sb.st_mode) ? json_load_file(cfg, 0, NULL) : NULL;
  nh = meta_int(c, "n_head");
  json_decref(c);
  return nh > 0 ? nh : C % HEAD_SIZE == 0 ? C / HEAD_SIZE : 0;
}

static wf_status shape2(const st_file *f, const char *name, int64_t *rows, int64_t *cols, char *err,
                        size_t len)
{
  json_t *t = find_tensor(f, name);
  tinfo ti;
  if (!t)
    return failf(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' is missing", f->path, name);
  wf_status st = parse_info(f, name, t, &ti, err, len);
  if (st == WF_OK && ti.ndim != 2)
    st = failf(err, len, WF_EFORMAT, "safetensors '%s': tensor '%s' is not 2-D", f->path, name);
  *rows = ti.shape[0], *cols = ti.shape[1];
  return st;
}

wf_status wf_safetensors_peek(const char *path, wf_gpt_dims *d, char *err, size_t len)
{
  st_file f;
  int64_t V = 0, C = 0, T = 0, C2 = 0;
  wf_status st = st_open(&f, path, err, len);
  if (st == WF_OK)
    st = shape2(&f, "transformer.wte.weight", &V, &C, err, len);
  if (st == WF_OK)
    st = shape2(&f, "transformer.wpe.weight", &T, &C2, err, len);
  long L = 0;
  const char *key, *rest;
  json_t *v;
  json_object_foreach(st == WF_OK ? f.header : NULL, key, v)
  {
    long l = layer_of(key, &rest);
    L = l >= L ? l + 1 : L;
  }
  if (st == WF_OK && (C2 != C || L < 1 || L > (1 << 16)))
    st =
        failf(err, len, WF_EFORMAT,
              "safetensors '%s': wte is [%lld, %lld], wpe [%lld, %lld] and %ld layers: not a GPT-2",
              path, (long long)V, (long long)C, (long long)T, (long long)C2, L);
  if (st == WF_OK) {
    *d = (wf_gpt_dims){.L = (int)L,
                       .NH = heads_of(&f, (int)C),
                       .C = (int)C,
                       .maxT = (int)T,
                       .V = (int)V,
                       .Vp = (int)((V + 127) / 128 * 128)};
    const char *bad = wf_gpt_dims_check(d);
    if (bad)
      st = failf(err, len, WF_EFORMAT,
                 "safetensors '%s': n_layer %d, n_head %d, n_embd %d, n_ctx %d, vocab %d: %s", path,
                 d->L, d->NH, d->C, d->maxT, d->V, bad);
  }
  st_close(&f);
  return st;
}
