/*
 * model.c - GPT-2 on one rank: layout, initialisation, forward, backward, AdamW.
 *
 * Memory: allocations of num_params floats with one layout (parameters, gradients,
 * and AdamW m and v, the last two allocated by the first update that needs them:
 * under ZeRO-1 the optimizer state lives in dp shards instead), the llm.c checkpoint
 * order with all layers of a kind together; one allocation of activations for B x T
 * tokens; one of backward scratch.
 *
 * Invariants:
 *  - Padding rows [V, Vp) of wte are zero after init and stay zero: the loss ignores
 *    the padding columns of the logits (xent kernels with ld = Vp and V real columns),
 *    so their gradient is exactly zero, and AdamW leaves a zero parameter with zero
 *    moments at zero.
 *  - Every parameter element is a pure function of (seed, kind, layer, index), so a
 *    slice of a tensor can be initialised alone (wf_gpt_init_slice).
 *  - Backward adds into the gradients; only wf_gpt_zero_grad clears them.
 *  - The hot path does no copies of big tensors: the logits buffer becomes the
 *    logits' gradient in place, the residual stream gradient is one (B,T,C) buffer
 *    that each layernorm backward adds into, and the outputs of the two projections
 *    go through one (B,T,C) scratch buffer because backward never needs them.
 *  - Mixed precision (wf_model.h): the GEMM weights are read from `wlow`, a rounded
 *    copy of the parameters in their layout, which wf_gpt_params_changed refreshes;
 *    the activations a GEMM reads are rounded in place when made, so the backward
 *    GEMMs and a recomputed forward (activation checkpointing) see the same operands
 *    bit for bit (rounding is elementwise and deterministic). Output gradients are
 *    rounded into scratch (`rdy`) or in place where nothing else reads them.
 *
 * Legend: B batch, T time, C d_model, L layers, NH heads, hs = C/NH, V vocab,
 * Vp padded vocab, N = B*T rows.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wf_check.h"
#include "wf_kernels.h"
#include "wf_model.h"
#include "model_int.h"

/* Activations of one micro-batch in one slot, for this stage's nl = l1 - l0 layers,
 * carved from one allocation sized for Bmax x Tmax. Per-layer tensors use a fixed
 * stride of the Bmax x Tmax size, and the first rows of each are live. R is the rows
 * of the replicated regions (N, or N/tp under sequence parallelism); the tensor-
 * parallel regions hold all N rows of the local heads (NHl = NH/tp) and hidden units
 * (4C/tp). */
typedef struct acts {
  float *encoded;                   /* (R,C) the stage's input */
  float *ln1, *ln1_mean, *ln1_rstd; /* (nl,R,C), (nl,R), (nl,R) */
  float *qkv;                       /* (nl,N,3C/tp) */
  float *atty;                      /* (nl,N,C/tp) */
  float *att;                       /* (nl,B,NHl,T,T) */
  float *residual2;                 /* (nl,R,C) */
  float *ln2, *ln2_mean, *ln2_rstd; /* (nl,R,C), (nl,R), (nl,R) */
  float *fch, *fch_gelu;            /* (nl,N,4C/tp) */
  float *residual3;                 /* (nl,R,C) */
  float *lnf, *lnf_mean, *lnf_rstd; /* (R,C), (R), (R): last stage */
  float *logits;                    /* (N,Vp/tp): last stage; dlogits after backward */
  float *row_max, *row_sumexp;      /* (N) global over the vocabulary */
  float *target_logit, *losses;     /* (N) */
  int *inputs, *targets;            /* (N) this micro-batch's tokens */
  int B, T, chunk;
  bool live;         /* forward done, backward not */
  bool have_targets; /* computed a loss, so backward may run */
} acts;

/* Scratch shared by all slots: one layer's worth, reused layer after layer. */
typedef struct dacts {
  float *proj;    /* (N,C) row-parallel partial output */
  float *full;    /* (N,C) a gathered input or output gradient (sequence parallelism) */
  float *dres;    /* (R,C) gradient of the residual stream */
  float *dc;      /* (N,C) partial input gradient of a column-parallel matmul */
  float *dl;      /* (R,C) dln1, dln2, dlnf after the tp reduction */
  float *d4a;     /* (N,4C/tp) dfch_gelu, then dqkv (N,3C/tp) */
  float *d4b;     /* (N,4C/tp) dfch */
  float *scratch; /* (B,NHl,T,T) attention backward scratch */
  float *stats;   /* (tp,3,N) gathered per-rank xent row statistics */
  float *rdy;     /* (N,C) a GEMM's rounded output gradient (mixed precision; else empty) */
} dacts;

struct wf_gpt {
  wf_gpt_dims d;
  wf_gpt_shard s;
  wf_tp tp;
  int nl; /* layers on this rank: v chunks of lc layers */
  int nchunk, lc;
  int NHl, Vl; /* local heads, local vocabulary rows */
  int Bmax, Tmax, n_slots, in_use, peak;
  size_t num_params;                /* local */
  size_t off[WF_GPT_NUM_KINDS + 1]; /* local offset of each kind; [16] = total */
  size_t slot_floats;
  float *params, *grads, *m, *v;
  wf_precision prec; /* GEMM operands rounded to bf16/fp16; WF_PREC_NO = fp32 */
  float *wlow;       /* mixed precision: the GEMM weights rounded (params layout), else NULL */
  float loss_scale;  /* backward's loss gradient is multiplied by it (fp16 loss scaling) */
  float *act_mem, *dact_mem, *re_mem;
  acts *a;        /* n_slots */
  bool recompute; /* activation checkpointing: slots keep layer outputs only */
  acts re;        /* recompute: one layer's intermediates */
  dacts da;
  wf_gpt_grad_hook hook; /* told when each group of gradients is final (dp overlap) */
  void *hook_user;
};

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
static bool kind_present(const wf_gpt_shard *s, wf_param_kind k)
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

static int global_layer(const wf_gpt *m, int i) { return shard_global_layer(&m->s, i); }

static int local_layer(const wf_gpt *m, int l)
{
  int stride = m->nchunk > 1 ? m->s.chunk_stride : 0;
  int c = m->nchunk > 1 ? (l - m->s.l0) / stride : 0;
  return c * m->lc + (l - m->s.l0 - c * stride);
}

/* Elements of one layer's tensor of kind k on shard s, and of all its layers. */
static size_t shard_layer_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  if (!kind_present(s, k))
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
  if (!kind_present(s, k))
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

int wf_gpt_local_layers(const wf_gpt *m) { return m->nl; }

