/*
 * block.c - what the Llama family computes: the vocabulary-parallel embedding, a block
 * (RMSNorm, grouped-query attention with RoPE, SwiGLU MLP) with its tensor-parallel
 * regions, the final RMSNorm before the head, and their backward passes.
 *
 * Attention: n1 = rmsnorm(x) (replicated region) -> enter -> qkv (column-parallel: the
 * local q heads, then the local kv heads) -> RoPE on q and k, in place -> grouped-query
 * attention -> o (row-parallel) -> leave. MLP: x + attention -> n2 = rmsnorm (one fused
 * op) -> enter -> [gate | up] (column-parallel) -> silu(gate) * up -> down (row-
 * parallel) -> leave -> residual. Every activation is stored in the model's format (16
 * bits under mixed precision) by the kernel that makes it: the ones a layer keeps (n1,
 * qkv, rotated in place, atty, attention's core state, res2, n2, gu, h) and the residual
 * stream; each row-parallel output is summed over tp in fp32 (da.ysum) and added to the
 * residual in fp32 before it is stored. The rstds stay fp32.
 *
 * Each sublayer's way in (its RMSNorm, entering the tp region) and out (the row-parallel
 * product), and their backward, are prenorm.c's, as is the head's RMSNorm.
 *
 * RoPE's angles are one table (T, hs) for the model (wf_rope_table, Hugging Face's
 * fp32 rounding), made on the host at creation and kept on the device (the family's
 * constant floats); backward needs only the angles, so the saved qkv is the rotated one
 * attention's backward reads.
 */
#include <stdlib.h>

#include "llama_int.h"
#include "wf_kernels.h" /* wf_rope_table */

/* One layer's saved intermediates (layer_floats; attention's core state, att, beside
 * them or in the shared core buffer: wf__layer_mem), the head's, backward's scratch.
 * Activations (void *) are stored in the model's format (storage.h), the rest fp32. */
typedef struct layer {
  wf__norm n1; /* (R,C), its rstds (R) */
  void *qkv;   /* (N, (NH + 2 KV) hs / tp), q and k rotated */
  void *atty;  /* (N, NH hs / tp) */
  void *att;   /* (attention_saved floats): the core state, as the table keeps it */
  void *res2;  /* (R,C) the residual after attention */
  wf__norm n2; /* (R,C), its rstds (R) */
  void *gu;    /* (N, 2F/tp) [gate | up] */
  void *h;     /* (N, F/tp) silu(gate) * up */
} layer;

typedef struct scratch {
  void *da;       /* (N, max(2F, (NH + 2 KV) hs) / tp): dgu, then dqkv */
  void *db;       /* (N, max(F, NH hs) / tp): dh, then datty; a recomputed attention output */
  float *scratch; /* (attention_scratch) */
} scratch;

static size_t hs_of(const wf__geo *z) { return (size_t)(z->d.C / z->d.NH); }
static size_t q_local(const wf__geo *z) { return (size_t)z->NHl * hs_of(z); }
static size_t qkv_local(const wf__geo *z) { return (size_t)(z->NHl + 2 * z->KVl) * hs_of(z); }
static size_t f_local(const wf__geo *z) { return (size_t)z->d.F / z->tp; }

static size_t carve_layer(layer *v, wf__layer_mem mem, const wf__geo *z, size_t *core)
{
  size_t C = z->C, N = z->N, R = z->R, F = f_local(z);
  size_t att = wf__attention_saved(z, (int)q_local(z), z->NHl);
  wf__carve_item t[] = {
      WF__ACT(&v->n1.out, R * C),
      WF__F32(&v->n1.rstd, R),
      WF__ACT(&v->qkv, N * qkv_local(z)),
      WF__ACT(&v->atty, N * q_local(z)),
      WF__CORE(&v->att, att),
      WF__ACT(&v->res2, R * C),
      WF__ACT(&v->n2.out, R * C),
      WF__F32(&v->n2.rstd, R),
      WF__ACT(&v->gu, N * 2 * F),
      WF__ACT(&v->h, N * F),
  };
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem.saved, mem.core, z->fmt}, core);
}

static size_t carve_scratch(scratch *s, void *mem, const wf__geo *z)
{
  size_t N = z->N, F = f_local(z);
  size_t att = wf__attention_scratch(z, (int)q_local(z), z->NHl);
  wf__carve_item t[] = {WF__ACT(&s->da, N * WF_MAX(2 * F, qkv_local(z))),
                        WF__ACT(&s->db, N * WF_MAX(F, q_local(z))), WF__F32(&s->scratch, att)};
  return wf__carve(t, WF_ARRAY_LEN(t), &(wf__carve_to){mem, NULL, z->fmt}, NULL);
}

static size_t layer_floats(const wf__geo *z, size_t *core)
{
  return carve_layer(&(layer){0}, (wf__layer_mem){NULL, NULL, NULL}, z, core);
}
static size_t scratch_floats(const wf__geo *z) { return carve_scratch(&(scratch){0}, NULL, z); }
/* RoPE's (T, hs) table for the longest micro-batch (its whole sequence under context
 * parallelism, whose rows sit anywhere in it). */
static size_t const_floats(const wf__geo *z) { return z->T * z->cp * hs_of(z); }

/* The table, made on the host as Hugging Face rounds it and copied to the device. */
static wf_status prepare(wf_model *m)
{
  wf_status st = WF_OK;
  size_t n = const_floats(&m->g);
  float *cs = NULL;
  WF_CHECK_ALLOC(cs = malloc(n * sizeof *cs));
  wf_rope_table(cs, m->Tmax * (int)m->g.cp, (int)hs_of(&m->g), m->d.rope_theta, &m->d.rope_scaling);
  st = wf_dev_copy(m->dev, m->da.consts, cs, n * sizeof *cs, WF_COPY_H2D, NULL);
fail:
  free(cs);
  return st;
}

