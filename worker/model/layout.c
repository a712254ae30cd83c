/*
 * layout.c - the parameter layout of the whole model and of a shard of it, read off the
 * family's tensor descriptions: sizes and offsets, which tensors a shard holds and how
 * tensor parallelism slices them, and the mapping between a shard's flat vector and the
 * whole model's (runs). Pure functions of (dims, shard): checkpoints and the full-model
 * exchange use them without a model.
 *
 * Invariant: the runs of every shard of a mesh, counted ones only, cover the whole
 * layout exactly once (tp-replicated tensors count on tp rank 0, the tied embedding on
 * the first stage, every tensor but the experts' on ep rank 0), so adding every shard's
 * counted runs into zeros assembles the model.
 *
 * An expert tensor holds E copies of its (rows, cols) shape, expert after expert; an ep
 * rank holds its E / ep consecutive experts, each sliced over tp as the tensor's split
 * says, so its local rows are the experts' local rows one expert after the other.
 */
#include <string.h>

#include "model_int.h"

/* ---- the whole model --------------------------------------------------------------- */

/* Experts of a tensor in the whole model (1: not an expert tensor), and on shard s. */
static size_t experts_of(const wf_model_dims *d, const wf_tensor_desc *t)
{
  return t->experts ? (size_t)d->E : 1;
}

static int ep_of(const wf_model_shard *s) { return s->ep > 1 ? s->ep : 1; }

static size_t local_experts(const wf_model_dims *d, const wf_tensor_desc *t,
                            const wf_model_shard *s)
{
  return experts_of(d, t) / (t->experts ? (size_t)ep_of(s) : 1);
}

static size_t desc_layer_numel(const wf_model_dims *d, const wf_tensor_desc *t)
{
  return experts_of(d, t) * wf_tensor_rows(d, t) * wf_tensor_cols(d, t);
}

static size_t desc_numel(const wf_model_dims *d, const wf_tensor_desc *t)
{
  size_t n = desc_layer_numel(d, t);
  return t->place == WF_PLACE_LAYER ? n * (size_t)d->L : n;
}

/* The resolved dims and description every pure function starts from. */
typedef struct view {
  wf_model_dims d;
  wf_model_desc desc;
} view;

static void view_of(view *v, const wf_model_dims *d)
{
  v->d = wf_model_dims_resolve(d);
  v->d.fam->describe(&v->d, &v->desc);
}

size_t wf_model_layer_numel(const wf_model_dims *d, int t)
{
  view v;
  view_of(&v, d);
  return desc_layer_numel(&v.d, &v.desc.t[t]);
}

size_t wf_model_tensor_numel(const wf_model_dims *d, int t)
{
  view v;
  view_of(&v, d);
  return desc_numel(&v.d, &v.desc.t[t]);
}

bool wf_model_tensor_layered(const wf_model_dims *d, int t)
{
  view v;
  view_of(&v, d);
  return v.desc.t[t].place == WF_PLACE_LAYER;
}

size_t wf_model_tensor_offset(const wf_model_dims *d, int t)
{
  view v;
  size_t off = 0;
  view_of(&v, d);
  for (int i = 0; i < t && i < v.desc.n; i++)
    off += desc_numel(&v.d, &v.desc.t[i]);
  return off;
}

size_t wf_model_num_params(const wf_model_dims *d)
{
  view v;
  size_t n = 0;
  view_of(&v, d);
  for (int i = 0; i < v.desc.n; i++)
    n += desc_numel(&v.d, &v.desc.t[i]);
  return n;
}

/* ---- shards ------------------------------------------------------------------------ */

wf_model_shard wf_model_shard_whole(const wf_model_dims *d)
{
  return (wf_model_shard){.tp = 1, .tp_rank = 0, .l0 = 0, .l1 = d->L, .first = true, .last = true};
}

