/*
 * ops.c - the pieces of a Megatron block that every family is built from: crossing the
 * tensor-parallel regions (through the operators worker/parallel gives the model, the
 * identity without them), the row-parallel product, the column-parallel backward, and
 * the vocabulary-parallel head with its cross-entropy loss.
 *
 * The model never communicates itself: every collective is behind m->tp (wf_tp_ops).
 * With tp = 1 the operators are the identity here, which copies where the caller asked
 * for a result in another buffer (so the two paths leave the same bytes in the same
 * places). Entering forward moves activations (the model's format); everything else
 * here moves fp32: partial sums and gradients.
 */
#include "model_int.h"

/* ---- tensor-parallel regions ------------------------------------------------------- */

static wf_status copy(wf_model *m, float *dst, const float *src, size_t n)
{
  if (dst == src)
    return WF_OK;
  return wf_dev_copy(m->dev, dst, src, n * sizeof(float), WF_COPY_D2D, NULL);
}

wf_status wf__enter_fwd(wf_model *m, const void **out, const void *x, void *full, size_t N,
                        size_t C)
{
  if (m->tp.ops)
    return m->tp.ops->enter_fwd(m->tp.ctx, out, x, full, N, C, (int)m->prec);
  *out = x;
  return WF_OK;
}

wf_status wf__enter_bwd(wf_model *m, float *dx, float *dfull, size_t N, size_t C)
{
  if (m->tp.ops)
    return m->tp.ops->enter_bwd(m->tp.ctx, dx, dfull, N, C);
  return copy(m, dx, dfull, N * C);
}

wf_status wf__leave_fwd(wf_model *m, float *y, float *partial, size_t N, size_t C)
{
  if (m->tp.ops)
    return m->tp.ops->leave_fwd(m->tp.ctx, y, partial, N, C);
  return copy(m, y, partial, N * C);
}

wf_status wf__leave_bwd(wf_model *m, const float **out, const float *dy, float *full, size_t N,
                        size_t C)
{
  if (m->tp.ops)
    return m->tp.ops->leave_bwd(m->tp.ctx, out, dy, full, N, C);
  *out = dy;
  return WF_OK;
}

wf_status wf__tp_sum(wf_model *m, float *x, size_t n)
{
  return m->tp.ops ? m->tp.ops->sum(m->tp.ctx, x, n) : WF_OK;
}

wf_status wf__zero(wf_model *m, float *p, size_t n)
{
  return wf_dev_memset(m->dev, p, 0, n * sizeof *p, NULL);
}

/* ---- the two halves of a tensor-parallel region ---------------------------------------- */

/* Where a row-parallel product lands before its sum over tp: da.proj under tensor
 * parallelism, else da.ysum itself (the sum of one part; da.proj is not carved). */
static float *partial_out(wf_model *m) { return m->tp.ops ? m->da.proj : m->da.ysum; }

float *wf__partial(wf_model *m) { return partial_out(m); }

wf_status wf__row_parallel(wf_model *m, const void *x, int w, int b, int l, int N, int IC)
{
  int C = m->d.C;
  const float *bias = b >= 0 && m->s.tp_rank == 0 ? wf_model_param(m, b, l, 0) : NULL;
  float *part = partial_out(m);
  WF_K(m->k, matmul)->forward_f32(part, x, wf__gemm_weight(m, w, l), bias, N, IC, C, m->prec, NULL);
  return wf__leave_fwd(m, m->da.ysum, part, (size_t)N, (size_t)C);
}

/* The GEMM writes its dinp in fp32 (matmul.h): straight into da.dl without tensor
 * parallelism, else into da.dc, which entering's backward reduces over tp into da.dl. */
