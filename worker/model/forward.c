/*
 * forward.c - the forward pass of a model chunk: embedding, transformer blocks with
 * their tensor-parallel regions, and the vocabulary-parallel head and loss.
 *
 * Every op is a kernel of the model's device; the host only moves the micro-batch's
 * tokens in and reads back the first out-of-vocabulary token, if any, before the
 * lookup that would read outside the table. The loss stays on the device: each last
 * chunk adds its micro-batch's mean into the model's loss sum (wf_gpt_take_loss).
 */
#include <string.h>

#include "model_int.h"

/* Row-parallel matmul (no bias), then leave the tp region, then the bias once. */
static wf_status row_parallel(wf_gpt *m, float *y, const float *x, wf_param_kind w, wf_param_kind b,
                              int l, int N, int IC)
{
  int C = m->d.C;
  /* Only tp rank 0 adds the bias, so the sum over tp adds it once. */
  const float *bias = m->s.tp_rank == 0 ? wf_gpt_param(m, b, l, 0) : NULL;
  m->k->matmul_forward(m->da.proj, x, wf__gemm_weight(m, w, l), bias, N, IC, C, m->prec, NULL);
  return wf__tp_leave_fwd(&m->tp, y, m->da.proj, (size_t)N, (size_t)C);
}

/* Attention: ln1 (replicated region) -> enter -> qkv (column-parallel, local heads) ->
 * attention -> attproj (row-parallel) -> leave, into res2 (the residual is added by the
 * MLP's first op, fused with its layernorm). Under mixed precision the GEMM inputs ln1,
 * atty, ln2, fchg are rounded as they are made (before the all-gather of sequence
 * parallelism: rounding is elementwise, so it commutes). Attention's own Q.K^T and
 * att.V stay fp32, as flash-attention kernels keep the softmax in fp32; only its
 * output, attproj's input, is rounded. */
static wf_status attention_block(wf_gpt *m, const wf__layer *v, const float *residual, int l, int B,
                                 int T)
{
  wf_status st = WF_OK;
  const wf_ktable *k = m->k;
  int C = m->d.C, tp = m->s.tp, N = B * T, R = (int)wf__tp_rows(&m->tp, (size_t)N);
  const float *x;
  k->layernorm_forward(v->ln1, v->ln1_mean, v->ln1_rstd, residual, wf_gpt_param(m, WF_P_LN1W, l, 0),
                       wf_gpt_param(m, WF_P_LN1B, l, 0), R, C, NULL);
  wf__round_operand(m, v->ln1, (size_t)R * C);
  WF_TRY(wf__tp_enter_fwd(&m->tp, &x, v->ln1, m->da.full, (size_t)N, (size_t)C));
  k->matmul_forward(v->qkv, x, wf__gemm_weight(m, WF_P_QKVW, l), wf_gpt_param(m, WF_P_QKVB, l, 0),
                    N, C, 3 * C / tp, m->prec, NULL);
  k->attention_forward(v->atty, v->att, v->qkv, B, T, C / tp, m->NHl, NULL);
  wf__round_operand(m, v->atty, (size_t)N * C / tp);
  st = row_parallel(m, v->res2, v->atty, WF_P_ATTPROJW, WF_P_ATTPROJB, l, N, C / tp);
fail:
  return st;
}

/* MLP: residual + attention output -> ln2 (one fused op) -> enter -> fc and GELU (one
 * fused op) -> fcproj (row-parallel) -> leave -> residual. */
static wf_status mlp_block(wf_gpt *m, const wf__layer *v, const float *residual, float *res3, int l,
                           int N)
{
  wf_status st = WF_OK;
  const wf_ktable *k = m->k;
  int C = m->d.C, tp = m->s.tp, R = (int)wf__tp_rows(&m->tp, (size_t)N);
  const float *x;
  k->residual_layernorm_forward(v->res2, v->ln2, v->ln2_mean, v->ln2_rstd, residual, v->res2,
                                wf_gpt_param(m, WF_P_LN2W, l, 0), wf_gpt_param(m, WF_P_LN2B, l, 0),
                                R, C, NULL);
  wf__round_operand(m, v->ln2, (size_t)R * C);
  WF_TRY(wf__tp_enter_fwd(&m->tp, &x, v->ln2, m->da.full, (size_t)N, (size_t)C));
  k->matmul_gelu_forward(v->fchg, v->fch, x, wf__gemm_weight(m, WF_P_FCW, l),
                         wf_gpt_param(m, WF_P_FCB, l, 0), N, C, 4 * C / tp, m->prec, NULL);
  wf__round_operand(m, v->fchg, (size_t)N * 4 * C / tp);
  WF_TRY(row_parallel(m, res3, v->fchg, WF_P_FCPROJW, WF_P_FCPROJB, l, N, 4 * C / tp));
  k->residual_forward(res3, v->res2, res3, (size_t)R * C, NULL);
fail:
  return st;
}

