/*
 * engine.c - a model chunk's forward and backward over activation slots, whatever the
 * family: the micro-batch's tokens in, the embedding, the blocks, the head and loss,
 * and back, with the hooks ZeRO and data parallelism listen to. What each step
 * computes is the family's (wf__family_ops).
 *
 * Every op is a kernel of the model's device; the host only moves the micro-batch's
 * tokens in and reads back the first out-of-vocabulary token, if any, before the lookup
 * that would read outside the table. The loss stays on the device: each last chunk adds
 * its micro-batch's mean into the model's loss sum (wf_model_take_loss). Under full
 * activation checkpointing a layer's intermediates are recomputed (the block's forward)
 * right before its backward; under selective recompute only its attention core state
 * (the family's core_forward), from the inputs the slot kept: the same kernels on the
 * same bits, so either recompute gives backward exactly what no recompute kept. As each group of
 * gradients becomes final the grad hook hears of it, so data parallelism can start reducing while
 * the rest of backward runs.
 *
 * Packed documents: a micro-batch's document starts (host) are checked and moved into its
 * slot with the positions they give (t - start); while the slot's blocks run, forward or
 * backward (recompute included), m->mb_starts and m->mb_pos point at them, so attention
 * and RoPE keep to documents (ops.c) with the family's code unchanged.
 */
#include "model_int.h"

/* ---- forward --------------------------------------------------------------------------- */

