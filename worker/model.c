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

/* Activations of one forward, carved from one allocation sized for Bmax x Tmax.
 * Per-layer tensors use a fixed stride of the Bmax x Tmax size, and the first B*T
 * rows of each slot are live. */
typedef struct acts {
  float *encoded;                   /* (B,T,C) */
  float *ln1, *ln1_mean, *ln1_rstd; /* (L,B,T,C), (L,B,T), (L,B,T) */
  float *qkv;                       /* (L,B,T,3C) */
  float *atty;                      /* (L,B,T,C) */
  float *att;                       /* (L,B,NH,T,T) */
  float *residual2;                 /* (L,B,T,C) */
  float *ln2, *ln2_mean, *ln2_rstd; /* (L,B,T,C), (L,B,T), (L,B,T) */
  float *fch, *fch_gelu;            /* (L,B,T,4C) */
  float *residual3;                 /* (L,B,T,C) */
  float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
  float *logits;                    /* (B,T,Vp); dlogits after backward */
  float *row_max, *row_sumexp;      /* (B,T) */
  float *target_logit, *losses;     /* (B,T) */
  float *proj;                      /* (B,T,C) scratch: attention/MLP projection out */
} acts;

/* Backward scratch: one layer's worth, reused layer after layer. */
typedef struct dacts {
  float *dres;    /* (B,T,C) gradient of the residual stream */
  float *dc;      /* (B,T,C) dln1, datty, dln2, dlnf */
  float *d4a;     /* (B,T,4C) dfch_gelu, then dqkv (B,T,3C) */
  float *d4b;     /* (B,T,4C) dfch */
  float *scratch; /* (B,NH,T,T) attention backward scratch */
} dacts;