const char *wf_model_shard_check(const wf_model_dims *dd, const wf_model_shard *s)
{
  wf_model_dims d = wf_model_dims_resolve(dd);
  if (s->tp < 1 || s->tp_rank < 0 || s->tp_rank >= s->tp)
    return "tp rank outside the tp group";
  if (s->cp > 1 && (s->cp_rank < 0 || s->cp_rank >= s->cp))
    return "cp rank outside the cp group";
  if (ep_of(s) > 1 && (s->ep_rank < 0 || s->ep_rank >= s->ep || d.E % s->ep))
    return "ep must divide the experts, and the ep rank lie inside the ep group";
  if (d.NH % s->tp || d.KV % s->tp || d.C % s->tp || d.Vp % s->tp || d.F % s->tp)
    return "tp must divide the heads, the kv heads, d_model, the MLP's width and the padded "
           "vocabulary";
  int v = s->chunks > 1 ? s->chunks : 1, stride = v > 1 ? s->chunk_stride : 0;
  if (s->l0 < 0 || s->l0 >= s->l1 || (v > 1 && stride < s->l1 - s->l0) ||
      (long)s->l1 + (long)(v - 1) * stride > d.L)
    return "the stage's layer ranges are empty, overlap or fall outside [0, L)";
  if (s->first != (s->l0 == 0) || s->last != (s->l1 + (v - 1) * stride == d.L))
    return "the first stage must start at layer 0 and the last end at layer L";
  return NULL;
}

bool wf__tensor_present(const wf_tensor_desc *t, const wf_model_shard *s)
{
  switch (t->place) {
  case WF_PLACE_FIRST: return s->first;
  case WF_PLACE_LAST: return s->last;
  case WF_PLACE_TIED: return s->first || s->last;
  default: return true;
  }
}

/* Model chunks of a shard (1 without interleaving) and its layers over all chunks. */
static int shard_chunks(const wf_model_shard *s) { return s->chunks > 1 ? s->chunks : 1; }
static int shard_layers(const wf_model_shard *s) { return shard_chunks(s) * (s->l1 - s->l0); }

/* Local layer i (chunk-major: chunk c holds local layers [c*lc, (c+1)*lc)) <-> global. */
static int shard_global_layer(const wf_model_shard *s, int i)
{
  int lc = s->l1 - s->l0;
  return s->l0 + i / lc * s->chunk_stride + i % lc;
}

int wf__global_layer(const wf_model *m, int i) { return shard_global_layer(&m->s, i); }

int wf__local_layer(const wf_model *m, int l)
{
  int stride = m->nchunk > 1 ? m->s.chunk_stride : 0;
  int c = m->nchunk > 1 ? (l - m->s.l0) / stride : 0;
  return c * m->lc + (l - m->s.l0 - c * stride);
}

/* Elements of one layer's tensor t on shard s, and of all its layers. */
static size_t shard_layer_numel(const wf_model_dims *d, const wf_tensor_desc *t,
                                const wf_model_shard *s)
{
  if (!wf__tensor_present(t, s))
    return 0;
  size_t n = desc_layer_numel(d, t) / (t->experts ? (size_t)ep_of(s) : 1);
  return t->split != WF_SPLIT_REPLICATED ? n / (size_t)s->tp : n;
}

static size_t shard_numel(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s)
{
  size_t n = shard_layer_numel(d, t, s);
  return t->place == WF_PLACE_LAYER ? n * (size_t)shard_layers(s) : n;
}

static bool shard_counted(const wf_tensor_desc *t, const wf_model_shard *s)
{
  if (!wf__tensor_present(t, s))
    return false;
  if (t->place == WF_PLACE_TIED && !s->first) /* the last stage's copy of the embedding */
    return false;
  if (!t->experts && ep_of(s) > 1 && s->ep_rank > 0) /* every ep rank holds it whole */
    return false;
  return t->split != WF_SPLIT_REPLICATED || s->tp_rank == 0;
}

size_t wf_model_shard_params(const wf_model_dims *d, const wf_model_shard *s)
{
  view v;
  size_t n = 0;
  view_of(&v, d);
  for (int t = 0; t < v.desc.n; t++)
    n += shard_numel(&v.d, &v.desc.t[t], s);
  return n;
}

int wf_model_shard_layers(const wf_model_shard *s) { return shard_layers(s); }

size_t wf_model_shard_numel(const wf_model_dims *d, const wf_model_shard *s, int t)
{
  view v;
  view_of(&v, d);
  return shard_numel(&v.d, &v.desc.t[t], s);
}

size_t wf_model_shard_layer_numel(const wf_model_dims *d, const wf_model_shard *s, int t)
{
  view v;
  view_of(&v, d);
  return shard_layer_numel(&v.d, &v.desc.t[t], s);
}

