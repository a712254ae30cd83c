/*
 * gpt.c - the model object: allocation of parameters, gradients and activation slots on
 * the model's device, accessors, mixed precision's rounded weights, and the exchange of
 * whole-model arrays with the host.
 *
 * Memory: allocations of num_params floats with one layout (parameters, gradients and,
 * under mixed precision, the rounded GEMM weights), the llm.c checkpoint order with all
 * layers of a kind together; one allocation of activations for `slots` micro-batches of
 * Bmax x Tmax tokens; one of backward scratch. All of it is device memory.
 *
 * Invariants:
 *  - Padding rows [V, Vp) of wte are zero after init and stay zero: the loss ignores
 *    the padding columns of the logits (xent kernels with ld = Vp and V real columns),
 *    so their gradient is exactly zero, and AdamW leaves a zero parameter with zero
 *    moments at zero.
 *  - Every parameter element is a pure function of (seed, kind, layer, index), so a
 *    slice of a tensor can be initialised alone (wf_gpt_init_slice).
 *  - Backward adds into the gradients; only wf_gpt_zero_grad clears them.
 *  - Mixed precision: the GEMM weights are read from `wlow`, a rounded copy of the
 *    parameters in their layout, which wf_gpt_params_changed refreshes; the
 *    activations a GEMM reads are rounded in place when made, so the backward GEMMs
 *    and a recomputed forward (activation checkpointing) see the same operands bit for
 *    bit (rounding is elementwise and deterministic). Output gradients are rounded into
 *    scratch (`rdy`) or in place where nothing else reads them.
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

/* ---- activation slots -------------------------------------------------------------- */

/* One tensor to carve: where its pointer goes, and its floats. */
typedef struct carve_item {
  float **p;
  size_t n;
} carve_item;

/* Point each item into `mem` (or just count, when mem is NULL), 64-byte aligned. */
static size_t carve(const carve_item *t, size_t n, float *mem)
{
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (mem)
      *t[i].p = mem + total;
    total += (t[i].n + 15) & ~(size_t)15;
  }
  return total;
}

/* The sizes every carve is made of, from the options alone (no model needed). */
static wf__geo geometry(const wf_gpt_opts *o, const wf_ktable *k)
{
  size_t tp = (size_t)o->shard.tp, N = (size_t)o->B * (size_t)o->T;
  bool seq = o->shard.sequence && o->shard.tp > 1;
  int C = o->dims.C, NHl = o->dims.NH / o->shard.tp;
  return (wf__geo){.C = (size_t)C,
                   .tp = tp,
                   .N = N,
                   .R = seq ? N / tp : N,
                   .att_saved = k->attention_saved(o->B, o->T, C / o->shard.tp, NHl),
                   .att_scratch = k->attention_scratch(o->B, o->T, C / o->shard.tp, NHl),
                   .Vl = (size_t)(o->dims.Vp / o->shard.tp),
                   .low = o->precision != WF_PREC_NO};
}

/* The intermediates of `inner` layers, the outputs (residual3) of `outer` layers, and
 * the head's when `head`. A slot is (nl, nl, last), or (0, nl, last) under activation
 * checkpointing, whose one shared recompute buffer is (1, 0, false). */
static size_t carve_acts(wf__acts *a, float *mem, const wf__geo *z, int inner, int outer, bool head)
{
  size_t L = (size_t)inner, Lo = (size_t)outer, C = z->C, tp = z->tp, N = z->N, R = z->R;
  size_t att = z->att_saved; /* what the device keeps */
  size_t last = head ? 1 : 0;
  carve_item t[] = {
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
      {&a->logits, last * N * z->Vl},
      {&a->row_max, last * N},
      {&a->row_sumexp, last * N},
      {&a->target_logit, last * N},
      {&a->losses, last * N},
      {(float **)&a->inputs, Lo ? N : 0}, /* int and float are both 4 bytes */
      {(float **)&a->targets, Lo ? N : 0},
  };
  return carve(t, WF_ARRAY_LEN(t), mem);
}