struct wf_gpt {
  wf_gpt_dims d;
  int Bmax, Tmax;
  size_t num_params;
  size_t off[WF_GPT_NUM_KINDS]; /* offset of each kind in the parameter layout */
  float *params, *grads, *m, *v;
  float *act_mem, *dact_mem;
  acts a;
  dacts da;
  int *inputs, *targets; /* (Bmax,Tmax) copies of the last forward's tokens */
  int B, T;              /* shape of the last forward */
  bool have_targets;     /* last forward computed a loss, so backward may run */
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

/* ---- allocation ------------------------------------------------------------------ */

/* Carve `mem` (or just count, when mem is NULL) into the activation tensors. */
static size_t carve_acts(acts *a, float *mem, const wf_gpt_dims *d, int B, int T)
{
  size_t L = (size_t)d->L, C = (size_t)d->C, N = (size_t)B * (size_t)T;
  size_t att = (size_t)B * (size_t)d->NH * (size_t)T * (size_t)T;
  struct {
    float **p;
    size_t n;
  } t[] = {
      {&a->encoded, N * C},
      {&a->ln1, L * N * C},
      {&a->ln1_mean, L * N},
      {&a->ln1_rstd, L * N},
      {&a->qkv, L * N * 3 * C},
      {&a->atty, L * N * C},
      {&a->att, L * att},
      {&a->residual2, L * N * C},
      {&a->ln2, L * N * C},
      {&a->ln2_mean, L * N},
      {&a->ln2_rstd, L * N},
      {&a->fch, L * N * 4 * C},
      {&a->fch_gelu, L * N * 4 * C},
      {&a->residual3, L * N * C},
      {&a->lnf, N * C},
      {&a->lnf_mean, N},
      {&a->lnf_rstd, N},
      {&a->logits, N * (size_t)d->Vp},
      {&a->row_max, N},
      {&a->row_sumexp, N},
      {&a->target_logit, N},
      {&a->losses, N},
      {&a->proj, N * C},
  };
  size_t total = 0;
  for (size_t i = 0; i < WF_ARRAY_LEN(t); i++) {
    if (mem)
      *t[i].p = mem + total;
    total += (t[i].n + 15) & ~(size_t)15; /* keep every tensor 64-byte aligned */
  }
  return total;
}

static size_t carve_dacts(dacts *g, float *mem, const wf_gpt_dims *d, int B, int T)
{
  size_t C = (size_t)d->C, N = (size_t)B * (size_t)T;
  size_t att = (size_t)B * (size_t)d->NH * (size_t)T * (size_t)T;
  struct {
    float **p;
    size_t n;
  } t[] = {{&g->dres, N * C},
           {&g->dc, N * C},
           {&g->d4a, N * 4 * C},
           {&g->d4b, N * 4 * C},
           {&g->scratch, att}};
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

wf_status wf_gpt_create(wf_gpt **out, const wf_gpt_dims *d, int B, int T)
{
  wf_status st = WF_OK;
  wf_gpt *m = NULL;
  const char *bad = wf_gpt_dims_check(d);
  *out = NULL;
  WF_CHECK(bad == NULL, WF_EINVAL, "GPT dims L=%d NH=%d C=%d maxT=%d V=%d Vp=%d: %s", d->L, d->NH,
           d->C, d->maxT, d->V, d->Vp, bad);
  WF_CHECK(B > 0 && T > 0 && T <= d->maxT, WF_EINVAL,
           "micro-batch %d x %d: need B > 0 and 0 < T <= context length %d", B, T, d->maxT);
  m = calloc(1, sizeof *m);
  WF_CHECK_ALLOC(m);
  m->d = *d;
  m->Bmax = B, m->Tmax = T;
  m->num_params = wf_gpt_num_params(d);
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++)
    m->off[k] = wf_gpt_kind_offset(d, (wf_param_kind)k);
  WF_CHECK_ALLOC(m->params = alloc_floats(m->num_params));
  WF_CHECK_ALLOC(m->grads = alloc_floats(m->num_params));
  /* AdamW's m and v are allocated by the first wf_gpt_update: under ZeRO-1 the
   * optimizer state lives in shards elsewhere and these are never needed. */
  WF_CHECK_ALLOC(m->act_mem = alloc_floats(carve_acts(&m->a, NULL, d, B, T)));
  carve_acts(&m->a, m->act_mem, d, B, T);
  WF_CHECK_ALLOC(m->dact_mem = alloc_floats(carve_dacts(&m->da, NULL, d, B, T)));
  carve_dacts(&m->da, m->dact_mem, d, B, T);
  WF_CHECK_ALLOC(m->inputs = wf_mem_alloc((size_t)B * T * sizeof(int)));
  WF_CHECK_ALLOC(m->targets = wf_mem_alloc((size_t)B * T * sizeof(int)));
  *out = m;
  m = NULL;
exit:
  wf_gpt_destroy(m);
  return st;
fail:
  goto exit;
}

void wf_gpt_destroy(wf_gpt *m)
{
  if (!m)
    return;
  wf_mem_free(m->params);
  wf_mem_free(m->grads);
  wf_mem_free(m->m);
  wf_mem_free(m->v);
  wf_mem_free(m->act_mem);
  wf_mem_free(m->dact_mem);
  wf_mem_free(m->inputs);
  wf_mem_free(m->targets);
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
    off += (size_t)layer * wf_gpt_layer_numel(&m->d, k);
  return base + off;
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

/* Initialise one whole tensor in chunks spread over the kernels' thread budget; each
 * element is a pure function of its index, so the result does not depend on it. */
#define INIT_CHUNK 65536
static void init_tensor(float *dst, wf_param_kind k, int layer, const wf_gpt_dims *d, uint64_t seed,
                        size_t n)
{
  long chunks = (long)((n + INIT_CHUNK - 1) / INIT_CHUNK);
#pragma omp parallel for schedule(dynamic, 1) num_threads(wf_kernels_threads()) if (chunks > 1)
  for (long c = 0; c < chunks; c++) {
    size_t first = (size_t)c * INIT_CHUNK;
    wf_gpt_init_slice(dst + first, k, layer, d, seed, first, WF_MIN(INIT_CHUNK, n - first));
  }
}

void wf_gpt_init(wf_gpt *m, uint64_t seed)
{
  for (int k = 0; k < WF_GPT_NUM_KINDS; k++) {
    int layers = wf_gpt_kind_is_layered((wf_param_kind)k) ? m->d.L : 1;
    size_t n = wf_gpt_layer_numel(&m->d, (wf_param_kind)k);
    for (int l = 0; l < layers; l++)
      init_tensor(wf_gpt_param(m, (wf_param_kind)k, l, 0), (wf_param_kind)k, l, &m->d, seed, n);
  }
  if (m->m) { /* a re-initialised model starts AdamW afresh */
    zero_floats(m->m, m->num_params);
    zero_floats(m->v, m->num_params);
  }
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

/* One transformer block: residual3[l] = block(residual). */
static void block_forward(wf_gpt *m, int l, const float *residual, int B, int T)
{
  const wf_gpt_dims *d = &m->d;
  acts *a = &m->a;
  int C = d->C, NH = d->NH, N = B * T;
  size_t nc = (size_t)m->Bmax * m->Tmax * C; /* per-layer slot stride of (B,T,C) */
  size_t nr = (size_t)m->Bmax * m->Tmax;
  size_t natt = (size_t)m->Bmax * NH * m->Tmax * m->Tmax;
  float *ln1 = a->ln1 + l * nc, *qkv = a->qkv + l * 3 * nc, *atty = a->atty + l * nc;
  float *att = a->att + l * natt, *res2 = a->residual2 + l * nc, *ln2 = a->ln2 + l * nc;
  float *fch = a->fch + l * 4 * nc, *fchg = a->fch_gelu + l * 4 * nc;

  wf_layernorm_forward(ln1, a->ln1_mean + l * nr, a->ln1_rstd + l * nr, residual,
                       wf_gpt_param(m, WF_P_LN1W, l, 0), wf_gpt_param(m, WF_P_LN1B, l, 0), N, C);
  wf_matmul_forward(qkv, ln1, wf_gpt_param(m, WF_P_QKVW, l, 0), wf_gpt_param(m, WF_P_QKVB, l, 0), N,
                    C, 3 * C);
  wf_attention_forward(atty, att, qkv, B, T, C, NH);
  wf_matmul_forward(a->proj, atty, wf_gpt_param(m, WF_P_ATTPROJW, l, 0),
                    wf_gpt_param(m, WF_P_ATTPROJB, l, 0), N, C, C);
  wf_residual_forward(res2, residual, a->proj, (size_t)N * C);
  wf_layernorm_forward(ln2, a->ln2_mean + l * nr, a->ln2_rstd + l * nr, res2,
                       wf_gpt_param(m, WF_P_LN2W, l, 0), wf_gpt_param(m, WF_P_LN2B, l, 0), N, C);
  wf_matmul_forward(fch, ln2, wf_gpt_param(m, WF_P_FCW, l, 0), wf_gpt_param(m, WF_P_FCB, l, 0), N,
                    C, 4 * C);
  wf_gelu_forward(fchg, fch, (size_t)N * 4 * C);
  wf_matmul_forward(a->proj, fchg, wf_gpt_param(m, WF_P_FCPROJW, l, 0),
                    wf_gpt_param(m, WF_P_FCPROJB, l, 0), N, 4 * C, C);
  wf_residual_forward(a->residual3 + l * nc, res2, a->proj, (size_t)N * C);
}

/* Mean cross-entropy of the logits against m->targets; keeps the row statistics. */
static float loss_forward(wf_gpt *m, int N)
{
  acts *a = &m->a;
  wf_xent_stats(a->row_max, a->row_sumexp, a->target_logit, a->logits, m->targets, N, m->d.V,
                m->d.Vp, 0);
  wf_xent_loss(a->losses, a->row_max, a->row_sumexp, a->target_logit, N);
  double sum = 0.0;
  for (int i = 0; i < N; i++)
    sum += a->losses[i];
  return (float)(sum / N);
}

float wf_gpt_forward(wf_gpt *m, const int *inputs, const int *targets, int B, int T)
{
  const wf_gpt_dims *d = &m->d;
  size_t N = (size_t)B * (size_t)T;
  size_t nc = (size_t)m->Bmax * m->Tmax * d->C;
  m->have_targets = false;
  if (B <= 0 || T <= 0 || B * T > m->Bmax * m->Tmax || T > m->Tmax) {
    WF_ERROR("forward of %d x %d tokens: the model was created for at most %d x %d", B, T, m->Bmax,
             m->Tmax);
    return NAN;
  }
  if (!tokens_valid(inputs, N, d->V, "inputs") ||
      (targets && !tokens_valid(targets, N, d->V, "targets")))
    return NAN;
  memcpy(m->inputs, inputs, N * sizeof *inputs);
  m->B = B, m->T = T;

  wf_encoder_forward(m->a.encoded, inputs, wf_gpt_param(m, WF_P_WTE, 0, 0),
                     wf_gpt_param(m, WF_P_WPE, 0, 0), B, T, d->C);
  for (int l = 0; l < d->L; l++)
    block_forward(m, l, l == 0 ? m->a.encoded : m->a.residual3 + (l - 1) * nc, B, T);
  wf_layernorm_forward(m->a.lnf, m->a.lnf_mean, m->a.lnf_rstd, m->a.residual3 + (d->L - 1) * nc,
                       wf_gpt_param(m, WF_P_LNFW, 0, 0), wf_gpt_param(m, WF_P_LNFB, 0, 0), (int)N,
                       d->C);
  /* Tied embedding; padding rows of wte give padding columns the loss ignores. */
  wf_matmul_forward(m->a.logits, m->a.lnf, wf_gpt_param(m, WF_P_WTE, 0, 0), NULL, (int)N, d->C,
                    d->Vp);
  if (!targets)
    return 0.0f;
  memcpy(m->targets, targets, N * sizeof *targets);
  m->have_targets = true;
  return loss_forward(m, (int)N);
}

const float *wf_gpt_logits(const wf_gpt *m) { return m->a.logits; }

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

/* One transformer block backward. On entry da.dres holds d residual3[l]; on exit it
 * holds d(residual input of block l). Parameter gradients are added to. */
static void block_backward(wf_gpt *m, int l, const float *residual, int B, int T)
{
  const wf_gpt_dims *d = &m->d;
  acts *a = &m->a;
  dacts *g = &m->da;
  int C = d->C, NH = d->NH, N = B * T;
  size_t nc = (size_t)m->Bmax * m->Tmax * C, nr = (size_t)m->Bmax * m->Tmax;
  size_t natt = (size_t)m->Bmax * NH * m->Tmax * m->Tmax;
  size_t n1 = (size_t)N * C, n4 = 4 * n1;
  float *ln1 = a->ln1 + l * nc, *qkv = a->qkv + l * 3 * nc, *atty = a->atty + l * nc;
  float *res2 = a->residual2 + l * nc, *ln2 = a->ln2 + l * nc;
  float *fch = a->fch + l * 4 * nc, *fchg = a->fch_gelu + l * 4 * nc;

  /* MLP branch: the gradient of its output is the residual stream's gradient. */
  memset(g->d4a, 0, n4 * sizeof(float));
  wf_matmul_backward(g->d4a, wf_gpt_param(m, WF_P_FCPROJW, l, 1),
                     wf_gpt_param(m, WF_P_FCPROJB, l, 1), g->dres, fchg,
                     wf_gpt_param(m, WF_P_FCPROJW, l, 0), N, 4 * C, C);
  memset(g->d4b, 0, n4 * sizeof(float));
  wf_gelu_backward(g->d4b, fch, g->d4a, n4);
  memset(g->dc, 0, n1 * sizeof(float));
  wf_matmul_backward(g->dc, wf_gpt_param(m, WF_P_FCW, l, 1), wf_gpt_param(m, WF_P_FCB, l, 1),
                     g->d4b, ln2, wf_gpt_param(m, WF_P_FCW, l, 0), N, C, 4 * C);
  wf_layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LN2W, l, 1), wf_gpt_param(m, WF_P_LN2B, l, 1),
                        g->dc, res2, wf_gpt_param(m, WF_P_LN2W, l, 0), a->ln2_mean + l * nr,
                        a->ln2_rstd + l * nr, N, C);
  /* Attention branch. */
  memset(g->dc, 0, n1 * sizeof(float));
  wf_matmul_backward(g->dc, wf_gpt_param(m, WF_P_ATTPROJW, l, 1),
                     wf_gpt_param(m, WF_P_ATTPROJB, l, 1), g->dres, atty,
                     wf_gpt_param(m, WF_P_ATTPROJW, l, 0), N, C, C);
  memset(g->d4a, 0, 3 * n1 * sizeof(float));
  wf_attention_backward(g->d4a, g->scratch, g->dc, qkv, a->att + l * natt, B, T, C, NH);
  memset(g->dc, 0, n1 * sizeof(float));
  wf_matmul_backward(g->dc, wf_gpt_param(m, WF_P_QKVW, l, 1), wf_gpt_param(m, WF_P_QKVB, l, 1),
                     g->d4a, ln1, wf_gpt_param(m, WF_P_QKVW, l, 0), N, C, 3 * C);
  wf_layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LN1W, l, 1), wf_gpt_param(m, WF_P_LN1B, l, 1),
                        g->dc, residual, wf_gpt_param(m, WF_P_LN1W, l, 0), a->ln1_mean + l * nr,
                        a->ln1_rstd + l * nr, N, C);
}

