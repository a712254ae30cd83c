/*
 * config.c - setting keys from text, with provenance; the environment; printing.
 *
 * Every source ends in the same two entry points, wf__cfg_set_scalar and
 * wf__cfg_set_list: the YAML loader hands them the scalars of its nodes, the
 * command line and the environment hand them their text (lists parsed as YAML
 * flow, config_yaml.c), and wf_config_init hands them the table's defaults.
 *
 * Invariants:
 *  - A value is parsed and range-checked before anything is stored, so a failed
 *    set leaves the config as it was (a mesh_shape sets its keys all or none).
 *  - store() is the only writer of cfg->source, and it enforces precedence (see
 *    config_int.h), so the order in which sources are applied does not matter.
 *  - A preset only overwrites model.* keys whose source is default or preset:
 *    explicit model keys win over a preset from any source.
 *  - A mesh_shape describes the whole mesh: it sets mesh.dp, mesh.tp and mesh.pp
 *    together. An axis it leaves out is 1 for tp and pp, and 0 (derived from the
 *    world size, as everywhere) for dp. Its fsdp and expert axes are carved from dp
 *    (mesh.fsdp, mesh.ep).
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_int.h"

static const char *const source_names[] = {"default", "preset", "file", "env", "cli", "derived"};

const char *wf_config_source_str(wf_config_source s)
{
  return (unsigned)s < WF_ARRAY_LEN(source_names) ? source_names[s] : "unknown";
}

int wf_config_key_count(void) { return wf__cfg_nkeys; }

const char *wf_config_key_name(int index)
{
  return index >= 0 && index < wf__cfg_nkeys ? wf__cfg_keys[index].name : NULL;
}

int wf_config_key_find(const char *key) { return key ? wf__cfg_key_index(key) : -1; }

wf_status wf__cfg_fail(const wf__cfg_ctx *ctx, const char *key, const char *fmt, ...)
{
  if (!ctx->err || ctx->err_len == 0)
    return WF_ECONFIG;
  size_t n = 0;
  if (ctx->file)
    n = (size_t)snprintf(ctx->err, ctx->err_len, "%s:%d: ", ctx->file, ctx->line);
  else if (ctx->env)
    n = (size_t)snprintf(ctx->err, ctx->err_len, "environment %s: ", ctx->env);
  else if (ctx->src == WF_SRC_CLI)
    n = (size_t)snprintf(ctx->err, ctx->err_len, "command line: ");
  if (key && n < ctx->err_len)
    n += (size_t)snprintf(ctx->err + n, ctx->err_len - n, "%s: ", key);
  if (n < ctx->err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err + n, ctx->err_len - n, fmt, ap);
    va_end(ap);
  }
  return WF_ECONFIG;
}

/* ---- precedence ---------------------------------------------------------------- */

static int src_rank(int s) { return s == WF_SRC_DERIVED ? -1 : s; }

/* Whether a value from `src` may replace key k's value; records src if so. */
static bool store(wf_config *cfg, int k, wf_config_source src)
{
  if (src_rank(src) < src_rank(cfg->source[k]))
    return false;
  cfg->source[k] = (uint8_t)src;
  return true;
}

static void *field(wf_config *cfg, const wf__cfg_key *k) { return (char *)cfg + k->off; }

/* ---- scalar parsing --------------------------------------------------------------- */

void wf__cfg_range_str(const wf__cfg_key *k, char *out, size_t len)
{
  const char *op = (k->flags & WF__KF_MIN_OPEN) ? ">" : ">=";
  if (k->max >= 1e300)
    snprintf(out, len, "%s %.15g", op, k->min);
  else
    snprintf(out, len, "%s %.15g and <= %.15g", op, k->min, k->max);
}

static wf_status range_error(const wf__cfg_ctx *ctx, const char *name, const wf__cfg_key *k,
                             const char *text)
{
  char range[96];
  wf__cfg_range_str(k, range, sizeof range);
  return wf__cfg_fail(ctx, name, "%s is out of range; it must be %s", text, range);
}

bool wf__cfg_in_range(const wf__cfg_key *k, double v)
{
  bool lo_ok = (k->flags & WF__KF_MIN_OPEN) ? v > k->min : v >= k->min;
  return lo_ok && v <= k->max;
}

static wf_status parse_int(const wf__cfg_key *k, const char *name, const char *text, int *out,
                           const wf__cfg_ctx *ctx)
{
  char *end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (end == text || *end != '\0' || isspace((unsigned char)*text))
    return wf__cfg_fail(ctx, name, "expected an integer, got '%s'", text);
  if (errno == ERANGE || v < INT_MIN || v > INT_MAX || !wf__cfg_in_range(k, (double)v))
    return range_error(ctx, name, k, text);
  *out = (int)v;
  return WF_OK;
}

