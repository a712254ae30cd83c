/*
 * backward.c - the backward pass of a model chunk, adding into the gradients.
 *
 * The hot path copies no big tensor: the logits buffer becomes the logits' gradient in
 * place, the residual stream's gradient is one (R,C) buffer that each layernorm
 * backward adds into, and the outputs of the two projections go through one (N,C)
 * scratch buffer because backward never needs them. Under activation checkpointing a
 * layer's intermediates are recomputed (wf__block_forward) right before its backward.
 * As each group of gradients becomes final the grad hook hears of it, so data
 * parallelism can start reducing while the rest of backward runs.
 */
#include <string.h>

#include "model_int.h"

static wf_status zero(wf_gpt *m, float *p, size_t n)
{
  return wf_dev_memset(m->dev, p, 0, n * sizeof *p, NULL);
}

/* Once ZeRO-2 dropped the flat buffer the gradient windows' owner zeroes them. */
wf_status wf_gpt_zero_grad(wf_gpt *m)
{
  return m->grads ? zero(m, m->grads, m->num_params) : WF_OK;
}

/* Column-parallel matmul backward from the full input x: the input gradient is this
 * rank's partial sum (dc), which entering's backward completes over tp into dl. dout
 * (N,OC) is scratch that only this GEMM reads, so mixed precision rounds it in place. */
static wf_status column_backward(wf_gpt *m, float *dout, const float *x, wf_param_kind w,
                                 wf_param_kind b, int l, int N, int OC)
{
  wf_status st = WF_OK;
  int C = m->d.C;
  wf__round_operand(m, dout, (size_t)N * OC);
  WF_TRY(zero(m, m->da.dc, (size_t)N * C));
  m->k->matmul_backward(m->da.dc, wf_gpt_param(m, w, l, 1),
                        b == WF_GPT_NUM_KINDS ? NULL : wf_gpt_param(m, b, l, 1), dout, x,
                        wf__gemm_weight(m, w, l), N, C, OC, m->prec, NULL);
  st = wf__tp_enter_bwd(&m->tp, m->da.dl, m->da.dc, (size_t)N, (size_t)C);
fail:
  return st;
}

/* MLP branch: the gradient of its output is the residual stream's (leave's backward). */
static wf_status mlp_backward(wf_gpt *m, const wf__layer *v, int l, int N)
{
  wf_status st = WF_OK;
  wf__dacts *g = &m->da;
  int C = m->d.C, tp = m->s.tp, R = (int)wf__tp_rows(&m->tp, (size_t)N);
  size_t n4 = (size_t)N * 4 * C / tp;
  const float *dy, *x;
  WF_TRY(wf__tp_leave_bwd(&m->tp, &dy, g->dres, g->full, (size_t)N, (size_t)C));
  dy = wf__rounded_grad(m, dy, (size_t)N * C);
  WF_TRY(zero(m, g->d4a, n4));
  m->k->matmul_backward(g->d4a, wf_gpt_param(m, WF_P_FCPROJW, l, 1),
                        wf_gpt_param(m, WF_P_FCPROJB, l, 1), dy, v->fchg,
                        wf__gemm_weight(m, WF_P_FCPROJW, l), N, 4 * C / tp, C, m->prec, NULL);
  WF_TRY(zero(m, g->d4b, n4));
  m->k->gelu_backward(g->d4b, v->fch, g->d4a, n4, NULL);
  WF_TRY(wf__tp_enter_fwd(&m->tp, &x, v->ln2, g->full, (size_t)N, (size_t)C)); /* re-gathered */
  WF_TRY(column_backward(m, g->d4b, x, WF_P_FCW, WF_P_FCB, l, N, 4 * C / tp));
  m->k->layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LN2W, l, 1),
                           wf_gpt_param(m, WF_P_LN2B, l, 1), g->dl, v->res2,
                           wf_gpt_param(m, WF_P_LN2W, l, 0), v->ln2_mean, v->ln2_rstd, R, C, NULL);
fail:
  return st;
}

static wf_status attention_backward(wf_gpt *m, const wf__layer *v, const float *residual, int l,
                                    int B, int T)
{
  wf_status st = WF_OK;
  wf__dacts *g = &m->da;
  int C = m->d.C, tp = m->s.tp, N = B * T, R = (int)wf__tp_rows(&m->tp, (size_t)N);
  const float *dy, *x;
  WF_TRY(wf__tp_leave_bwd(&m->tp, &dy, g->dres, g->full, (size_t)N, (size_t)C));
  dy = wf__rounded_grad(m, dy, (size_t)N * C);
  WF_TRY(zero(m, g->d4b, (size_t)N * C / tp));
  m->k->matmul_backward(g->d4b, wf_gpt_param(m, WF_P_ATTPROJW, l, 1),
                        wf_gpt_param(m, WF_P_ATTPROJB, l, 1), dy, v->atty,
                        wf__gemm_weight(m, WF_P_ATTPROJW, l), N, C / tp, C, m->prec, NULL);
  WF_TRY(zero(m, g->d4a, (size_t)N * 3 * C / tp));
  m->k->attention_backward(g->d4a, g->scratch, g->d4b, v->qkv, v->att, B, T, C / tp, m->NHl, NULL);
  WF_TRY(wf__tp_enter_fwd(&m->tp, &x, v->ln1, g->full, (size_t)N, (size_t)C));
  WF_TRY(column_backward(m, g->d4a, x, WF_P_QKVW, WF_P_QKVB, l, N, 3 * C / tp));
  m->k->layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LN1W, l, 1),
                           wf_gpt_param(m, WF_P_LN1B, l, 1), g->dl, residual,
                           wf_gpt_param(m, WF_P_LN1W, l, 0), v->ln1_mean, v->ln1_rstd, R, C, NULL);
