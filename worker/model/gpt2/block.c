/*
 * block.c - what the GPT-2 family computes: the vocabulary-parallel embedding (wte +
 * wpe), a pre-LayerNorm block with its tensor-parallel regions, the final layernorm
 * before the tied head, and their backward passes.
 *
 * A block is attention: ln1 (replicated region) -> enter -> qkv (column-parallel, local
 * heads) -> attention -> attproj (row-parallel) -> leave; then MLP: residual +
 * attention output -> ln2 (one fused op) -> enter -> fc and GELU (one fused op) ->
 * fcproj (row-parallel) -> leave -> residual. Under mixed precision the GEMM inputs
 * ln1, atty, ln2, fchg are rounded as they are made (before the all-gather of sequence
 * parallelism: rounding is elementwise, so it commutes). Attention's own Q.K^T and
 * att.V stay fp32, as flash-attention kernels keep the softmax in fp32; only its
 * output, attproj's input, is rounded.
 *
 * Backward copies no big tensor: the residual stream's gradient is one (R,C) buffer
 * (da.dres) that each layernorm backward adds into, and the outputs of the two
 * projections go through one (N,C) scratch buffer because backward never needs them.
 */
#include "gpt2_int.h"

/* One layer's saved intermediates, carved from its `saved` floats; the backward
 * scratch, from da.fam. */
typedef struct layer {
  float *ln1, *ln1_mean, *ln1_rstd; /* (R,C), (R), (R) */
  float *qkv;                       /* (N,3C/tp) */
  float *atty;                      /* (N,C/tp) */
  float *att;                       /* (attention_saved): (B,NH/tp,T,T) on the CPU */
  float *res2;                      /* (R,C) the residual after attention */
  float *ln2, *ln2_mean, *ln2_rstd; /* (R,C), (R), (R) */
  float *fch, *fchg;                /* (N,4C/tp) fc's output and its GELU */
} layer;

typedef struct head {
  float *lnf, *lnf_mean, *lnf_rstd; /* (R,C), (R), (R) */
} head;

typedef struct scratch {
  float *d4a;     /* (N,4C/tp) dfchg, then dqkv (N,3C/tp) */
  float *d4b;     /* (N,4C/tp) dfch, then datty */
  float *scratch; /* (attention_scratch) attention backward scratch */
} scratch;

static size_t att_saved(const wf__geo *z)
{
  return z->k->attention_saved((int)z->B, (int)z->T, (int)(z->C / z->tp), z->NHl);
}

static size_t carve_layer(layer *v, float *mem, const wf__geo *z)
{
  size_t C = z->C, tp = z->tp, N = z->N, R = z->R;
  wf__carve_item t[] = {
      {&v->ln1, R * C},          {&v->ln1_mean, R},         {&v->ln1_rstd, R},
      {&v->qkv, N * 3 * C / tp}, {&v->atty, N * C / tp},    {&v->att, att_saved(z)},
      {&v->res2, R * C},         {&v->ln2, R * C},          {&v->ln2_mean, R},
      {&v->ln2_rstd, R},         {&v->fch, N * 4 * C / tp}, {&v->fchg, N * 4 * C / tp},
  };
  return wf__carve(t, WF_ARRAY_LEN(t), mem);
}

static size_t carve_head(head *h, float *mem, const wf__geo *z)
{
  wf__carve_item t[] = {{&h->lnf, z->R * z->C}, {&h->lnf_mean, z->R}, {&h->lnf_rstd, z->R}};
  return wf__carve(t, WF_ARRAY_LEN(t), mem);
}

static size_t carve_scratch(scratch *s, float *mem, const wf__geo *z)
{
  size_t n4 = z->N * 4 * z->C / z->tp;
  size_t att = z->k->attention_scratch((int)z->B, (int)z->T, (int)(z->C / z->tp), z->NHl);
  wf__carve_item t[] = {{&s->d4a, n4}, {&s->d4b, n4}, {&s->scratch, att}};
  return wf__carve(t, WF_ARRAY_LEN(t), mem);
}

static size_t layer_floats(const wf__geo *z) { return carve_layer(&(layer){0}, NULL, z); }
static size_t head_floats(const wf__geo *z) { return carve_head(&(head){0}, NULL, z); }
static size_t scratch_floats(const wf__geo *z) { return carve_scratch(&(scratch){0}, NULL, z); }
static size_t const_floats(const wf__geo *z) { return (void)z, 0; }

/* The carves at the model's geometry (Bmax x Tmax: a smaller micro-batch uses the first
 * rows of each). */
static layer layer_at(const wf_model *m, float *saved)
{
  layer v;
  carve_layer(&v, saved, &m->g);
  return v;
}

