/*
 * family.c - the registry of model families and what every caller asks of one through
 * its description: dimensions (defaults, checks, from the config), the tensors and
 * their sizes, FLOPs and the planner's kernel costs.
 *
 * A family is data plus its compute: adding one is a folder under model/ (its
 * wf_family table, its tensors' descriptions, its block's forward and backward) and a
 * line in `families` below. Nothing outside model/ names a family's tensors, and
 * runtime/'s config validation asks this registry (wf_model_config_check) which
 * families exist and what each one's keys allow.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "model_int.h"

static const wf_family *const families[] = {&wf__family_gpt2, &wf__family_llama, &wf__family_olmoe,
                                            &wf__family_qwen3_moe, &wf__family_mixtral};

const wf_family *const *wf_model_families(int *n)
{
  *n = (int)WF_ARRAY_LEN(families);
  return families;
}

const wf_family *wf_model_family_find(const char *name)
{
  for (size_t i = 0; name && i < WF_ARRAY_LEN(families); i++)
    if (!strcmp(families[i]->name, name) && families[i]->version == WF_FAMILY_VERSION)
      return families[i];
  return NULL;
}

const wf_family *wf_model_family(const wf_model_dims *d)
{
  return d->fam ? d->fam : &wf__family_gpt2;
}

const char *wf_model_family_name(const wf_model_dims *d) { return wf_model_family(d)->name; }

/* ---- dimensions -------------------------------------------------------------------- */

wf_model_dims wf_model_dims_resolve(const wf_model_dims *d)
{
  wf_model_dims r = *d;
  r.fam = wf_model_family(d);
  if (r.KV <= 0)
    r.KV = r.NH;
  if (r.F <= 0)
    r.F = 4 * r.C;
  r.fam->resolve(&r);
  if (r.HD <= 0 && r.NH > 0)
    r.HD = r.C / r.NH;
  return r;
}

wf_model_dims wf_model_dims_from_config(const wf_config *cfg)
{
  wf_model_dims d = {
      .fam = wf_model_family_find(cfg->model.family),
      .L = cfg->model.layers,
      .NH = cfg->model.heads,
      .C = cfg->model.d_model,
      .maxT = cfg->model.seq_len,
      .V = cfg->model.vocab,
      .Vp = cfg->model.padded_vocab,
      .KV = cfg->model.kv_heads,
      .F = cfg->model.ffn,
      .tie = cfg->model.tie_embeddings,
      .rope_theta = cfg->model.rope_theta,
      .rope_scaling = cfg->model.rope_scaling,
      .norm_eps = (float)cfg->model.norm_eps,
      .HD = cfg->model.head_dim,
      .E = cfg->model.experts,
      .K = cfg->model.experts_per_token,
      .norm_topk = cfg->model.norm_topk_prob,
      .aux_coef = cfg->model.router_aux_loss_coef,
      .z_coef = cfg->model.router_z_loss_coef,
      .capacity = cfg->model.capacity_factor,
  };
  if (d.Vp < d.V) /* not derived yet: round up to a multiple of 128 as validate does */
    d.Vp = (d.V + 127) / 128 * 128;
  return wf_model_dims_resolve(&d);
}

const char *wf_model_dims_check(const wf_model_dims *dd)
{
  wf_model_dims r = wf_model_dims_resolve(dd), *d = &r;
  if (d->L <= 0 || d->NH <= 0 || d->C <= 0 || d->maxT <= 0 || d->V <= 0 || d->Vp <= 0 ||
      d->KV <= 0 || d->F <= 0)
    return "every dimension must be positive";
  /* Bounds that keep every size_t product exact and every (B*T, C) int index valid. */
  double experts = d->E > 0 ? d->E : 1;
  if (d->L > (1 << 16))
    return "more than 65536 layers";
  if (d->C > (1 << 20))
    return "d_model above 1048576";
  if (d->NH > d->C)
    return "more heads than d_model";
  if (d->maxT > (1 << 20))
    return "a context (seq_len) above 1048576";
  if (d->Vp > (1 << 24))
    return "a vocabulary above 16777216";
  if (d->F > (1 << 22))
    return "an MLP (ffn) wider than 4194304";
  if (d->HD > (1 << 16) || d->E > (1 << 16))
    return "a head_dim or a number of experts above 65536";
  if ((double)d->L * (4.0 * d->C * d->C + 3.0 * experts * d->C * d->F) > 1e12)
    return "more than 1e12 parameters in the blocks (layers x (4 d_model^2 + 3 d_model ffn x "
           "experts)), beyond any memory";
  if (d->C % d->NH != 0 && !d->fam->own_head_dim)
    return "d_model must be a multiple of the number of heads";
  if (d->HD <= 0 || (d->HD * d->NH != d->C && !d->fam->own_head_dim))
    return "the head size must be d_model / heads (this family has no head_dim of its own)";
  if (d->NH % d->KV != 0)
    return "the heads must be a multiple of the key/value heads";
  if (d->Vp < d->V)
    return "padded vocab must be at least the vocab";
  return d->fam->check(d);
}

