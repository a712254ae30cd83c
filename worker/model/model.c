/*
 * model.c - the model object: allocation of parameters, gradients and activation slots
 * on the model's device by the family's memory plan, accessors, mixed precision's
 * rounded weights, and the exchange of whole-model arrays with the host.
 *
 * Memory: allocations of num_params elements with one layout (parameters, gradients and,
 * under mixed precision, the 16-bit copy of the parameters), the family's tensors in description
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
 *  - Mixed precision: the GEMM weights are read from `wlow`, the 16-bit copy of the
 *    parameters in their layout (2 bytes each), which wf_model_params_changed
 *    refreshes; activations are stored in 16 bits as the kernels make them (m->k is the
 *    device's table of the model's format), so the backward GEMMs and a recomputed
 *    forward (activation checkpointing) read the same operands bit for bit (each kernel
 *    is deterministic). Output gradients stay fp32 and are stored in 16 bits into
 *    scratch (`rdy`) for the GEMM that reads them.
 *  - The plan adds activations up in 4-byte units, each tensor 64-byte aligned, 16-bit
 *    ones at 2 bytes an element (wf__carve).
 */
#include <stdlib.h>
#include <string.h>

#include "model_int.h"

size_t wf__carve(const wf__carve_item *t, size_t n, const wf__carve_to *to, size_t *core_floats)
{
  size_t used[2] = {0, 0};
  float *base[2] = {to->mem, to->core};
  for (size_t i = 0; i < n; i++) {
    int r = t[i].core ? 1 : 0;
    size_t bytes = t[i].n * (t[i].act ? wf_storage_size(to->fmt) : sizeof(float));
    if (base[r]) /* an empty item is NULL, so a use of it fails where it happens */
      *t[i].p = bytes ? base[r] + used[r] : NULL;
    used[r] += ((bytes + 3) / 4 + 15) & ~(size_t)15; /* floats, 64-byte aligned */
  }
  if (core_floats)
    *core_floats = used[1];
  return used[0];
}

/* ---- the memory plan ----------------------------------------------------------------- */

/* The kernels of the model's format: the device's set of that element type. */
static const wf_kset *format_kernels(const wf_kset *k, wf_precision p)
{
  return wf_kset_as(k, (int)p);
}

/* Every op the model computes with, in the model's element type on its device: the
 * family's own and those the engine calls whatever the family (the head's GEMM, the
 * loss, the stage messages' and the weights' casts, the token check). Missing ones fail
 * here, at set-up, naming the op. */
static wf_status kernels_present(const wf_model_opts *o)
{
  static const wf_op_id engine[] = {WF_OP_matmul, WF_OP_xent, WF_OP_cast, WF_OP_tokens};
  const wf__family_ops *ops = wf_model_dims_resolve(&o->dims).fam->ops;
  const wf_kset *k = wf_dev_kernels(o->dev ? o->dev : wf_dev_cpu(), (int)o->precision);
  wf_status st = WF_OK;
  WF_CHECK(k, WF_EINVAL, "precision %d is not an element type", (int)o->precision);
  WF_TRY(wf_kset_need(k, engine, (int)(sizeof engine / sizeof *engine)));
  WF_TRY(wf_kset_need(k, ops->kernels, ops->n_kernels));
fail:
  return st;
}

/* The sizes every carve is made of, from the options alone (no model needed). */
static wf__geo geometry(const wf_model_opts *o, const wf_kset *k)
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
                   .cp = o->shard.cp > 1 ? (size_t)o->shard.cp : 1,
                   .ep = (size_t)(o->shard.ep > 1 ? o->shard.ep : 1),
                   .docs = o->docs,
                   .Vl = (size_t)(d.Vp / o->shard.tp),
                   .NHl = d.NH / o->shard.tp,
                   .KVl = d.KV / o->shard.tp,
                   .fmt = (int)o->precision,
                   .k = format_kernels(k, o->precision)};
}