static float *P(wf_model *m, int t, int l) { return wf_model_param(m, t, l, 0); }
static float *G(wf_model *m, int t, int l) { return wf_model_param(m, t, l, 1); }

/* ---- forward ------------------------------------------------------------------------ */

static wf_status attention_forward(wf_model *m, const layer *v, const float *residual, int l, int B,
                                   int T)
{
  wf_status st = WF_OK;
  const wf_ktable *k = m->k;
  int C = m->d.C, tp = m->s.tp, N = B * T, R = (int)wf__rows(m, (size_t)N);
  const float *x;
  k->layernorm_forward(v->ln1, v->ln1_mean, v->ln1_rstd, residual, P(m, G_LN1W, l), P(m, G_LN1B, l),
                       R, C, NULL);
  wf__round_operand(m, v->ln1, (size_t)R * C);
  WF_TRY(wf__enter_fwd(m, &x, v->ln1, m->da.full, (size_t)N, (size_t)C));
  k->matmul_forward(v->qkv, x, wf__gemm_weight(m, G_QKVW, l), P(m, G_QKVB, l), N, C, 3 * C / tp,
                    m->prec, NULL);
  k->attention_forward(v->atty, v->att, v->qkv, B, T, C / tp, m->NHl, NULL);
  wf__round_operand(m, v->atty, (size_t)N * C / tp);
  st = wf__row_parallel(m, v->res2, v->atty, G_ATTPROJW, G_ATTPROJB, l, N, C / tp);
fail:
  return st;
}

static wf_status mlp_forward(wf_model *m, const layer *v, const float *residual, float *res3, int l,
                             int N)
{
  wf_status st = WF_OK;
  const wf_ktable *k = m->k;
  int C = m->d.C, tp = m->s.tp, R = (int)wf__rows(m, (size_t)N);
  const float *x;
  k->residual_layernorm_forward(v->res2, v->ln2, v->ln2_mean, v->ln2_rstd, residual, v->res2,
                                P(m, G_LN2W, l), P(m, G_LN2B, l), R, C, NULL);
  wf__round_operand(m, v->ln2, (size_t)R * C);
  WF_TRY(wf__enter_fwd(m, &x, v->ln2, m->da.full, (size_t)N, (size_t)C));
  k->matmul_gelu_forward(v->fchg, v->fch, x, wf__gemm_weight(m, G_FCW, l), P(m, G_FCB, l), N, C,
                         4 * C / tp, m->prec, NULL);
  wf__round_operand(m, v->fchg, (size_t)N * 4 * C / tp);
  WF_TRY(wf__row_parallel(m, res3, v->fchg, G_FCPROJW, G_FCPROJB, l, N, 4 * C / tp));
  k->residual_forward(res3, v->res2, res3, (size_t)R * C, NULL);
fail:
  return st;
}

static wf_status block_forward(wf_model *m, float *saved, const float *x, float *y, int l, int B,
                               int T)
{
  wf_status st = WF_OK;
  layer v = layer_at(m, saved);
  WF_TRY(attention_forward(m, &v, x, l, B, T));
  st = mlp_forward(m, &v, x, y, l, B * T);
fail:
  return st;
}

/* Vocabulary-parallel embedding: each tp rank looks up the tokens in its rows of wte
 * (tp rank 0 adds the positions), and leaving the tp region sums the parts. */
static wf_status embed_forward(wf_model *m, wf__slot *a)
{
  return wf__embed_forward(m, a, G_WTE, G_WPE);
}

/* Final layernorm, then the tied wte's logits and the loss. */
static wf_status head_forward(wf_model *m, wf__slot *a, const float *x)
{
  head h;
  int C = m->d.C, R = (int)wf__rows(m, (size_t)a->B * a->T);
  carve_head(&h, a->head, &m->g);
  m->k->layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, P(m, G_LNFW, 0), P(m, G_LNFB, 0), R, C,
                          NULL);
  wf__round_operand(m, h.lnf, (size_t)R * C);
  return wf__head_loss_forward(m, a, h.lnf, G_WTE);
}

/* ---- backward ------------------------------------------------------------------------ */