fail:
  return st;
}

/* One transformer block backward. On entry da.dres holds d residual3[j]; on exit it
 * holds d(residual input of local layer j). Parameter gradients are added to. */
static wf_status block_backward(wf_gpt *m, wf__acts *a, int j)
{
  wf_status st = WF_OK;
  int l = wf__global_layer(m, a->chunk * m->lc + j);
  if (m->unit_hook)
    m->unit_hook(m->unit_user, a->chunk * m->lc + j, true);
  if (m->recompute) /* activation checkpointing: rebuild this layer's intermediates */
    WF_TRY(wf__block_forward(m, a, j, a->B, a->T));
  wf__layer v = wf__layer_at(m, a, j);
  WF_TRY(mlp_backward(m, &v, l, a->B * a->T));
  WF_TRY(attention_backward(m, &v, wf__layer_input(m, a, j), l, a->B, a->T));
fail:
  return st;
}

/* Loss -> logits -> (tied wte, enter's backward) -> final layernorm -> dres. */
static wf_status head_backward(wf_gpt *m, wf__acts *a, float dloss_scale)
{
  wf_status st = WF_OK;
  wf__dacts *g = &m->da;
  int N = a->B * a->T, C = m->d.C, R = (int)wf__tp_rows(&m->tp, (size_t)N);
  const float *x;
  /* loss_scale is 1 unless fp16 loss scaling is on: x * 1.0f is x, bit for bit. */
  m->k->xent_backward(a->logits, a->logits, a->row_max, a->row_sumexp, a->targets,
                      dloss_scale * m->loss_scale / (float)N, N, wf__local_real_vocab(m), m->Vl,
                      m->s.tp_rank * m->Vl, NULL);
  WF_TRY(wf__tp_enter_fwd(&m->tp, &x, a->lnf, g->full, (size_t)N, (size_t)C));
  WF_TRY(column_backward(m, a->logits, x, WF_P_WTE, WF_GPT_NUM_KINDS, 0, N, m->Vl));
  WF_TRY(zero(m, g->dres, (size_t)R * C));
  m->k->layernorm_backward(g->dres, wf_gpt_param(m, WF_P_LNFW, 0, 1),
                           wf_gpt_param(m, WF_P_LNFB, 0, 1), g->dl, wf__layer_input(m, a, m->lc),
                           wf_gpt_param(m, WF_P_LNFW, 0, 0), a->lnf_mean, a->lnf_rstd, R, C, NULL);
fail:
  return st;
}

/* The embeddings' backward (first chunk): the residual gradient leaves the tp region
 * and lands in this rank's vocabulary rows of wte and in wpe. */
static wf_status embed_backward(wf_gpt *m, wf__acts *a)
{
  wf_status st = WF_OK;
  int C = m->d.C, N = a->B * a->T;
  const float *dout;
  WF_TRY(wf__tp_leave_bwd(&m->tp, &dout, m->da.dres, m->da.full, (size_t)N, (size_t)C));
  m->k->encoder_backward_vp(wf_gpt_param(m, WF_P_WTE, 0, 1), wf_gpt_param(m, WF_P_WPE, 0, 1), dout,
                            a->inputs, m->s.tp_rank * m->Vl, m->Vl, a->B, a->T, C, NULL);
fail:
  return st;
}

static void announce(wf_gpt *m, int group)
{
  if (m->hook)
    m->hook(m->hook_user, group);
}

static wf_status chunk_backward(wf_gpt *m, wf__acts *a, const float *dy, float dloss_scale)
{
  wf_status st = WF_OK;
  int base = a->chunk * m->lc;
  if (wf__chunk_last(m, a->chunk)) {
    WF_TRY(head_backward(m, a, dloss_scale));
    announce(m, 0); /* the final layernorm's gradients are final */
  } else {
    WF_TRY(wf_dev_copy(m->dev, m->da.dres, dy, wf_gpt_stage_io_numel(m, a->B, a->T) * sizeof *dy,
                       WF_COPY_D2D, NULL));
  }
  for (int j = m->lc - 1; j >= 0; j--) {
    WF_TRY(block_backward(m, a, j));
    announce(m, m->nl - (base + j));
  }
  if (wf__chunk_first(m, a->chunk)) {
    WF_TRY(embed_backward(m, a));
    if (wf__chunk_last(m, a->chunk)) /* one stage: no embedding group to sum over first */
      announce(m, m->nl + 1);
  }
fail:
  return st;
}

wf_status wf_gpt_stage_backward(wf_gpt *m, int slot, const float *dy, float dloss_scale)
{
  wf_status st = WF_OK;
  bool ok = slot >= 0 && slot < m->n_slots && m->a[slot].live;
  bool last = ok && wf__chunk_last(m, m->a[slot].chunk);
  WF_CHECK(ok && (last ? m->a[slot].have_targets : dy != NULL), WF_EINVAL,
           "backward of slot %d needs a forward %s in that slot just before", slot,
           last ? "with targets" : "and the next stage's gradient");
  wf__acts *a = &m->a[slot];
  a->have_targets = false; /* the logits become their gradient below */
  st = chunk_backward(m, a, dy, dloss_scale);
  a->live = false;
  m->in_use--;
  if (st == WF_OK)
    st = wf_dev_check(m->dev);
fail:
  return st;
}

const float *wf_gpt_stage_dinput(const wf_gpt *m) { return m->da.dres; }

void wf_gpt_stage_release(wf_gpt *m, int slot)
{
  if (slot >= 0 && slot < m->n_slots && m->a[slot].live) {
    m->a[slot].live = false;
    m->in_use--;
  }
}

wf_status wf_gpt_backward(wf_gpt *m, float dloss_scale)
{
  return wf_gpt_stage_backward(m, 0, NULL, dloss_scale);
}