static wf_status parse_u64(const char *name, const char *text, uint64_t *out,
                           const wf__cfg_ctx *ctx)
{
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(text, &end, 10);
  if (end == text || *end != '\0' || !isdigit((unsigned char)*text))
    return wf__cfg_fail(ctx, name, "expected a non-negative integer, got '%s'", text);
  if (errno == ERANGE)
    return wf__cfg_fail(ctx, name, "%s does not fit in 64 bits", text);
  *out = (uint64_t)v;
  return WF_OK;
}

static wf_status parse_double(const wf__cfg_key *k, const char *name, const char *text, double *out,
                              const wf__cfg_ctx *ctx)
{
  char *end = NULL;
  double v = strtod(text, &end);
  if (end == text || *end != '\0' || isspace((unsigned char)*text) || !isfinite(v))
    return wf__cfg_fail(ctx, name, "expected a number, got '%s'", text);
  if (!wf__cfg_in_range(k, v))
    return range_error(ctx, name, k, text);
  *out = v;
  return WF_OK;
}

static wf_status parse_bool(const char *name, const char *text, bool *out, const wf__cfg_ctx *ctx)
{
  static const char *const yes[] = {"true", "yes", "on", "1"};
  static const char *const no[] = {"false", "no", "off", "0", "none"};
  for (size_t i = 0; i < WF_ARRAY_LEN(yes); i++)
    if (strcasecmp(text, yes[i]) == 0)
      return *out = true, WF_OK;
  for (size_t i = 0; i < WF_ARRAY_LEN(no); i++)
    if (strcasecmp(text, no[i]) == 0)
      return *out = false, WF_OK;
  return wf__cfg_fail(ctx, name, "expected true or false, got '%s'", text);
}

/* "a|b|c": the first name of each value. */
void wf__cfg_enum_names(const wf__cfg_enum *e, char *out, size_t len)
{
  size_t n = 0;
  out[0] = '\0';
  for (int i = 0; e[i].name && n < len; i++) {
    bool first = true;
    for (int j = 0; j < i; j++)
      first = first && e[j].value != e[i].value;
    if (first)
      n += (size_t)snprintf(out + n, len - n, "%s%s", n ? "|" : "", e[i].name);
  }
}

static wf_status parse_enum(const wf__cfg_key *k, const char *name, const char *text, int *out,
                            const wf__cfg_ctx *ctx)
{
  for (int i = 0; k->enums[i].name; i++)
    if (strcasecmp(text, k->enums[i].name) == 0)
      return *out = k->enums[i].value, WF_OK;
  char names[128];
  wf__cfg_enum_names(k->enums, names, sizeof names);
  return wf__cfg_fail(ctx, name, "expected one of %s, got '%s'", names, text);
}

/* ---- presets ------------------------------------------------------------------------ */

static void preset_dbl(wf_config *cfg, const char *key, double v, wf_config_source src)
{
  int k = wf__cfg_key_index(key);
  if (k >= 0 && src_rank(cfg->source[k]) <= WF_SRC_PRESET) {
    *(double *)field(cfg, &wf__cfg_keys[k]) = v;
    cfg->source[k] = (uint8_t)WF_MIN(src, WF_SRC_PRESET);
  }
}

/* A preset given as a default (wf_config_init) leaves its keys at "default". */
static void preset_int(wf_config *cfg, const char *key, int v, wf_config_source src)
{
  int k = wf__cfg_key_index(key);
  if (k >= 0 && src_rank(cfg->source[k]) <= WF_SRC_PRESET) {
    *(int *)field(cfg, &wf__cfg_keys[k]) = v;
    cfg->source[k] = (uint8_t)WF_MIN(src, WF_SRC_PRESET);
  }
}

static void preset_str(wf_config *cfg, const char *key, const char *v, wf_config_source src)
{
  int k = wf__cfg_key_index(key);
  if (k >= 0 && src_rank(cfg->source[k]) <= WF_SRC_PRESET) {
    wf_strlcpy(field(cfg, &wf__cfg_keys[k]), v, wf__cfg_keys[k].cap);
    cfg->source[k] = (uint8_t)WF_MIN(src, WF_SRC_PRESET);
  }
}

