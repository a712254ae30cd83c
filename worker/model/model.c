/*
 * model.c - the model object: allocation of parameters, gradients and activation slots
 * on the model's device by the family's memory plan, accessors, mixed precision's
 * rounded weights, and the exchange of whole-model arrays with the host.
 *
 * Memory: allocations of num_params floats with one layout (parameters, gradients and,
 * under mixed precision, the rounded GEMM weights), the family's tensors in description
 * order with all layers of a tensor together; one allocation of activations for `slots`
 * micro-batches of Bmax x Tmax tokens; one of backward scratch. All of it is device
 * memory. What a slot holds per layer and for the head, and the scratch a block's
 * backward needs, are the family's (wf__family_ops' layer_floats, head_floats,
 * scratch_floats): the plan below is the only place that adds them up.
 *
 * Invariants:
 *  - Padding rows [V, Vp) of a vocabulary-split tensor are zero after init and stay
 *    zero: the loss ignores the padding columns of the logits (xent kernels with ld = Vp
 *    and V real columns), so their gradient is exactly zero, and AdamW leaves a zero
 *    parameter with zero moments at zero.
 *  - Every parameter element is a pure function of (seed, tensor, layer, index), so a
 *    slice of a tensor can be initialised alone (wf_model_init_slice).
 *  - Backward adds into the gradients; only wf_model_zero_grad clears them.
 *  - Mixed precision: the GEMM weights are read from `wlow`, a rounded copy of the
 *    parameters in their layout, which wf_model_params_changed refreshes; the
 *    activations a GEMM reads are rounded in place when made, so the backward GEMMs and
 *    a recomputed forward (activation checkpointing) see the same operands bit for bit
 *    (rounding is elementwise and deterministic). Output gradients are rounded into
 *    scratch (`rdy`) or in place where nothing else reads them.
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

size_t wf__carve(const wf__carve_item *t, size_t n, float *mem)
{
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (mem)
      *t[i].p = mem + total;
    total += (t[i].n + 15) & ~(size_t)15;
  }
  return total;
}

/* ---- the memory plan ----------------------------------------------------------------- */

/* The sizes every carve is made of, from the options alone (no model needed). */
static wf__geo geometry(const wf_model_opts *o, const wf_ktable *k)
{
  wf_model_dims d = wf_model_dims_resolve(&o->dims);
  size_t tp = (size_t)o->shard.tp, N = (size_t)o->B * (size_t)o->T;
  bool seq = o->shard.sequence && o->shard.tp > 1;
  return (wf__geo){.d = d,
                   .B = (size_t)o->B,
                   .T = (size_t)o->T,
                   .N = N,
                   .R = seq ? N / tp : N,
                   .C = (size_t)d.C,
                   .tp = tp,
                   .Vl = (size_t)(d.Vp / o->shard.tp),
                   .NHl = d.NH / o->shard.tp,
                   .KVl = d.KV / o->shard.tp,
                   .low = o->precision != WF_PREC_NO,
                   .k = k};
}

/* A slot for `inner` layers of intermediates and `outer` layer outputs, with the head's
 * when `head`; a slot is (lc, lc, last), or (0, lc, last) under activation checkpointing,
 * whose one shared recompute buffer is the family's layer_floats. */
static size_t carve_slot(wf__slot *a, float *mem, const wf__geo *z, const wf__family_ops *ops,
                         int inner, int outer, bool head)
{
  size_t C = z->C, N = z->N, R = z->R, last = head ? 1 : 0;
  wf__carve_item t[] = {
      {&a->encoded, R * C},
      {&a->saved, (size_t)inner * ops->layer_floats(z)},
      {&a->out, (size_t)outer * R * C},
      {&a->head, last * ops->head_floats(z)},
      {&a->logits, last * N * z->Vl},
      {&a->row_max, last * N},
      {&a->row_sumexp, last * N},
      {&a->target_logit, last * N},
      {&a->losses, last * N},
      {(float **)&a->inputs, N}, /* int and float are both 4 bytes */
      {(float **)&a->targets, N},
  };
  return wf__carve(t, WF_ARRAY_LEN(t), mem);
}