size_t wf_gpt_local_layer_numel(const wf_gpt *m, wf_param_kind k)
{
  return shard_layer_numel(&m->d, &m->s, k);
}

size_t wf_gpt_local_numel(const wf_gpt *m, wf_param_kind k) { return shard_numel(&m->d, &m->s, k); }

size_t wf_gpt_local_offset(const wf_gpt *m, wf_param_kind k) { return m->off[k]; }
size_t wf_gpt_local_params(const wf_gpt *m) { return m->num_params; }
const wf_gpt_shard *wf_gpt_get_shard(const wf_gpt *m) { return &m->s; }

bool wf_gpt_kind_counted(const wf_gpt *m, wf_param_kind k) { return shard_counted(&m->s, k); }

bool wf_gpt_kind_tp_partial(const wf_gpt *m, wf_param_kind k)
{
  bool norm = k == WF_P_LN1W || k == WF_P_LN1B || k == WF_P_LN2W || k == WF_P_LN2B ||
              k == WF_P_LNFW || k == WF_P_LNFB;
  return norm && m->s.sequence && m->s.tp > 1 && kind_present(&m->s, k);
}

/* ---- the local <-> full mapping ------------------------------------------------------ */

/* Local tensor (k, layer) as `rows` rows of `cols` elements; local row i is full row
 * full_row(i), columns [col0, col0 + cols) of a full row of full_cols elements. */
typedef struct geom {
  size_t rows, cols, full_cols, col0;
} geom;