static size_t carve_dacts(wf__dacts *g, double **loss_acc, int **bad_token, float *mem,
                          const wf__geo *z)
{
  size_t C = z->C, tp = z->tp, N = z->N;
  carve_item t[] = {
      {&g->proj, N * C},
      {&g->full, N * C},
      {&g->dres, N * C},
      {&g->dc, N * C},
      {&g->dl, N * C},
      {&g->d4a, N * 4 * C / tp},
      {&g->d4b, N * 4 * C / tp},
      {&g->scratch, z->att_scratch},
      {&g->stats, 3 * (tp + 1) * N},
      {&g->rdy, z->low ? N * C : 0},
      {(float **)loss_acc, 2}, /* one double */
      {(float **)bad_token, 2},
  };
  return carve(t, WF_ARRAY_LEN(t), mem);
}

wf_gpt_mem wf_gpt_mem_plan(const wf_gpt_opts *o, const struct wf_ktable *k)
{
  wf_gpt_mem r = {0};
  wf__acts a;
  wf__dacts da;
  double *acc;
  int *bad;
  const wf_gpt_shard *s = &o->shard;
  k = k ? k : wf_dev_kernels(o->dev ? o->dev : wf_dev_cpu());
  wf__geo z = geometry(o, k);
  size_t n = wf_gpt_shard_params(&o->dims, s) * sizeof(float);
  int lc = s->l1 - s->l0; /* a slot holds one chunk's layers */
  r.params = n;
  r.grads = n;
  r.wlow = o->precision != WF_PREC_NO ? n : 0;
  r.slot = carve_acts(&a, NULL, &z, o->recompute ? 0 : lc, lc, s->last) * sizeof(float);
  r.slots = r.slot * (size_t)o->slots;
  r.recompute = o->recompute ? carve_acts(&a, NULL, &z, 1, 0, false) * sizeof(float) : 0;
  r.scratch = carve_dacts(&da, &acc, &bad, NULL, &z) * sizeof(float);
  r.io = z.R * z.C;
  r.total = r.params + r.grads + r.wlow + r.slots + r.recompute + r.scratch;
  return r;
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

/* Activation slots, the recompute buffer and backward scratch, sized as
 * wf_gpt_mem_plan says. */
static wf_status alloc_acts(wf_gpt *m, const wf_gpt_mem *mp)
{
  wf_status st = WF_OK;
  int inner = m->recompute ? 0 : m->lc; /* a slot holds one chunk's layers */
  m->slot_floats = mp->slot / sizeof(float);
  WF_CHECK_ALLOC(m->a = calloc((size_t)m->n_slots, sizeof *m->a));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->act_mem, mp->slots / sizeof(float)));
  for (int i = 0; i < m->n_slots; i++)
    carve_acts(&m->a[i], m->act_mem + (size_t)i * m->slot_floats, &m->g, inner, m->lc, m->s.last);
  if (m->recompute) { /* one layer's intermediates, shared by every layer and slot */
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->re_mem, mp->recompute / sizeof(float)));
    carve_acts(&m->re, m->re_mem, &m->g, 1, 0, false);
  }
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->dact_mem, mp->scratch / sizeof(float)));
  carve_dacts(&m->da, &m->loss_acc, &m->bad_token, m->dact_mem, &m->g);
fail:
  return st;
}

/* ---- creation ----------------------------------------------------------------------- */

static wf_status check_opts(const wf_gpt_opts *o)
{
  wf_status st = WF_OK;
  const wf_gpt_dims *d = &o->dims;
  const char *bad = wf_gpt_dims_check(d);
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
fail:
  return st;
}

static void set_geometry(wf_gpt *m, const wf_gpt_opts *o)
{
  m->d = o->dims;
  m->s = o->shard;
  m->dev = o->dev ? o->dev : wf_dev_cpu();
  m->k = wf_dev_kernels(m->dev);
  m->tp = (wf_tp){.comm = o->shard.tp > 1 ? o->tp_comm : NULL,
                  .dev = m->dev,
                  .size = o->shard.tp,
                  .rank = o->shard.tp_rank,
                  .sequence = o->shard.sequence && o->shard.tp > 1};
  m->nchunk = o->shard.chunks > 1 ? o->shard.chunks : 1;
  m->lc = o->shard.l1 - o->shard.l0;
  m->nl = m->nchunk * m->lc;
  m->NHl = o->dims.NH / o->shard.tp;
  m->Vl = o->dims.Vp / o->shard.tp;
  m->Bmax = o->B, m->Tmax = o->T, m->n_slots = o->slots;
  m->recompute = o->recompute;
  m->prec = o->precision;
  m->loss_scale = 1.0f;
  m->g = geometry(o, m->k);
  layout(m);
}