static size_t carve_dacts(wf__dacts *g, double **loss_acc, int **bad_token, float *mem,
                          const wf__geo *z, const wf__family_ops *ops)
{
  size_t C = z->C, tp = z->tp, N = z->N;
  wf__carve_item t[] = {
      {&g->proj, N * C},
      {&g->full, N * C},
      {&g->dres, N * C},
      {&g->dc, N * C},
      {&g->dl, N * C},
      {&g->stats, 3 * (tp + 1) * N},
      {&g->rdy, z->low ? N * C : 0},
      {&g->fam, ops->scratch_floats(z)},
      {&g->consts, ops->const_floats(z)},
      {(float **)loss_acc, 2}, /* one double */
      {(float **)bad_token, 2},
  };
  return wf__carve(t, WF_ARRAY_LEN(t), mem);
}

static const wf__family_ops *ops_of(const wf_model_dims *d) { return wf_model_family(d)->ops; }

wf_model_mem wf_model_mem_plan(const wf_model_opts *o, const struct wf_ktable *k)
{
  wf_model_mem r = {0};
  wf__slot a;
  wf__dacts da;
  double *acc;
  int *bad;
  const wf_model_shard *s = &o->shard;
  const wf__family_ops *ops = ops_of(&o->dims);
  k = k ? k : wf_dev_kernels(o->dev ? o->dev : wf_dev_cpu());
  wf__geo z = geometry(o, k);
  size_t n = wf_model_shard_params(&o->dims, s) * sizeof(float);
  int lc = s->l1 - s->l0; /* a slot holds one chunk's layers */
  r.params = n;
  r.grads = n;
  r.wlow = o->precision != WF_PREC_NO ? n : 0;
  r.slot = carve_slot(&a, NULL, &z, ops, o->recompute ? 0 : lc, lc, s->last) * sizeof(float);
  r.slots = r.slot * (size_t)o->slots;
  r.recompute = o->recompute ? ops->layer_floats(&z) * sizeof(float) : 0;
  r.scratch = carve_dacts(&da, &acc, &bad, NULL, &z, ops) * sizeof(float);
  r.io = z.R * z.C;
  r.total = r.params + r.grads + r.wlow + r.slots + r.recompute + r.scratch;
  return r;
}

static void layout(wf_model *m)
{
  size_t off = 0;
  for (int t = 0; t < m->desc.n; t++) {
    m->off[t] = off;
    off += wf_model_local_numel(m, t);
  }
  m->off[m->desc.n] = off;
  m->num_params = off;
}

/* Activation slots, the recompute buffer and backward scratch, sized as
 * wf_model_mem_plan says. */
static wf_status alloc_acts(wf_model *m, const wf_model_mem *mp)
{
  wf_status st = WF_OK;
  int inner = m->recompute ? 0 : m->lc; /* a slot holds one chunk's layers */
  m->slot_floats = mp->slot / sizeof(float);
  WF_CHECK_ALLOC(m->a = calloc((size_t)m->n_slots, sizeof *m->a));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->act_mem, mp->slots / sizeof(float)));
  for (int i = 0; i < m->n_slots; i++)
    carve_slot(&m->a[i], m->act_mem + (size_t)i * m->slot_floats, &m->g, m->ops, inner, m->lc,
               m->s.last);
  if (m->recompute) /* one layer's intermediates, shared by every layer and slot */
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->re_saved, mp->recompute / sizeof(float)));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->dact_mem, mp->scratch / sizeof(float)));
  carve_dacts(&m->da, &m->loss_acc, &m->bad_token, m->dact_mem, &m->g, m->ops);
fail:
  return st;
}

/* ---- creation ----------------------------------------------------------------------- */