/* ---- a config's model keys (wf_config_validate's model check) ------------------------ */

wf_status wf__keys_fail(char *err, size_t len, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err ? len : 0, fmt, ap);
  va_end(ap);
  return WF_ECONFIG;
}

/* The keys of a family with neither experts nor a head size of its own (GPT-2, Llama).
 * A model.init whose family the config leaves at its default names its own family: the
 * trainer checks these against it once read (wf_model_dims_meet_config). */
wf_status wf__family_dense_keys(const wf_config *c, char *err, size_t len)
{
  const char *f = c->model.family;
  int E = c->model.experts, K = c->model.experts_per_token, ep = c->mesh.ep;
  if (c->model.init[0] && c->source[wf_config_key_find("model.family")] == WF_SRC_DEFAULT)
    return WF_OK;
  if (E > 0 || K > 0 || ep > 1)
    return wf__keys_fail(err, len,
                         "%s=%d: model.family=%s has no experts; use model.family=olmoe, "
                         "qwen3_moe or mixtral (or a preset such as olmoe-tiny), or remove it",
                         E > 0   ? "model.experts"
                         : K > 0 ? "model.experts_per_token"
                                 : "mesh.ep",
                         E > 0   ? E
                         : K > 0 ? K
                                 : ep,
                         f);
  if (c->model.head_dim && c->model.head_dim * c->model.heads != c->model.d_model)
    return wf__keys_fail(err, len,
                         "model.head_dim=%d: model.family=%s's heads are d_model / heads = %d "
                         "wide; leave model.head_dim at 0",
                         c->model.head_dim, f, c->model.d_model / c->model.heads);
  return WF_OK;
}

wf_status wf_model_config_check(const wf_config *c, char *err, size_t len)
{
  const wf_family *fam = wf_model_family_find(c->model.family);
  char names[128] = "";
  if (fam)
    return fam->check_keys(c, err, len);
  for (size_t i = 0; i < WF_ARRAY_LEN(families); i++) {
    size_t n = strlen(names);
    snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "", families[i]->name);
  }
  return wf__keys_fail(err, len, "model.family=%s is not a model family weft knows; use one of %s",
                       c->model.family, names);
}

bool wf_model_dims_same(const wf_model_dims *a, const wf_model_dims *b, const char **field,
                        double *va, double *vb)
{
  wf_model_dims x = wf_model_dims_resolve(a), y = wf_model_dims_resolve(b);
  const struct {
    const char *name;
    double a, b;
  } f[] = {
      {"family", x.fam == y.fam ? 0 : 1, 0},
      {"layers", x.L, y.L},
      {"heads", x.NH, y.NH},
      {"kv_heads", x.KV, y.KV},
      {"d_model", x.C, y.C},
      {"ffn", x.F, y.F},
      {"seq_len", x.maxT, y.maxT},
      {"vocab", x.V, y.V},
      {"padded_vocab", x.Vp, y.Vp},
      {"tie_embeddings", x.tie == WF_TIE_YES, y.tie == WF_TIE_YES},
      {"rope_theta", x.rope_theta, y.rope_theta},
      {"rope_scaling.rope_type", x.rope_scaling.rope_type, y.rope_scaling.rope_type},
      {"rope_scaling.factor", x.rope_scaling.factor, y.rope_scaling.factor},
      {"rope_scaling.low_freq_factor", x.rope_scaling.low_freq_factor,
       y.rope_scaling.low_freq_factor},
      {"rope_scaling.high_freq_factor", x.rope_scaling.high_freq_factor,
       y.rope_scaling.high_freq_factor},
      {"rope_scaling.original_max_position_embeddings",
       x.rope_scaling.original_max_position_embeddings,
       y.rope_scaling.original_max_position_embeddings},
      {"norm_eps", x.norm_eps, y.norm_eps},
      {"head_dim", x.HD, y.HD},
      {"experts", x.E, y.E},
      {"experts_per_token", x.K, y.K},
      {"norm_topk_prob", x.norm_topk == WF_SWITCH_ON, y.norm_topk == WF_SWITCH_ON},
  };
  for (size_t i = 0; i < WF_ARRAY_LEN(f); i++) {
    if (f[i].a != f[i].b) {
      if (field)
        *field = f[i].name, *va = f[i].a, *vb = f[i].b;
      return false;
    }
  }
  return true;
}

/* ---- tensors ------------------------------------------------------------------------ */