static geom tensor_geom(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k)
{
  size_t C = (size_t)d->C, tp = (size_t)s->tp, r = (size_t)s->tp_rank;
  size_t n = shard_layer_numel(d, s, k);
  switch (k) {
  case WF_P_WTE:
  case WF_P_QKVW:
  case WF_P_FCW: return (geom){n / C, C, C, 0};
  case WF_P_QKVB:
  case WF_P_FCB: return (geom){n, 1, 1, 0};
  case WF_P_ATTPROJW: return (geom){C, C / tp, C, r * C / tp};
  case WF_P_FCPROJW: return (geom){C, 4 * C / tp, 4 * C, r * 4 * C / tp};
  default: return (geom){1, n, n, 0}; /* replicated */
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
static size_t full_index(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k,
                         const geom *g, size_t i)
{
  return full_row(d, s, k, i) * g->full_cols + g->col0;
}

/* The runs of one local tensor (k, layer) whose elements start at local offset loc:
 * consecutive rows that are also consecutive in the full tensor form one run. */
static void tensor_runs(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k, int layer,
                        size_t loc, wf_gpt_run_fn fn, void *user)
{
  geom g = tensor_geom(d, s, k);
  size_t base = wf_gpt_kind_offset(d, k) + (size_t)layer * wf_gpt_layer_numel(d, k);
  wf_gpt_run r = {k, layer, shard_counted(s, k), 0, 0, 0};
  for (size_t i = 0; i < g.rows; i++) {
    size_t full = base + full_index(d, s, k, &g, i);
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

/* Copy between this rank's tensors and the whole model's (to_full: add into full). */
static void exchange_full(wf_gpt *m, int which, float *full, bool to_full)
{
  wf_gpt_shard_exchange(&m->d, &m->s, which ? m->grads : m->params, 0, m->num_params, full,
                        to_full);
}

void wf_gpt_export_full(wf_gpt *m, int which, float *full) { exchange_full(m, which, full, true); }

void wf_gpt_import_full(wf_gpt *m, int which, const float *full)
{
  exchange_full(m, which, (float *)full, false);
  if (which == 0)
    wf_gpt_params_changed(m);
}

/* ---- allocation ------------------------------------------------------------------ */

/* Carve `mem` (or just count, when mem is NULL) into activation tensors: the
 * intermediates of `inner` layers, the outputs (residual3) of `outer` layers, and the
 * head's when `head`. A slot is (nl, nl, last), or (0, nl, last) under activation
 * checkpointing, whose one shared recompute buffer is (1, 0, false). */
static size_t carve_acts(acts *a, float *mem, const wf_gpt *m, int inner, int outer, bool head)
{
  size_t L = (size_t)inner, Lo = (size_t)outer, C = (size_t)m->d.C, tp = (size_t)m->s.tp;
  size_t N = (size_t)m->Bmax * (size_t)m->Tmax, R = wf_tp_rows(&m->tp, N);
  size_t att = (size_t)m->Bmax * (size_t)m->NHl * (size_t)m->Tmax * (size_t)m->Tmax;
  size_t last = head ? 1 : 0;
  struct {
    void *p;
    size_t n;
  } t[] = {
      {&a->encoded, R * C},
      {&a->ln1, L * R * C},
      {&a->ln1_mean, L * R},
      {&a->ln1_rstd, L * R},
      {&a->qkv, L * N * 3 * C / tp},
      {&a->atty, L * N * C / tp},
      {&a->att, L * att},
      {&a->residual2, L * R * C},
      {&a->ln2, L * R * C},
      {&a->ln2_mean, L * R},
      {&a->ln2_rstd, L * R},
      {&a->fch, L * N * 4 * C / tp},
      {&a->fch_gelu, L * N * 4 * C / tp},
      {&a->residual3, Lo * R * C},
      {&a->lnf, last * R * C},
      {&a->lnf_mean, last * R},
      {&a->lnf_rstd, last * R},
      {&a->logits, last * N * (size_t)m->Vl},
      {&a->row_max, last * N},
      {&a->row_sumexp, last * N},
      {&a->target_logit, last * N},
      {&a->losses, last * N},
      {&a->inputs, Lo ? N : 0}, /* int and float are both 4 bytes */
      {&a->targets, Lo ? N : 0},
  };
  size_t total = 0;
  for (size_t i = 0; i < WF_ARRAY_LEN(t); i++) {
    if (mem)
      *(float **)t[i].p = mem + total;
    total += (t[i].n + 15) & ~(size_t)15; /* keep every tensor 64-byte aligned */
  }
  return total;
}

static size_t carve_dacts(dacts *g, float *mem, const wf_gpt *m)
{
  size_t C = (size_t)m->d.C, tp = (size_t)m->s.tp, N = (size_t)m->Bmax * m->Tmax;
  size_t att = (size_t)m->Bmax * (size_t)m->NHl * (size_t)m->Tmax * (size_t)m->Tmax;
  struct {
    float **p;
    size_t n;
  } t[] = {{&g->proj, N * C},
           {&g->full, N * C},
           {&g->dres, N * C},
           {&g->dc, N * C},
           {&g->dl, N * C},
           {&g->d4a, N * 4 * C / tp},
           {&g->d4b, N * 4 * C / tp},
           {&g->scratch, att},
           {&g->stats, 3 * (tp + 1) * N},
           {&g->rdy, m->prec != WF_PREC_NO ? N * C : 0}};
  size_t total = 0;
  for (size_t i = 0; i < WF_ARRAY_LEN(t); i++) {
    if (mem)
      *t[i].p = mem + total;
    total += (t[i].n + 15) & ~(size_t)15;
  }
  return total;
}

static float *alloc_floats(size_t n)
{
  return n > SIZE_MAX / sizeof(float) ? NULL : wf_mem_alloc(n * sizeof(float));
}

static void layout(wf_gpt *m)
{
  size_t off = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    m->off[k] = off;
    off += wf_gpt_local_numel(m, (wf_param_kind)k);
  }
  m->off[WF_GPT_NUM_KINDS] = off;
  m->num_params = off;
}

static wf_status alloc_acts(wf_gpt *m)
{
  wf_status st = WF_OK;
  acts probe;
  int inner = m->recompute ? 0 : m->lc; /* a slot holds one chunk's layers */
  m->slot_floats = carve_acts(&probe, NULL, m, inner, m->lc, m->s.last);
  WF_CHECK_ALLOC(m->a = calloc((size_t)m->n_slots, sizeof *m->a));
  WF_CHECK_ALLOC(m->act_mem = alloc_floats(m->slot_floats * (size_t)m->n_slots));
  for (int i = 0; i < m->n_slots; i++)
    carve_acts(&m->a[i], m->act_mem + (size_t)i * m->slot_floats, m, inner, m->lc, m->s.last);
  if (m->recompute) { /* one layer's intermediates, shared by every layer and slot */
    size_t n = carve_acts(&m->re, NULL, m, 1, 0, false);
    WF_CHECK_ALLOC(m->re_mem = alloc_floats(n));
    carve_acts(&m->re, m->re_mem, m, 1, 0, false);
  }
  WF_CHECK_ALLOC(m->dact_mem = alloc_floats(carve_dacts(&m->da, NULL, m)));
  carve_dacts(&m->da, m->dact_mem, m);
fail:
  return st;
}

wf_status wf_gpt_create_shard(wf_gpt **out, const wf_gpt_opts *o)
{
  wf_status st = WF_OK;
  wf_gpt *m = NULL;
  const wf_gpt_dims *d = &o->dims;
  const char *bad = wf_gpt_dims_check(d);
  *out = NULL;
  WF_CHECK(bad == NULL, WF_EINVAL, "GPT dims L=%d NH=%d C=%d maxT=%d V=%d Vp=%d: %s", d->L, d->NH,
           d->C, d->maxT, d->V, d->Vp, bad);
  bad = wf_gpt_shard_check(d, &o->shard);
  WF_CHECK(bad == NULL, WF_EINVAL, "model shard tp %d/%d layers [%d, %d): %s", o->shard.tp_rank,
           o->shard.tp, o->shard.l0, o->shard.l1, bad);
  WF_CHECK(o->B > 0 && o->T > 0 && o->T <= d->maxT && o->slots >= 1, WF_EINVAL,
           "micro-batch %d x %d with %d slots: need B > 0, 0 < T <= context length %d and a "
           "slot",
           o->B, o->T, o->slots, d->maxT);
  WF_CHECK(o->shard.tp == 1 || o->tp_comm, WF_EINVAL, "tp %d needs a tp communicator", o->shard.tp);
  WF_CHECK(!o->shard.sequence || ((size_t)o->B * o->T) % (size_t)o->shard.tp == 0, WF_EINVAL,
           "sequence parallelism needs B*T = %d x %d tokens divisible by tp %d", o->B, o->T,
           o->shard.tp);
  m = calloc(1, sizeof *m);
  WF_CHECK_ALLOC(m);
  m->d = *d;
  m->s = o->shard;
  m->tp = (wf_tp){.comm = o->shard.tp > 1 ? o->tp_comm : NULL,
                  .size = o->shard.tp,
                  .rank = o->shard.tp_rank,
                  .sequence = o->shard.sequence && o->shard.tp > 1};
  m->nchunk = o->shard.chunks > 1 ? o->shard.chunks : 1;
  m->lc = o->shard.l1 - o->shard.l0;
  m->nl = m->nchunk * m->lc;
  m->NHl = d->NH / o->shard.tp;
  m->Vl = d->Vp / o->shard.tp;
  m->Bmax = o->B, m->Tmax = o->T, m->n_slots = o->slots;
  m->recompute = o->recompute;
  m->prec = o->precision;
  m->loss_scale = 1.0f;
  layout(m);
  WF_CHECK_ALLOC(m->params = alloc_floats(m->num_params));
  WF_CHECK_ALLOC(m->grads = alloc_floats(m->num_params));
  if (m->prec != WF_PREC_NO)
    WF_CHECK_ALLOC(m->wlow = alloc_floats(m->num_params));
  /* AdamW's m and v are allocated by the first wf_gpt_update: under ZeRO-1 the
   * optimizer state lives in shards elsewhere and these are never needed. */
  WF_TRY(alloc_acts(m));
  *out = m;
  m = NULL;
exit:
  wf_gpt_destroy(m);
  return st;
fail:
  goto exit;
}

wf_status wf_gpt_create(wf_gpt **out, const wf_gpt_dims *d, int B, int T)
{
  wf_gpt_opts o = {.dims = *d, .shard = wf_gpt_shard_whole(d), .B = B, .T = T, .slots = 1};
  return wf_gpt_create_shard(out, &o);
}

void wf_gpt_destroy(wf_gpt *m)
{
  if (!m)
    return;
  wf_mem_free(m->params);
  wf_mem_free(m->grads);
  wf_mem_free(m->wlow);
  wf_mem_free(m->m);
  wf_mem_free(m->v);
  wf_mem_free(m->act_mem);
  wf_mem_free(m->dact_mem);
  wf_mem_free(m->re_mem);
  free(m->a);
  free(m);
}

const wf_gpt_dims *wf_gpt_get_dims(const wf_gpt *m) { return &m->d; }
float *wf_gpt_params(wf_gpt *m) { return m->params; }
float *wf_gpt_grads(wf_gpt *m) { return m->grads; }

float *wf_gpt_param(wf_gpt *m, wf_param_kind k, int layer, int grads)
{
  float *base = grads ? m->grads : m->params;
  size_t off = m->off[k];
  if (wf_gpt_kind_is_layered(k))
    off += (size_t)local_layer(m, layer) * wf_gpt_local_layer_numel(m, k);
  return base + off;
}

size_t wf_gpt_slot_bytes(const wf_gpt *m) { return m->slot_floats * sizeof(float); }

size_t wf_gpt_act_bytes(const wf_gpt *m, int slots)
{
  size_t re = m->recompute ? carve_acts(&(acts){0}, NULL, m, 1, 0, false) : 0;
  return ((size_t)slots * m->slot_floats + re) * sizeof(float);
}

int wf_gpt_peak_slots(wf_gpt *m)
{
  int p = m->peak;
  m->peak = m->in_use;
  return p;
}

void wf_gpt_set_trace(wf_gpt *m, struct wf_trace *trace) { m->tp.trace = trace; }

void wf_gpt_tp_stats(wf_gpt *m, double *seconds, double *bytes)
{
  *seconds = m->tp.comm_s;
  *bytes = m->tp.comm_bytes;
  m->tp.comm_s = 0;
  m->tp.comm_bytes = 0;
}

/* ---- initialisation -------------------------------------------------------------- */

static void zero_floats(float *p, size_t n);

void wf_gpt_init_slice(float *dst, wf_param_kind k, int layer, const wf_gpt_dims *d, uint64_t seed,
                       size_t first, size_t n)
{
  switch (k) {
  case WF_P_LN1W:
  case WF_P_LN2W:
  case WF_P_LNFW:
    for (size_t i = 0; i < n; i++)
      dst[i] = 1.0f;
    return;
  case WF_P_LN1B:
  case WF_P_LN2B:
  case WF_P_LNFB:
  case WF_P_QKVB:
  case WF_P_ATTPROJB:
  case WF_P_FCB:
  case WF_P_FCPROJB: memset(dst, 0, n * sizeof *dst); return;
  default: break;
  }
  float std = 0.02f;
  if (k == WF_P_ATTPROJW || k == WF_P_FCPROJW)
    std = 0.02f / sqrtf(2.0f * (float)d->L);
  uint64_t stream = (uint64_t)k * 4096 + (uint64_t)(wf_gpt_kind_is_layered(k) ? layer : 0);
  size_t live = n;
  if (k == WF_P_WTE) { /* padding rows [V, Vp) stay zero */
    size_t real = (size_t)d->V * (size_t)d->C;
    live = first >= real ? 0 : WF_MIN(n, real - first);
  }
  wf_rng_fill_normal(dst, live, std, seed, stream, first);
  memset(dst + live, 0, (n - live) * sizeof *dst);
}

/* Initialise this rank's slice of tensor (k, layer), row by row of the local tensor
 * (each a contiguous run of the full tensor), spread over the kernels' thread budget;
 * each element is a pure function of its full index, so the result does not depend on
 * the split. */
static void init_tensor(wf_gpt *m, wf_param_kind k, int layer, uint64_t seed)
{
  float *dst = wf_gpt_param(m, k, layer, 0);
  geom g = tensor_geom(&m->d, &m->s, k);
  const wf_gpt *cm = m;
  if (g.rows == 1) { /* one contiguous run: split it in chunks */
    enum { CHUNK = 65536 };
    long chunks = (long)((g.cols + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(dynamic, 1) num_threads(wf_kernels_threads()) if (chunks > 1)
    for (long c = 0; c < chunks; c++) {
      size_t first = (size_t)c * CHUNK;
      wf_gpt_init_slice(dst + first, k, layer, &cm->d, seed, first, WF_MIN(CHUNK, g.cols - first));
    }
    return;
  }
#pragma omp parallel for schedule(static) num_threads(wf_kernels_threads()) if (g.rows > 64)
  for (long i = 0; i < (long)g.rows; i++)
    wf_gpt_init_slice(dst + (size_t)i * g.cols, k, layer, &cm->d, seed,
                      full_index(&cm->d, &cm->s, k, &g, (size_t)i), g.cols);
}

void wf_gpt_init(wf_gpt *m, uint64_t seed)
{
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    wf_param_kind kk = (wf_param_kind)k;
    if (!kind_present(&m->s, kk))
      continue;
    if (!wf_gpt_kind_is_layered(kk))
      init_tensor(m, kk, 0, seed);
    else
      for (int i = 0; i < m->nl; i++)
        init_tensor(m, kk, global_layer(m, i), seed);
  }
  if (m->m) { /* a re-initialised model starts AdamW afresh */
    zero_floats(m->m, m->num_params);
    zero_floats(m->v, m->num_params);
  }
  wf_gpt_params_changed(m);
}

/* ---- forward ------------------------------------------------------------------- */

static bool tokens_valid(const int *tok, size_t n, int V, const char *what)
{
  for (size_t i = 0; i < n; i++) {
    if (tok[i] < 0 || tok[i] >= V) {
      WF_ERROR("%s[%zu] = %d is outside the vocabulary [0, %d)", what, i, tok[i], V);
      return false;
    }
  }
  return true;
}

/* Per-layer slot strides (the Bmax x Tmax sizes). */
typedef struct strides {
  size_t rc, r, n3, n1, n4, att; /* (R,C), (R), (N,3C/tp), (N,C/tp), (N,4C/tp), att */
} strides;

static strides layer_strides(const wf_gpt *m)
{
  size_t N = (size_t)m->Bmax * m->Tmax, C = (size_t)m->d.C, tp = (size_t)m->s.tp;
  size_t R = wf_tp_rows(&m->tp, N);
  return (strides){R * C,          R,
                   N * 3 * C / tp, N * C / tp,
                   N * 4 * C / tp, (size_t)m->Bmax * m->NHl * m->Tmax * m->Tmax};
}

/* Layer j's intermediates: in the slot, or in the shared recompute buffer. */
typedef struct layer_view {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
      *fchg;
} layer_view;

static layer_view layer_at(const wf_gpt *m, const acts *a, int j)
{
  const acts *x = m->recompute ? &m->re : a;
  size_t i = m->recompute ? 0 : (size_t)j;
  strides z = layer_strides(m);
  return (layer_view){x->ln1 + i * z.rc,       x->ln1_mean + i * z.r, x->ln1_rstd + i * z.r,
                      x->qkv + i * z.n3,       x->atty + i * z.n1,    x->att + i * z.att,
                      x->residual2 + i * z.rc, x->ln2 + i * z.rc,     x->ln2_mean + i * z.r,
                      x->ln2_rstd + i * z.r,   x->fch + i * z.n4,     x->fch_gelu + i * z.n4};
}

/* The residual stream entering local layer j (0-based on this stage). */
static float *layer_input(const wf_gpt *m, const acts *a, int j)
{
  return j == 0 ? a->encoded : a->residual3 + (size_t)(j - 1) * layer_strides(m).rc;
}

/* ---- mixed precision ------------------------------------------------------------ */

/* The weights a GEMM multiplies by: the rounded copy under mixed precision. */
static const float *gemm_weight(wf_gpt *m, wf_param_kind k, int layer)
{
  const float *w = wf_gpt_param(m, k, layer, 0);
  return m->wlow ? m->wlow + (w - m->params) : w;
}

/* Round n floats to the model's GEMM precision (nothing at precision no). */
static void round_to(const wf_gpt *m, float *dst, const float *src, size_t n)
{
  if (m->prec == WF_PREC_BF16)
    wf_round_bf16(dst, src, n);
  else if (m->prec == WF_PREC_FP16)
    wf_round_fp16(dst, src, n);
}

/* An activation about to enter a GEMM, rounded where it lies. */
static void round_operand(const wf_gpt *m, float *x, size_t n) { round_to(m, x, x, n); }

/* An output gradient (N,C) that other ops read unrounded (the residual stream's): its
 * rounded copy in da.rdy for the GEMMs, or itself at precision no. */
static const float *rounded_grad(wf_gpt *m, const float *dy, size_t n)
{
  if (m->prec == WF_PREC_NO)
    return dy;
  round_to(m, m->da.rdy, dy, n);
  return m->da.rdy;
}

/* The GEMM weights (qkv, attproj, fc, fcproj, the tied wte) rounded into wlow. */
void wf_gpt_params_changed(wf_gpt *m)
{
  static const wf_param_kind gemm[] = {WF_P_WTE, WF_P_QKVW, WF_P_ATTPROJW, WF_P_FCW, WF_P_FCPROJW};
  if (!m->wlow)
    return;
  for (size_t i = 0; i < WF_ARRAY_LEN(gemm); i++) {
    size_t off = m->off[gemm[i]];
    round_to(m, m->wlow + off, m->params + off, wf_gpt_local_numel(m, gemm[i]));
  }
}

wf_precision wf_gpt_precision(const wf_gpt *m) { return m->prec; }
void wf_gpt_set_loss_scale(wf_gpt *m, float s) { m->loss_scale = s; }

/* Row-parallel matmul (no bias), then leave the tp region, then the bias once. */
static void row_parallel(wf_gpt *m, float *y, const float *x, wf_param_kind w, wf_param_kind b,
                         int l, int N, int IC)
{
  int C = m->d.C;
  /* Only tp rank 0 adds the bias, so the sum over tp adds it once. */
  const float *bias = m->s.tp_rank == 0 ? wf_gpt_param(m, b, l, 0) : NULL;
  wf_matmul_forward(m->da.proj, x, gemm_weight(m, w, l), bias, N, IC, C);
  wf_tp_leave_fwd(&m->tp, y, m->da.proj, (size_t)N, (size_t)C);
}

/* One transformer block: residual3[j] = block(residual), with the tp regions marked. */
static void block_forward(wf_gpt *m, acts *a, int j, int B, int T)
{
  const wf_gpt_dims *d = &m->d;
  int l = global_layer(m, a->chunk * m->lc + j), C = d->C, tp = m->s.tp, N = B * T;
  int R = (int)wf_tp_rows(&m->tp, (size_t)N);
  strides z = layer_strides(m);
  const float *residual = layer_input(m, a, j);
  layer_view v = layer_at(m, a, j);
  float *ln1 = v.ln1, *qkv = v.qkv, *atty = v.atty, *att = v.att, *res2 = v.res2, *ln2 = v.ln2;
  float *fch = v.fch, *fchg = v.fchg;
  float *res3 = a->residual3 + j * z.rc;
  const float *x;

  /* Attention: ln1 (replicated region) -> enter -> qkv (column-parallel, local heads)
   * -> attention -> attproj (row-parallel) -> leave -> residual. Under mixed precision
   * the GEMM inputs ln1, atty, ln2, fchg are rounded as they are made (before the
   * all-gather of sequence parallelism: rounding is elementwise, so it commutes).
   * Attention's own Q.K^T and att.V stay fp32, as flash-attention kernels keep the
   * softmax in fp32; only its output, attproj's input, is rounded. */
  wf_layernorm_forward(ln1, v.ln1_mean, v.ln1_rstd, residual, wf_gpt_param(m, WF_P_LN1W, l, 0),
                       wf_gpt_param(m, WF_P_LN1B, l, 0), R, C);
  round_operand(m, ln1, (size_t)R * C);
  x = wf_tp_enter_fwd(&m->tp, ln1, m->da.full, (size_t)N, (size_t)C);
  wf_matmul_forward(qkv, x, gemm_weight(m, WF_P_QKVW, l), wf_gpt_param(m, WF_P_QKVB, l, 0), N, C,
                    3 * C / tp);
  wf_attention_forward(atty, att, qkv, B, T, C / tp, m->NHl);
  round_operand(m, atty, (size_t)N * C / tp);
  row_parallel(m, res2, atty, WF_P_ATTPROJW, WF_P_ATTPROJB, l, N, C / tp);
  wf_residual_forward(res2, residual, res2, (size_t)R * C);
  /* MLP: ln2 -> enter -> fc (column-parallel) -> GELU -> fcproj (row-parallel) -> leave. */
  wf_layernorm_forward(ln2, v.ln2_mean, v.ln2_rstd, res2, wf_gpt_param(m, WF_P_LN2W, l, 0),
                       wf_gpt_param(m, WF_P_LN2B, l, 0), R, C);
  round_operand(m, ln2, (size_t)R * C);
  x = wf_tp_enter_fwd(&m->tp, ln2, m->da.full, (size_t)N, (size_t)C);
  wf_matmul_forward(fch, x, gemm_weight(m, WF_P_FCW, l), wf_gpt_param(m, WF_P_FCB, l, 0), N, C,
                    4 * C / tp);
  wf_gelu_forward(fchg, fch, (size_t)N * 4 * C / tp);
  round_operand(m, fchg, (size_t)N * 4 * C / tp);
  row_parallel(m, res3, fchg, WF_P_FCPROJW, WF_P_FCPROJB, l, N, 4 * C / tp);
  wf_residual_forward(res3, res2, res3, (size_t)R * C);
}

/* Vocabulary-parallel embedding: each tp rank looks up the tokens in its rows of wte
 * (tp rank 0 adds the positions), and leaving the tp region sums the parts. */
static void embed_forward(wf_gpt *m, acts *a, int B, int T)
{
  int N = B * T, C = m->d.C;
  const float *wpe = m->s.tp_rank == 0 ? wf_gpt_param(m, WF_P_WPE, 0, 0) : NULL;
  wf_encoder_forward_vp(m->da.proj, a->inputs, wf_gpt_param(m, WF_P_WTE, 0, 0),
                        m->s.tp_rank * m->Vl, m->Vl, wpe, B, T, C);
  wf_tp_leave_fwd(&m->tp, a->encoded, m->da.proj, (size_t)N, (size_t)C);
}

/* Real (non-padding) vocabulary columns in this rank's slice. */
static int local_real_vocab(const wf_gpt *m)
{
  int v0 = m->s.tp_rank * m->Vl;
  return WF_MAX(0, WF_MIN(m->Vl, m->d.V - v0));
}

/* Combine the tp ranks' row statistics of the vocabulary-parallel softmax: the global
 * max M, sum_r sumexp_r * exp(max_r - M), and the target logit of the rank holding
 * the target. One all-gather of 3 floats per row; nobody holds full-vocabulary logits. */
static void xent_combine(wf_gpt *m, acts *a, int N)
{
  int tp = m->s.tp;
  if (tp == 1 || !m->tp.comm)
    return;
  float *all = m->da.stats, *mine = all + (size_t)3 * tp * N; /* (tp,3,N) then (3,N) */
  for (int i = 0; i < N; i++) {
    mine[3 * i] = a->row_max[i];
    mine[3 * i + 1] = a->row_sumexp[i];
    mine[3 * i + 2] = a->target_logit[i];
  }
  double t0 = wf_now();
  wf_status st = wf_comm_allgather(m->tp.comm, mine, all, (size_t)3 * N, WF_COMM_F32);
  m->tp.comm_s += wf_now() - t0;
  m->tp.comm_bytes += 3.0 * N * sizeof(float);
  if (st != WF_OK && m->tp.err == WF_OK)
    m->tp.err = st;
  for (int i = 0; i < N; i++) {
    float M = -INFINITY, S = 0, tl = 0;
    for (int r = 0; r < tp; r++)
      M = fmaxf(M, all[(size_t)r * 3 * N + 3 * i]);
    for (int r = 0; r < tp; r++) {
      const float *x = all + (size_t)r * 3 * N + 3 * i;
      if (x[1] > 0)
        S += x[1] * expf(x[0] - M);
      tl += x[2];
    }
    a->row_max[i] = M, a->row_sumexp[i] = S, a->target_logit[i] = tl;
  }
}

/* Final layernorm -> enter -> logits of this rank's vocabulary slice -> the mean
 * cross-entropy, reduced over tp. */
static float head_forward(wf_gpt *m, acts *a, int N)
{
  int C = m->d.C, R = (int)wf_tp_rows(&m->tp, (size_t)N);
  wf_layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, layer_input(m, a, m->lc),
                       wf_gpt_param(m, WF_P_LNFW, 0, 0), wf_gpt_param(m, WF_P_LNFB, 0, 0), R, C);
  round_operand(m, a->lnf, (size_t)R * C);
  const float *x = wf_tp_enter_fwd(&m->tp, a->lnf, m->da.full, (size_t)N, (size_t)C);
  /* Tied embedding; padding rows of wte give padding columns the loss ignores. */
  wf_matmul_forward(a->logits, x, gemm_weight(m, WF_P_WTE, 0), NULL, N, C, m->Vl);
  if (!a->have_targets)
    return 0.0f;
  wf_xent_stats(a->row_max, a->row_sumexp, a->target_logit, a->logits, a->targets, N,
                local_real_vocab(m), m->Vl, m->s.tp_rank * m->Vl);
  xent_combine(m, a, N);
  wf_xent_loss(a->losses, a->row_max, a->row_sumexp, a->target_logit, N);
  double sum = 0.0;
  for (int i = 0; i < N; i++)
    sum += a->losses[i];
  return (float)(sum / N);
}

size_t wf_gpt_stage_io_numel(const wf_gpt *m, int B, int T)
{
  return wf_tp_rows(&m->tp, (size_t)B * T) * (size_t)m->d.C;
}

const float *wf_gpt_stage_output(const wf_gpt *m, int slot)
{
  return layer_input(m, &m->a[slot], m->lc);
}

/* Whether chunk c holds the embeddings / the head. */
static bool chunk_first(const wf_gpt *m, int c) { return m->s.first && c == 0; }
static bool chunk_last(const wf_gpt *m, int c) { return m->s.last && c == m->nchunk - 1; }

static bool forward_args_ok(const wf_gpt *m, int slot, int chunk, const int *inputs, const float *x,
                            const int *targets, int B, int T)
{
  bool first = chunk_first(m, chunk);
  size_t N = (size_t)B * (size_t)T;
  if (slot < 0 || slot >= m->n_slots || chunk < 0 || chunk >= m->nchunk) {
    WF_ERROR("forward of chunk %d in activation slot %d: the model has %d chunks and %d slots",
             chunk, slot, m->nchunk, m->n_slots);
    return false;
  }
  if (B <= 0 || T <= 0 || B * T > m->Bmax * m->Tmax || T > m->Tmax) {
    WF_ERROR("forward of %d x %d tokens: the model was created for at most %d x %d", B, T, m->Bmax,
             m->Tmax);
    return false;
  }
  if (m->tp.sequence && N % (size_t)m->s.tp) {
    WF_ERROR("forward of %d x %d tokens: sequence parallelism needs a multiple of tp %d", B, T,
             m->s.tp);
    return false;
  }
  if (first ? !inputs : !x) {
    WF_ERROR("forward: the %s stage needs %s", first ? "first" : "next",
             first ? "token inputs" : "the previous stage's activations");
    return false;
  }
  return (!first || tokens_valid(inputs, N, m->d.V, "inputs")) &&
         (!targets || tokens_valid(targets, N, m->d.V, "targets"));
}

float wf_gpt_stage_forward(wf_gpt *m, int slot, const int *inputs, const float *x,
                           const int *targets, int B, int T)
{
  return wf_gpt_chunk_forward(m, slot, 0, inputs, x, targets, B, T);
}

float wf_gpt_chunk_forward(wf_gpt *m, int slot, int chunk, const int *inputs, const float *x,
                           const int *targets, int B, int T)
{
  if (!forward_args_ok(m, slot, chunk, inputs, x, targets, B, T))
    return NAN;
  acts *a = &m->a[slot];
  size_t N = (size_t)B * (size_t)T;
  if (!a->live && ++m->in_use > m->peak)
    m->peak = m->in_use;
  a->live = true;
  a->B = B, a->T = T, a->chunk = chunk;
  a->have_targets = chunk_last(m, chunk) && targets;
  if (a->have_targets)
    memcpy(a->targets, targets, N * sizeof *targets);
  if (chunk_first(m, chunk)) {
    memcpy(a->inputs, inputs, N * sizeof *inputs);
    embed_forward(m, a, B, T);
  } else {
    memcpy(a->encoded, x, wf_gpt_stage_io_numel(m, B, T) * sizeof(float));
  }
  for (int j = 0; j < m->lc; j++)
    block_forward(m, a, j, B, T);
  float loss = chunk_last(m, chunk) ? head_forward(m, a, (int)N) : 0.0f;
  return m->tp.err == WF_OK ? loss : NAN;
}

float wf_gpt_forward(wf_gpt *m, const int *inputs, const int *targets, int B, int T)
{
  float loss = wf_gpt_stage_forward(m, 0, inputs, NULL, targets, B, T);
  if (!targets) /* no backward follows: the slot is free again */
    wf_gpt_stage_release(m, 0);
  return loss;
}

const float *wf_gpt_logits(const wf_gpt *m) { return m->a[0].logits; }

/* ---- backward ------------------------------------------------------------------ */

/* memset over the kernels' thread budget: these buffers are the size of the model,
 * and one core alone does not reach the memory bandwidth. */
#define ZERO_CHUNK (1L << 20)
static void zero_floats(float *p, size_t n)
{
  long chunks = (long)((n + ZERO_CHUNK - 1) / ZERO_CHUNK);
#pragma omp parallel for schedule(static) num_threads(wf_kernels_threads()) if (chunks > 1)
  for (long c = 0; c < chunks; c++) {
    size_t first = (size_t)c * ZERO_CHUNK;
    memset(p + first, 0, WF_MIN((size_t)ZERO_CHUNK, n - first) * sizeof *p);
  }
}

void wf_gpt_zero_grad(wf_gpt *m) { zero_floats(m->grads, m->num_params); }

/* Column-parallel matmul backward from the full input x: the input gradient is this
 * rank's partial sum (dc), which entering's backward completes over tp into dl. dout
 * (N,OC) is scratch that only this GEMM reads, so mixed precision rounds it in place. */
static void column_backward(wf_gpt *m, float *dout, const float *x, wf_param_kind w,
                            wf_param_kind b, int l, int N, int OC)
{
  int C = m->d.C;
  round_operand(m, dout, (size_t)N * OC);
  memset(m->da.dc, 0, (size_t)N * C * sizeof(float));
  wf_matmul_backward(m->da.dc, wf_gpt_param(m, w, l, 1),
                     b == WF_GPT_NUM_KINDS ? NULL : wf_gpt_param(m, b, l, 1), dout, x,
                     gemm_weight(m, w, l), N, C, OC);
  wf_tp_enter_bwd(&m->tp, m->da.dl, m->da.dc, (size_t)N, (size_t)C);
}

/* One transformer block backward. On entry da.dres holds d residual3[j]; on exit it
 * holds d(residual input of local layer j). Parameter gradients are added to. */
static void block_backward(wf_gpt *m, acts *a, int j)
{
  const wf_gpt_dims *d = &m->d;
  dacts *g = &m->da;
  int B = a->B, T = a->T, l = global_layer(m, a->chunk * m->lc + j), C = d->C, tp = m->s.tp;
  int N = B * T;
  int R = (int)wf_tp_rows(&m->tp, (size_t)N);
  size_t n4 = (size_t)N * 4 * C / tp, n3 = (size_t)N * 3 * C / tp;
  const float *residual = layer_input(m, a, j), *dy, *x;
  if (m->recompute) /* activation checkpointing: rebuild this layer's intermediates */
    block_forward(m, a, j, B, T);
  layer_view v = layer_at(m, a, j);
  float *ln1 = v.ln1, *qkv = v.qkv, *atty = v.atty, *res2 = v.res2, *ln2 = v.ln2;
  float *fch = v.fch, *fchg = v.fchg;

  /* MLP branch: the gradient of its output is the residual stream's (leave's backward). */
  dy = wf_tp_leave_bwd(&m->tp, g->dres, g->full, (size_t)N, (size_t)C);
  dy = rounded_grad(m, dy, (size_t)N * C);
  memset(g->d4a, 0, n4 * sizeof(float));
  wf_matmul_backward(g->d4a, wf_gpt_param(m, WF_P_FCPROJW, l, 1),
                     wf_gpt_param(m, WF_P_FCPROJB, l, 1), dy, fchg, gemm_weight(m, WF_P_FCPROJW, l),
                     N, 4 * C / tp, C);
  memset(g->d4b, 0, n4 * sizeof(float));
  wf_gelu_backward(g->d4b, fch, g->d4a, n4);
  x = wf_tp_enter_fwd(&m->tp, ln2, g->full, (size_t)N, (size_t)C); /* re-gathered */
  column_backward(m, g->d4b, x, WF_P_FCW, WF_P_FCB, l, N, 4 * C / tp);
  wf_layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LN2W, l, 1), wf_gpt_param(m, WF_P_LN2B, l, 1),
                        g->dl, res2, wf_gpt_param(m, WF_P_LN2W, l, 0), v.ln2_mean, v.ln2_rstd, R,
                        C);
  /* Attention branch. */
  dy = wf_tp_leave_bwd(&m->tp, g->dres, g->full, (size_t)N, (size_t)C);
  dy = rounded_grad(m, dy, (size_t)N * C);
  memset(g->d4b, 0, (size_t)N * C / tp * sizeof(float));
  wf_matmul_backward(g->d4b, wf_gpt_param(m, WF_P_ATTPROJW, l, 1),
                     wf_gpt_param(m, WF_P_ATTPROJB, l, 1), dy, atty,
                     gemm_weight(m, WF_P_ATTPROJW, l), N, C / tp, C);
  memset(g->d4a, 0, n3 * sizeof(float));
  wf_attention_backward(g->d4a, g->scratch, g->d4b, qkv, v.att, B, T, C / tp, m->NHl);
  x = wf_tp_enter_fwd(&m->tp, ln1, g->full, (size_t)N, (size_t)C);
  column_backward(m, g->d4a, x, WF_P_QKVW, WF_P_QKVB, l, N, 3 * C / tp);
  wf_layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LN1W, l, 1), wf_gpt_param(m, WF_P_LN1B, l, 1),
                        g->dl, residual, wf_gpt_param(m, WF_P_LN1W, l, 0), v.ln1_mean, v.ln1_rstd,
                        R, C);
}

