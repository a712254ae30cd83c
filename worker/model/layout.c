/*
 * layout.c - the parameter layout of the whole model and of a shard of it: dimensions,
 * kinds, which kinds a shard holds and how they are sliced over tp, and the mapping
 * between a shard's flat vector and the whole model's (runs). Pure functions of
 * (dims, shard): checkpoints and the full-model exchange use them without a model.
 *
 * Invariant: the runs of every shard of a mesh, counted ones only, cover the whole
 * layout exactly once (tp-replicated kinds count on tp rank 0, the tied wte on the
 * first stage), so adding every shard's counted runs into zeros assembles the model.
 */
#include <string.h>

#include "model_int.h"

/* ---- layout -------------------------------------------------------------------- */

wf_gpt_dims wf_gpt_dims_from_config(const wf_config *cfg)
{
  wf_gpt_dims d;
  d.L = cfg->model.layers;
  d.NH = cfg->model.heads;
  d.C = cfg->model.d_model;
  d.maxT = cfg->model.seq_len;
  d.V = cfg->model.vocab;
  d.Vp = cfg->model.padded_vocab;
  if (d.Vp < d.V) /* not derived yet: round up to a multiple of 128 as validate does */
    d.Vp = (d.V + 127) / 128 * 128;
  return d;
}

bool wf_gpt_kind_is_layered(wf_param_kind k)
{
  return k != WF_P_WTE && k != WF_P_WPE && k != WF_P_LNFW && k != WF_P_LNFB;
}

bool wf_gpt_kind_decays(wf_param_kind k)
{
  return k == WF_P_WTE || k == WF_P_WPE || k == WF_P_QKVW || k == WF_P_ATTPROJW || k == WF_P_FCW ||
         k == WF_P_FCPROJW;
}

const char *wf_gpt_kind_name(wf_param_kind k)
{
  static const char *names[WF_GPT_NUM_KINDS] = {
      "wte",  "wpe",  "ln1w", "ln1b", "qkvw",    "qkvb",    "attprojw", "attprojb",
      "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",     "lnfb"};
  return (unsigned)k < WF_GPT_NUM_KINDS ? names[k] : "?";
}

size_t wf_gpt_layer_numel(const wf_gpt_dims *d, wf_param_kind k)
{
  size_t C = (size_t)d->C;
  switch (k) {
  case WF_P_WTE: return (size_t)d->Vp * C;
  case WF_P_WPE: return (size_t)d->maxT * C;
  case WF_P_QKVW: return 3 * C * C;
  case WF_P_QKVB: return 3 * C;
  case WF_P_ATTPROJW: return C * C;
  case WF_P_FCW: return 4 * C * C;
  case WF_P_FCB: return 4 * C;
  case WF_P_FCPROJW: return 4 * C * C;
  default: return C; /* layernorm weights and biases, attprojb, fcprojb */
  }
}

size_t wf_gpt_kind_numel(const wf_gpt_dims *d, wf_param_kind k)
{
  size_t n = wf_gpt_layer_numel(d, k);
  return wf_gpt_kind_is_layered(k) ? n * (size_t)d->L : n;
}

size_t wf_gpt_kind_offset(const wf_gpt_dims *d, wf_param_kind k)
{
  size_t off = 0;
  for (int i = 0; i < (int)k; i++)
    off += wf_gpt_kind_numel(d, (wf_param_kind)i);
  return off;
}

size_t wf_gpt_num_params(const wf_gpt_dims *d)
{
  return wf_gpt_kind_offset(d, (wf_param_kind)WF_GPT_NUM_KINDS);
}