wf_status wf_gpt_create_shard(wf_gpt **out, const wf_gpt_opts *o)
{
  wf_status st = WF_OK;
  wf_gpt *m = NULL;
  *out = NULL;
  WF_TRY(check_opts(o));
  WF_CHECK_ALLOC(m = calloc(1, sizeof *m));
  set_geometry(m, o);
  wf_gpt_mem mp = wf_gpt_mem_plan(o, m->k);
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->params, mp.params / sizeof(float)));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->grads, mp.grads / sizeof(float)));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->wlow, mp.wlow / sizeof(float))); /* 0: none */
  m->gstride = m->nl > 0 ? m->nl : 1;
  WF_CHECK_ALLOC(m->gptr = calloc((size_t)WF_GPT_NUM_KINDS * (size_t)m->gstride, sizeof *m->gptr));
  WF_CHECK_ALLOC(m->pptr = calloc((size_t)WF_GPT_NUM_KINDS * (size_t)m->gstride, sizeof *m->pptr));
  WF_CHECK_ALLOC(m->lptr = calloc((size_t)WF_GPT_NUM_KINDS * (size_t)m->gstride, sizeof *m->lptr));
  WF_TRY(alloc_acts(m, &mp));
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
  wf_dev_free(m->dev, m->params);
  wf_dev_free(m->dev, m->grads);
  wf_dev_free(m->dev, m->wlow);
  wf_dev_free(m->dev, m->act_mem);
  wf_dev_free(m->dev, m->dact_mem);
  wf_dev_free(m->dev, m->re_mem);
  free(m->a);
  free(m->gptr);
  free(m->pptr);
  free(m->lptr);
  free(m);
}

/* ---- accessors ------------------------------------------------------------------------ */

const wf_gpt_dims *wf_gpt_get_dims(const wf_gpt *m) { return &m->d; }
const wf_gpt_shard *wf_gpt_get_shard(const wf_gpt *m) { return &m->s; }
struct wf_dev *wf_gpt_dev(const wf_gpt *m) { return m->dev; }
size_t wf_gpt_local_offset(const wf_gpt *m, wf_param_kind k) { return m->off[k]; }
size_t wf_gpt_local_params(const wf_gpt *m) { return m->num_params; }
float *wf_gpt_params(wf_gpt *m) { return m->params; }
float *wf_gpt_grads(wf_gpt *m) { return m->grads; }

float *wf_gpt_param(wf_gpt *m, wf_param_kind k, int layer, int grads)
{
  float *base = grads ? m->grads : m->params;
  size_t off = m->off[k];
  int j = wf_gpt_kind_is_layered(k) ? wf__local_layer(m, layer) : 0;
  float **redirect = grads ? m->gptr : m->pptr;
  if (redirect[(size_t)k * (size_t)m->gstride + (size_t)j])
    return redirect[(size_t)k * (size_t)m->gstride + (size_t)j];
  return base + off + (size_t)j * (wf_gpt_kind_is_layered(k) ? wf_gpt_local_layer_numel(m, k) : 0);
}

void wf_gpt_set_grad_tensor(wf_gpt *m, wf_param_kind k, int j, float *p)
{
  m->gptr[(size_t)k * (size_t)m->gstride + (size_t)j] = p;
}

static bool is_gemm_weight(wf_param_kind k)
{
  return k == WF_P_WTE || k == WF_P_QKVW || k == WF_P_ATTPROJW || k == WF_P_FCW ||
         k == WF_P_FCPROJW;
}

static void round_to(const wf_gpt *m, float *dst, const float *src, size_t n);

void wf_gpt_set_param_tensor(wf_gpt *m, wf_param_kind k, int j, float *p, float *low)
{
  size_t i = (size_t)k * (size_t)m->gstride + (size_t)j;
  m->pptr[i] = p;
  m->lptr[i] = NULL;
  if (p && low && m->prec != WF_PREC_NO && is_gemm_weight(k)) {
    round_to(m, low, p,
             wf_gpt_kind_is_layered(k) ? wf_gpt_local_layer_numel(m, k) : wf_gpt_local_numel(m, k));
    m->lptr[i] = low;
  }
}

void wf_gpt_drop_params(wf_gpt *m)
{
  wf_dev_free(m->dev, m->params);
  wf_dev_free(m->dev, m->wlow);
  m->params = m->wlow = NULL;
}