static wf_status set_preset(wf_config *cfg, int k, const char *name, const char *text,
                            const wf__cfg_ctx *ctx)
{
  const wf__cfg_preset *p = wf__cfg_preset_find(text);
  if (!p) {
    char known[512];
    size_t n = 0;
    for (int i = 0; i < wf__cfg_npresets && n < sizeof known; i++)
      n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "",
                            wf__cfg_presets[i].name);
    return wf__cfg_fail(ctx, name, "unknown preset '%s'; known presets: %s", text, known);
  }
  if (!store(cfg, k, ctx->src))
    return WF_OK;
  wf_strlcpy(cfg->model.preset, p->name, sizeof cfg->model.preset);
  preset_int(cfg, "model.layers", p->layers, ctx->src);
  preset_int(cfg, "model.heads", p->heads, ctx->src);
  preset_int(cfg, "model.d_model", p->d_model, ctx->src);
  preset_int(cfg, "model.seq_len", p->seq_len, ctx->src);
  preset_int(cfg, "model.vocab", p->vocab, ctx->src);
  preset_str(cfg, "model.family", p->family, ctx->src);
  preset_int(cfg, "model.kv_heads", p->kv_heads, ctx->src);
  preset_int(cfg, "model.ffn", p->ffn, ctx->src);
  preset_dbl(cfg, "model.rope_theta", p->rope_theta, ctx->src);
  preset_int(cfg, "model.tie_embeddings", p->tie, ctx->src);
  const wf_rope_scaling *rs = &p->rope_scaling;
  preset_int(cfg, "model.rope_scaling.rope_type", (int)rs->rope_type, ctx->src);
  preset_dbl(cfg, "model.rope_scaling.factor", rs->factor, ctx->src);
  preset_dbl(cfg, "model.rope_scaling.low_freq_factor", rs->low_freq_factor, ctx->src);
  preset_dbl(cfg, "model.rope_scaling.high_freq_factor", rs->high_freq_factor, ctx->src);
  preset_int(cfg, "model.rope_scaling.original_max_position_embeddings",
             rs->original_max_position_embeddings, ctx->src);
  preset_int(cfg, "model.experts", p->experts, ctx->src);
  preset_int(cfg, "model.experts_per_token", p->experts_per_token, ctx->src);
  preset_int(cfg, "model.head_dim", p->head_dim, ctx->src);
  preset_int(cfg, "model.norm_topk_prob", p->norm_topk, ctx->src);
  preset_dbl(cfg, "model.router_aux_loss_coef", p->aux_coef > 0 ? p->aux_coef : -1, ctx->src);
  preset_dbl(cfg, "train.lr", p->lr, ctx->src);
  /* the cosine ends at a tenth of the peak, as llm.c and nanoGPT decay (gpt2-tiny's 3e-4
   * is the key's default) */
  preset_dbl(cfg, "train.min_lr", p->lr / 10, ctx->src);
  cfg->model.padded_vocab = wf__cfg_pad_vocab(cfg->model.vocab);
  return WF_OK;
}

/* ---- setting one key ------------------------------------------------------------------ */

static wf_status type_error_list(const wf__cfg_key *k, const char *name, const char *what,
                                 const wf__cfg_ctx *ctx)
{
  switch (k->type) {
  case WF__CT_INT:
  case WF__CT_U64: return wf__cfg_fail(ctx, name, "expected an integer, got %s", what);
  case WF__CT_DOUBLE: return wf__cfg_fail(ctx, name, "expected a number, got %s", what);
  case WF__CT_BOOL: return wf__cfg_fail(ctx, name, "expected true or false, got %s", what);
  default: return wf__cfg_fail(ctx, name, "expected a single value, got %s", what);
  }
}

static wf_status set_string(wf_config *cfg, int k, const char *name, const char *text,
                            const wf__cfg_ctx *ctx)
{
  const wf__cfg_key *key = &wf__cfg_keys[k];
  if (strlen(text) >= key->cap)
    return wf__cfg_fail(ctx, name, "value is %zu characters long; the limit is %zu", strlen(text),
                        key->cap - 1);
  if (k == wf__cfg_key_index("model.preset"))
    return set_preset(cfg, k, name, text, ctx);
  if (store(cfg, k, ctx->src))
    wf_strlcpy(field(cfg, key), text, key->cap);
  return WF_OK;
}

/* Parses into a union first and stores only when it parsed. */
static wf_status set_number(wf_config *cfg, int k, const char *name, const char *text,
                            const wf__cfg_ctx *ctx)
{
  const wf__cfg_key *key = &wf__cfg_keys[k];
  union {
    int i;
    uint64_t u;
    double d;
    bool b;
  } v;
  wf_status st = WF_EINVAL;
  size_t size = 0;
  switch (key->type) {
  case WF__CT_INT: st = parse_int(key, name, text, &v.i, ctx), size = sizeof v.i; break;
  case WF__CT_U64: st = parse_u64(name, text, &v.u, ctx), size = sizeof v.u; break;
  case WF__CT_DOUBLE: st = parse_double(key, name, text, &v.d, ctx), size = sizeof v.d; break;
  case WF__CT_BOOL: st = parse_bool(name, text, &v.b, ctx), size = sizeof v.b; break;
  case WF__CT_ENUM: st = parse_enum(key, name, text, &v.i, ctx), size = sizeof v.i; break;
  default: break;
  }
  if (st == WF_OK && store(cfg, k, ctx->src))
    memcpy(field(cfg, key), &v, size);
  if (st == WF_OK && k == wf__cfg_key_index("model.vocab"))
    cfg->model.padded_vocab = wf__cfg_pad_vocab(cfg->model.vocab);
  return st;
}