static wf_status check_opts(const wf_model_opts *o)
{
  wf_status st = WF_OK;
  const wf_model_dims *d = &o->dims;
  const char *bad = wf_model_dims_check(d);
  WF_CHECK(bad == NULL, WF_EINVAL, "%s dims L=%d NH=%d KV=%d C=%d F=%d maxT=%d V=%d Vp=%d: %s",
           wf_model_family_name(d), d->L, d->NH, d->KV, d->C, d->F, d->maxT, d->V, d->Vp, bad);
  bad = wf_model_shard_check(d, &o->shard);
  WF_CHECK(bad == NULL, WF_EINVAL, "model shard tp %d/%d layers [%d, %d): %s", o->shard.tp_rank,
           o->shard.tp, o->shard.l0, o->shard.l1, bad);
  WF_CHECK(o->B > 0 && o->T > 0 && o->T <= d->maxT && o->slots >= 1, WF_EINVAL,
           "micro-batch %d x %d with %d slots: need B > 0, 0 < T <= context length %d and a "
           "slot",
           o->B, o->T, o->slots, d->maxT);
  WF_CHECK(o->shard.tp == 1 || (o->tp.ops && o->tp.ops->version == WF_TP_OPS_VERSION), WF_EINVAL,
           "tp %d needs tensor parallelism's region operators (version %d)", o->shard.tp,
           WF_TP_OPS_VERSION);
  WF_CHECK(!o->shard.sequence || ((size_t)o->B * o->T) % (size_t)o->shard.tp == 0, WF_EINVAL,
           "sequence parallelism needs B*T = %d x %d tokens divisible by tp %d", o->B, o->T,
           o->shard.tp);
fail:
  return st;
}

static void set_geometry(wf_model *m, const wf_model_opts *o)
{
  m->d = wf_model_dims_resolve(&o->dims);
  m->fam = m->d.fam;
  m->ops = m->fam->ops;
  m->fam->describe(&m->d, &m->desc);
  m->s = o->shard;
  m->dev = o->dev ? o->dev : wf_dev_cpu();
  m->k = wf_dev_kernels(m->dev);
  m->tp = o->shard.tp > 1 ? o->tp : (wf_tp_regions){NULL, NULL};
  m->sequence = o->shard.sequence && o->shard.tp > 1;
  m->nchunk = o->shard.chunks > 1 ? o->shard.chunks : 1;
  m->lc = o->shard.l1 - o->shard.l0;
  m->nl = m->nchunk * m->lc;
  m->NHl = m->d.NH / o->shard.tp;
  m->KVl = m->d.KV / o->shard.tp;
  m->Vl = m->d.Vp / o->shard.tp;
  m->Bmax = o->B, m->Tmax = o->T, m->n_slots = o->slots;
  m->recompute = o->recompute;
  m->prec = o->precision;
  m->loss_scale = 1.0f;
  m->g = geometry(o, m->k);
  m->layer_floats = m->ops->layer_floats(&m->g);
  layout(m);
}

wf_status wf_model_create_shard(wf_model **out, const wf_model_opts *o)
{
  wf_status st = WF_OK;
  wf_model *m = NULL;
  *out = NULL;
  WF_TRY(check_opts(o));
  WF_CHECK_ALLOC(m = calloc(1, sizeof *m));
  set_geometry(m, o);
  wf_model_mem mp = wf_model_mem_plan(o, m->k);
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->params, mp.params / sizeof(float)));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->grads, mp.grads / sizeof(float)));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->wlow, mp.wlow / sizeof(float))); /* 0: none */
  m->gstride = m->nl > 0 ? m->nl : 1;
  size_t slots = (size_t)WF_MAX_TENSORS * (size_t)m->gstride;
  WF_CHECK_ALLOC(m->gptr = calloc(slots, sizeof *m->gptr));
  WF_CHECK_ALLOC(m->pptr = calloc(slots, sizeof *m->pptr));
  WF_CHECK_ALLOC(m->lptr = calloc(slots, sizeof *m->lptr));
  WF_TRY(alloc_acts(m, &mp));
  if (m->ops->prepare)
    WF_TRY(m->ops->prepare(m));
  *out = m;
  m = NULL;
exit:
  wf_model_destroy(m);
  return st;
fail:
  goto exit;
}

wf_status wf_model_create(wf_model **out, const wf_model_dims *d, int B, int T)
{
  wf_model_opts o = {.dims = *d, .shard = wf_model_shard_whole(d), .B = B, .T = T, .slots = 1};
  return wf_model_create_shard(out, &o);
}

void wf_model_destroy(wf_model *m)
{
  if (!m)
    return;
  wf_dev_free(m->dev, m->params);
  wf_dev_free(m->dev, m->grads);
  wf_dev_free(m->dev, m->wlow);
  wf_dev_free(m->dev, m->act_mem);
  wf_dev_free(m->dev, m->dact_mem);
  wf_dev_free(m->dev, m->re_saved);
  free(m->a);
  free(m->gptr);
  free(m->pptr);
  free(m->lptr);
  free(m);
}

/* ---- accessors ------------------------------------------------------------------------ */

