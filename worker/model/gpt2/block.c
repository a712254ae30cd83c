/*
 * block.c - what the GPT-2 family computes: the vocabulary-parallel embedding (wte +
 * wpe), a pre-LayerNorm block with its tensor-parallel regions, the final layernorm
 * before the tied head, and their backward passes.
 *
 * A block is attention: ln1 (replicated region) -> enter -> qkv (column-parallel, local
 * heads) -> attention -> attproj (row-parallel) -> leave; then MLP: residual +
 * attention output -> ln2 (one fused op) -> enter -> fc and GELU (one fused op) ->
 * fcproj (row-parallel) -> leave -> residual. Every activation is stored in the model's
 * format (16 bits under mixed precision) by the kernel that makes it: the ones a
 * layer keeps (ln1, qkv, atty, attention's core state, res2, ln2, fch, fchg) and the
 * residual stream (res2, the layer's output); each row-parallel output is summed over
 * tp in fp32 (da.ysum) and added to the residual in fp32 before it is stored. The
 * statistics (means, rstds) stay fp32.
 *
 * Each sublayer's way in (its layernorm, entering the tp region) and out (the row-parallel
 * product), and their backward, are prenorm.c's, as is the head's layernorm.
 *
 * Backward copies no big tensor: the residual stream's gradient is one (R,C) buffer
 * (da.dres) that each layernorm backward adds into, and the outputs of the two
 * projections go through one (N,C) scratch buffer because backward never needs them.
 */
#include "gpt2_int.h"

/* One layer's saved intermediates, carved from its memory (the core state, att, beside
 * them or in the shared core buffer: wf__layer_mem); the backward scratch, from da.fam.
 * Activations (void *) are stored in the model's format. */
typedef struct layer {
  wf__norm ln1;     /* (R,C), its means and rstds (R) */
  void *qkv;        /* (N,3C/tp) */
  void *atty;       /* (N,C/tp) */
  void *att;        /* (attention_saved floats): the core state, as the table keeps it */
  void *res2;       /* (R,C) the residual after attention */
  wf__norm ln2;     /* (R,C), its means and rstds (R) */
  void *fch, *fchg; /* (N,4C/tp) fc's output and its GELU */
} layer;

typedef struct scratch {
  void *d4a;      /* (N,4C/tp) in the activation format: dfchg, then dqkv (N,3C/tp) */
  void *d4b;      /* (N,4C/tp) in the activation format: dfch, then datty (N,C/tp) or a
                   * recomputed attention output */
  float *scratch; /* (attention_scratch) attention backward scratch */
} scratch;

static size_t att_saved(const wf__geo *z)
{
  return wf__attention_saved(z, (int)(z->C / z->tp), z->NHl);
}

static size_t carve_layer(layer *v, wf__layer_mem mem, const wf__geo *z, size_t *core)
{
  size_t C = z->C, tp = z->tp, N = z->N, R = z->R;
  wf__carve_item t[] = {
      WF__ACT(&v->ln1.out, R * C),      WF__F32(&v->ln1.mean, R),
      WF__F32(&v->ln1.rstd, R),         WF__ACT(&v->qkv, N * 3 * C / tp),
      WF__ACT(&v->atty, N * C / tp),    WF__CORE(&v->att, att_saved(z)),
      WF__ACT(&v->res2, R * C),         WF__ACT(&v->ln2.out, R * C),
      WF__F32(&v->ln2.mean, R),         WF__F32(&v->ln2.rstd, R),
      WF__ACT(&v->fch, N * 4 * C / tp), WF__ACT(&v->fchg, N * 4 * C / tp),
  };
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem.saved, mem.core, z->fmt}, core);
}

static size_t carve_scratch(scratch *s, void *mem, const wf__geo *z)
{
  size_t n4 = z->N * 4 * z->C / z->tp;
  size_t att = wf__attention_scratch(z, (int)(z->C / z->tp), z->NHl);
  wf__carve_item t[] = {WF__ACT(&s->d4a, n4), WF__ACT(&s->d4b, n4), WF__F32(&s->scratch, att)};
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem, NULL, z->fmt}, NULL);
}