wf_status wf__cfg_set_scalar(wf_config *cfg, wf__cfg_target t, const char *name, const char *text,
                             wf__cfg_ctx *ctx)
{
  if (wf__cfg_takes_one(t))
    return wf__cfg_set_list(cfg, t, name, &text, 1, ctx);
  if (wf__cfg_target_is_list(t)) {
    const char *like = t.key < 0                                 ? "[[2, 2], [dp, tp]]"
                       : wf__cfg_keys[t.key].type == WF__CT_AXES ? "[dp, tp, pp]"
                                                                 : "[1, 3]";
    return wf__cfg_fail(ctx, name, "expected a list like %s, got '%s'", like, text);
  }
  const wf__cfg_key *key = &wf__cfg_keys[t.key];
  if (key->flags & WF__KF_DERIVED)
    return wf__cfg_fail(ctx, name,
                        "is derived (model.vocab rounded up to a multiple of 128) "
                        "and cannot be set; set model.vocab instead");
  if (key->type == WF__CT_STRING)
    return set_string(cfg, t.key, name, text, ctx);
  return set_number(cfg, t.key, name, text, ctx);
}

/* ---- lists ---------------------------------------------------------------------------- */

/* dp/data/fsdp -> 0, tp/tensor/model -> 1, pp/pipe/pipeline -> 2, cp/context -> 3; -1 if
 * unknown. */
#define N_AXES 4
static int axis_index(const char *s)
{
  static const char *const names[N_AXES][3] = {{"dp", "data", "fsdp"},
                                               {"tp", "tensor", "model"},
                                               {"pp", "pipe", "pipeline"},
                                               {"cp", "context", "context"}};
  for (int a = 0; a < N_AXES; a++)
    for (int j = 0; j < 3; j++)
      if (strcasecmp(s, names[a][j]) == 0)
        return a;
  return -1;
}

static const char *const axis_canon[N_AXES] = {"dp", "tp", "pp", "cp"};

/* Parses 1..4 axis names into order[]: axis indices in the given order, then the
 * axes not named, so order[] is always a permutation of dp, tp, pp, cp. */
static wf_status parse_axes(const char *name, const char *const *items, int n, int order[N_AXES],
                            const wf__cfg_ctx *ctx)
{
  bool seen[N_AXES] = {false, false, false, false};
  if (n < 1 || n > N_AXES)
    return wf__cfg_fail(ctx, name, "expected 1 to 4 axis names (dp, tp, pp, cp), got %d", n);
  for (int i = 0; i < n; i++) {
    int a = axis_index(items[i]);
    if (a < 0)
      return wf__cfg_fail(ctx, name,
                          "unknown mesh axis '%s'; use dp (data, fsdp), tp (tensor, model), "
                          "pp (pipe, pipeline), cp (context) or expert (ep)",
                          items[i]);
    if (seen[a])
      return wf__cfg_fail(ctx, name, "mesh axis '%s' is named twice (as %s)", items[i],
                          axis_canon[a]);
    seen[a] = true;
    order[i] = a;
  }
  for (int a = 0, i = n; a < N_AXES; a++)
    if (!seen[a])
      order[i++] = a;
  return WF_OK;
}

static void store_axes(wf_config *cfg, const int order[N_AXES], wf_config_source src)
{
  int k = wf__cfg_key_index("mesh.axis_names");
  if (!store(cfg, k, src))
    return;
  for (int i = 0; i < N_AXES; i++)
    wf_strlcpy(cfg->mesh.axis_names[i], axis_canon[order[i]], sizeof cfg->mesh.axis_names[i]);
}