wf_status wf__column_backward(wf_model *m, const void *dout, const void *x, int w, int b, int l,
                              int N, int OC)
{
  int C = m->d.C;
  float *dx = m->tp.ops ? m->da.dc : m->da.dl;
  WF_K(m->k, matmul)
      ->backward_f32(dx, wf_model_param(m, w, l, 1), b >= 0 ? wf_model_param(m, b, l, 1) : NULL,
                     dout, x, wf__gemm_weight(m, w, l), N, C, OC, m->prec, NULL);
  return wf__enter_bwd(m, m->da.dl, dx, (size_t)N, (size_t)C);
}

/* ---- positions and attention ---------------------------------------------------------- */

int wf_cp_position(int cp, int rank, int T, int t)
{
  if (cp <= 1)
    return t;
  int c = T / 2;
  return t < c ? rank * c + t : (2 * cp - 1 - rank) * c + (t - c);
}

/* The runs of consecutive positions in a sequence of T local rows: rows [row, row + n)
 * are positions [pos, pos + n). One run without context parallelism, else two. */
typedef struct span {
  int row, pos, n;
} span;

static int spans_of(const wf_model *m, int T, span sp[2])
{
  int cp = m->s.cp;
  if (cp <= 1) {
    sp[0] = (span){0, 0, T};
    return 1;
  }
  for (int i = 0; i < 2; i++)
    sp[i] = (span){i * T / 2, wf_cp_position(cp, m->s.cp_rank, T, i * T / 2), T / 2};
  return 2;
}

/* Elements of one qkv row (local q heads, then k and v heads). */
static size_t qkv_width(const wf_model *m, int hs) { return (size_t)(m->NHl + 2 * m->KVl) * hs; }

static void rope_apply(wf_model *m, void *qkv, int B, int T, int hs, bool backward)
{
  span sp[2];
  int n = spans_of(m, T, sp);
  size_t row = qkv_width(m, hs) * m->esize;
  if (m->mb_pos) { /* packed documents: each row's own position */
    if (backward)
      WF_K(m->k, rope)->backward(qkv, m->da.consts, m->mb_pos, B, T, m->NHl, m->KVl, hs, NULL);
    else
      WF_K(m->k, rope)->forward(qkv, m->da.consts, m->mb_pos, B, T, m->NHl, m->KVl, hs, NULL);
    return;
  }
  for (int b = 0; b < (n > 1 ? B : 1); b++)
    for (int i = 0; i < n; i++) {
      char *x = (char *)qkv + ((size_t)b * T + (size_t)sp[i].row) * row;
      const float *cs = m->da.consts + (size_t)sp[i].pos * hs;
      int nb = n > 1 ? 1 : B, t = n > 1 ? sp[i].n : T; /* one call for all rows without cp */
      if (backward)
        WF_K(m->k, rope)->backward(x, cs, NULL, nb, t, m->NHl, m->KVl, hs, NULL);
      else
        WF_K(m->k, rope)->forward(x, cs, NULL, nb, t, m->NHl, m->KVl, hs, NULL);
    }
}

void wf__rope_forward(wf_model *m, void *qkv, int B, int T, int hs)
{
  rope_apply(m, qkv, B, T, hs, false);
}

void wf__rope_backward(wf_model *m, void *dqkv, int B, int T, int hs)
{
  rope_apply(m, dqkv, B, T, hs, true);
}

size_t wf__attention_saved(const wf__geo *g, int Cq, int NH)
{
  if (g->cp > 1)
    return g->B * (size_t)NH * g->T;
  return WF_K(g->k, attention)->saved((int)g->B, (int)g->T, Cq, NH);
}

size_t wf__attention_scratch(const wf__geo *g, int Cq, int NH)
{
  return g->cp > 1 ? 0 : WF_K(g->k, attention)->scratch((int)g->B, (int)g->T, Cq, NH);
}