size_t wf_model_shard_offset(const wf_model_dims *d, const wf_model_shard *s, int t)
{
  view v;
  size_t off = 0;
  view_of(&v, d);
  for (int i = 0; i < t; i++)
    off += shard_numel(&v.d, &v.desc.t[i], s);
  return off;
}

bool wf_model_shard_holds(const wf_model_dims *d, const wf_model_shard *s, int t)
{
  view v;
  view_of(&v, d);
  return wf__tensor_present(&v.desc.t[t], s);
}

bool wf_model_shard_counted(const wf_model_dims *d, const wf_model_shard *s, int t)
{
  view v;
  view_of(&v, d);
  return shard_counted(&v.desc.t[t], s);
}

static bool tp_partial(const wf_tensor_desc *t, const wf_model_shard *s, bool sequence)
{
  return (t->tp_partial || (t->sp_partial && sequence)) && s->tp > 1 && wf__tensor_present(t, s);
}

bool wf_model_shard_tp_partial(const wf_model_dims *d, const wf_model_shard *s, int t)
{
  view v;
  view_of(&v, d);
  return tp_partial(&v.desc.t[t], s, s->sequence);
}

bool wf_model_shard_expert(const wf_model_dims *d, int t)
{
  view v;
  view_of(&v, d);
  return v.desc.t[t].experts;
}

/* The model's own, from its cached description (the hot paths). */
int wf_model_local_layers(const wf_model *m) { return m->nl; }

size_t wf_model_local_layer_numel(const wf_model *m, int t)
{
  return shard_layer_numel(&m->d, &m->desc.t[t], &m->s);
}

size_t wf_model_local_numel(const wf_model *m, int t)
{
  return shard_numel(&m->d, &m->desc.t[t], &m->s);
}

bool wf_model_counted(const wf_model *m, int t) { return shard_counted(&m->desc.t[t], &m->s); }

bool wf_model_counted_any_ep(const wf_model *m, int t)
{
  wf_model_shard s = m->s;
  s.ep_rank = 0; /* a dense tensor counts as on ep rank 0 */
  return shard_counted(&m->desc.t[t], &s);
}

bool wf_model_tp_partial(const wf_model *m, int t)
{
  return tp_partial(&m->desc.t[t], &m->s, m->sequence);
}

/* ---- the local <-> full mapping ------------------------------------------------------ */

/* Local tensor (t, layer) as `rows` rows of `cols` elements; local row i is full row
 * full_row(i), columns [col0, col0 + cols) of a full row of full_cols elements.
 * Replicated tensors are one row; column-split ones keep their rows' columns whole,
 * row-split ones (ROW: the input columns) a slice of every row. */
wf__geom wf__tensor_geom(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s)
{
  size_t tp = (size_t)s->tp, r = (size_t)s->tp_rank, n = shard_layer_numel(d, t, s);
  size_t cols = wf_tensor_cols(d, t), ne = local_experts(d, t, s);
  switch (t->split) {
  case WF_SPLIT_COLUMN:
  case WF_SPLIT_VOCAB: return (wf__geom){n / cols, cols, cols, 0};
  case WF_SPLIT_ROW: return (wf__geom){ne * wf_tensor_rows(d, t), cols / tp, cols, r * cols / tp};
  default: /* one row per expert (a replicated expert tensor is each expert's whole copy) */
    return (wf__geom){ne, n / ne, n / ne, 0};
  }
}

/* Full row of local row i: a column-split tensor holds, of each row group in turn, its
 * rank's 1/tp of the group's rows ([q | k | v] each by heads, [gate | up] each by
 * hidden units); the vocabulary split its rank's Vp/tp rows. */
static size_t expert_row(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s,
                         size_t i);

static size_t full_row(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s,
                       size_t i)
{
  size_t tp = (size_t)s->tp, r = (size_t)s->tp_rank, base = 0;
  if (t->experts)
    return expert_row(d, t, s, i);
  if (t->split == WF_SPLIT_VOCAB)
    return r * (wf_tensor_rows(d, t) / tp) + i;
  if (t->split != WF_SPLIT_COLUMN)
    return i;
  for (int g = 0; g < t->n_groups; g++) {
    size_t gr = wf_tensor_group_rows(d, t, g), part = gr / tp;
    if (i < part)
      return base + r * part + i;
    i -= part, base += gr;
  }
  return base + i; /* past the end: not reached for a local row */
}