static wf_status set_intlist(wf_config *cfg, int k, const char *name, const char *const *items,
                             int n, const wf__cfg_ctx *ctx)
{
  const wf__cfg_key *key = &wf__cfg_keys[k];
  int vals[WF_MAX_STAGES];
  bool fixed = key->flags & WF__KF_FIXED_LEN;
  if (fixed && n != (int)key->cap)
    return wf__cfg_fail(ctx, name, "expected a list of %zu integers like [2, 3], got %d", key->cap,
                        n);
  if (n > (int)key->cap || n > WF_MAX_STAGES)
    return wf__cfg_fail(ctx, name, "has %d entries; at most %zu are allowed", n, key->cap);
  for (int i = 0; i < n; i++)
    if (parse_int(key, name, items[i], &vals[i], ctx) != WF_OK)
      return WF_ECONFIG;
  if (!store(cfg, k, ctx->src))
    return WF_OK;
  memcpy(field(cfg, key), vals, (size_t)n * sizeof(int));
  if (!fixed)
    *(int *)((char *)cfg + key->count_off) = n;
  return WF_OK;
}

static wf_status set_strlist(wf_config *cfg, int k, const char *name, const char *const *items,
                             int n, const wf__cfg_ctx *ctx)
{
  const wf__cfg_key *key = &wf__cfg_keys[k];
  if (n > (int)key->items)
    return wf__cfg_fail(ctx, name, "has %d entries; at most %zu are allowed", n, key->items);
  for (int i = 0; i < n; i++) {
    if (!items[i][0])
      return wf__cfg_fail(ctx, name, "entry %d is empty", i);
    if (strlen(items[i]) >= key->cap)
      return wf__cfg_fail(ctx, name, "entry %d is %zu characters long; the limit is %zu", i,
                          strlen(items[i]), key->cap - 1);
  }
  if (!store(cfg, k, ctx->src))
    return WF_OK;
  char *out = field(cfg, key);
  memset(out, 0, key->cap * key->items);
  for (int i = 0; i < n; i++)
    wf_strlcpy(out + (size_t)i * key->cap, items[i], key->cap);
  *(int *)((char *)cfg + key->count_off) = n;
  return WF_OK;
}

static wf_status set_dbllist(wf_config *cfg, int k, const char *name, const char *const *items,
                             int n, const wf__cfg_ctx *ctx)
{
  const wf__cfg_key *key = &wf__cfg_keys[k];
  double vals[WF_DATA_MAX_SOURCES];
  if (n > (int)key->cap || n > (int)WF_ARRAY_LEN(vals))
    return wf__cfg_fail(ctx, name, "has %d entries; at most %zu are allowed", n, key->cap);
  for (int i = 0; i < n; i++)
    if (parse_double(key, name, items[i], &vals[i], ctx) != WF_OK)
      return WF_ECONFIG;
  if (!store(cfg, k, ctx->src))
    return WF_OK;
  memcpy(field(cfg, key), vals, (size_t)n * sizeof(double));
  *(int *)((char *)cfg + key->count_off) = n;
  return WF_OK;
}

wf_status wf__cfg_set_list(wf_config *cfg, wf__cfg_target t, const char *name,
                           const char *const *items, int n, wf__cfg_ctx *ctx)
{
  if (t.key < 0) /* mesh_shape: a flat list of sizes */
    return wf__cfg_set_mesh_shape(cfg, name, items, n, NULL, 0, ctx);
  const wf__cfg_key *key = &wf__cfg_keys[t.key];
  if (key->type == WF__CT_INTLIST)
    return set_intlist(cfg, t.key, name, items, n, ctx);
  if (key->type == WF__CT_STRLIST)
    return set_strlist(cfg, t.key, name, items, n, ctx);
  if (key->type == WF__CT_DBLLIST)
    return set_dbllist(cfg, t.key, name, items, n, ctx);
  if (key->type == WF__CT_AXES) {
    int order[N_AXES];
    if (parse_axes(name, items, n, order, ctx) != WF_OK)
      return WF_ECONFIG;
    store_axes(cfg, order, ctx->src);
    return WF_OK;
  }
  return type_error_list(key, name, "a list", ctx);
}

/* Axis order in effect, for a flat mesh_shape. */
static void current_axes(const wf_config *cfg, int order[N_AXES])
{
  for (int i = 0; i < N_AXES; i++) {
    int a = axis_index(cfg->mesh.axis_names[i]);
    order[i] = a >= 0 ? a : i;
  }
}

/* The seeds' HSDP form: an "fsdp" axis beside a "dp"/"data" one. The fsdp axis leaves
 * the list, the dp axis grows by its size and mesh.fsdp takes it (ZeRO shards within
 * groups of that many consecutive dp ranks, replicated across the data axis). Returns 0
 * when the shape has no such pair, 1 when it was set, -1 on an error (reported). */