size_t wf_dim_size(const wf_model_dims *d, wf_dim x)
{
  size_t hs = (size_t)(d->HD > 0 ? d->HD : d->C / d->NH);
  switch (x) {
  case WF_DIM_C: return (size_t)d->C;
  case WF_DIM_Q: return (size_t)d->NH * hs;
  case WF_DIM_KV: return (size_t)d->KV * hs;
  case WF_DIM_F: return (size_t)d->F;
  case WF_DIM_VP: return (size_t)d->Vp;
  case WF_DIM_T: return (size_t)d->maxT;
  case WF_DIM_E: return (size_t)d->E;
  case WF_DIM_HD: return hs;
  default: return 1;
  }
}

size_t wf_tensor_group_rows(const wf_model_dims *d, const wf_tensor_desc *t, int g)
{
  return wf_dim_size(d, t->rows[g]);
}

size_t wf_tensor_rows(const wf_model_dims *d, const wf_tensor_desc *t)
{
  size_t n = 0;
  for (int g = 0; g < t->n_groups; g++)
    n += wf_tensor_group_rows(d, t, g);
  return n;
}

size_t wf_tensor_cols(const wf_model_dims *d, const wf_tensor_desc *t)
{
  return wf_dim_size(d, t->cols);
}

void wf_model_describe(const wf_model_dims *d, wf_model_desc *out)
{
  wf_model_dims r = wf_model_dims_resolve(d);
  r.fam->describe(&r, out);
}

int wf_model_num_tensors(const wf_model_dims *d)
{
  wf_model_desc desc;
  wf_model_describe(d, &desc);
  return desc.n;
}

int wf_model_tensor_find(const wf_model_dims *d, const char *name)
{
  wf_model_desc desc;
  wf_model_describe(d, &desc);
  for (int i = 0; i < desc.n; i++)
    if (!strcmp(desc.t[i].name, name))
      return i;
  return -1;
}

double wf_model_flops_per_step(const wf_model_dims *d, int B, int T)
{
  wf_model_dims r = wf_model_dims_resolve(d);
  return r.fam->step_flops(&r, B, T);
}

double wf_model_layer_flops(const wf_model_dims *d, int T)
{
  wf_model_dims r = wf_model_dims_resolve(d);
  return r.fam->layer_flops(&r, T);
}

void wf_model_costs_get(const wf_model_dims *d, const wf_cost_geo *g, wf_model_costs *out)
{
  wf_model_dims r = wf_model_dims_resolve(d);
  memset(out, 0, sizeof *out);
  r.fam->costs(&r, g, out);
}

/* ---- model.init's shape, met by the config's model keys ------------------------------ */

/* Whether the user gave `key` (a file, WEFT_* or the command line), not a default or a
 * preset. */
static bool user_set(const wf_config *cfg, const char *key)
{
  int s = cfg->source[wf_config_key_find(key)];
  return s >= WF_SRC_FILE && s != WF_SRC_DERIVED;
}

typedef struct meeting {
  const wf_config *cfg;
  const char *init;
  char *err;
  size_t len;
} meeting;

/* A key the user set must say what the file says (callers pass the file's value for a 0
 * that means "the family's default"). */
static bool agrees(meeting *m, const char *key, double file, double mine, const char *file_text,
                   const char *mine_text)
{
  char a[32], b[32];
  if (!user_set(m->cfg, key) || file == mine)
    return true;
  if (!file_text)
    snprintf(a, sizeof a, "%.9g", file), snprintf(b, sizeof b, "%.9g", mine);
  snprintf(m->err, m->len,
           "%s=%s, but model.init '%s' has %s: the file decides the model; remove %s, "
           "or set it to %s",
           key, mine_text ? mine_text : b, m->init, file_text ? file_text : a, key,
           file_text ? file_text : a);
  return false;
}

static const char *tie_text(bool tie) { return tie ? "true" : "false"; }

static const char *rope_text(wf_rope_type t) { return t == WF_ROPE_LLAMA3 ? "llama3" : "none"; }

/* The family and the integer sizes: those a user names most. */
static bool shape_agrees(meeting *m, const wf_model_dims *f)
{
  const wf_config *c = m->cfg;
  bool same_family = !strcmp(f->fam->name, c->model.family);
  if (!same_family && user_set(c, "model.preset") && !user_set(c, "model.family")) {
    snprintf(m->err, m->len,
             "model.preset=%s is a %s model, but model.init '%s' is a %s one: the file decides "
             "the model; remove model.preset",
             c->model.preset, c->model.family, m->init, f->fam->name);
    return false;
  }
  return agrees(m, "model.family", same_family, 1, f->fam->name, c->model.family) &&
         agrees(m, "model.layers", f->L, c->model.layers, NULL, NULL) &&
         agrees(m, "model.heads", f->NH, c->model.heads, NULL, NULL) &&
         agrees(m, "model.kv_heads", f->KV, c->model.kv_heads ? c->model.kv_heads : f->NH, NULL,
                NULL) &&
         agrees(m, "model.d_model", f->C, c->model.d_model, NULL, NULL) &&
         agrees(m, "model.ffn", f->F, c->model.ffn ? c->model.ffn : f->F, NULL, NULL) &&
         agrees(m, "model.vocab", f->V, c->model.vocab, NULL, NULL);
}