/* One transformer block: residual3[j] = block(residual), with the tp regions marked. */
wf_status wf__block_forward(wf_gpt *m, wf__acts *a, int j, int B, int T)
{
  wf_status st = WF_OK;
  int l = wf__global_layer(m, a->chunk * m->lc + j);
  const float *residual = wf__layer_input(m, a, j);
  float *res3 = wf__layer_input(m, a, j + 1); /* residual3[j] */
  wf__layer v = wf__layer_at(m, a, j);
  WF_TRY(attention_block(m, &v, residual, l, B, T));
  WF_TRY(mlp_block(m, &v, residual, res3, l, B * T));
fail:
  return st;
}

/* Vocabulary-parallel embedding: each tp rank looks up the tokens in its rows of wte
 * (tp rank 0 adds the positions), and leaving the tp region sums the parts. */
static wf_status embed_forward(wf_gpt *m, wf__acts *a, int B, int T)
{
  int N = B * T, C = m->d.C;
  const float *wpe = m->s.tp_rank == 0 ? wf_gpt_param(m, WF_P_WPE, 0, 0) : NULL;
  m->k->encoder_forward_vp(m->da.proj, a->inputs, wf_gpt_param(m, WF_P_WTE, 0, 0),
                           m->s.tp_rank * m->Vl, m->Vl, wpe, B, T, C, NULL);
  return wf__tp_leave_fwd(&m->tp, a->encoded, m->da.proj, (size_t)N, (size_t)C);
}

/* Combine the tp ranks' row statistics of the vocabulary-parallel softmax: the global
 * max M, sum_r sumexp_r * exp(max_r - M), and the target logit of the rank holding
 * the target. One all-gather of 3 floats per row; nobody holds full-vocabulary logits. */
static wf_status xent_combine(wf_gpt *m, wf__acts *a, int N)
{
  wf_status st = WF_OK;
  int tp = m->s.tp;
  if (tp == 1 || !m->tp.comm)
    return WF_OK;
  float *all = m->da.stats, *mine = all + (size_t)3 * tp * N; /* (tp,N,3) then (N,3) */
  m->k->xent_pack(mine, a->row_max, a->row_sumexp, a->target_logit, N, NULL);
  WF_TRY(wf__tp_allgather(&m->tp, mine, all, (size_t)3 * N));
  m->k->xent_combine(a->row_max, a->row_sumexp, a->target_logit, all, N, tp, NULL);
fail:
  return st;
}

/* Final layernorm -> enter -> logits of this rank's vocabulary slice -> the mean
 * cross-entropy, reduced over tp, added to the loss sum. */
static wf_status head_forward(wf_gpt *m, wf__acts *a, int N)
{
  wf_status st = WF_OK;
  const wf_ktable *k = m->k;
  int C = m->d.C, R = (int)wf__tp_rows(&m->tp, (size_t)N);
  const float *x;
  k->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, wf__layer_input(m, a, m->lc),
                       wf_gpt_param(m, WF_P_LNFW, 0, 0), wf_gpt_param(m, WF_P_LNFB, 0, 0), R, C,
                       NULL);
  wf__round_operand(m, a->lnf, (size_t)R * C);
  WF_TRY(wf__tp_enter_fwd(&m->tp, &x, a->lnf, m->da.full, (size_t)N, (size_t)C));
  /* Tied embedding; padding rows of wte give padding columns the loss ignores. */
  k->matmul_forward(a->logits, x, wf__gemm_weight(m, WF_P_WTE, 0), NULL, N, C, m->Vl, m->prec,
                    NULL);
  if (!a->have_targets)
    return WF_OK;
  k->xent_stats(a->row_max, a->row_sumexp, a->target_logit, a->logits, a->targets, N,
                wf__local_real_vocab(m), m->Vl, m->s.tp_rank * m->Vl, NULL);
  WF_TRY(xent_combine(m, a, N));
  k->xent_loss(a->losses, a->row_max, a->row_sumexp, a->target_logit, N, NULL);
  k->loss_accumulate(m->loss_acc, a->losses, N, NULL);
fail:
  return st;
}