static wf_status check_args(const wf_model *m, int slot, int chunk, const int *inputs,
                            const void *x, int B, int T)
{
  wf_status st = WF_OK;
  bool first = wf__chunk_first(m, chunk);
  WF_CHECK(slot >= 0 && slot < m->n_slots && chunk >= 0 && chunk < m->nchunk, WF_EINVAL,
           "forward of chunk %d in activation slot %d: the model has %d chunks and %d slots", chunk,
           slot, m->nchunk, m->n_slots);
  WF_CHECK(B > 0 && T > 0 && B * T <= m->Bmax * m->Tmax && T <= m->Tmax, WF_EINVAL,
           "forward of %d x %d tokens: the model was created for at most %d x %d", B, T, m->Bmax,
           m->Tmax);
  WF_CHECK(!m->sequence || ((size_t)B * T) % (size_t)m->s.tp == 0, WF_EINVAL,
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
static wf_status load_tokens(wf_model *m, int *dev, const int *host, size_t n, const char *what)
{
  wf_status st = WF_OK;
  int bad[2];
  WF_K(wf_dev_kernels(wf_dev_cpu(), WF_DT_F32), tokens)->check(bad, host, n, m->d.V, NULL);
  WF_CHECK(bad[0] < 0, WF_EINVAL, "%s[%d] = %d is outside the vocabulary [0, %d)", what, bad[0],
           bad[1], m->d.V);
  WF_TRY(wf_dev_copy(m->dev, dev, host, n * sizeof *host, WF_COPY_H2D, NULL));
fail:
  return st;
}

/* Row b's starts are a document start's or their own position: starts[0] is 0, and
 * starts[t] is starts[t-1] (the same document) or t (a new one). -1 when they are, else
 * the first position that breaks it. */
static int bad_start(const int *st, int T)
{
  for (int t = 0; t < T; t++)
    if (t == 0 ? st[t] != 0 : st[t] != t && st[t] != st[t - 1])
      return t;
  return -1;
}

/* The micro-batch's document starts checked, and with their positions into the slot. */
static wf_status load_docs(wf_model *m, wf__slot *a, const int *starts)
{
  wf_status st = WF_OK;
  size_t N = (size_t)a->B * (size_t)a->T;
  a->has_docs = starts != NULL;
  if (!starts)
    return WF_OK;
  WF_CHECK(m->g.docs && !m->cp.ops, WF_EINVAL,
           "forward with document starts: the model was made %s",
           m->cp.ops ? "for context parallelism, whose ring attention does not keep to documents"
                     : "without documents (wf_model_opts.docs)");
  for (int b = 0; b < a->B; b++) {
    const int *row = starts + (size_t)b * a->T;
    int t = bad_start(row, a->T);
    WF_CHECK(t < 0, WF_EINVAL,
             "document starts of row %d: position %d starts at %d, neither its own position "
             "nor the previous one's start %d",
             b, t, t >= 0 ? row[t] : 0, t > 0 ? row[t - 1] : 0);
    for (t = 0; t < a->T; t++)
      m->host_pos[(size_t)b * a->T + t] = t - row[t];
  }
  WF_TRY(wf_dev_copy(m->dev, a->starts, starts, N * sizeof *starts, WF_COPY_H2D, NULL));
  WF_TRY(wf_dev_copy(m->dev, a->pos, m->host_pos, N * sizeof *starts, WF_COPY_H2D, NULL));
fail:
  return st;
}

/* The slot's documents are the ones the blocks keep to until the next slot runs. */
static void use_docs(wf_model *m, const wf__slot *a)
{
  m->mb_starts = a->has_docs ? a->starts : NULL;
  m->mb_pos = a->has_docs ? a->pos : NULL;
}

/* If x is a spare stage input, the slot keeps it as its input (received in place) and
 * its old input becomes that spare: no copy. */
static bool take_inbox(wf_model *m, wf__slot *a, const void *x)
{
  for (int i = 0; i < m->n_inbox; i++)
    if (m->inbox[i] == x) {
      m->inbox[i] = a->encoded;
      a->encoded = (void *)x;
      return true;
    }
  return false;
}

void *wf_model_stage_inbox(const wf_model *m, int i)
{
  return i >= 0 && i < m->n_inbox ? m->inbox[i] : NULL;
}

int wf_model_stage_inboxes(const wf_model *m) { return m->n_inbox; }

/* The slot's input: the tokens (and the embedding) on the first chunk, else the
 * previous stage's output; the targets on the last. */
static wf_status load_inputs(wf_model *m, wf__slot *a, const int *inputs, const void *x,
                             const int *targets)
{
  wf_status st = WF_OK;
  size_t N = (size_t)a->B * (size_t)a->T;
  if (a->have_targets)
    WF_TRY(load_tokens(m, a->targets, targets, N, "targets"));
  if (wf__chunk_first(m, a->chunk)) {
    WF_TRY(load_tokens(m, a->inputs, inputs, N, "inputs"));
    WF_TRY(m->ops->embed_forward(m, a));
    if (m->side_floats) /* the side band's sums start here */
      WF_TRY(wf__zero(m, wf__side(m, a->encoded, a->B, a->T), m->side_floats));
  } else if (!take_inbox(m, a, x)) {
    WF_TRY(wf_dev_copy(m->dev, a->encoded, x, wf_model_stage_io_bytes(m, a->B, a->T), WF_COPY_D2D,
                       NULL));
  }
fail:
  return st;
}

/* Local layer j of the slot's chunk: out[j] = block(its input). */
static wf_status block_forward(wf_model *m, wf__slot *a, int j)
{
  int l = wf__global_layer(m, a->chunk * m->lc + j);
  return m->ops->block_forward(m, wf__layer_saved(m, a, j), wf__layer_input(m, a, j),
                               wf__layer_input(m, a, j + 1), l, a->B, a->T);
}

wf_status wf_model_chunk_forward(wf_model *m, int slot, int chunk, const int *inputs, const void *x,
                                 const int *targets, const int *starts, int B, int T)
{
  wf_status st = WF_OK;
  WF_TRY(check_args(m, slot, chunk, inputs, x, B, T));
  wf__slot *a = &m->a[slot];
  if (!a->live && ++m->in_use > m->peak)
    m->peak = m->in_use;
  a->live = true;
  a->B = B, a->T = T, a->chunk = chunk;
  a->have_targets = wf__chunk_last(m, chunk) && targets;
  WF_TRY(load_docs(m, a, starts));
  use_docs(m, a);
  WF_TRY(load_inputs(m, a, inputs, x, targets));
  for (int j = 0; j < m->lc; j++) {
    if (m->unit_hook)
      m->unit_hook(m->unit_user, chunk * m->lc + j, false);
    WF_TRY(block_forward(m, a, j));
  }
  if (m->ops->side_forward)
    WF_TRY(m->ops->side_forward(m, a));
  if (wf__chunk_last(m, chunk))
    WF_TRY(m->ops->head_forward(m, a, wf__layer_input(m, a, m->lc)));
  st = wf_dev_check(m->dev);
fail:
  return st;
}

wf_status wf_model_forward(wf_model *m, const int *inputs, const int *targets, int B, int T,
                           float *loss)
{
  double sum = 0;
  wf_status st = wf_model_chunk_forward(m, 0, 0, inputs, NULL, targets, NULL, B, T);
  if (!targets) /* no backward follows: the slot is free again */
    wf_model_stage_release(m, 0);
  if (st == WF_OK)
    st = wf_model_take_loss(m, &sum);
  if (loss)
    *loss = (float)sum; /* one micro-batch: its float mean, exactly */
  return st;
}

/* ---- backward -------------------------------------------------------------------------- */

/* Once ZeRO-2 dropped the flat buffer the gradient windows' owner zeroes them. */
wf_status wf_model_zero_grad(wf_model *m)
{
  return m->grads ? wf__zero(m, m->grads, m->num_params) : WF_OK;
}

static void announce(wf_model *m, int group)
{
  if (m->hook)
    m->hook(m->hook_user, group);
}

/* One block backward. On entry da.dres holds d out[j]; on exit it holds d(the input of
 * local layer j). Parameter gradients are added to. */
static wf_status block_backward(wf_model *m, wf__slot *a, int j)
{
  wf_status st = WF_OK;
  int l = wf__global_layer(m, a->chunk * m->lc + j);
  if (m->unit_hook)
    m->unit_hook(m->unit_user, a->chunk * m->lc + j, true);
  if (m->recompute == WF_RECOMPUTE_FULL) /* rebuild this layer's intermediates */
    WF_TRY(block_forward(m, a, j));
  if (m->recompute == WF_RECOMPUTE_SELECTIVE) /* rebuild its attention core state */
    WF_TRY(m->ops->core_forward(m, wf__layer_saved(m, a, j), l, a->B, a->T));
  st = m->ops->block_backward(m, wf__layer_saved(m, a, j), wf__layer_input(m, a, j), l, a->B, a->T);
fail:
  return st;
}

static wf_status chunk_backward(wf_model *m, wf__slot *a, const void *dy, float dloss_scale)
{
  wf_status st = WF_OK;
  int base = a->chunk * m->lc;
  use_docs(m, a);
  const void *sums = wf__chunk_last(m, a->chunk) ? wf__layer_input(m, a, m->lc) : dy;
  if (m->side_floats) /* the whole model's statistics: the last chunk's output has them */
    WF_TRY(wf_dev_copy(m->dev, m->da.side, wf__side(m, sums, a->B, a->T),
                       m->side_floats * sizeof(float), WF_COPY_D2D, NULL));
  if (wf__chunk_last(m, a->chunk)) {
    WF_TRY(m->ops->head_backward(m, a, wf__layer_input(m, a, m->lc), dloss_scale));
    announce(m, 0); /* the head's gradients are final */
  } else {          /* the next stage's gradient, widened: inside a stage it is fp32 */
    WF_K(m->k, cast)->load(m->da.dres, dy, wf_model_stage_io_numel(m, a->B, a->T), NULL);
  }
  for (int j = m->lc - 1; j >= 0; j--) {
    WF_TRY(block_backward(m, a, j));
    announce(m, m->nl - (base + j));
  }
  if (wf__chunk_first(m, a->chunk)) {
    WF_TRY(m->ops->embed_backward(m, a));
    if (wf__chunk_last(m, a->chunk)) /* one stage: no embedding group to sum over first */
      announce(m, m->nl + 1);
  }
fail:
  return st;
}

wf_status wf_model_stage_backward(wf_model *m, int slot, const void *dy, float dloss_scale)
{
  wf_status st = WF_OK;
  bool ok = slot >= 0 && slot < m->n_slots && m->a[slot].live;
  bool last = ok && wf__chunk_last(m, m->a[slot].chunk);
  WF_CHECK(ok && (last ? m->a[slot].have_targets : dy != NULL), WF_EINVAL,
           "backward of slot %d needs a forward %s in that slot just before", slot,
           last ? "with targets" : "and the next stage's gradient");
  wf__slot *a = &m->a[slot];
  a->have_targets = false; /* the logits become their gradient below */
  m->dres_n = wf_model_stage_io_numel(m, a->B, a->T);
  m->dloss = dloss_scale * m->loss_scale;
  st = chunk_backward(m, a, dy, dloss_scale);
  a->live = false;
  m->in_use--;
  if (st == WF_OK)
    st = wf_dev_check(m->dev);
fail:
  return st;
}

wf_status wf_model_stage_dinput(wf_model *m, void *dst)
{
  WF_K(m->k, cast)->store(dst, m->da.dres, m->dres_n, NULL);
  if (!m->side_floats) /* the statistics go on to the stage before */
    return WF_OK;
  float *side = (float *)((char *)dst + ((m->dres_n * m->esize + 63) & ~(size_t)63));
  return wf_dev_copy(m->dev, side, m->da.side, m->side_floats * sizeof(float), WF_COPY_D2D, NULL);
}

void wf_model_stage_release(wf_model *m, int slot)
{
  if (slot >= 0 && slot < m->n_slots && m->a[slot].live) {
    m->a[slot].live = false;
    m->in_use--;
  }
}

wf_status wf_model_backward(wf_model *m, float dloss_scale)
{
  return wf_model_stage_backward(m, 0, NULL, dloss_scale);
}