void wf_gpt_backward(wf_gpt *m, float dloss_scale)
{
  const wf_gpt_dims *d = &m->d;
  acts *a = &m->a;
  dacts *g = &m->da;
  int B = m->B, T = m->T, N = B * T, C = d->C;
  size_t nc = (size_t)m->Bmax * m->Tmax * C, n1 = (size_t)N * C;
  if (!m->have_targets) {
    WF_ERROR("wf_gpt_backward needs a forward with targets just before it");
    return;
  }
  m->have_targets = false; /* the logits become their gradient below */
  wf_xent_backward(a->logits, a->logits, a->row_max, a->row_sumexp, m->targets,
                   dloss_scale / (float)N, N, d->V, d->Vp, 0);
  memset(g->dc, 0, n1 * sizeof(float));
  wf_matmul_backward(g->dc, wf_gpt_param(m, WF_P_WTE, 0, 1), NULL, a->logits, a->lnf,
                     wf_gpt_param(m, WF_P_WTE, 0, 0), N, C, d->Vp);
  memset(g->dres, 0, n1 * sizeof(float));
  wf_layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LNFW, 0, 1), wf_gpt_param(m, WF_P_LNFB, 0, 1),
                        g->dc, a->residual3 + (d->L - 1) * nc, wf_gpt_param(m, WF_P_LNFW, 0, 0),
                        a->lnf_mean, a->lnf_rstd, N, C);
  if (m->hook)
    m->hook(m->hook_user, 0); /* the final layernorm's gradients are final */
  for (int l = d->L - 1; l >= 0; l--) {
    block_backward(m, l, l == 0 ? a->encoded : a->residual3 + (l - 1) * nc, B, T);
    if (m->hook)
      m->hook(m->hook_user, d->L - l); /* layer l */
  }
  wf_encoder_backward(wf_gpt_param(m, WF_P_WTE, 0, 1), wf_gpt_param(m, WF_P_WPE, 0, 1), g->dres,
                      m->inputs, B, T, C);
  if (m->hook)
    m->hook(m->hook_user, d->L + 1); /* the embeddings */
}

void wf_gpt_set_grad_hook(wf_gpt *m, wf_gpt_grad_hook fn, void *user)
{
  m->hook = fn;
  m->hook_user = user;
}

/* ---- optimizer ----------------------------------------------------------------- */

float wf_gpt_grad_norm(wf_gpt *m) { return (float)sqrt(wf_sumsq(m->grads, m->num_params)); }

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
    size_t off = m->off[k], n = wf_gpt_kind_numel(&m->d, (wf_param_kind)k);
    float wd = wf_gpt_kind_decays((wf_param_kind)k) ? weight_decay : 0.0f;
    wf_adamw_update(m->params + off, mb + off, vb + off, m->grads + off, n, lr, beta1, beta2, eps,
                    wd, t, grad_scale);
  }
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