/* Loss -> logits -> (tied wte, enter's backward) -> final layernorm -> dres. */
static void head_backward(wf_gpt *m, acts *a, float dloss_scale)
{
  dacts *g = &m->da;
  int N = a->B * a->T, C = m->d.C, R = (int)wf_tp_rows(&m->tp, (size_t)N);
  /* loss_scale is 1 unless fp16 loss scaling is on: x * 1.0f is x, bit for bit. */
  wf_xent_backward(a->logits, a->logits, a->row_max, a->row_sumexp, a->targets,
                   dloss_scale * m->loss_scale / (float)N, N, local_real_vocab(m), m->Vl,
                   m->s.tp_rank * m->Vl);
  const float *x = wf_tp_enter_fwd(&m->tp, a->lnf, g->full, (size_t)N, (size_t)C);
  column_backward(m, a->logits, x, WF_P_WTE, WF_GPT_NUM_KINDS, 0, N, m->Vl);
  memset(g->dres, 0, (size_t)R * C * sizeof(float));
  wf_layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LNFW, 0, 1), wf_gpt_param(m, WF_P_LNFB, 0, 1),
                        g->dl, layer_input(m, a, m->lc), wf_gpt_param(m, WF_P_LNFW, 0, 0),
                        a->lnf_mean, a->lnf_rstd, R, C);
}