static int set_hsdp_shape(wf_config *cfg, const char *name, const char *const *sizes, int n_sizes,
                          const char *const *axes, int n_axes, wf__cfg_ctx *ctx)
{
  static const wf__cfg_key size_key = {.name = "mesh_shape", .min = 1, .max = 1 << 24};
  int f = -1, d = -1, fsdp = 0;
  for (int i = 0; axes && i < n_axes && i < n_sizes; i++) {
    if (strcasecmp(axes[i], "fsdp") == 0)
      f = i;
    else if (axis_index(axes[i]) == 0)
      d = i;
  }
  if (f < 0 || d < 0 || n_axes != n_sizes)
    return 0;
  if (parse_int(&size_key, name, sizes[f], &fsdp, ctx) != WF_OK)
    return -1;
  const char *s2[N_AXES], *a2[N_AXES];
  int n = 0;
  for (int i = 0; i < n_sizes && n < N_AXES; i++)
    if (i != f)
      s2[n] = sizes[i], a2[n++] = axes[i];
  if (wf__cfg_set_mesh_shape(cfg, name, s2, n, a2, n, ctx) != WF_OK)
    return -1;
  long long dp = (long long)cfg->mesh.dp * fsdp;
  if (dp > (1 << 24))
    return wf__cfg_fail(ctx, name, "data x fsdp = %lld is out of range", dp), -1;
  cfg->mesh.dp = (int)dp;
  if (store(cfg, wf__cfg_key_index("mesh.fsdp"), ctx->src))
    cfg->mesh.fsdp = fsdp;
  return 1;
}

static bool is_expert_axis(const char *a)
{
  return strcasecmp(a, "ep") == 0 || strcasecmp(a, "expert") == 0;
}

/* An "expert" (or "ep") axis, as Megatron-Core carves expert parallelism from the data-
 * parallel ranks: it leaves the list and mesh.ep takes its size; a dp ("data") axis
 * beside it grows by that size (the dp group holds both), and without one dp is derived
 * from the world as always. Returns 0 when the shape has no such axis, 1 when it was set,
 * -1 on an error (reported). */
static int set_ep_shape(wf_config *cfg, const char *name, const char *const *sizes, int n_sizes,
                        const char *const *axes, int n_axes, wf__cfg_ctx *ctx)
{
  static const wf__cfg_key size_key = {.name = "mesh_shape", .min = 1, .max = 1 << 16};
  int e = -1, ep = 0;
  bool dp = false;
  for (int i = 0; axes && i < n_axes && i < n_sizes; i++) {
    if (is_expert_axis(axes[i]))
      e = i;
    else if (axis_index(axes[i]) == 0)
      dp = true;
  }
  if (e < 0 || n_axes != n_sizes)
    return 0;
  if (parse_int(&size_key, name, sizes[e], &ep, ctx) != WF_OK)
    return -1;
  const char *s2[4], *a2[4];
  int n = 0;
  for (int i = 0; i < n_sizes && n < 4; i++)
    if (i != e)
      s2[n] = sizes[i], a2[n++] = axes[i];
  if (n == 0) /* the expert axis alone: the mesh is dp ranks, dp derived */
    s2[0] = "1", a2[0] = "tp", n = 1;
  if (wf__cfg_set_mesh_shape(cfg, name, s2, n, a2, n, ctx) != WF_OK)
    return -1;
  long long d = (long long)cfg->mesh.dp * ep;
  if (dp && d > (1 << 24))
    return wf__cfg_fail(ctx, name, "data x expert = %lld is out of range", d), -1;
  if (dp)
    cfg->mesh.dp = (int)d;
  if (store(cfg, wf__cfg_key_index("mesh.ep"), ctx->src))
    cfg->mesh.ep = ep;
  return 1;
}

