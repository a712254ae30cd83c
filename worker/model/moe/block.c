/*
 * block.c - what the mixture-of-experts families compute around their experts: the
 * vocabulary-parallel embedding, attention (Llama's, with the queries' and keys' RMSNorm
 * of OLMoE and Qwen3), the block with its tensor-parallel regions, the final RMSNorm and
 * the head with the auxiliary losses, the layer's memory, and the side band that carries
 * the routers' statistics across pipeline stages.
 *
 * Attention: n1 = rmsnorm(x) -> enter -> qkv (column-parallel) -> q/k norm (the raw q and
 * k kept for its backward; OLMoE's statistics summed over tp, a group spanning the
 * projection) -> RoPE -> grouped-query attention -> o (row-parallel) -> leave. MoE: x +
 * attention -> n2 = rmsnorm -> enter -> router, experts, combine (experts.c: a tp-partial
 * sum like a row-parallel output) -> leave -> residual.
 *
 * The load-balancing loss (transformers' load_balancing_loss_func) couples every layer:
 * its gradient at one router needs how often each expert was chosen over the whole model
 * for the micro-batch. Each layer keeps its statistics in the slot (keep); at a chunk's
 * end side_forward adds them to the side band its input brought (zeros on the first
 * stage), which its output carries on; the last chunk's head adds the micro-batch's
 * losses from those sums, and backward, from the last stage down, hands the sums back in
 * every gradient message (engine.c), where each router's backward reads them.
 */
#include <math.h>
#include <stdlib.h>

#include "moe_int.h"
#include "wf_kernels.h" /* wf_rope_table, the MoE and q/k-norm ops (CPU) */

size_t wf__moe_hs(const wf__geo *z) { return (size_t)z->d.HD; }
size_t wf__moe_q_local(const wf__geo *z) { return (size_t)z->NHl * wf__moe_hs(z); }
size_t wf__moe_qkv_local(const wf__geo *z) { return (size_t)(z->NHl + 2 * z->KVl) * wf__moe_hs(z); }
size_t wf__moe_f_local(const wf__geo *z) { return (size_t)z->d.F / z->tp; }
size_t wf__moe_rows(const wf__geo *z) { return z->N * (size_t)z->d.K; }

size_t wf__moe_expert_rows(const wf__geo *z)
{
  size_t E = (size_t)z->d.E, K = (size_t)z->d.K, El = E / z->ep, N = z->N;
  if (z->ep == 1)
    return N * K;
  size_t most = z->ep * N * WF_MIN(K, El); /* every rank's tokens, each choosing them */
  if (z->d.capacity > 0) {
    size_t cap = (size_t)ceil(z->d.capacity * (double)N * K / E);
    most = WF_MIN(most, z->ep * El * cap);
  }
  return most;
}

static const moe_variant *variant_geo(const wf__geo *z) { return z->d.fam->data; }

/* q/k norm groups a row: OLMoE's one q and one k group, Qwen3's one a head. */
static size_t qk_groups(const wf__geo *z)
{
  switch (variant_geo(z)->qk) {
  case MOE_QK_WHOLE: return 2;
  case MOE_QK_HEAD: return (size_t)(z->NHl + z->KVl);
  default: return 0;
  }
}