static void announce(wf_gpt *m, int group)
{
  if (m->hook)
    m->hook(m->hook_user, group);
}

wf_status wf_gpt_stage_backward(wf_gpt *m, int slot, const float *dy, float dloss_scale)
{
  bool ok = slot >= 0 && slot < m->n_slots && m->a[slot].live;
  bool last = ok && chunk_last(m, m->a[slot].chunk);
  if (!ok || (last ? !m->a[slot].have_targets : !dy)) {
    WF_ERROR("backward of slot %d needs a forward %s in that slot just before", slot,
             last ? "with targets" : "and the next stage's gradient");
    return WF_EINVAL;
  }
  acts *a = &m->a[slot];
  int N = a->B * a->T, C = m->d.C, base = a->chunk * m->lc;
  a->have_targets = false; /* the logits become their gradient below */
  if (last) {
    head_backward(m, a, dloss_scale);
    announce(m, 0); /* the final layernorm's gradients are final */
  } else {
    memcpy(m->da.dres, dy, wf_gpt_stage_io_numel(m, a->B, a->T) * sizeof(float));
  }
  for (int j = m->lc - 1; j >= 0; j--) {
    block_backward(m, a, j);
    announce(m, m->nl - (base + j));
  }
  if (chunk_first(m, a->chunk)) {
    const float *dout = wf_tp_leave_bwd(&m->tp, m->da.dres, m->da.full, (size_t)N, (size_t)C);
    float *dwpe = wf_gpt_param(m, WF_P_WPE, 0, 1);
    wf_encoder_backward_vp(wf_gpt_param(m, WF_P_WTE, 0, 1), dwpe, dout, a->inputs,
                           m->s.tp_rank * m->Vl, m->Vl, a->B, a->T, C);
    if (chunk_last(m, a->chunk)) /* one stage: no embedding group to sum over first */
      announce(m, m->nl + 1);
  }
  a->live = false;
  m->in_use--;
  return m->tp.err;
}