/* An expert tensor's local row i: local expert i / rl (rl rows each, as the geometry has
 * them), which is expert ep_rank * E/ep + i / rl of the whole tensor, and within it the
 * row the tensor's split gives row i % rl of one expert's copy. */
static size_t expert_row(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s,
                         size_t i)
{
  wf_tensor_desc one = *t;
  one.experts = false;
  size_t ne = local_experts(d, t, s), rl = wf__tensor_geom(d, t, s).rows / ne;
  size_t e = (size_t)(ep_of(s) > 1 ? s->ep_rank : 0) * ne + i / rl;
  size_t rows = t->split == WF_SPLIT_REPLICATED ? 1 : wf_tensor_rows(d, t);
  return e * rows + full_row(d, &one, s, i % rl);
}

size_t wf__full_index(const wf_model_dims *d, const wf_tensor_desc *t, const wf_model_shard *s,
                      const wf__geom *g, size_t i)
{
  return full_row(d, t, s, i) * g->full_cols + g->col0;
}

/* The runs of one local tensor (t, layer) whose elements start at local offset loc:
 * consecutive rows that are also consecutive in the full tensor form one run. */
static void tensor_runs(const view *v, const wf_model_shard *s, int ti, size_t base, int layer,
                        size_t loc, wf_model_run_fn fn, void *user)
{
  const wf_tensor_desc *t = &v->desc.t[ti];
  wf__geom g = wf__tensor_geom(&v->d, t, s);
  wf_model_run r = {ti, layer, shard_counted(t, s), 0, 0, 0};
  for (size_t i = 0; i < g.rows; i++) {
    size_t full = base + wf__full_index(&v->d, t, s, &g, i);
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

void wf_model_shard_runs(const wf_model_dims *d, const wf_model_shard *s, wf_model_run_fn fn,
                         void *user)
{
  view v;
  size_t loc = 0, off = 0;
  view_of(&v, d);
  for (int t = 0; t < v.desc.n; t++) {
    const wf_tensor_desc *td = &v.desc.t[t];
    bool layered = td->place == WF_PLACE_LAYER;
    size_t ll = shard_layer_numel(&v.d, td, s), full_ll = desc_layer_numel(&v.d, td);
    int layers = layered ? shard_layers(s) : 1;
    for (int j = 0; ll > 0 && j < layers; j++, loc += ll) {
      int l = layered ? shard_global_layer(s, j) : 0;
      tensor_runs(&v, s, t, off + (size_t)l * full_ll, l, loc, fn, user);
    }
    off += desc_numel(&v.d, td);
  }
}

/* A caller's callback, given only the part of each run inside [lo, hi). */
typedef struct clip {
  size_t lo, hi;
  wf_model_run_fn fn;
  void *user;
} clip;

static void clip_run(void *user, const wf_model_run *r)
{
  const clip *c = user;
  size_t a = WF_MAX(r->local, c->lo), b = WF_MIN(r->local + r->n, c->hi);
  if (a >= b)
    return;
  wf_model_run part = *r;
  part.full += a - r->local, part.local = a, part.n = b - a;
  c->fn(c->user, &part);
}

void wf_model_shard_runs_in(const wf_model_dims *d, const wf_model_shard *s, size_t lo, size_t hi,
                            wf_model_run_fn fn, void *user)
{
  clip c = {lo, hi, fn, user};
  wf_model_shard_runs(d, s, clip_run, &c);
}

/* wf_model_shard_exchange over one run inside [lo, hi). */
typedef struct exchange {
  float *local, *full;
  size_t lo;
  bool to_full;
} exchange;

static void exchange_run(void *user, const wf_model_run *r)
{
  const exchange *x = user;
  if (x->to_full && !r->counted)
    return;
  float *f = x->full + r->full, *l = x->local + (r->local - x->lo);
  if (!x->to_full) {
    memcpy(l, f, r->n * sizeof *l);
    return;
  }
  for (size_t i = 0; i < r->n; i++)
    f[i] += l[i];
}

void wf_model_shard_exchange(const wf_model_dims *d, const wf_model_shard *s, float *local,
                             size_t lo, size_t hi, float *full, bool to_full)
{
  exchange x = {local, full, lo, to_full};
  wf_model_shard_runs_in(d, s, lo, hi, exchange_run, &x);
}