static size_t keep_of(const wf__family_ops *ops, const wf__geo *z)
{
  return ops->keep_floats ? ops->keep_floats(z) : 0;
}

static size_t side_of(const wf__family_ops *ops, const wf__geo *z)
{
  return ops->side_floats ? ops->side_floats(z) : 0;
}

/* Bytes of a stage message of `rows` activation rows: the activations, then the side
 * band (if any) from the next 64-byte boundary. */
static size_t message_bytes(size_t rows, size_t C, int fmt, size_t side)
{
  size_t act = rows * C * wf_storage_size(fmt);
  return side ? ((act + 63) & ~(size_t)63) + side * sizeof(float) : act;
}

/* Elements of the format a stage buffer of R rows takes beyond its activations: room for
 * the side band after them (wf__side). */
static size_t side_room(const wf__geo *z, size_t side)
{
  size_t act = z->R * z->C * wf_storage_size(z->fmt);
  return (message_bytes(z->R, z->C, z->fmt, side) - act) / wf_storage_size(z->fmt);
}

/* A slot for `inner` layers of intermediates and `outer` layer outputs, with the head's
 * when `head`; a slot is (lc, lc, last), or (0, lc, last) under full activation
 * checkpointing, whose one shared recompute buffer is the family's whole layer. Each
 * layer keeps the family's keep_floats in the slot whatever the recompute; the stage's
 * input and output have room for the side band after them. */
static size_t carve_slot(wf__slot *a, void *mem, const wf__geo *z, size_t layer, int inner,
                         int outer, bool head, const wf__family_ops *ops)
{
  size_t C = z->C, N = z->N, R = z->R, last = head ? 1 : 0, room = side_room(z, side_of(ops, z));
  wf__carve_item t[] = {
      WF__ACT(&a->encoded, R * C + room),
      WF__F32(&a->saved, (size_t)inner * layer),
      WF__ACT(&a->out, (size_t)outer * R * C + room),
      WF__F32(&a->keep, (size_t)outer * keep_of(ops, z)),
      WF__F32(&a->head, last * ops->head_floats(z)),
      WF__ACT(&a->logits, last * N * z->Vl),
      WF__F32(&a->row_max, last * N),
      WF__F32(&a->row_sumexp, last * N),
      WF__F32(&a->target_logit, last * N),
      WF__F32(&a->losses, last * N),
      WF__F32(&a->inputs, N), /* int and float are both 4 bytes */
      WF__F32(&a->targets, N),
      WF__F32(&a->starts, z->docs ? N : 0),
      WF__F32(&a->pos, z->docs ? N : 0),
  };
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem, NULL, z->fmt}, NULL);
}

static size_t carve_dacts(wf__dacts *g, double **loss_acc, int **bad_token, void *mem,
                          const wf__geo *z, const wf__family_ops *ops)
{
  size_t C = z->C, tp = z->tp, N = z->N, R = z->R;
  wf__carve_item t[] = {
      WF__F32(&g->proj, tp > 1 ? N * C : 0), /* tp 1: products land in ysum, */
      WF__F32(&g->ysum, R * C),
      WF__F32(&g->full, N * C),
      WF__F32(&g->dres, N * C),
      WF__F32(&g->dc, tp > 1 ? N * C : 0), /* input gradients in dl (ops.c) */
      WF__F32(&g->dl, N * C),
      WF__F32(&g->stats, 3 * (tp + 1) * N),
      WF__ACT(&g->rdy, z->fmt != WF_PREC_NO ? N * C : 0),
      WF__F32(&g->fam, ops->scratch_floats(z)),
      WF__F32(&g->consts, ops->const_floats(z)),
      WF__F32(&g->side, side_of(ops, z)),
      WF__F32(loss_acc, 2 + 6), /* one double, then the three of aux_acc */
      WF__F32(bad_token, 2),
  };
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem, NULL, z->fmt}, NULL);
}