const float *wf_gpt_stage_dinput(const wf_gpt *m) { return m->da.dres; }

void wf_gpt_stage_release(wf_gpt *m, int slot)
{
  if (slot >= 0 && slot < m->n_slots && m->a[slot].live) {
    m->a[slot].live = false;
    m->in_use--;
  }
}

void wf_gpt_backward(wf_gpt *m, float dloss_scale)
{
  if (!m->a[0].have_targets) {
    WF_ERROR("wf_gpt_backward needs a forward with targets just before it");
    return;
  }
  wf_gpt_stage_backward(m, 0, NULL, dloss_scale);
}

wf_status wf_gpt_finish_grads(wf_gpt *m)
{
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++)
    if (wf_gpt_kind_tp_partial(m, (wf_param_kind)k))
      wf_tp_allreduce(&m->tp, m->grads + m->off[k], wf_gpt_local_numel(m, (wf_param_kind)k));
  return m->tp.err;
}

void wf_gpt_set_grad_hook(wf_gpt *m, wf_gpt_grad_hook fn, void *user)
{
  m->hook = fn;
  m->hook_user = user;
}

/* ---- optimizer ----------------------------------------------------------------- */

float wf_gpt_grad_norm(wf_gpt *m) { return (float)sqrt(wf_sumsq(m->grads, m->num_params)); }