wf_status wf__attention_forward(wf_model *m, void *out, void *att, const void *qkv, int B, int T,
                                int Cq, int NH, int NKV)
{
  if (m->cp.ops)
    return m->cp.ops->forward(m->cp.ctx, out, att, qkv, B, T, Cq, NH, NKV ? NKV : NH, (int)m->prec);
  WF_K(m->k, attention)->forward(out, att, qkv, m->mb_starts, B, T, Cq, NH, NKV ? NKV : NH, NULL);
  return WF_OK;
}

wf_status wf__attention_backward(wf_model *m, void *dqkv, float *scratch, const void *dout,
                                 const void *qkv, const void *att, const void *out, int B, int T,
                                 int Cq, int NH, int NKV)
{
  if (m->cp.ops)
    return m->cp.ops->backward(m->cp.ctx, dqkv, dout, qkv, out, att, B, T, Cq, NH, NKV ? NKV : NH,
                               (int)m->prec);
  WF_K(m->k, attention)
      ->backward(dqkv, scratch, dout, qkv, att, m->mb_starts, B, T, Cq, NH, NKV ? NKV : NH, NULL);
  return WF_OK;
}

/* ---- the vocabulary-parallel head ----------------------------------------------------- */

/* Combine the tp ranks' row statistics of the vocabulary-parallel softmax: the global
 * max M, sum_r sumexp_r * exp(max_r - M), and the target logit of the rank holding the
 * target. One all-gather of 3 floats per row; nobody holds full-vocabulary logits. */
static wf_status xent_combine(wf_model *m, wf__slot *a, int N)
{
  wf_status st = WF_OK;
  int tp = m->s.tp;
  if (tp == 1 || !m->tp.ops)
    return WF_OK;
  float *all = m->da.stats, *mine = all + (size_t)3 * tp * N; /* (tp,N,3) then (N,3) */
  WF_K(m->k, xent)->pack(mine, a->row_max, a->row_sumexp, a->target_logit, N, NULL);
  WF_TRY(m->tp.ops->gather(m->tp.ctx, mine, all, (size_t)3 * N));
  WF_K(m->k, xent)->combine(a->row_max, a->row_sumexp, a->target_logit, all, N, tp, NULL);
fail:
  return st;
}

wf_status wf__head_loss_forward(wf_model *m, wf__slot *a, const void *xn, int w)
{
  wf_status st = WF_OK;
  const wf_kset *k = m->k;
  int C = m->d.C, N = a->B * a->T;
  const void *x;
  WF_TRY(wf__enter_fwd(m, &x, xn, m->da.full, (size_t)N, (size_t)C));
  /* padding rows of the weight give padding columns the loss ignores */
  WF_K(k, matmul)->forward(a->logits, x, wf__gemm_weight(m, w, 0), NULL, N, C, m->Vl, m->prec,
                           NULL);
  if (!a->have_targets)
    return WF_OK;
  WF_K(k, xent)->stats(a->row_max, a->row_sumexp, a->target_logit, a->logits, a->targets, N,
                       wf__local_real_vocab(m), m->Vl, m->s.tp_rank * m->Vl, NULL);
  WF_TRY(xent_combine(m, a, N));
  WF_K(k, xent)->loss(a->losses, a->row_max, a->row_sumexp, a->target_logit, N, NULL);
  WF_K(k, xent)->accumulate(m->loss_acc, a->losses, N, NULL);
fail:
  return st;
}

wf_status wf__head_loss_backward(wf_model *m, wf__slot *a, const void *xn, int w, float dloss)
{
  wf_status st = WF_OK;
  int N = a->B * a->T, C = m->d.C;
  const void *x;
  /* loss_scale is 1 unless fp16 loss scaling is on: x * 1.0f is x, bit for bit. */
  WF_K(m->k, xent)
      ->backward(a->logits, a->logits, a->row_max, a->row_sumexp, a->targets,
                 dloss * m->loss_scale / (float)N, N, wf__local_real_vocab(m), m->Vl,
                 m->s.tp_rank * m->Vl, NULL);
  WF_TRY(wf__enter_fwd(m, &x, xn, m->da.full, (size_t)N, (size_t)C));
  st = wf__column_backward(m, a->logits, x, w, -1, 0, N, m->Vl); /* dlogits: already stored */
fail:
  return st;
}