const wf_model_dims *wf_model_get_dims(const wf_model *m) { return &m->d; }
const wf_model_shard *wf_model_get_shard(const wf_model *m) { return &m->s; }
const wf_model_desc *wf_model_get_desc(const wf_model *m) { return &m->desc; }
struct wf_dev *wf_model_dev(const wf_model *m) { return m->dev; }
size_t wf_model_local_offset(const wf_model *m, int t) { return m->off[t]; }
size_t wf_model_local_params(const wf_model *m) { return m->num_params; }
float *wf_model_params(wf_model *m) { return m->params; }
float *wf_model_grads(wf_model *m) { return m->grads; }

static bool layered(const wf_model *m, int t) { return m->desc.t[t].place == WF_PLACE_LAYER; }

float *wf_model_param(wf_model *m, int t, int layer, int grads)
{
  float *base = grads ? m->grads : m->params;
  int j = layered(m, t) ? wf__local_layer(m, layer) : 0;
  float **redirect = grads ? m->gptr : m->pptr;
  float *p = redirect[(size_t)t * (size_t)m->gstride + (size_t)j];
  if (p)
    return p;
  return base + m->off[t] + (size_t)j * (layered(m, t) ? wf_model_local_layer_numel(m, t) : 0);
}

void wf_model_set_grad_tensor(wf_model *m, int t, int j, float *p)
{
  m->gptr[(size_t)t * (size_t)m->gstride + (size_t)j] = p;
}

static void round_to(const wf_model *m, float *dst, const float *src, size_t n);

void wf_model_set_param_tensor(wf_model *m, int t, int j, float *p, float *low)
{
  size_t i = (size_t)t * (size_t)m->gstride + (size_t)j;
  m->pptr[i] = p;
  m->lptr[i] = NULL;
  if (p && low && m->prec != WF_PREC_NO && m->desc.t[t].gemm) {
    round_to(m, low, p,
             layered(m, t) ? wf_model_local_layer_numel(m, t) : wf_model_local_numel(m, t));
    m->lptr[i] = low;
  }
}

void wf_model_drop_params(wf_model *m)
{
  wf_dev_free(m->dev, m->params);
  wf_dev_free(m->dev, m->wlow);
  m->params = m->wlow = NULL;
}

wf_status wf_model_restore_params(wf_model *m)
{
  wf_status st = WF_OK;
  if (!m->params)
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->params, m->num_params));
  if (m->prec != WF_PREC_NO && !m->wlow)
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->wlow, m->num_params));
fail:
  return st;
}

void wf_model_set_unit_hook(wf_model *m, wf_model_unit_hook fn, void *user)
{
  m->unit_hook = fn;
  m->unit_user = user;
}

void wf_model_drop_grads(wf_model *m)
{
  wf_dev_free(m->dev, m->grads);
  m->grads = NULL;
}

float *wf_model_grad_tensor(wf_model *m, int t)
{
  float *p = m->gptr[(size_t)t * (size_t)m->gstride];
  return p ? p : m->grads + m->off[t];
}

size_t wf_model_grad_bytes(const wf_model *m)
{
  return m->grads ? m->num_params * sizeof(float) : 0;
}

size_t wf_model_param_bytes(const wf_model *m)
{
  return (m->params ? 1 : 0) * (m->wlow ? 2 : 1) * m->num_params * sizeof(float);
}

size_t wf_model_slot_bytes(const wf_model *m) { return m->slot_floats * sizeof(float); }

size_t wf_model_act_bytes(const wf_model *m, int slots)
{
  size_t re = m->recompute ? m->layer_floats : 0;
  return ((size_t)slots * m->slot_floats + re) * sizeof(float);
}

int wf_model_peak_slots(wf_model *m)
{
  int p = m->peak;
  m->peak = m->in_use;
  return p;
}

void wf_model_set_grad_hook(wf_model *m, wf_model_grad_hook fn, void *user)
{
  m->hook = fn;
  m->hook_user = user;
}

const float *wf_model_logits(const wf_model *m) { return m->a[0].logits; }

size_t wf__rows(const wf_model *m, size_t N) { return m->sequence ? N / (size_t)m->s.tp : N; }

size_t wf_model_stage_io_numel(const wf_model *m, int B, int T)
{
  return wf__rows(m, (size_t)B * T) * (size_t)m->d.C;
}