static const wf__family_ops *ops_of(const wf_model_dims *d) { return wf_model_family(d)->ops; }

size_t wf_model_low_bytes(wf_precision p) { return p == WF_PREC_NO ? 0 : 2; }

/* One spare stage input: a message, 64-byte aligned like the slot's input it trades
 * places with. */
static size_t inbox_bytes(size_t io) { return (io + 63) & ~(size_t)63; }

wf_model_mem wf_model_mem_plan(const wf_model_opts *o, const struct wf_kset *k)
{
  wf_model_mem r = {0};
  wf__slot a;
  wf__dacts da;
  double *acc;
  int *bad;
  const wf_model_shard *s = &o->shard;
  const wf__family_ops *ops = ops_of(&o->dims);
  k = k ? k : wf_dev_kernels(o->dev ? o->dev : wf_dev_cpu(), WF_DT_F32);
  wf__geo z = geometry(o, k);
  size_t n = wf_model_shard_params(&o->dims, s), core = 0;
  size_t layer = ops->layer_floats(&z, &core);
  int lc = s->l1 - s->l0; /* a slot holds one chunk's layers */
  bool full = o->recompute == WF_RECOMPUTE_FULL, sel = o->recompute == WF_RECOMPUTE_SELECTIVE;
  r.params = n * sizeof(float);
  r.grads = n * sizeof(float);
  r.wlow = n * wf_model_low_bytes(o->precision);
  if (o->zero >= 3) /* ZeRO-3's shard and windows hold the parameters and their copy */
    r.params = r.wlow = 0;
  if (o->zero >= 2) /* ZeRO-2/3's windows take every gradient */
    r.grads = 0;
  r.slot = carve_slot(&a, NULL, &z, sel ? layer : layer + core, full ? 0 : lc, lc, s->last, ops) *
           sizeof(float);
  r.slots = r.slot * (size_t)o->slots;
  r.recompute = (full ? layer + core : sel ? core : 0) * sizeof(float);
  r.scratch = carve_dacts(&da, &acc, &bad, NULL, &z, ops) * sizeof(float);
  r.stats = (size_t)wf_model_shard_layers(s) * keep_of(ops, &z) * sizeof(float);
  r.io = message_bytes(z.R, z.C, z.fmt, side_of(ops, &z));
  r.inbox = (size_t)WF_MAX(o->inbox, 0) * inbox_bytes(r.io);
  r.total = r.params + r.grads + r.wlow + r.slots + r.recompute + r.scratch + r.stats + r.inbox;
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
  bool full = m->recompute == WF_RECOMPUTE_FULL, sel = m->recompute == WF_RECOMPUTE_SELECTIVE;
  size_t layer = sel ? m->layer_floats : m->layer_floats + m->core_floats;
  m->slot_floats = mp->slot / sizeof(float);
  WF_CHECK_ALLOC(m->a = calloc((size_t)m->n_slots, sizeof *m->a));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->act_mem, mp->slots / sizeof(float)));
  for (int i = 0; i < m->n_slots; i++) /* a slot holds one chunk's layers */
    carve_slot(&m->a[i], m->act_mem + (size_t)i * m->slot_floats, &m->g, layer, full ? 0 : m->lc,
               m->lc, m->s.last, m->ops);
  /* full: one layer's intermediates; selective: one layer's core state; shared by every
   * layer and slot */
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->re_saved, mp->recompute / sizeof(float)));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->dact_mem, mp->scratch / sizeof(float)));
  if (m->keep_floats) { /* the layers' statistics, summed since the last take */
    WF_TRY(wf_dev_alloc_floats(m->dev, &m->stats, (size_t)m->nl * m->keep_floats));
    WF_TRY(wf__zero(m, m->stats, (size_t)m->nl * m->keep_floats));
  }
  carve_dacts(&m->da, &m->loss_acc, &m->bad_token, m->dact_mem, &m->g, m->ops);
  m->aux_acc = m->loss_acc + 1;
  /* spare stage inputs: pipeline receives land in them (wf_model_stage_inbox) */
  WF_TRY(wf_dev_alloc(m->dev, &m->inbox_mem, mp->inbox));
  WF_CHECK_ALLOC(m->inbox = calloc((size_t)m->n_inbox + 1, sizeof *m->inbox));
  for (int i = 0; i < m->n_inbox; i++)
    m->inbox[i] = (char *)m->inbox_mem + (size_t)i * inbox_bytes(mp->io);
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
  WF_CHECK(o->shard.ep <= 1 || (o->ep.ops && o->ep.ops->version == WF_EP_OPS_VERSION), WF_EINVAL,
           "ep %d needs expert parallelism's exchange (version %d)", o->shard.ep,
           WF_EP_OPS_VERSION);
  WF_CHECK(!o->shard.sequence || ((size_t)o->B * o->T) % (size_t)o->shard.tp == 0, WF_EINVAL,
           "sequence parallelism needs B*T = %d x %d tokens divisible by tp %d", o->B, o->T,
           o->shard.tp);
  int cp = o->shard.cp > 1 ? o->shard.cp : 1;
  WF_CHECK(cp == 1 || (o->cp.ops && o->cp.ops->version == WF_CP_OPS_VERSION), WF_EINVAL,
           "cp %d needs context parallelism's attention (version %d)", cp, WF_CP_OPS_VERSION);
  WF_CHECK(cp == 1 || ((long)o->T * cp <= d->maxT && o->T % 2 == 0), WF_EINVAL,
           "context parallelism over %d ranks of %d rows each: the sequence (%d) must fit the "
           "context length %d, and each rank holds two equal chunks",
           cp, o->T, o->T * cp, d->maxT);
  WF_TRY(kernels_present(o));
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
  m->k = format_kernels(wf_dev_kernels(m->dev, WF_DT_F32), o->precision);
  m->tp = o->shard.tp > 1 ? o->tp : (wf_tp_regions){NULL, NULL};
  m->cp = o->shard.cp > 1 ? o->cp : (wf_cp_regions){NULL, NULL};
  m->ep = o->shard.ep > 1 ? o->ep : (wf_ep_regions){NULL, NULL};
  m->sequence = o->shard.sequence && o->shard.tp > 1;
  m->nchunk = o->shard.chunks > 1 ? o->shard.chunks : 1;
  m->lc = o->shard.l1 - o->shard.l0;
  m->nl = m->nchunk * m->lc;
  m->NHl = m->d.NH / o->shard.tp;
  m->KVl = m->d.KV / o->shard.tp;
  m->Vl = m->d.Vp / o->shard.tp;
  m->Bmax = o->B, m->Tmax = o->T, m->n_slots = o->slots;
  m->n_inbox = WF_MAX(o->inbox, 0);
  m->recompute = o->recompute;
  m->prec = o->precision;
  m->esize = wf_storage_size((int)o->precision);
  m->loss_scale = 1.0f;
  m->g = geometry(o, wf_dev_kernels(m->dev, WF_DT_F32));
  m->layer_floats = m->ops->layer_floats(&m->g, &m->core_floats);
  m->keep_floats = keep_of(m->ops, &m->g);
  m->side_floats = side_of(m->ops, &m->g);
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
  /* 0 bytes (ZeRO-2/3's flat vectors, an fp32 run's copy): none, NULL */
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->params, mp.params / sizeof(float)));
  WF_TRY(wf_dev_alloc(m->dev, &m->wlow, mp.wlow));
  WF_TRY(wf_dev_alloc_floats(m->dev, &m->grads, mp.grads / sizeof(float)));
  m->gstride = m->nl > 0 ? m->nl : 1;
  size_t slots = (size_t)WF_MAX_TENSORS * (size_t)m->gstride;
  WF_CHECK_ALLOC(m->gptr = calloc(slots, sizeof *m->gptr));
  WF_CHECK_ALLOC(m->pptr = calloc(slots, sizeof *m->pptr));
  WF_CHECK_ALLOC(m->lptr = calloc(slots, sizeof *m->lptr));
  WF_TRY(alloc_acts(m, &mp));
  if (o->docs) /* staging for the positions a micro-batch's starts give */
    WF_CHECK_ALLOC(m->host_pos = malloc((size_t)o->B * (size_t)o->T * sizeof *m->host_pos));
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
  wf_dev_free(m->dev, m->stats);
  wf_dev_free(m->dev, m->inbox_mem); /* slots and spares may have traded places: both freed */
  free(m->inbox);
  free(m->host_pos);
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