static wf_status check_args(const wf_gpt *m, int slot, int chunk, const int *inputs, const float *x,
                            int B, int T)
{
  wf_status st = WF_OK;
  bool first = wf__chunk_first(m, chunk);
  WF_CHECK(slot >= 0 && slot < m->n_slots && chunk >= 0 && chunk < m->nchunk, WF_EINVAL,
           "forward of chunk %d in activation slot %d: the model has %d chunks and %d slots", chunk,
           slot, m->nchunk, m->n_slots);
  WF_CHECK(B > 0 && T > 0 && B * T <= m->Bmax * m->Tmax && T <= m->Tmax, WF_EINVAL,
           "forward of %d x %d tokens: the model was created for at most %d x %d", B, T, m->Bmax,
           m->Tmax);
  WF_CHECK(!m->tp.sequence || ((size_t)B * T) % (size_t)m->s.tp == 0, WF_EINVAL,
           "forward of %d x %d tokens: sequence parallelism needs a multiple of tp %d", B, T,
           m->s.tp);
  WF_CHECK(first ? inputs != NULL : x != NULL, WF_EINVAL, "forward: the %s stage needs %s",
           first ? "first" : "next", first ? "token inputs" : "the previous stage's activations");
fail:
  return st;
}

/* Check n host tokens against the vocabulary where they are, on the host (the CPU
 * device's kernel), then move them into the device buffer `dev`: checked on the device,
 * the answer would have to come back, and the host would wait for the device twice per
 * micro-batch. */
static wf_status load_tokens(wf_gpt *m, int *dev, const int *host, size_t n, const char *what)
{
  wf_status st = WF_OK;
  int bad[2];
  wf_dev_kernels(wf_dev_cpu())->tokens_check(bad, host, n, m->d.V, NULL);
  WF_CHECK(bad[0] < 0, WF_EINVAL, "%s[%d] = %d is outside the vocabulary [0, %d)", what, bad[0],
           bad[1], m->d.V);
  WF_TRY(wf_dev_copy(m->dev, dev, host, n * sizeof *host, WF_COPY_H2D, NULL));
fail:
  return st;
}

/* The slot's input: the tokens (and the embedding) on the first chunk, else the
 * previous stage's output; the targets on the last. */
static wf_status load_inputs(wf_gpt *m, wf__acts *a, const int *inputs, const float *x,
                             const int *targets)
{
  wf_status st = WF_OK;
  size_t N = (size_t)a->B * (size_t)a->T;
  if (a->have_targets)
    WF_TRY(load_tokens(m, a->targets, targets, N, "targets"));
  if (wf__chunk_first(m, a->chunk)) {
    WF_TRY(load_tokens(m, a->inputs, inputs, N, "inputs"));
    WF_TRY(embed_forward(m, a, a->B, a->T));
  } else {
    WF_TRY(wf_dev_copy(m->dev, a->encoded, x, wf_gpt_stage_io_numel(m, a->B, a->T) * sizeof *x,
                       WF_COPY_D2D, NULL));
  }
fail:
  return st;
}

wf_status wf_gpt_chunk_forward(wf_gpt *m, int slot, int chunk, const int *inputs, const float *x,
                               const int *targets, int B, int T)
{
  wf_status st = WF_OK;
  WF_TRY(check_args(m, slot, chunk, inputs, x, B, T));
  wf__acts *a = &m->a[slot];
  if (!a->live && ++m->in_use > m->peak)
    m->peak = m->in_use;
  a->live = true;
  a->B = B, a->T = T, a->chunk = chunk;
  a->have_targets = wf__chunk_last(m, chunk) && targets;
  WF_TRY(load_inputs(m, a, inputs, x, targets));
  for (int j = 0; j < m->lc; j++) {
    if (m->unit_hook)
      m->unit_hook(m->unit_user, chunk * m->lc + j, false);
    WF_TRY(wf__block_forward(m, a, j, B, T));
  }
  if (wf__chunk_last(m, chunk))
    WF_TRY(head_forward(m, a, B * T));
  st = wf_dev_check(m->dev);
fail:
  return st;
}

wf_status wf_gpt_forward(wf_gpt *m, const int *inputs, const int *targets, int B, int T,
                         float *loss)
{
  double sum = 0;
  wf_status st = wf_gpt_chunk_forward(m, 0, 0, inputs, NULL, targets, B, T);
  if (!targets) /* no backward follows: the slot is free again */
    wf_gpt_stage_release(m, 0);
  if (st == WF_OK)
    st = wf_gpt_take_loss(m, &sum);
  if (loss)
    *loss = (float)sum; /* one micro-batch: its float mean, exactly */
  return st;
}