double wf_gpt_grad_sumsq(wf_gpt *m)
{
  double ss = 0;
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++)
    if (wf_gpt_kind_counted(m, (wf_param_kind)k))
      ss += wf_sumsq(m->grads + m->off[k], wf_gpt_local_numel(m, (wf_param_kind)k));
  return ss;
}

wf_status wf_gpt_adam_state(wf_gpt *m, float **mbuf, float **vbuf)
{
  if (!m->m)
    m->m = alloc_floats(m->num_params);
  if (!m->v)
    m->v = alloc_floats(m->num_params);
  *mbuf = m->m;
  *vbuf = m->v;
  if (m->m && m->v)
    return WF_OK;
  WF_ERROR("out of memory for AdamW state (%zu parameters)", m->num_params);
  return WF_ENOMEM;
}

void wf_gpt_update(wf_gpt *m, float lr, float beta1, float beta2, float eps, float weight_decay,
                   float grad_scale, int t)
{
  float *mb, *vb;
  if (wf_gpt_adam_state(m, &mb, &vb) != WF_OK)
    return;
  /* One call per kind so the weight decay can differ; kinds are contiguous. */
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    size_t off = m->off[k], n = wf_gpt_local_numel(m, (wf_param_kind)k);
    float wd = wf_gpt_kind_decays((wf_param_kind)k) ? weight_decay : 0.0f;
    wf_adamw_update(m->params + off, mb + off, vb + off, m->grads + off, n, lr, beta1, beta2, eps,
                    wd, t, grad_scale);
  }
  wf_gpt_params_changed(m);
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