const char *wf_gpt_dims_check(const wf_gpt_dims *d)
{
  if (d->L <= 0 || d->NH <= 0 || d->C <= 0 || d->maxT <= 0 || d->V <= 0 || d->Vp <= 0)
    return "every dimension must be positive";
  /* Bounds that keep every size_t product exact and every (B*T, C) int index valid. */
  if (d->L > (1 << 16) || d->C > (1 << 20) || d->NH > d->C || d->maxT > (1 << 20) ||
      d->Vp > (1 << 24) || (double)d->L * 12.0 * d->C * d->C > 1e12)
    return "dimensions too large";
  if (d->C % d->NH != 0)
    return "d_model must be a multiple of the number of heads";
  if (d->Vp < d->V)
    return "padded vocab must be at least the vocab";
  return NULL;
}

/* ---- shards ------------------------------------------------------------------------ */

wf_gpt_shard wf_gpt_shard_whole(const wf_gpt_dims *d)
{
  return (wf_gpt_shard){.tp = 1, .tp_rank = 0, .l0 = 0, .l1 = d->L, .first = true, .last = true};
}

const char *wf_gpt_shard_check(const wf_gpt_dims *d, const wf_gpt_shard *s)
{
  if (s->tp < 1 || s->tp_rank < 0 || s->tp_rank >= s->tp)
    return "tp rank outside the tp group";
  if (d->NH % s->tp || d->C % s->tp || d->Vp % s->tp)
    return "tp must divide the heads, d_model and the padded vocabulary";
  int v = s->chunks > 1 ? s->chunks : 1, stride = v > 1 ? s->chunk_stride : 0;
  if (s->l0 < 0 || s->l0 >= s->l1 || (v > 1 && stride < s->l1 - s->l0) ||
      (long)s->l1 + (long)(v - 1) * stride > d->L)
    return "the stage's layer ranges are empty, overlap or fall outside [0, L)";
  if (s->first != (s->l0 == 0) || s->last != (s->l1 + (v - 1) * stride == d->L))
    return "the first stage must start at layer 0 and the last end at layer L";
  return NULL;
}

/* Whether kind k exists on this stage. */
bool wf__kind_present(const wf_gpt_shard *s, wf_param_kind k)
{
  switch (k) {
  case WF_P_WTE: return s->first || s->last;
  case WF_P_WPE: return s->first;
  case WF_P_LNFW:
  case WF_P_LNFB: return s->last;
  default: return true;
  }
}

/* Kinds split over tp (the others are replicated). */
static bool kind_tp_split(wf_param_kind k)
{
  return k == WF_P_WTE || k == WF_P_QKVW || k == WF_P_QKVB || k == WF_P_ATTPROJW || k == WF_P_FCW ||
         k == WF_P_FCB || k == WF_P_FCPROJW;
}

/* Model chunks of a shard (1 without interleaving) and its layers over all chunks. */
static int shard_chunks(const wf_gpt_shard *s) { return s->chunks > 1 ? s->chunks : 1; }
static int shard_layers(const wf_gpt_shard *s) { return shard_chunks(s) * (s->l1 - s->l0); }

/* Local layer i (chunk-major: chunk c holds local layers [c*lc, (c+1)*lc)) <-> global. */
static int shard_global_layer(const wf_gpt_shard *s, int i)
{
  int lc = s->l1 - s->l0;
  return s->l0 + i / lc * s->chunk_stride + i % lc;
}

int wf__global_layer(const wf_gpt *m, int i) { return shard_global_layer(&m->s, i); }

int wf__local_layer(const wf_gpt *m, int l)
{
  int stride = m->nchunk > 1 ? m->s.chunk_stride : 0;
  int c = m->nchunk > 1 ? (l - m->s.l0) / stride : 0;
  return c * m->lc + (l - m->s.l0 - c * stride);
}

/* Elements of one layer's tensor of kind k on shard s, and of all its layers. */
static size_t shard_layer_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  if (!wf__kind_present(s, k))
    return 0;
  size_t n = wf_gpt_layer_numel(d, k);
  return kind_tp_split(k) ? n / (size_t)s->tp : n;
}

static size_t shard_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  size_t n = shard_layer_numel(d, s, k);
  return wf_gpt_kind_is_layered(k) ? n * (size_t)shard_layers(s) : n;
}