wf_status wf__cfg_set_mesh_shape(wf_config *cfg, const char *name, const char *const *sizes,
                                 int n_sizes, const char *const *axes, int n_axes, wf__cfg_ctx *ctx)
{
  if (n_sizes >= 1 && n_sizes <= 5) {
    int e = set_ep_shape(cfg, name, sizes, n_sizes, axes, n_axes, ctx);
    if (e != 0)
      return e > 0 ? WF_OK : WF_ECONFIG;
  }
  static const wf__cfg_key size_key = {.name = "mesh_shape", .min = 1, .max = 1 << 24};
  bool fsdp = false; /* an axis named fsdp, as the seeds and JAX mean it: sharded params */
  for (int i = 0; axes && i < n_axes; i++)
    fsdp |= strcasecmp(axes[i], "fsdp") == 0;
  if (n_sizes >= 2 && n_sizes <= N_AXES + 1) {
    int h = set_hsdp_shape(cfg, name, sizes, n_sizes, axes, n_axes, ctx);
    if (h > 0 && cfg->source[wf__cfg_key_index("mesh.dp")] == ctx->src)
      cfg->mesh.fsdp_axis = true;
    if (h != 0)
      return h > 0 ? WF_OK : WF_ECONFIG;
  }
  int order[N_AXES], dims[N_AXES] = {0, 1, 1, 1}; /* left out: dp derived, the others 1 */
  if (n_sizes < 1 || n_sizes > N_AXES)
    return wf__cfg_fail(ctx, name,
                        "expected 1 to 4 axis sizes, got %d; write it like "
                        "[[2, 2, 2], [dp, tp, pp]]",
                        n_sizes);
  if (axes && n_axes != n_sizes)
    return wf__cfg_fail(ctx, name, "has %d sizes but %d axis names; give one name per size",
                        n_sizes, n_axes);
  if (axes && parse_axes(name, axes, n_axes, order, ctx) != WF_OK)
    return WF_ECONFIG;
  if (!axes)
    current_axes(cfg, order);
  for (int i = 0; i < n_sizes; i++)
    if (parse_int(&size_key, name, sizes[i], &dims[order[i]], ctx) != WF_OK)
      return WF_ECONFIG;
  static const char *const keys[N_AXES] = {"mesh.dp", "mesh.tp", "mesh.pp", "mesh.cp"};
  int *fields[N_AXES] = {&cfg->mesh.dp, &cfg->mesh.tp, &cfg->mesh.pp, &cfg->mesh.cp};
  if (dims[2] > WF_MAX_STAGES)
    return wf__cfg_fail(ctx, name, "pp size %d is out of range; it must be <= %d", dims[2],
                        WF_MAX_STAGES);
  for (int a = 0; a < N_AXES; a++)
    if (store(cfg, wf__cfg_key_index(keys[a]), ctx->src))
      *fields[a] = dims[a];
  if (axes)
    store_axes(cfg, order, ctx->src);
  if (cfg->source[wf__cfg_key_index("mesh.dp")] == ctx->src)
    cfg->mesh.fsdp_axis = fsdp;
  return WF_OK;
}

/* ---- public entry points ------------------------------------------------------------- */

void wf_config_init(wf_config *cfg)
{
  memset(cfg, 0, sizeof *cfg);
  wf__cfg_ctx ctx = {.src = WF_SRC_DEFAULT};
  for (int i = 0; i < wf__cfg_nkeys; i++)
    if (wf__cfg_keys[i].def)
      wf__cfg_apply_text(cfg, (wf__cfg_target){i, WF__SP_NONE}, wf__cfg_keys[i].name,
                         wf__cfg_keys[i].def, &ctx);
  cfg->model.padded_vocab = wf__cfg_pad_vocab(cfg->model.vocab);
}

wf_status wf__cfg_unknown_key(const char *key, const wf__cfg_ctx *ctx)
{
  char hint[128];
  const char *why = wf__cfg_unsupported(key);
  if (why)
    return wf__cfg_fail(ctx, NULL, "key '%s' is not used by weft: %s", key, why);
  wf__cfg_suggest(key, false, hint, sizeof hint);
  if (hint[0])
    return wf__cfg_fail(ctx, NULL, "unknown key '%s'; did you mean '%s'?", key, hint);
  return wf__cfg_fail(ctx, NULL, "unknown key '%s'; run `worker --print-config` to list every key",
                      key);
}

wf_status wf_config_set(wf_config *cfg, const char *key, const char *value, wf_config_source src,
                        char *err, size_t err_len)
{
  wf__cfg_ctx ctx = {.err = err, .err_len = err_len, .src = src};
  wf__cfg_target t;
  if (!cfg || !key || !value || (unsigned)src > WF_SRC_CLI)
    return WF_EINVAL;
  if (!wf__cfg_resolve(key, &t))
    return wf__cfg_unknown_key(key, &ctx);
  return wf__cfg_apply_text(cfg, t, key, value, &ctx);
}

static wf_status env_one(wf_config *cfg, const char *entry, char *err, size_t err_len)
{
  char var[128];
  const char *eq = strchr(entry, '=');
  size_t n = eq ? (size_t)(eq - entry) : strlen(entry);
  snprintf(var, sizeof var, "%.*s", (int)WF_MIN(n, sizeof var - 1), entry);
  if (wf__cfg_env_skipped(var))
    return WF_OK;
  wf__cfg_ctx ctx = {.err = err, .err_len = err_len, .src = WF_SRC_ENV, .env = var};
  wf__cfg_target t;
  const char *name = NULL;
  if (wf__cfg_resolve_env(var, &t, &name))
    return wf__cfg_apply_text(cfg, t, name, eq ? eq + 1 : "", &ctx);
  char hint[128];
  wf__cfg_suggest(var, true, hint, sizeof hint);
  ctx.env = NULL;
  if (hint[0])
    return wf__cfg_fail(&ctx, NULL,
                        "environment variable %s is not a weft setting; "
                        "did you mean %s?",
                        var, hint);
  return wf__cfg_fail(&ctx, NULL,
                      "environment variable %s is not a weft setting; unset it "
                      "(WEFT_<KEY> sets a key, e.g. WEFT_TRAIN_STEPS)",
                      var);
}