/* The embedding's lookup (backward: its gradients) of a micro-batch, a span of positions
 * at a time: context parallelism's two chunks each read their own rows of wpe (one call
 * for the whole micro-batch without it); packed documents give each row its own
 * position (the slot's, one call). */
static void embed_spans(wf_model *m, wf__slot *a, float *part, const float *dout, int wte, int wpe)
{
  span sp[2];
  int n = spans_of(m, a->T, sp), C = m->d.C, T = a->T;
  bool fwd = part != NULL, pos = wpe >= 0 && (!fwd || m->s.tp_rank == 0);
  if (a->has_docs) {
    size_t N = (size_t)a->B * T;
    float *w = wf_model_param(m, wte, 0, fwd ? 0 : 1);
    float *p = pos ? wf_model_param(m, wpe, 0, fwd ? 0 : 1) : NULL;
    if (fwd)
      WF_K(m->k, embedding)
          ->forward(part, a->inputs, w, m->s.tp_rank * m->Vl, m->Vl, (int)N, C, NULL);
    else
      WF_K(m->k, embedding)
          ->backward(w, dout, a->inputs, m->s.tp_rank * m->Vl, m->Vl, (int)N, C, NULL);
    if (p && fwd)
      WF_K(m->k, position)->forward(part, p, a->pos, a->B, T, C, NULL);
    else if (p)
      WF_K(m->k, position)->backward(p, dout, a->pos, a->B, T, C, NULL);
    return;
  }
  for (int b = 0; b < (n > 1 ? a->B : 1); b++)
    for (int i = 0; i < n; i++) {
      size_t r = (size_t)b * T + (size_t)sp[i].row;
      int nb = n > 1 ? 1 : a->B, t = n > 1 ? sp[i].n : T;
      float *w = wf_model_param(m, wte, 0, fwd ? 0 : 1);
      float *p = pos ? wf_model_param(m, wpe, 0, fwd ? 0 : 1) + (size_t)sp[i].pos * C : NULL;
      if (fwd) {
        WF_K(m->k, embedding)
            ->forward(part + r * C, a->inputs + r, w, m->s.tp_rank * m->Vl, m->Vl, nb * t, C, NULL);
        if (p)
          WF_K(m->k, position)->forward(part + r * C, p, NULL, nb, t, C, NULL);
      } else {
        WF_K(m->k, embedding)
            ->backward(w, dout + r * C, a->inputs + r, m->s.tp_rank * m->Vl, m->Vl, nb * t, C,
                       NULL);
        if (p)
          WF_K(m->k, position)->backward(p, dout + r * C, NULL, nb, t, C, NULL);
      }
    }
}

wf_status wf__embed_forward(wf_model *m, wf__slot *a, int wte, int wpe)
{
  wf_status st = WF_OK;
  int N = a->B * a->T, C = m->d.C;
  float *part = partial_out(m);
  embed_spans(m, a, part, NULL, wte, wpe);
  /* summed over tp in fp32, then stored in the model's format */
  WF_TRY(wf__leave_fwd(m, m->da.ysum, part, (size_t)N, (size_t)C));
  WF_K(m->k, cast)->store(a->encoded, m->da.ysum, wf__rows(m, (size_t)N) * (size_t)C, NULL);
fail:
  return st;
}

wf_status wf__embed_backward(wf_model *m, wf__slot *a, int wte, int wpe)
{
  wf_status st = WF_OK;
  int C = m->d.C, N = a->B * a->T;
  const float *dout;
  WF_TRY(wf__leave_bwd(m, &dout, m->da.dres, m->da.full, (size_t)N, (size_t)C));
  embed_spans(m, a, NULL, dout, wte, wpe);
fail:
  return st;
}