static size_t carve_layer(moe_layer *v, wf__layer_mem mem, const wf__geo *z, size_t *core)
{
  size_t C = z->C, N = z->N, R = z->R, F = wf__moe_f_local(z), M = wf__moe_rows(z);
  size_t E = (size_t)z->d.E, K = (size_t)z->d.K, G = qk_groups(z), Me = wf__moe_expert_rows(z);
  size_t q = wf__moe_q_local(z), kv = (size_t)z->KVl * wf__moe_hs(z), ep = z->ep > 1;
  size_t att = wf__attention_saved(z, (int)q, z->NHl);
  wf__carve_item t[] = {
      WF__ACT(&v->n1.out, R * C),
      WF__F32(&v->n1.rstd, R),
      WF__ACT(&v->qkv, N * wf__moe_qkv_local(z)),
      WF__ACT(&v->qk_raw, G ? N * (q + kv) : 0),
      WF__F32(&v->qk_rstd, N * G),
      WF__ACT(&v->atty, N * q),
      WF__CORE(&v->att, att),
      WF__ACT(&v->res2, R * C),
      WF__ACT(&v->n2.out, R * C),
      WF__F32(&v->n2.rstd, R),
      WF__F32(&v->probs, N * E),
      WF__F32(&v->lse, N),
      WF__F32(&v->idx, N * K), /* int and float are both 4 bytes */
      WF__F32(&v->w, N * K),
      WF__F32(&v->pos, N * K),
      WF__F32(&v->counts, E),
      WF__F32(&v->rc, ep * E), /* ep blocks of El */
      WF__ACT(&v->xp, M * C),
      WF__F32(&v->y, M * C),
      WF__ACT(&v->xr, ep * Me * C),
      WF__ACT(&v->gu, Me * 2 * F),
      WF__ACT(&v->h, Me * F),
  };
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem.saved, mem.core, z->fmt}, core);
}

static size_t carve_scratch(moe_scratch *s, void *mem, const wf__geo *z)
{
  size_t N = z->N, C = z->C, F = wf__moe_f_local(z), M = wf__moe_rows(z);
  size_t q = wf__moe_q_local(z), E = (size_t)z->d.E, K = (size_t)z->d.K;
  size_t Me = wf__moe_expert_rows(z), ep = z->ep > 1;
  size_t att = wf__attention_scratch(z, (int)q, z->NHl);
  wf__carve_item t[] = {
      WF__ACT(&s->da, WF_MAX(Me * 2 * F, N * wf__moe_qkv_local(z))),
      WF__ACT(&s->db, WF_MAX(Me * F, N * q)),
      WF__ACT(&s->dyp, M * C),
      WF__F32(&s->dxp, M * C),
      WF__ACT(&s->dyr, ep * Me * C),
      WF__F32(&s->dxr, ep * Me * C),
      WF__ACT(&s->dlogits, N * E),
      WF__F32(&s->dw, N * K),
      WF__F32(&s->qk_sums, N * qk_groups(z)),
      WF__F32(&s->scratch, att),
  };
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem, NULL, z->fmt}, NULL);
}

static size_t layer_floats(const wf__geo *z, size_t *core)
{
  return carve_layer(&(moe_layer){0}, (wf__layer_mem){NULL, NULL, NULL}, z, core);
}
static size_t scratch_floats(const wf__geo *z) { return carve_scratch(&(moe_scratch){0}, NULL, z); }
static size_t const_floats(const wf__geo *z) { return z->T * wf__moe_hs(z); }
static size_t stats_floats(const wf__geo *z) { return WF_MOE_STATS(z->d.E); }

moe_layer wf__moe_layer_at(const wf_model *m, wf__layer_mem mem)
{
  moe_layer v;
  carve_layer(&v, mem, &m->g, NULL);
  v.n1.w = wf__moe_tensor(m, MO_LN1), v.n1.b = -1;
  v.n2.w = wf__moe_tensor(m, MO_LN2), v.n2.b = -1;
  return v;
}

moe_scratch wf__moe_scratch_at(wf_model *m)
{
  moe_scratch s;
  carve_scratch(&s, m->da.fam, &m->g);
  return s;
}

/* RoPE's (T, hs) table, made on the host as Hugging Face rounds it. */
static wf_status prepare(wf_model *m)
{
  wf_status st = WF_OK;
  size_t n = const_floats(&m->g);
  float *cs = NULL;
  WF_CHECK(m->dev == wf_dev_cpu(), WF_EUNSUPPORTED,
           "model.family=%s: the mixture-of-experts kernels (router, dispatch, combine, q/k "
           "norm) run on the CPU only in this build; use runtime.device=cpu",
           m->fam->name);
  WF_CHECK_ALLOC(cs = malloc(n * sizeof *cs));
  wf_rope_table(cs, m->Tmax, (int)wf__moe_hs(&m->g), m->d.rope_theta, &m->d.rope_scaling);
  st = wf_dev_copy(m->dev, m->da.consts, cs, n * sizeof *cs, WF_COPY_H2D, NULL);
fail:
  free(cs);
  return st;
}