/* What the family computes with beyond the sizes: ties, RoPE, the norm's epsilon. */
static bool math_agrees(meeting *m, const wf_model_dims *f)
{
  const wf_config *c = m->cfg;
  const wf_rope_scaling *fs = &f->rope_scaling, *ms = &c->model.rope_scaling;
  bool ftie = f->tie == WF_TIE_YES;
  bool mtie = c->model.tie_embeddings == WF_TIE_AUTO ? ftie : c->model.tie_embeddings == WF_TIE_YES;
  return agrees(m, "model.tie_embeddings", ftie, mtie, tie_text(ftie), tie_text(mtie)) &&
         agrees(m, "model.rope_theta", f->rope_theta,
                c->model.rope_theta ? c->model.rope_theta : f->rope_theta, NULL, NULL) &&
         agrees(m, "model.norm_eps", f->norm_eps,
                c->model.norm_eps ? (float)c->model.norm_eps : f->norm_eps, NULL, NULL) &&
         agrees(m, "model.rope_scaling.rope_type", fs->rope_type, ms->rope_type,
                rope_text(fs->rope_type), rope_text(ms->rope_type)) &&
         agrees(m, "model.rope_scaling.factor", fs->factor, ms->factor, NULL, NULL) &&
         agrees(m, "model.rope_scaling.low_freq_factor", fs->low_freq_factor, ms->low_freq_factor,
                NULL, NULL) &&
         agrees(m, "model.rope_scaling.high_freq_factor", fs->high_freq_factor,
                ms->high_freq_factor, NULL, NULL) &&
         agrees(m, "model.rope_scaling.original_max_position_embeddings",
                fs->original_max_position_embeddings, ms->original_max_position_embeddings, NULL,
                NULL);
}

/* Key `key` now holds the file's value: derived from model.init, unless the user gave it
 * (and it agreed). */
static void from_file(wf_config *cfg, const char *key)
{
  if (!user_set(cfg, key))
    cfg->source[wf_config_key_find(key)] = WF_SRC_DERIVED;
}

static void take_file(wf_config *c, const wf_model_dims *f)
{
  static const char *const keys[] = {"model.family",
                                     "model.layers",
                                     "model.heads",
                                     "model.kv_heads",
                                     "model.d_model",
                                     "model.ffn",
                                     "model.vocab",
                                     "model.tie_embeddings",
                                     "model.rope_theta",
                                     "model.norm_eps",
                                     "model.rope_scaling.rope_type",
                                     "model.rope_scaling.factor",
                                     "model.rope_scaling.low_freq_factor",
                                     "model.rope_scaling.high_freq_factor",
                                     "model.rope_scaling.original_max_position_embeddings"};
  wf_strlcpy(c->model.family, f->fam->name, sizeof c->model.family);
  c->model.layers = f->L, c->model.heads = f->NH, c->model.kv_heads = f->KV,
  c->model.d_model = f->C;
  c->model.ffn = f->F, c->model.vocab = f->V;
  c->model.tie_embeddings = f->tie == WF_TIE_YES ? WF_TIE_YES : WF_TIE_NO;
  c->model.rope_theta = f->rope_theta, c->model.norm_eps = f->norm_eps;
  c->model.rope_scaling = f->rope_scaling;
  for (size_t i = 0; i < WF_ARRAY_LEN(keys); i++)
    from_file(c, keys[i]);
}

wf_status wf_model_dims_meet_config(const wf_model_dims *file, const char *init, wf_config *cfg,
                                    char *err, size_t len)
{
  wf_model_dims f = wf_model_dims_resolve(file);
  meeting m = {cfg, init, err, len};
  if (!shape_agrees(&m, &f) || !math_agrees(&m, &f))
    return WF_ECONFIG;
  /* the context: a shorter one trains on shorter sequences (the file's first positions),
   * a longer one the file has no positions for */
  if (user_set(cfg, "model.seq_len") && cfg->model.seq_len > f.maxT) {
    snprintf(err, len,
             "model.seq_len=%d, but model.init '%s' has a context of %d positions: train on "
             "at most %d (model.seq_len or train.seq_len), or leave model.seq_len out",
             cfg->model.seq_len, init, f.maxT, f.maxT);
    return WF_ECONFIG;
  }
  take_file(cfg, &f);
  return WF_OK;
}