static bool shard_counted(const wf_gpt_shard *s, wf_param_kind k)
{
  if (!wf__kind_present(s, k))
    return false;
  if (k == WF_P_WTE && !s->first) /* the last stage's copy of the tied embedding */
    return false;
  return kind_tp_split(k) || s->tp_rank == 0;
}

size_t wf_gpt_shard_params(const wf_gpt_dims *d, const wf_gpt_shard *s)
{
  size_t n = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++)
    n += shard_numel(d, s, (wf_param_kind)k);
  return n;
}

int wf_gpt_shard_layers(const wf_gpt_shard *s) { return shard_layers(s); }

size_t wf_gpt_shard_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  return shard_numel(d, s, k);
}

size_t wf_gpt_shard_layer_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  return shard_layer_numel(d, s, k);
}

size_t wf_gpt_shard_offset(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  size_t off = 0;
  for (int i = 0; i < (int)k; i++)
    off += shard_numel(d, s, (wf_param_kind)i);
  return off;
}

int wf_gpt_local_layers(const wf_gpt *m) { return m->nl; }

size_t wf_gpt_local_layer_numel(const wf_gpt *m, wf_param_kind k)
{
  return shard_layer_numel(&m->d, &m->s, k);
}

size_t wf_gpt_local_numel(const wf_gpt *m, wf_param_kind k) { return shard_numel(&m->d, &m->s, k); }

bool wf_gpt_kind_counted(const wf_gpt *m, wf_param_kind k) { return shard_counted(&m->s, k); }

bool wf_gpt_shard_kind_tp_partial(const wf_gpt_shard *s, wf_param_kind k)
{
  bool norm = k == WF_P_LN1W || k == WF_P_LN1B || k == WF_P_LN2W || k == WF_P_LN2B ||
              k == WF_P_LNFW || k == WF_P_LNFB;
  return norm && s->sequence && s->tp > 1 && wf__kind_present(s, k);
}

bool wf_gpt_kind_tp_partial(const wf_gpt *m, wf_param_kind k)
{
  return wf_gpt_shard_kind_tp_partial(&m->s, k);
}

/* ---- the local <-> full mapping ------------------------------------------------------ */

/* Local tensor (k, layer) as `rows` rows of `cols` elements; local row i is full row
 * full_row(i), columns [col0, col0 + cols) of a full row of full_cols elements. */

wf__geom wf__tensor_geom(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  size_t C = (size_t)d->C, tp = (size_t)s->tp, r = (size_t)s->tp_rank;
  size_t n = shard_layer_numel(d, s, k);
  switch (k) {
  case WF_P_WTE:
  case WF_P_QKVW:
  case WF_P_FCW: return (wf__geom){n / C, C, C, 0};
  case WF_P_QKVB:
  case WF_P_FCB: return (wf__geom){n, 1, 1, 0};
  case WF_P_ATTPROJW: return (wf__geom){C, C / tp, C, r * C / tp};
  case WF_P_FCPROJW: return (wf__geom){C, 4 * C / tp, 4 * C, r * 4 * C / tp};
  default: return (wf__geom){1, n, n, 0}; /* replicated */
  }
}

/* Full row of local row i. qkv rows are [q | k | v], each C rows of which this rank
 * holds its heads' C/tp. */
static size_t full_row(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k, size_t i)
{
  size_t C = (size_t)d->C, tp = (size_t)s->tp, r = (size_t)s->tp_rank;
  switch (k) {
  case WF_P_QKVW:
  case WF_P_QKVB: return i / (C / tp) * C + r * (C / tp) + i % (C / tp);
  case WF_P_FCW:
  case WF_P_FCB: return r * (4 * C / tp) + i;
  case WF_P_WTE: return r * ((size_t)d->Vp / tp) + i;
  default: return i;
  }
}