void wf_model_set_param_tensor(wf_model *m, int t, int j, float *p, void *low)
{
  size_t i = (size_t)t * (size_t)m->gstride + (size_t)j;
  m->pptr[i] = p;
  m->lptr[i] = NULL;
  if (p && low && m->prec != WF_PREC_NO && m->desc.t[t].gemm) {
    WF_K(m->k, cast)
        ->store(low, p,
                layered(m, t) ? wf_model_local_layer_numel(m, t) : wf_model_local_numel(m, t),
                NULL);
    m->lptr[i] = low;
  }
}

void wf_model_drop_params(wf_model *m)
{
  wf_dev_free(m->dev, m->params);
  wf_dev_free(m->dev, m->wlow);
  m->params = m->wlow = NULL;
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
  size_t low = m->wlow ? wf_model_low_bytes(m->prec) : 0;
  return m->params ? m->num_params * (sizeof(float) + low) : 0;
}

size_t wf_model_slot_bytes(const wf_model *m) { return m->slot_floats * sizeof(float); }

size_t wf_model_act_bytes(const wf_model *m, int slots)
{
  size_t re = m->recompute == WF_RECOMPUTE_FULL        ? m->layer_floats + m->core_floats
              : m->recompute == WF_RECOMPUTE_SELECTIVE ? m->core_floats
                                                       : 0;
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

wf_status wf_model_logits_read(wf_model *m, float *host, size_t first, size_t n)
{
  wf_status st = WF_OK;
  uint16_t *h = NULL;
  const void *src = wf_storage_at(m->a[0].logits, first, (int)m->prec);
  if (m->prec == WF_PREC_NO)
    return wf_dev_read(m->dev, host, src, n * sizeof *host);
  WF_CHECK_ALLOC(h = malloc(n * sizeof *h));
  WF_TRY(wf_dev_read(m->dev, h, src, n * sizeof *h));
  for (size_t i = 0; i < n; i++)
    host[i] = wf_storage_get(h, i, (int)m->prec);
fail:
  free(h);
  return st;
}

size_t wf__rows(const wf_model *m, size_t N) { return m->sequence ? N / (size_t)m->s.tp : N; }

size_t wf_model_stage_io_numel(const wf_model *m, int B, int T)
{
  return wf__rows(m, (size_t)B * T) * (size_t)m->d.C;
}

size_t wf_model_stage_io_bytes(const wf_model *m, int B, int T)
{
  return message_bytes(wf__rows(m, (size_t)B * T), (size_t)m->d.C, (int)m->prec, m->side_floats);
}

float *wf__side(const wf_model *m, const void *x, int B, int T)
{
  if (!m->side_floats)
    return NULL;
  size_t act = wf_model_stage_io_numel(m, B, T) * m->esize;
  return (float *)((char *)x + ((act + 63) & ~(size_t)63));
}

const void *wf_model_stage_output(const wf_model *m, int slot)
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

wf_status wf_model_take_aux(wf_model *m, double sums[3])
{
  wf_status st = wf_dev_read(m->dev, sums, m->aux_acc, 3 * sizeof *sums);
  if (st == WF_OK)
    st = wf_dev_memset(m->dev, m->aux_acc, 0, 3 * sizeof *m->aux_acc, NULL);
  return st;
}

size_t wf_model_stats_floats(const wf_model *m) { return m->keep_floats; }

wf_status wf_model_take_stats(wf_model *m, float *full)
{
  wf_status st = WF_OK;
  size_t k = m->keep_floats, n = (size_t)m->nl * k;
  float *h = NULL;
  if (!k)
    return WF_OK;
  WF_CHECK_ALLOC(h = malloc(n * sizeof *h));
  WF_TRY(wf_dev_read(m->dev, h, m->stats, n * sizeof *h));
  for (int j = 0; j < m->nl; j++)
    for (size_t i = 0; i < k; i++)
      full[(size_t)wf__global_layer(m, j) * k + i] += h[(size_t)j * k + i];
  st = wf__zero(m, m->stats, n);
fail:
  free(h);
  return st;
}

/* ---- slot geometry ---------------------------------------------------------------------- */

wf__layer_mem wf__layer_saved(const wf_model *m, const wf__slot *a, int j)
{
  size_t layer = m->layer_floats, core = m->core_floats;
  float *keep = m->keep_floats ? a->keep + (size_t)j * m->keep_floats : NULL;
  switch (m->recompute) {
  case WF_RECOMPUTE_FULL: return (wf__layer_mem){m->re_saved, m->re_saved + layer, keep};
  case WF_RECOMPUTE_SELECTIVE:
    return (wf__layer_mem){a->saved + (size_t)j * layer, m->re_saved, keep};
  default: break;
  }
  float *saved = a->saved + (size_t)j * (layer + core);
  return (wf__layer_mem){saved, saved + layer, keep};
}

void *wf__layer_input(const wf_model *m, const wf__slot *a, int j)
{
  size_t rc = wf__rows(m, (size_t)m->Bmax * m->Tmax) * (size_t)m->d.C;
  return j == 0 ? a->encoded : (char *)a->out + (size_t)(j - 1) * rc * m->esize;
}

/* ---- mixed precision ------------------------------------------------------------------- */

const void *wf__gemm_weight(wf_model *m, int t, int layer)
{
  int j = layered(m, t) ? wf__local_layer(m, layer) : 0;
  const void *low = m->lptr[(size_t)t * (size_t)m->gstride + (size_t)j];
  if (low) /* ZeRO-3's window, stored in 16 bits when it was gathered */
    return low;
  const float *w = wf_model_param(m, t, layer, 0);
  return m->wlow ? (const char *)m->wlow + (size_t)(w - m->params) * m->esize : (const void *)w;
}

/* The residual stream's gradient dy (N, C, fp32) entering a row-parallel GEMM's backward,
 * in the activation format: stored into da.rdy, or itself at fp32. It is the one output
 * gradient a GEMM reads that is not written in the format already (GELU's, SwiGLU's and
 * attention's are; the logits' gradient is written in place). */
const void *wf__res_grad(wf_model *m, const float *dy, size_t N)
{
  if (m->prec == WF_PREC_NO)
    return dy;
  WF_K(m->k, cast)->store(m->da.rdy, dy, N * (size_t)m->d.C, NULL);
  return m->da.rdy;
}

/* The 16-bit copy of every parameter (the GEMMs read the weights' from it). */
wf_status wf_model_params_changed(wf_model *m)
{
  if (!m->wlow || !m->params) /* ZeRO-3 dropped the flat copy: its windows keep theirs */
    return WF_OK;
  WF_K(m->k, cast)->store(m->wlow, m->params, m->num_params, NULL);
  return wf_dev_check(m->dev);
}

wf_precision wf_model_precision(const wf_model *m) { return m->prec; }
void *wf_model_params_low(wf_model *m) { return m->wlow; /* NULL when the params are */ }
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