wf_status wf_gpt_restore_params(wf_gpt *m)
{
  wf_status st = WF_OK;
  if (!m->params)
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->params, m->num_params));
  if (m->prec != WF_PREC_NO && !m->wlow)
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->wlow, m->num_params));
fail:
  return st;
}

void wf_gpt_set_unit_hook(wf_gpt *m, wf_gpt_unit_hook fn, void *user)
{
  m->unit_hook = fn;
  m->unit_user = user;
}

void wf_gpt_drop_grads(wf_gpt *m)
{
  wf_dev_free(m->dev, m->grads);
  m->grads = NULL;
}

float *wf_gpt_grad_kind(wf_gpt *m, wf_param_kind k)
{
  float *p = m->gptr[(size_t)k * (size_t)m->gstride];
  return p ? p : m->grads + m->off[k];
}

size_t wf_gpt_grad_bytes(const wf_gpt *m) { return m->grads ? m->num_params * sizeof(float) : 0; }

size_t wf_gpt_param_bytes(const wf_gpt *m)
{
  return (m->params ? 1 : 0) * (m->wlow ? 2 : 1) * m->num_params * sizeof(float);
}

size_t wf_gpt_slot_bytes(const wf_gpt *m) { return m->slot_floats * sizeof(float); }

size_t wf_gpt_act_bytes(const wf_gpt *m, int slots)
{
  size_t re = m->recompute ? carve_acts(&(wf__acts){0}, NULL, &m->g, 1, 0, false) : 0;
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

void wf_gpt_set_grad_hook(wf_gpt *m, wf_gpt_grad_hook fn, void *user)
{
  m->hook = fn;
  m->hook_user = user;
}

const float *wf_gpt_logits(const wf_gpt *m) { return m->a[0].logits; }

size_t wf_gpt_stage_io_numel(const wf_gpt *m, int B, int T)
{
  return wf__tp_rows(&m->tp, (size_t)B * T) * (size_t)m->d.C;
}

const float *wf_gpt_stage_output(const wf_gpt *m, int slot)
{
  return wf__layer_input(m, &m->a[slot], m->lc);
}

bool wf__chunk_first(const wf_gpt *m, int c) { return m->s.first && c == 0; }
bool wf__chunk_last(const wf_gpt *m, int c) { return m->s.last && c == m->nchunk - 1; }

int wf__local_real_vocab(const wf_gpt *m)
{
  int v0 = m->s.tp_rank * m->Vl;
  return WF_MAX(0, WF_MIN(m->Vl, m->d.V - v0));
}

wf_status wf_gpt_take_loss(wf_gpt *m, double *sum)
{
  wf_status st = wf_dev_read(m->dev, sum, m->loss_acc, sizeof *sum);
  if (st == WF_OK)
    st = wf_dev_memset(m->dev, m->loss_acc, 0, sizeof *m->loss_acc, NULL);
  return st;
}

/* ---- slot geometry ---------------------------------------------------------------------- */

/* Per-layer slot strides (the Bmax x Tmax sizes). */
typedef struct strides {
  size_t rc, r, n3, n1, n4, att; /* (R,C), (R), (N,3C/tp), (N,C/tp), (N,4C/tp), att */
} strides;

static strides layer_strides(const wf_gpt *m)
{
  size_t N = (size_t)m->Bmax * m->Tmax, C = (size_t)m->d.C, tp = (size_t)m->s.tp;
  size_t R = wf__tp_rows(&m->tp, N);
  return (strides){R * C, R, N * 3 * C / tp, N * C / tp, N * 4 * C / tp, m->g.att_saved};
}

wf__layer wf__layer_at(const wf_gpt *m, const wf__acts *a, int j)
{
  const wf__acts *x = m->recompute ? &m->re : a;
  size_t i = m->recompute ? 0 : (size_t)j;
  strides z = layer_strides(m);
  return (wf__layer){x->ln1 + i * z.rc,       x->ln1_mean + i * z.r, x->ln1_rstd + i * z.r,
                     x->qkv + i * z.n3,       x->atty + i * z.n1,    x->att + i * z.att,
                     x->residual2 + i * z.rc, x->ln2 + i * z.rc,     x->ln2_mean + i * z.r,
                     x->ln2_rstd + i * z.r,   x->fch + i * z.n4,     x->fch_gelu + i * z.n4};
}

float *wf__layer_input(const wf_gpt *m, const wf__acts *a, int j)
{
  return j == 0 ? a->encoded : a->residual3 + (size_t)(j - 1) * layer_strides(m).rc;
}

/* ---- mixed precision ------------------------------------------------------------------- */

const float *wf__gemm_weight(wf_gpt *m, wf_param_kind k, int layer)
{
  int j = wf_gpt_kind_is_layered(k) ? wf__local_layer(m, layer) : 0;
  const float *low = m->lptr[(size_t)k * (size_t)m->gstride + (size_t)j];
  if (low) /* ZeRO-3's window, rounded when it was gathered */
    return low;
  const float *w = wf_gpt_param(m, k, layer, 0);
  return m->wlow ? m->wlow + (w - m->params) : w;
}

/* Round n floats to the model's GEMM precision (nothing at precision no). */
static void round_to(const wf_gpt *m, float *dst, const float *src, size_t n)
{
  if (m->prec == WF_PREC_BF16)
    m->k->round_bf16(dst, src, n, NULL);
  else if (m->prec == WF_PREC_FP16)
    m->k->round_fp16(dst, src, n, NULL);
}

void wf__round_operand(const wf_gpt *m, float *x, size_t n) { round_to(m, x, x, n); }

/* An output gradient (N,C) that other ops read unrounded (the residual stream's): its
 * rounded copy in da.rdy for the GEMMs, or itself at precision no. */
const float *wf__rounded_grad(wf_gpt *m, const float *dy, size_t n)
{
  if (m->prec == WF_PREC_NO)
    return dy;
  round_to(m, m->da.rdy, dy, n);
  return m->da.rdy;
}

/* The GEMM weights (qkv, attproj, fc, fcproj, the tied wte) rounded into wlow. */
wf_status wf_gpt_params_changed(wf_gpt *m)
{
  static const wf_param_kind gemm[] = {WF_P_WTE, WF_P_QKVW, WF_P_ATTPROJW, WF_P_FCW, WF_P_FCPROJW};
  if (!m->wlow || !m->params) /* ZeRO-3 refuses mixed precision: no rounded copy to keep */
    return WF_OK;
  for (size_t i = 0; i < WF_ARRAY_LEN(gemm); i++) {
    size_t off = m->off[gemm[i]];
    round_to(m, m->wlow + off, m->params + off, wf_gpt_local_numel(m, gemm[i]));
  }
  return wf_dev_check(m->dev);
}

wf_precision wf_gpt_precision(const wf_gpt *m) { return m->prec; }
void wf_gpt_set_loss_scale(wf_gpt *m, float s) { m->loss_scale = s; }

/* ---- whole-model arrays ------------------------------------------------------------------- */

/* Copy between this rank's tensors and the whole model's (to_full: add into full),
 * through a host view of the parameters or gradients. */
static wf_status exchange_full(wf_gpt *m, int which, float *full, bool to_full)
{
  wf_dev_view v;
  float *local = which ? m->grads : m->params;
  if (!local) {
    WF_ERROR("the %s are sharded over dp (optim.zero=%d): no whole-model copy here",
             which ? "gradients" : "parameters", which ? 2 : 3);
    return WF_EINVAL;
  }
  wf_status st = wf_dev_map(m->dev, &v, local, m->num_params * sizeof(float),
                            to_full ? WF_MAP_READ : WF_MAP_WRITE);
  if (st != WF_OK)
    return st;
  wf_gpt_shard_exchange(&m->d, &m->s, v.host, 0, m->num_params, full, to_full);
  return wf_dev_unmap(m->dev, &v);
}

wf_status wf_gpt_export_full(wf_gpt *m, int which, float *full)
{
  return exchange_full(m, which, full, true);
}

wf_status wf_gpt_import_full(wf_gpt *m, int which, const float *full)
{
  wf_status st = exchange_full(m, which, (float *)full, false);
  return st == WF_OK && which == 0 ? wf_gpt_params_changed(m) : st;
}

wf_status wf_gpt_gather_full(wf_gpt *m, int which, float *full, struct wf_comm *world,
                             bool contribute)
{
  wf_status st = WF_OK;
  size_t n = wf_gpt_num_params(&m->d);
  memset(full, 0, n * sizeof *full);
  if (contribute)
    WF_TRY(wf_gpt_export_full(m, which, full));
  if (world)
    WF_TRY(wf_comm_allreduce(world, full, full, n, WF_COMM_F32, WF_COMM_SUM));
fail:
  return st;
}