/* MLP branch: the gradient of its output is the residual stream's (leave's backward). */
static wf_status mlp_backward(wf_model *m, const layer *v, const scratch *s, int l, int N)
{
  wf_status st = WF_OK;
  wf__dacts *g = &m->da;
  int C = m->d.C, tp = m->s.tp, R = (int)wf__rows(m, (size_t)N);
  size_t n4 = (size_t)N * 4 * C / tp;
  const float *dy, *x;
  WF_TRY(wf__leave_bwd(m, &dy, g->dres, g->full, (size_t)N, (size_t)C));
  dy = wf__rounded_grad(m, dy, (size_t)N * C);
  WF_TRY(wf__zero(m, s->d4a, n4));
  m->k->matmul_backward(s->d4a, G(m, G_FCPROJW, l), G(m, G_FCPROJB, l), dy, v->fchg,
                        wf__gemm_weight(m, G_FCPROJW, l), N, 4 * C / tp, C, m->prec, NULL);
  WF_TRY(wf__zero(m, s->d4b, n4));
  m->k->gelu_backward(s->d4b, v->fch, s->d4a, n4, NULL);
  WF_TRY(wf__enter_fwd(m, &x, v->ln2, g->full, (size_t)N, (size_t)C)); /* re-gathered */
  WF_TRY(wf__column_backward(m, s->d4b, x, G_FCW, G_FCB, l, N, 4 * C / tp));
  m->k->layernorm_backward(g->dres, G(m, G_LN2W, l), G(m, G_LN2B, l), g->dl, v->res2,
                           P(m, G_LN2W, l), v->ln2_mean, v->ln2_rstd, R, C, NULL);
fail:
  return st;
}

static wf_status attention_backward(wf_model *m, const layer *v, const scratch *s,
                                    const float *residual, int l, int B, int T)
{
  wf_status st = WF_OK;
  wf__dacts *g = &m->da;
  int C = m->d.C, tp = m->s.tp, N = B * T, R = (int)wf__rows(m, (size_t)N);
  const float *dy, *x;
  WF_TRY(wf__leave_bwd(m, &dy, g->dres, g->full, (size_t)N, (size_t)C));
  dy = wf__rounded_grad(m, dy, (size_t)N * C);
  WF_TRY(wf__zero(m, s->d4b, (size_t)N * C / tp));
  m->k->matmul_backward(s->d4b, G(m, G_ATTPROJW, l), G(m, G_ATTPROJB, l), dy, v->atty,
                        wf__gemm_weight(m, G_ATTPROJW, l), N, C / tp, C, m->prec, NULL);
  WF_TRY(wf__zero(m, s->d4a, (size_t)N * 3 * C / tp));
  m->k->attention_backward(s->d4a, s->scratch, s->d4b, v->qkv, v->att, B, T, C / tp, m->NHl, NULL);
  WF_TRY(wf__enter_fwd(m, &x, v->ln1, g->full, (size_t)N, (size_t)C));
  WF_TRY(wf__column_backward(m, s->d4a, x, G_QKVW, G_QKVB, l, N, 3 * C / tp));
  m->k->layernorm_backward(g->dres, G(m, G_LN1W, l), G(m, G_LN1B, l), g->dl, residual,
                           P(m, G_LN1W, l), v->ln1_mean, v->ln1_rstd, R, C, NULL);
fail:
  return st;
}

static wf_status block_backward(wf_model *m, float *saved, const float *x, int l, int B, int T)
{
  wf_status st = WF_OK;
  layer v = layer_at(m, saved);
  scratch s;
  carve_scratch(&s, m->da.fam, &m->g);
  WF_TRY(mlp_backward(m, &v, &s, l, B * T));
  st = attention_backward(m, &v, &s, x, l, B, T);
fail:
  return st;
}

/* Loss -> logits -> (tied wte, enter's backward) -> final layernorm -> dres. */
static wf_status head_backward(wf_model *m, wf__slot *a, const float *x, float dloss)
{
  wf_status st = WF_OK;
  head h;
  int C = m->d.C, R = (int)wf__rows(m, (size_t)a->B * a->T);
  carve_head(&h, a->head, &m->g);
  WF_TRY(wf__head_loss_backward(m, a, h.lnf, G_WTE, dloss));
  WF_TRY(wf__zero(m, m->da.dres, (size_t)R * C));
  m->k->layernorm_backward(m->da.dres, G(m, G_LNFW, 0), G(m, G_LNFB, 0), m->da.dl, x,
                           P(m, G_LNFW, 0), h.lnf_mean, h.lnf_rstd, R, C, NULL);
fail:
  return st;
}

/* The embeddings' backward (first chunk): the residual gradient leaves the tp region
 * and lands in this rank's vocabulary rows of wte and in wpe. */
static wf_status embed_backward(wf_model *m, wf__slot *a)
{
  return wf__embed_backward(m, a, G_WTE, G_WPE);
}

const wf__family_ops wf__gpt2_ops = {
    .layer_floats = layer_floats,
    .head_floats = head_floats,
    .scratch_floats = scratch_floats,
    .const_floats = const_floats,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .block_forward = block_forward,
    .block_backward = block_backward,
    .head_forward = head_forward,
    .head_backward = head_backward,
};