/* Offset in the full tensor (k, layer) of local row i's first element. */
size_t wf__full_index(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k,
                      const wf__geom *g, size_t i)
{
  return full_row(d, s, k, i) * g->full_cols + g->col0;
}

/* The runs of one local tensor (k, layer) whose elements start at local offset loc:
 * consecutive rows that are also consecutive in the full tensor form one run. */
static void tensor_runs(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k, int layer,
                        size_t loc, wf_gpt_run_fn fn, void *user)
{
  wf__geom g = wf__tensor_geom(d, s, k);
  size_t base = wf_gpt_kind_offset(d, k) + (size_t)layer * wf_gpt_layer_numel(d, k);
  wf_gpt_run r = {k, layer, shard_counted(s, k), 0, 0, 0};
  for (size_t i = 0; i < g.rows; i++) {
    size_t full = base + wf__full_index(d, s, k, &g, i);
    if (r.n > 0 && g.cols == g.full_cols && full == r.full + r.n) {
      r.n += g.cols;
      continue;
    }
    if (r.n > 0)
      fn(user, &r);
    r.full = full, r.local = loc + i * g.cols, r.n = g.cols;
  }
  if (r.n > 0)
    fn(user, &r);
}

void wf_gpt_shard_runs(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_gpt_run_fn fn, void *user)
{
  size_t loc = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    wf_param_kind kk = (wf_param_kind)k;
    size_t ll = shard_layer_numel(d, s, kk);
    int layers = wf_gpt_kind_is_layered(kk) ? shard_layers(s) : 1;
    for (int j = 0; ll > 0 && j < layers; j++, loc += ll)
      tensor_runs(d, s, kk, wf_gpt_kind_is_layered(kk) ? shard_global_layer(s, j) : 0, loc, fn,
                  user);
  }
}

/* wf_gpt_shard_exchange over one run, clipped to the elements [lo, hi) held. */
typedef struct exchange {
  float *local, *full;
  size_t lo, hi;
  bool to_full;
} exchange;

static void exchange_run(void *user, const wf_gpt_run *r)
{
  const exchange *x = user;
  size_t a = WF_MAX(r->local, x->lo), b = WF_MIN(r->local + r->n, x->hi);
  if (a >= b || (x->to_full && !r->counted))
    return;
  float *f = x->full + r->full + (a - r->local), *l = x->local + (a - x->lo);
  if (!x->to_full) {
    memcpy(l, f, (b - a) * sizeof *l);
    return;
  }
  for (size_t i = 0; i < b - a; i++)
    f[i] += l[i];
}

void wf_gpt_shard_exchange(const wf_gpt_dims *d, const wf_gpt_shard *s, float *local, size_t lo,
                           size_t hi, float *full, bool to_full)
{
  exchange x = {local, full, lo, hi, to_full};
  wf_gpt_shard_runs(d, s, exchange_run, &x);
}

/* ---- FLOPs --------------------------------------------------------------------- */

/*
 * Matmuls: 6 * num_params * tokens (2 flops per multiply-add, forward 1x, backward 2x:
 * input and weight gradients), counting every parameter as llm.c does.
 * Attention, per layer, forward: Q.K^T is B*NH*T*T*hs multiply-adds and att.V as many,
 * so 2 * 2 * B*NH*T*T*hs = 4*B*T*T*C flops, counted over the full T x T square (the
 * usual convention, although the causal kernel skips about half); backward is 2x
 * forward. Total attention = 3 * 4 * L*B*T*T*C = 12 * L*B*T*T*C.
 * Layernorm, GELU, softmax, residuals and AdamW are not counted.
 */
double wf_gpt_flops_per_step(const wf_gpt_dims *d, int B, int T)
{
  double tokens = (double)B * T;
  double matmul = 6.0 * (double)wf_gpt_num_params(d) * tokens;
  double attn = 12.0 * d->L * tokens * T * d->C;
  return matmul + attn;
}