/* The carves at the model's geometry (Bmax x Tmax: a smaller micro-batch uses the first
 * rows of each), and the norms' tensors. */
static layer layer_at(const wf_model *m, wf__layer_mem mem)
{
  layer v;
  carve_layer(&v, mem, &m->g, NULL);
  v.n1.w = LL_LN1W, v.n1.b = -1;
  v.n2.w = LL_LN2W, v.n2.b = -1;
  return v;
}

/* The tensor the head multiplies by: its own, or the tied embedding. */
static int head_tensor(const wf_model *m) { return m->desc.n > LL_HEAD ? LL_HEAD : LL_EMB; }

/* ---- forward ------------------------------------------------------------------------ */

static wf_status attention_forward(wf_model *m, const layer *v, const void *x, int l, int B, int T)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, N = B * T, hs = (int)hs_of(&m->g);
  int q = (int)q_local(&m->g), qkv = (int)qkv_local(&m->g);
  const void *xin;
  WF_TRY(wf__prenorm_forward(m, &v->n1, &xin, NULL, x, l, N));
  WF_K(k, matmul)->forward(v->qkv, xin, wf__gemm_weight(m, LL_QKVW, l), NULL, N, C, qkv, m->prec,
                           NULL);
  wf__rope_forward(m, v->qkv, B, T, hs);
  WF_TRY(wf__attention_forward(m, v->atty, v->att, v->qkv, B, T, q, m->NHl, m->KVl));
  st = wf__row_parallel(m, v->atty, LL_OW, -1, l, N, q);
fail:
  return st;
}

/* res2 = x + attention's output (in da.ysum), n2, the MLP, and the layer's output
 * y = res2 + the MLP's output. */
static wf_status mlp_forward(wf_model *m, const layer *v, const void *x, void *y, int l, int N)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, R = (int)wf__rows(m, (size_t)N), F = (int)f_local(&m->g);
  const void *xin;
  WF_TRY(wf__prenorm_forward(m, &v->n2, &xin, v->res2, x, l, N));
  WF_K(k, matmul)->forward(v->gu, xin, wf__gemm_weight(m, LL_GUW, l), NULL, N, C, 2 * F, m->prec,
                           NULL);
  WF_K(k, swiglu)->forward(v->h, v->gu, N, F, NULL);
  WF_TRY(wf__row_parallel(m, v->h, LL_DOWNW, -1, l, N, F));
  WF_K(k, residual)->forward(y, v->res2, m->da.ysum, (size_t)R * C, NULL);
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

/* Selective recompute: attention's core state again from the qkv the slot kept (rotated
 * already; its output, identical to the kept atty, lands in scratch). */
static wf_status core_forward(wf_model *m, wf__layer_mem mem, int l, int B, int T)
{
  layer v = layer_at(m, mem);
  scratch s;
  carve_scratch(&s, m->da.fam, &m->g);
  (void)l;
  return wf__attention_forward(m, s.db, v.att, v.qkv, B, T, (int)q_local(&m->g), m->NHl, m->KVl);
}

/* Vocabulary-parallel embedding (no positions: RoPE turns q and k instead). */
static wf_status embed_forward(wf_model *m, wf__slot *a)
{
  return wf__embed_forward(m, a, LL_EMB, -1);
}

static wf_status head_forward(wf_model *m, wf__slot *a, const void *x)
{
  return wf__head_forward(m, a, x, LL_NORMW, -1, head_tensor(m));
}

/* ---- backward ------------------------------------------------------------------------ */

static wf_status mlp_backward(wf_model *m, const layer *v, const scratch *s, int l, int N)
{
  wf_status st = WF_OK;
  int F = (int)f_local(&m->g);
  WF_TRY(wf__row_parallel_backward(m, s->db, v->h, LL_DOWNW, -1, l, N, F));
  WF_K(m->k, swiglu)->backward(s->da, v->gu, s->db, N, F, NULL);
  st = wf__prenorm_backward(m, &v->n2, s->da, LL_GUW, -1, 2 * F, v->res2, l, N);
fail:
  return st;
}

static wf_status attention_backward(wf_model *m, const layer *v, const scratch *s, const void *x,
                                    int l, int B, int T)
{
  wf_status st = WF_OK;
  int N = B * T, hs = (int)hs_of(&m->g);
  int q = (int)q_local(&m->g), qkv = (int)qkv_local(&m->g);
  WF_TRY(wf__row_parallel_backward(m, s->db, v->atty, LL_OW, -1, l, N, q));
  WF_TRY(wf__attention_backward(m, s->da, s->scratch, s->db, v->qkv, v->att, v->atty, B, T, q,
                                m->NHl, m->KVl));
  wf__rope_backward(m, s->da, B, T, hs);
  st = wf__prenorm_backward(m, &v->n1, s->da, LL_QKVW, -1, qkv, x, l, N);
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

static wf_status head_backward(wf_model *m, wf__slot *a, const void *x, float dloss)
{
  return wf__head_backward(m, a, x, LL_NORMW, -1, head_tensor(m), dloss);
}

static wf_status embed_backward(wf_model *m, wf__slot *a)
{
  return wf__embed_backward(m, a, LL_EMB, -1);
}

/* The ops Llama's blocks, embedding and head call (besides the engine's: model.c). */
static const wf_op_id kernels[] = {WF_OP_embedding, WF_OP_rmsnorm, WF_OP_matmul,   WF_OP_attention,
                                   WF_OP_rope,      WF_OP_swiglu,  WF_OP_residual, WF_OP_xent};

const wf__family_ops wf__llama_ops = {
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
};