static float *P(wf_model *m, int x, int l) { return wf_model_param(m, wf__moe_tensor(m, x), l, 0); }
static float *G(wf_model *m, int x, int l) { return wf_model_param(m, wf__moe_tensor(m, x), l, 1); }
static const void *W(wf_model *m, int x, int l)
{
  return wf__gemm_weight(m, wf__moe_tensor(m, x), l);
}
static int head_x(const wf_model *m) { return m->d.tie == WF_TIE_YES ? MO_EMB : MO_HEAD; }

/* ---- the queries' and keys' norm -------------------------------------------------------- */

/* The groups' geometry (qknorm.h): OLMoE's one group a row for q and one for k, each as
 * wide as the rank's slice and normalised over the whole projection; Qwen3's heads. */
typedef struct qk_geo {
  int ld, nq, gq, fq, nk, gk, fk;
} qk_geo;

static qk_geo qk_of(const wf_model *m)
{
  int hs = (int)wf__moe_hs(&m->g), nq = m->NHl * hs, nk = m->KVl * hs;
  int ld = (int)wf__moe_qkv_local(&m->g);
  if (wf__moe_variant(m)->qk == MOE_QK_WHOLE)
    return (qk_geo){ld, nq, nq, m->d.NH * hs, nk, nk, m->d.KV * hs};
  return (qk_geo){ld, nq, hs, hs, nk, hs, hs};
}

/* A group spanning tp ranks (OLMoE's) has its sums added over tp. */
static wf_status qk_reduce(wf_model *m, float *x, int N)
{
  if (wf__moe_variant(m)->qk != MOE_QK_WHOLE)
    return WF_OK;
  return wf__tp_sum(m, x, (size_t)N * qk_groups(&m->g));
}

static wf_status qk_forward(wf_model *m, const moe_layer *v, int l, int N)
{
  wf_status st = WF_OK;
  qk_geo g = qk_of(m);
  float *ss = wf__moe_scratch_at(m).qk_sums;
  if (wf__moe_variant(m)->qk == MOE_QK_NONE)
    return WF_OK;
  WF_K(m->k, qknorm)->sumsq(ss, v->qkv, N, g.ld, g.nq, g.gq, g.nk, g.gk, (int)m->prec, NULL);
  WF_TRY(qk_reduce(m, ss, N));
  WF_K(m->k, qknorm)
      ->forward(v->qkv, v->qk_raw, v->qk_rstd, ss, P(m, MO_QN, l), P(m, MO_KN, l), N, g.ld, g.nq,
                g.gq, g.fq, g.nk, g.gk, g.fk, m->d.norm_eps, (int)m->prec, NULL);
fail:
  return st;
}

static wf_status qk_backward(wf_model *m, const moe_layer *v, void *dqkv, int l, int N)
{
  wf_status st = WF_OK;
  qk_geo g = qk_of(m);
  float *dot = wf__moe_scratch_at(m).qk_sums;
  if (wf__moe_variant(m)->qk == MOE_QK_NONE)
    return WF_OK;
  WF_K(m->k, qknorm)
      ->dot(dot, dqkv, v->qk_raw, v->qk_rstd, P(m, MO_QN, l), P(m, MO_KN, l), N, g.ld, g.nq, g.gq,
            g.nk, g.gk, (int)m->prec, NULL);
  WF_TRY(qk_reduce(m, dot, N));
  WF_K(m->k, qknorm)
      ->backward(dqkv, G(m, MO_QN, l), G(m, MO_KN, l), v->qk_raw, v->qk_rstd, dot, P(m, MO_QN, l),
                 P(m, MO_KN, l), N, g.ld, g.nq, g.gq, g.fq, g.nk, g.gk, g.fk, (int)m->prec, NULL);
fail:
  return st;
}

/* ---- forward ---------------------------------------------------------------------------- */