wf_status wf_config_load_env(wf_config *cfg, char *const *envp, char *err, size_t err_len)
{
  if (!cfg)
    return WF_EINVAL;
  for (; envp && *envp; envp++) {
    if (strncmp(*envp, "WEFT_", 5) != 0)
      continue;
    wf_status st = env_one(cfg, *envp, err, err_len);
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

/* ---- printing ------------------------------------------------------------------------ */

static void format_list(const int *v, int n, char *out, size_t len)
{
  size_t w = (size_t)snprintf(out, len, "[");
  for (int i = 0; i < n && w < len; i++)
    w += (size_t)snprintf(out + w, len - w, "%s%d", i ? ", " : "", v[i]);
  if (w < len)
    snprintf(out + w, len - w, "]");
}

/* "[a, b]" of a STRLIST or DBLLIST (strings as they are: paths and names). */
static void format_items(const wf_config *cfg, const wf__cfg_key *k, char *out, size_t len)
{
  const char *p = (const char *)cfg + k->off;
  int n = WF_MIN(*(const int *)((const char *)cfg + k->count_off),
                 (int)(k->type == WF__CT_STRLIST ? k->items : k->cap));
  size_t w = (size_t)snprintf(out, len, "[");
  for (int i = 0; i < n && w < len; i++) {
    if (k->type == WF__CT_STRLIST)
      w += (size_t)snprintf(out + w, len - w, "%s%s", i ? ", " : "", p + (size_t)i * k->cap);
    else
      w += (size_t)snprintf(out + w, len - w, "%s%g", i ? ", " : "", ((const double *)p)[i]);
  }
  if (w < len)
    snprintf(out + w, len - w, "]");
}

static void format_value(const wf_config *cfg, const wf__cfg_key *k, char *out, size_t len)
{
  const void *p = (const char *)cfg + k->off;
  switch (k->type) {
  case WF__CT_INT: snprintf(out, len, "%d", *(const int *)p); break;
  case WF__CT_U64: snprintf(out, len, "%llu", (unsigned long long)*(const uint64_t *)p); break;
  case WF__CT_DOUBLE: snprintf(out, len, "%g", *(const double *)p); break;
  case WF__CT_BOOL: snprintf(out, len, "%s", *(const bool *)p ? "true" : "false"); break;
  case WF__CT_STRING: snprintf(out, len, "%s", *(const char *)p ? (const char *)p : "\"\""); break;
  case WF__CT_ENUM: {
    int v = *(const int *)p;
    snprintf(out, len, "%d", v);
    for (int i = 0; k->enums[i].name; i++)
      if (k->enums[i].value == v) {
        snprintf(out, len, "%s", k->enums[i].name);
        break;
      }
    break;
  }
  case WF__CT_INTLIST: {
    int n = (k->flags & WF__KF_FIXED_LEN) ? (int)k->cap
                                          : *(const int *)((const char *)cfg + k->count_off);
    format_list(p, WF_MIN(n, (int)k->cap), out, len);
    break;
  }
  case WF__CT_AXES:
    snprintf(out, len, "[%s, %s, %s, %s]", cfg->mesh.axis_names[0], cfg->mesh.axis_names[1],
             cfg->mesh.axis_names[2], cfg->mesh.axis_names[3]);
    break;
  case WF__CT_STRLIST:
  case WF__CT_DBLLIST: format_items(cfg, k, out, len); break;
  }
}

void wf_config_print(const wf_config *cfg, FILE *out)
{
  char val[WF_DATA_MAX_SOURCES * (WF_PATH_MAX + 2) + 8]; /* a whole data.source */
  int kw = 0, vw = 0;
  for (int i = 0; i < wf__cfg_nkeys; i++) {
    format_value(cfg, &wf__cfg_keys[i], val, sizeof val);
    kw = WF_MAX(kw, (int)strlen(wf__cfg_keys[i].name));
    vw = WF_MAX(vw, WF_MIN((int)strlen(val), 24));
  }
  for (int i = 0; i < wf__cfg_nkeys; i++) {
    format_value(cfg, &wf__cfg_keys[i], val, sizeof val);
    fprintf(out, "%-*s = %-*s  (%s)\n", kw, wf__cfg_keys[i].name, vw, val,
            wf_config_source_str((wf_config_source)cfg->source[i]));
  }
}