static size_t layer_floats(const wf__geo *z, size_t *core)
{
  return carve_layer(&(layer){0}, (wf__layer_mem){NULL, NULL, NULL}, z, core);
}

static size_t scratch_floats(const wf__geo *z) { return carve_scratch(&(scratch){0}, NULL, z); }
static size_t const_floats(const wf__geo *z) { return (void)z, 0; }

/* The carves at the model's geometry (Bmax x Tmax: a smaller micro-batch uses the first
 * rows of each), and the norms' tensors. */
static layer layer_at(const wf_model *m, wf__layer_mem mem)
{
  layer v;
  carve_layer(&v, mem, &m->g, NULL);
  v.ln1.w = G_LN1W, v.ln1.b = G_LN1B;
  v.ln2.w = G_LN2W, v.ln2.b = G_LN2B;
  return v;
}

static float *P(wf_model *m, int t, int l) { return wf_model_param(m, t, l, 0); }

/* ---- forward ------------------------------------------------------------------------ */

static wf_status attention_forward(wf_model *m, const layer *v, const void *residual, int l, int B,
                                   int T)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, tp = m->s.tp, N = B * T;
  const void *x;
  WF_TRY(wf__prenorm_forward(m, &v->ln1, &x, NULL, residual, l, N));
  WF_K(k, matmul)->forward(v->qkv, x, wf__gemm_weight(m, G_QKVW, l), P(m, G_QKVB, l), N, C,
                           3 * C / tp, m->prec, NULL);
  WF_TRY(wf__attention_forward(m, v->atty, v->att, v->qkv, B, T, C / tp, m->NHl, 0));
  st = wf__row_parallel(m, v->atty, G_ATTPROJW, G_ATTPROJB, l, N, C / tp);
fail:
  return st;
}

/* res2 = residual + attention's output (in da.ysum), ln2, the MLP, and the layer's
 * output res3 = res2 + the MLP's output. */
static wf_status mlp_forward(wf_model *m, const layer *v, const void *residual, void *res3, int l,
                             int N)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, tp = m->s.tp, R = (int)wf__rows(m, (size_t)N);
  const void *x;
  WF_TRY(wf__prenorm_forward(m, &v->ln2, &x, v->res2, residual, l, N));
  WF_K(k, matmul)->gelu_forward(v->fchg, v->fch, x, wf__gemm_weight(m, G_FCW, l), P(m, G_FCB, l), N,
                                C, 4 * C / tp, m->prec, NULL);
  WF_TRY(wf__row_parallel(m, v->fchg, G_FCPROJW, G_FCPROJB, l, N, 4 * C / tp));
  WF_K(k, residual)->forward(res3, v->res2, m->da.ysum, (size_t)R * C, NULL);
fail:
  return st;
}

static wf_status block_forward(wf_model *m, wf__layer_mem mem, const void *x, void *y, int l, int B,
                               int T)
{
  wf_status st = WF_OK;
  layer v = layer_at(m, mem);
  WF_TRY(attention_forward(m, &v, x, l, B, T));
  st = mlp_forward(m, &v, x, y, l, B * T);
fail:
  return st;
}

/* Selective recompute: attention's core state again from the qkv the slot kept (its
 * output, identical to the kept atty, lands in scratch). */
static wf_status core_forward(wf_model *m, wf__layer_mem mem, int l, int B, int T)
{
  layer v = layer_at(m, mem);
  scratch s;
  carve_scratch(&s, m->da.fam, &m->g);
  (void)l;
  return wf__attention_forward(m, s.d4b, v.att, v.qkv, B, T, m->d.C / m->s.tp, m->NHl, 0);
}

/* Vocabulary-parallel embedding: each tp rank looks up the tokens in its rows of wte
 * (tp rank 0 adds the positions), leaving the tp region sums the parts, and the sum is
 * stored as the stage's input. */