static wf_status attention_forward(wf_model *m, const moe_layer *v, const void *x, int l, int B,
                                   int T)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, N = B * T, hs = (int)wf__moe_hs(&m->g);
  int q = (int)wf__moe_q_local(&m->g), qkv = (int)wf__moe_qkv_local(&m->g);
  const void *xin;
  WF_TRY(wf__prenorm_forward(m, &v->n1, &xin, NULL, x, l, N));
  WF_K(k, matmul)->forward(v->qkv, xin, W(m, MO_QKV, l), NULL, N, C, qkv, m->prec, NULL);
  WF_TRY(qk_forward(m, v, l, N));
  wf__rope_forward(m, v->qkv, B, T, hs);
  WF_TRY(wf__attention_forward(m, v->atty, v->att, v->qkv, B, T, q, m->NHl, m->KVl));
  st = wf__row_parallel(m, v->atty, wf__moe_tensor(m, MO_O), -1, l, N, q);
fail:
  return st;
}

static wf_status mlp_forward(wf_model *m, const moe_layer *v, float *keep, const void *x, void *y,
                             int l, int N)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, R = (int)wf__rows(m, (size_t)N);
  const void *xin;
  float *part = wf__partial(m);
  WF_TRY(wf__prenorm_forward(m, &v->n2, &xin, v->res2, x, l, N));
  WF_TRY(wf__moe_mlp_forward(m, v, keep, xin, part, l, N));
  WF_TRY(wf__leave_fwd(m, m->da.ysum, part, (size_t)N, (size_t)C));
  WF_K(k, residual)->forward(y, v->res2, m->da.ysum, (size_t)R * C, NULL);
fail:
  return st;
}

static wf_status block_forward(wf_model *m, wf__layer_mem mem, const void *x, void *y, int l, int B,
                               int T)
{
  wf_status st = WF_OK;
  moe_layer v = wf__moe_layer_at(m, mem);
  WF_TRY(attention_forward(m, &v, x, l, B, T));
  st = mlp_forward(m, &v, mem.keep, x, y, l, B * T);
fail:
  return st;
}

static wf_status core_forward(wf_model *m, wf__layer_mem mem, int l, int B, int T)
{
  moe_layer v = wf__moe_layer_at(m, mem);
  moe_scratch s = wf__moe_scratch_at(m);
  (void)l;
  return wf__attention_forward(m, s.db, v.att, v.qkv, B, T, (int)wf__moe_q_local(&m->g), m->NHl,
                               m->KVl);
}

static wf_status embed_forward(wf_model *m, wf__slot *a)
{
  return wf__embed_forward(m, a, wf__moe_tensor(m, MO_EMB), -1);
}

/* The chunk's output side band: its input's plus each of its layers' statistics, which
 * also join the model's running sums (wf_model_take_stats). Once per forward, never in a
 * recompute. */
static wf_status side_forward(wf_model *m, wf__slot *a)
{
  const wf_kset *k =
      wf_dev_kernels(m->dev, WF_DT_F32); /* fp32: the statistics are not activations */
  float *in = wf__side(m, a->encoded, a->B, a->T);
  float *out = wf__side(m, wf__layer_input(m, a, m->lc), a->B, a->T);
  size_t n = m->keep_floats;
  for (int j = 0; j < m->lc; j++) {
    const float *keep = a->keep + (size_t)j * n;
    float *sum = m->stats + (size_t)(a->chunk * m->lc + j) * n;
    WF_K(k, residual)->forward(out, j ? out : in, keep, n, NULL);
    WF_K(k, residual)->forward(sum, sum, keep, n, NULL);
  }
  return WF_OK;
}

/* The head, and with targets the micro-batch's auxiliary losses from the whole model's
 * statistics (the side band of the last chunk's output). */
static wf_status head_forward(wf_model *m, wf__slot *a, const void *x)
{
  wf_status st = WF_OK;
  WF_TRY(wf__head_forward(m, a, x, wf__moe_tensor(m, MO_NORM), -1, wf__moe_tensor(m, head_x(m))));
  if (a->have_targets)
    WF_K(m->k, moe_route)
        ->aux_accumulate(m->aux_acc, wf__side(m, x, a->B, a->T), m->d.E,
                         (double)m->d.L * a->B * a->T, NULL);
fail:
  return st;
}