const float *wf_model_stage_output(const wf_model *m, int slot)
{
  return wf__layer_input(m, &m->a[slot], m->lc);
}

bool wf__chunk_first(const wf_model *m, int c) { return m->s.first && c == 0; }
bool wf__chunk_last(const wf_model *m, int c) { return m->s.last && c == m->nchunk - 1; }

int wf__local_real_vocab(const wf_model *m)
{
  int v0 = m->s.tp_rank * m->Vl;
  return WF_MAX(0, WF_MIN(m->Vl, m->d.V - v0));
}

wf_status wf_model_take_loss(wf_model *m, double *sum)
{
  wf_status st = wf_dev_read(m->dev, sum, m->loss_acc, sizeof *sum);
  if (st == WF_OK)
    st = wf_dev_memset(m->dev, m->loss_acc, 0, sizeof *m->loss_acc, NULL);
  return st;
}

/* ---- slot geometry ---------------------------------------------------------------------- */

float *wf__layer_saved(const wf_model *m, const wf__slot *a, int j)
{
  return m->recompute ? m->re_saved : a->saved + (size_t)j * m->layer_floats;
}

float *wf__layer_input(const wf_model *m, const wf__slot *a, int j)
{
  size_t rc = wf__rows(m, (size_t)m->Bmax * m->Tmax) * (size_t)m->d.C;
  return j == 0 ? a->encoded : a->out + (size_t)(j - 1) * rc;
}

/* ---- mixed precision ------------------------------------------------------------------- */

const float *wf__gemm_weight(wf_model *m, int t, int layer)
{
  int j = layered(m, t) ? wf__local_layer(m, layer) : 0;
  const float *low = m->lptr[(size_t)t * (size_t)m->gstride + (size_t)j];
  if (low) /* ZeRO-3's window, rounded when it was gathered */
    return low;
  const float *w = wf_model_param(m, t, layer, 0);
  return m->wlow ? m->wlow + (w - m->params) : w;
}

/* Round n floats to the model's GEMM precision (nothing at precision no). */
static void round_to(const wf_model *m, float *dst, const float *src, size_t n)
{
  if (m->prec == WF_PREC_BF16)
    m->k->round_bf16(dst, src, n, NULL);
  else if (m->prec == WF_PREC_FP16)
    m->k->round_fp16(dst, src, n, NULL);
}

void wf__round_operand(const wf_model *m, float *x, size_t n) { round_to(m, x, x, n); }

/* An output gradient (N,C) that other ops read unrounded (the residual stream's): its
 * rounded copy in da.rdy for the GEMMs, or itself at precision no. */
const float *wf__rounded_grad(wf_model *m, const float *dy, size_t n)
{
  if (m->prec == WF_PREC_NO)
    return dy;
  round_to(m, m->da.rdy, dy, n);
  return m->da.rdy;
}

/* The GEMM weights (the tensors described `gemm`) rounded into wlow. */
wf_status wf_model_params_changed(wf_model *m)
{
  if (!m->wlow || !m->params) /* ZeRO-3 refuses mixed precision: no rounded copy to keep */
    return WF_OK;
  for (int t = 0; t < m->desc.n; t++) {
    if (!m->desc.t[t].gemm)
      continue;
    size_t off = m->off[t];
    round_to(m, m->wlow + off, m->params + off, wf_model_local_numel(m, t));
  }
  return wf_dev_check(m->dev);
}

wf_precision wf_model_precision(const wf_model *m) { return m->prec; }
void wf_model_set_loss_scale(wf_model *m, float s) { m->loss_scale = s; }

/* ---- whole-model arrays ------------------------------------------------------------------- */

/* Copy between this rank's tensors and the whole model's (to_full: add into full),
 * through a host view of the parameters or gradients. */
static wf_status exchange_full(wf_model *m, int which, float *full, bool to_full)
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
  wf_model_shard_exchange(&m->d, &m->s, v.host, 0, m->num_params, full, to_full);
  return wf_dev_unmap(m->dev, &v);
}

wf_status wf_model_export_full(wf_model *m, int which, float *full)
{
  return exchange_full(m, which, full, true);
}

wf_status wf_model_import_full(wf_model *m, int which, const float *full)
{
  wf_status st = exchange_full(m, which, (float *)full, false);
  return st == WF_OK && which == 0 ? wf_model_params_changed(m) : st;
}