static wf_status embed_forward(wf_model *m, wf__slot *a)
{
  return wf__embed_forward(m, a, G_WTE, G_WPE);
}

/* Final layernorm, then the tied wte's logits and the loss. */
static wf_status head_forward(wf_model *m, wf__slot *a, const void *x)
{
  return wf__head_forward(m, a, x, G_LNFW, G_LNFB, G_WTE);
}

/* ---- backward ------------------------------------------------------------------------ */

/* MLP branch: the gradient of its output is the residual stream's (leave's backward). */
static wf_status mlp_backward(wf_model *m, const layer *v, const scratch *s, int l, int N)
{
  wf_status st = WF_OK;
  int F = 4 * m->d.C / m->s.tp;
  WF_TRY(wf__row_parallel_backward(m, s->d4a, v->fchg, G_FCPROJW, G_FCPROJB, l, N, F));
  WF_K(m->k, gelu)->backward(s->d4b, v->fch, s->d4a, (size_t)N * F, NULL); /* activation format */
  st = wf__prenorm_backward(m, &v->ln2, s->d4b, G_FCW, G_FCB, F, v->res2, l, N);
fail:
  return st;
}

static wf_status attention_backward(wf_model *m, const layer *v, const scratch *s,
                                    const void *residual, int l, int B, int T)
{
  wf_status st = WF_OK;
  int C = m->d.C, tp = m->s.tp;
  void *datty = s->d4b;
  WF_TRY(wf__row_parallel_backward(m, datty, v->atty, G_ATTPROJW, G_ATTPROJB, l, B * T, C / tp));
  WF_TRY(wf__attention_backward(m, s->d4a, s->scratch, datty, v->qkv, v->att, v->atty, B, T, C / tp,
                                m->NHl, 0));
  st = wf__prenorm_backward(m, &v->ln1, s->d4a, G_QKVW, G_QKVB, 3 * C / tp, residual, l, B * T);
fail:
  return st;
}

static wf_status block_backward(wf_model *m, wf__layer_mem mem, const void *x, int l, int B, int T)
{
  wf_status st = WF_OK;
  layer v = layer_at(m, mem);
  scratch s;
  carve_scratch(&s, m->da.fam, &m->g);
  WF_TRY(mlp_backward(m, &v, &s, l, B * T));
  st = attention_backward(m, &v, &s, x, l, B, T);
fail:
  return st;
}

/* Loss -> logits -> (tied wte, enter's backward) -> final layernorm -> dres. */
static wf_status head_backward(wf_model *m, wf__slot *a, const void *x, float dloss)
{
  return wf__head_backward(m, a, x, G_LNFW, G_LNFB, G_WTE, dloss);
}

/* The embeddings' backward (first chunk): the residual gradient leaves the tp region
 * and lands in this rank's vocabulary rows of wte and in wpe. */
static wf_status embed_backward(wf_model *m, wf__slot *a)
{
  return wf__embed_backward(m, a, G_WTE, G_WPE);
}

/* The ops GPT-2's blocks, embeddings and head call (besides the engine's: model.c). */
static const wf_op_id kernels[] = {WF_OP_embedding, WF_OP_position, WF_OP_layernorm, WF_OP_matmul,
                                   WF_OP_attention, WF_OP_gelu,     WF_OP_residual,  WF_OP_xent};

const wf__family_ops wf__gpt2_ops = {
    .kernels = kernels,
    .n_kernels = (int)(sizeof kernels / sizeof *kernels),
    .norm = WF__LAYERNORM,
    .layer_floats = layer_floats,
    .head_floats = wf__head_floats,
    .scratch_floats = scratch_floats,
    .const_floats = const_floats,
    .embed_forward = embed_forward,
    .embed_backward = embed_backward,
    .block_forward = block_forward,
    .core_forward = core_forward,
    .block_backward = block_backward,
    .head_forward = head_forward,
    .head_backward = head_backward,
};