/* ---- backward ---------------------------------------------------------------------------- */

static wf_status mlp_backward(wf_model *m, const moe_layer *v, const moe_scratch *s, int l, int N)
{
  wf_status st = WF_OK;
  wf__dacts *g = &m->da;
  int C = m->d.C, R = (int)wf__rows(m, (size_t)N);
  const float *dy;
  float *dx = m->tp.ops ? g->dc : g->dl;
  WF_TRY(wf__leave_bwd(m, &dy, g->dres, g->full, (size_t)N, (size_t)C));
  WF_TRY(wf__moe_mlp_backward(m, v, s, v->n2.out, dy, dx, l, N));
  WF_TRY(wf__enter_bwd(m, g->dl, dx, (size_t)N, (size_t)C));
  wf__norm_backward(m, &v->n2, v->res2, l, R);
fail:
  return st;
}

static wf_status attention_backward(wf_model *m, const moe_layer *v, const moe_scratch *s,
                                    const void *x, int l, int B, int T)
{
  wf_status st = WF_OK;
  int N = B * T, hs = (int)wf__moe_hs(&m->g);
  int q = (int)wf__moe_q_local(&m->g), qkv = (int)wf__moe_qkv_local(&m->g);
  WF_TRY(wf__row_parallel_backward(m, s->db, v->atty, wf__moe_tensor(m, MO_O), -1, l, N, q));
  WF_TRY(wf__attention_backward(m, s->da, s->scratch, s->db, v->qkv, v->att, v->atty, B, T, q,
                                m->NHl, m->KVl));
  wf__rope_backward(m, s->da, B, T, hs);
  WF_TRY(qk_backward(m, v, s->da, l, N));
  st = wf__prenorm_backward(m, &v->n1, s->da, wf__moe_tensor(m, MO_QKV), -1, qkv, x, l, N);
fail:
  return st;
}

static wf_status block_backward(wf_model *m, wf__layer_mem mem, const void *x, int l, int B, int T)
{
  wf_status st = WF_OK;
  moe_layer v = wf__moe_layer_at(m, mem);
  moe_scratch s = wf__moe_scratch_at(m);
  WF_TRY(mlp_backward(m, &v, &s, l, B * T));
  st = attention_backward(m, &v, &s, x, l, B, T);
fail:
  return st;
}

static wf_status head_backward(wf_model *m, wf__slot *a, const void *x, float dloss)
{
  return wf__head_backward(m, a, x, wf__moe_tensor(m, MO_NORM), -1, wf__moe_tensor(m, head_x(m)),
                           dloss);
}

static wf_status embed_backward(wf_model *m, wf__slot *a)
{
  return wf__embed_backward(m, a, wf__moe_tensor(m, MO_EMB), -1);
}

/* The ops the block calls (checked at set-up for the model's element type and device). */
static const wf_op_id kernels[] = {WF_OP_embedding,    WF_OP_rmsnorm,     WF_OP_matmul,
                                   WF_OP_attention,    WF_OP_rope,        WF_OP_swiglu,
                                   WF_OP_residual,     WF_OP_xent,        WF_OP_moe_route,
                                   WF_OP_moe_dispatch, WF_OP_moe_combine, WF_OP_qknorm};

const wf__family_ops wf__moe_ops = {
    .kernels = kernels,
    .n_kernels = (int)(sizeof kernels / sizeof *kernels),
    .norm = WF__RMSNORM,
    .layer_floats = layer_floats,
    .head_floats = wf__head_floats,
    .scratch_floats = scratch_floats,
    .const_floats = const_floats,
    .prepare = prepare,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .block_forward = block_forward,
    .core_forward = core_forward,
    .block_backward = block_backward,
    .head_forward = head_forward,
    .head_backward = head_backward,
    .keep_floats = stats_floats,
    .side_floats = stats_floats,
    .side_forward = side_forward,
};
