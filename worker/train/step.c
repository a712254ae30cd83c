/*
 * step.c - one training step and evaluation.
 *
 * A step is four phases, kept apart so the parallel engines slot their communication
 * in between without touching the mathematics:
 *   1. forward and backward of this rank's micro-batches through the pipeline schedule,
 *      loss gradient 1/M each, so the accumulated gradient is that of the mean loss over
 *      the whole global batch (the gradient path zeroes first and arms its overlapped dp
 *      reduction before the last backward);
 *   2. the gradient path: the rest of the reductions, then the global norm;
 *   3. the optimizer: clip, fp16 loss scaling (an overflow skips the update), AdamW;
 *   4. the gradient path again: parameters synchronised (ZeRO), the tied embedding's
 *      copies checked (on the device; the answer comes with the next norm).
 * The host waits for the device twice a step, where a value must reach it: the loss
 * (the pipeline's end) and the norm (info->host_syncs counts it).
 * Evaluation runs the forward pass on train.eval_batches fixed validation batches (the
 * same ones every time, so the curve is comparable across evaluations).
 *
 * Invariant: the loss sequence is a pure function of the config (same seed, same bits).
 */
#include <math.h>
#include <string.h>

#include "train_int.h"

/* Mean of a per-rank value over the dp (x cp) group (float32 on the wire): each cp rank's
 * loss is the mean over its equal share of every sequence's tokens. */
static wf_status dp_mean(wf__trainer *tr, double *x)
{
  if (tr->grad_size == 1)
    return WF_OK;
  float v = (float)*x;
  wf_status st = wf_comm_allreduce(tr->grad_comm, &v, &v, 1, WF_COMM_F32, WF_COMM_AVG);
  *x = v;
  return st;
}

/* The last stage's value on every stage. */
static wf_status from_last_stage(wf__trainer *tr, double *x)
{
  if (tr->pp == 1)
    return WF_OK;
  float v = (float)*x;
  wf_status st = wf_comm_bcast(tr->pp_comm, &v, 1, WF_COMM_F32, tr->pp - 1);
  *x = v;
  return st;
}

static int64_t batch_index(const wf__trainer *tr)
{
  return tr->split == WF_DATA_TRAIN ? tr->step - 1 : tr->step;
}

/* This cp rank's rows of (B, T) sequences: chunks cp_rank and 2cp-1-cp_rank of each. */
static void cp_rows(const wf__trainer *tr, int *dst, const int *seq)
{
  for (int b = 0; b < tr->B; b++)
    for (int t = 0; t < tr->Tl; t++)
      dst[(size_t)b * tr->Tl + t] =
          seq[(size_t)b * tr->T + wf_cp_position(tr->cp, tr->cp_rank, tr->Tl, t)];
}

wf_status wf__batch_cb(void *user, int mb, int *inputs, int *targets, int *starts)
{
  wf__trainer *tr = user;
  int64_t index = batch_index(tr);
  if (tr->cp == 1) /* (document starts never meet cp: the config refuses the two) */
    return wf_data_batch(tr->data, inputs, targets, starts, tr->split, index, tr->dp_rank, tr->D,
                         mb, tr->M);
  wf_status st = wf_data_batch(tr->data, tr->seq_in, tr->seq_tg, NULL, tr->split, index,
                               tr->dp_rank, tr->D, mb, tr->M);
  if (st != WF_OK)
    return st;
  cp_rows(tr, inputs, tr->seq_in);
  if (targets)
    cp_rows(tr, targets, tr->seq_tg);
  return WF_OK;
}

/* A stream's batch made before the schedule asks for it, and the outcome agreed over the
 * job: a bad line that one rank's loader met stops every rank here, together, said once
 * by that rank, instead of one rank leaving its peers in a collective. Only the ranks
 * that read data (the first and last stage; every stage under data.document_mask) wait
 * for it. */
static wf_status data_ready(wf__trainer *tr)
{
  char err[2048] = "";
  int bad = -1;
  const wf_model_shard *sh = wf_model_get_shard(tr->model);
  if (wf_data_get_kind(tr->data) != WF_DATA_STREAM)
    return WF_OK;
  wf_status mine = sh->first || sh->last || tr->cfg->data.document_mask
                       ? wf_data_ready(tr->data, tr->split, batch_index(tr), err, sizeof err)
                       : WF_OK;
  wf_status st = wf_comm_agree(tr->world, mine, &bad);
  if (mine != WF_OK && bad == wf__comm_rank(tr->world))
    WF_ERROR("%s", err[0] ? err : wf_status_str(mine));
  return st;
}

static void arm_cb(void *user)
{
  wf__trainer *tr = user;
  wf_grads_arm(tr->grads); /* reduce gradient buckets while the last backward runs */
}

wf_status wf__accumulate(wf__trainer *tr, int step, double *loss, wf_pipe_stats *ps)
{
  wf_status st = WF_OK;
  tr->step = step;
  tr->split = WF_DATA_TRAIN;
  WF_TRY(data_ready(tr));
  WF_TRY(wf_grads_zero(tr->grads));
  WF_TRY(wf_pipe_step(tr->pipe, step, wf__batch_cb, arm_cb, tr, loss, ps));
  *loss /= tr->M;
  WF_TRY(dp_mean(tr, loss));
  st = from_last_stage(tr, loss);
fail:
  return st;
}

/* Reduce gradients, clip by the global norm, AdamW with the scheduled lr; under fp16 an
 * overflow anywhere skips the update. The launcher's stop may drop the step before its
 * update instead (tr->abandoned; rescue.c). */
static wf_status reduce_and_update(wf__trainer *tr, int step, double loss, float *norm,
                                   wf_optim_step_info *oi)
{
  wf_status st = WF_OK;
  double t0 = wf_now();
  WF_TRY(wf_grads_finish(tr->grads));
  if (wf_trace_on(tr->trace))
    wf_trace_span(tr->trace, "gradient reduction", "comm", t0, wf_now(), step, -1);
  WF_TRY(wf__rescue_enter(tr, &tr->abandoned)); /* the update's window (rescue.c) */
  if (tr->abandoned)
    goto fail;
  WF_TRY(wf_grads_norm(tr->grads, wf_optim_backward_scale(tr->optim), norm));
  WF_TRY(wf_optim_step(tr->optim, step, loss, *norm, wf_grads_for_update(tr->grads), oi));
  if (!oi->skipped)
    WF_TRY(wf_grads_sync_params(tr->grads, wf_optim_writes_low(tr->optim)));
fail:
  wf__rescue_leave(tr, step, st == WF_OK && !tr->abandoned);
  return st;
}

/* Pipeline figures of every stage on every rank: peak activations (bytes and
 * micro-batches), and the bubble as the theory defines it: the idle share of the
 * pipeline's span, 1 - mean(busy) / longest schedule wall time. The stages start a step
 * together (after the previous step's collectives) but the last one finishes early,
 * while stage 0 runs the final backwards: its own wall time would hide that idle tail. */
static wf_status stage_stats(wf__trainer *tr, const wf_pipe_stats *ps, wf_train_step_info *info)
{
  wf_status st = WF_OK;
  uint64_t mine_u[2] = {ps->act_bytes, (uint64_t)ps->peak_slots}, all_u[2 * WF_MAX_STAGES];
  float mine_t[2] = {(float)ps->busy_s, (float)ps->wall_s}, all_t[2 * WF_MAX_STAGES];
  info->n_stages = tr->pp;
  if (tr->pp > 1) {
    WF_TRY(wf_comm_allgather(tr->pp_comm, mine_u, all_u, 2, WF_COMM_U64));
    WF_TRY(wf_comm_allgather(tr->pp_comm, mine_t, all_t, 2, WF_COMM_F32));
  } else {
    memcpy(all_u, mine_u, sizeof mine_u);
    memcpy(all_t, mine_t, sizeof mine_t);
  }
  double busy = 0, span = 0;
  for (int s = 0; s < tr->pp && s < WF_MAX_STAGES; s++) {
    info->stage_act_bytes[s] = (int64_t)all_u[2 * s];
    info->stage_peak_slots[s] = (int)all_u[2 * s + 1];
    busy += all_t[2 * s];
    span = WF_MAX(span, (double)all_t[2 * s + 1]);
  }
  info->bubble = tr->pp > 1 && span > 0 ? 1 - busy / tr->pp / span : 0;
  wf_sched_params prm = {tr->cfg->train.schedule, tr->pp, tr->M, tr->chunks};
  info->bubble_theory = tr->pp > 1 ? wf_schedule_bubble_theory(&prm) : 0;
fail:
  return st;
}

/* Each layer's least and most chosen expert and their imbalance (the most over the mean),
 * from the routers' statistics summed over every stage and dp rank (tp ranks route alike:
 * the pp and dp groups of one tp rank see every token once). */
static wf_status expert_load(wf__trainer *tr, wf_train_step_info *info)
{
  wf_status st = WF_OK;
  size_t k = wf_model_stats_floats(tr->model), n = (size_t)tr->dims.L * k;
  int E = tr->dims.E;
  memset(tr->router_stats, 0, n * sizeof *tr->router_stats);
  WF_TRY(wf_model_take_stats(tr->model, tr->router_stats));
  if (tr->pp > 1)
    WF_TRY(wf_comm_allreduce(tr->pp_comm, tr->router_stats, tr->router_stats, n, WF_COMM_F32,
                             WF_COMM_SUM));
  if (tr->D > 1)
    WF_TRY(wf_comm_allreduce(tr->dp_comm, tr->router_stats, tr->router_stats, n, WF_COMM_F32,
                             WF_COMM_SUM));
  for (int l = 0; l < tr->dims.L; l++) {
    const float *cnt = tr->router_stats + (size_t)l * k; /* choices per expert first */
    float lo = cnt[0], hi = cnt[0], sum = 0;
    for (int e = 0; e < E; e++)
      lo = WF_MIN(lo, cnt[e]), hi = WF_MAX(hi, cnt[e]), sum += cnt[e];
    float *o = tr->expert_load + 3 * (size_t)l;
    o[0] = lo, o[1] = hi, o[2] = sum > 0 ? hi * E / sum : 0;
  }
  info->n_expert_layers = tr->dims.L;
  info->expert_load = tr->expert_load;
fail:
  return st;
}

static void add_extra(wf_train_step_info *info, const char *name, double v)
{
  if (info->n_extra < WF_TRAIN_MAX_EXTRA)
    info->extra[info->n_extra].name = name, info->extra[info->n_extra++].value = v;
}

/* The figures as named scalars (train.metrics' keys, train.tensorboard's tags, the
 * coordinator's Prometheus series): the losses, the dropped choices, and over every layer
 * the fewest and most tokens an expert received and the worst imbalance. */
static void expert_extras(const wf__trainer *tr, wf_train_step_info *info)
{
  const float *x = info->expert_load;
  double lo = x[0], hi = x[1], imb = x[2];
  for (int l = 1; l < info->n_expert_layers; l++)
    lo = WF_MIN(lo, x[3 * l]), hi = WF_MAX(hi, x[3 * l + 1]), imb = WF_MAX(imb, x[3 * l + 2]);
  add_extra(info, "router/aux_loss", info->aux_loss);
  if (tr->dims.z_coef > 0)
    add_extra(info, "router/z_loss", info->z_loss);
  add_extra(info, "router/dropped_tokens", (double)info->dropped_tokens);
  add_extra(info, "router/tokens_per_expert_min", lo);
  add_extra(info, "router/tokens_per_expert_max", hi);
  add_extra(info, "router/imbalance", imb);
}

/* A mixture of experts' figures of the step: the auxiliary losses of the last stage's
 * micro-batches, averaged like the loss; the dropped choices, summed over dp; the load. */
static wf_status expert_figures(wf__trainer *tr, wf_train_step_info *info)
{
  wf_status st = WF_OK;
  double sums[3], dropped;
  info->aux_loss = info->z_loss = NAN;
  if (!tr->router_stats)
    return WF_OK;
  WF_TRY(wf_model_take_aux(tr->model, sums));
  info->aux_loss = sums[0] / tr->M, info->z_loss = sums[1] / tr->M, dropped = sums[2];
  WF_TRY(dp_mean(tr, &info->aux_loss));
  WF_TRY(dp_mean(tr, &info->z_loss));
  WF_TRY(dp_mean(tr, &dropped));
  WF_TRY(from_last_stage(tr, &info->aux_loss));
  WF_TRY(from_last_stage(tr, &info->z_loss));
  WF_TRY(from_last_stage(tr, &dropped));
  info->dropped_tokens = (int64_t)llround(dropped * tr->D);
  WF_TRY(expert_load(tr, info));
  expert_extras(tr, info);
fail:
  return st;
}

/* After an evaluation or a sample: its forwards' expert figures are no step's. Local. */
wf_status wf__discard_expert_figures(wf__trainer *tr)
{
  wf_status st = WF_OK;
  double sums[3];
  if (!tr->router_stats)
    return WF_OK;
  WF_TRY(wf_model_take_aux(tr->model, sums));
  st = wf_model_take_stats(tr->model, tr->router_stats); /* overwritten by the next step */
fail:
  return st;
}

static bool tracing(const wf__trainer *tr, int step)
{
  const int *ts = tr->cfg->train.trace_steps;
  return tr->trace && step >= ts[0] && step <= ts[1];
}

/* The step's figures, once its work is done (dt seconds). */
static void fill_info(wf__trainer *tr, int step, double dt, double loss, float norm,
                      const wf_optim_step_info *oi, wf_train_step_info *info)
{
  wf_mem_stats ms;
  wf_grads_stats gs;
  double tp_s = 0, tp_bytes = 0, cp_s = 0, cp_bytes = 0, ep_s = 0, ep_bytes = 0;
  wf_mem_get_stats(&ms);
  wf_grads_get_stats(tr->grads, &gs);
  wf_tp_stats(tr->tpr, &tp_s, &tp_bytes);
  wf_cp_stats(tr->cpr, &cp_s, &cp_bytes);
  wf_ep_stats(tr->epr, &ep_s, &ep_bytes);
  *info = (wf_train_step_info){
      .step = step,
      .steps = tr->steps,
      .loss = loss,
      .lr = oi->lr,
      .grad_norm = oi->skipped ? NAN : norm, /* an overflowed step has no norm */
      .step_ms = dt * 1e3,
      .tokens_per_s = (double)tr->B * tr->M * tr->D * tr->T / dt,
      .tflops = tr->flops / dt * 1e-12,
      .val_loss = NAN,
      .entropy_floor = wf_data_entropy_floor(tr->data),
      .mem_bytes = ms.current[WF_MEM_HOST] + ms.current[WF_MEM_DEVICE],
      .comm_ms = gs.exposed_ms,
      .tp_ms = tp_s * 1e3,
      .cp_ms = cp_s * 1e3,
      .cp_bytes = cp_bytes,
      .ep_ms = ep_s * 1e3,
      .ep_bytes = ep_bytes,
      .optim_bytes = (int64_t)wf_optim_bytes(tr->optim),
      .peak_tflops = tr->peak_tflops,
      .params = (int64_t)wf_model_local_params(tr->model),
      .loss_scale = oi->scale,
      .skipped = oi->skipped,
      .skipped_steps = wf_optim_get_scaler(tr->optim)->skipped,
      .param_bytes = (int64_t)(wf_model_param_bytes(tr->model) + wf_grads_param_bytes(tr->grads)),
      .grad_bytes = (int64_t)wf_grads_bytes(tr->grads),
  };
  /* The peak is per rank; the job has world_size such ranks. */
  info->tokens_per_s_gpu = info->tokens_per_s / tr->world_size;
  info->tflops_gpu = info->tflops / tr->world_size;
  info->mfu = tr->peak_tflops > 0 ? info->tflops_gpu / tr->peak_tflops : 0;
}

/* A step's time is the cycle from the previous step's end to this one's, less what ran
 * aside in between (evaluation, samples, checkpoints), as Megatron-LM's interval timer
 * stops for them. The report and the ranks' agreement to go on (on_step) are the step's:
 * with ranks out of step (sharing cores, or any straggler) that agreement is where the
 * others wait for the last one, and timing from this step's start alone read 26-33 ms a
 * step where 8 ranks on 2 cores ran 38-45 ms steps end to end (dp 8, ZeRO 0-2). The
 * first step after start-up (or a resume) has no previous end: its own span. */
static double step_seconds(wf__trainer *tr, double t0, double end)
{
  double dt = tr->last_end > 0 ? end - tr->last_end - tr->aside_s : end - t0;
  tr->last_end = end, tr->aside_s = 0;
  return dt > 0 ? dt : end - t0;
}

wf_status wf__train_step(wf__trainer *tr, int step, wf_train_step_info *info)
{
  wf_status st = WF_OK;
  double t0 = wf_now(), loss = 0;
  float norm = 0;
  wf_optim_step_info oi = {0};
  wf_pipe_stats ps = {0};
  uint64_t syncs = wf_dev_host_syncs(tr->dev);
  if (tr->trace)
    wf_trace_set_on(tr->trace, tracing(tr, step));
  wf_model_set_loss_scale(tr->model, (float)wf_optim_backward_scale(tr->optim));
  WF_TRY(wf__accumulate(tr, step, &loss, &ps));
  double tr0 = wf_now();
  WF_TRY(reduce_and_update(tr, step, loss, &norm, &oi));
  if (tr->abandoned)
    goto fail;
  WF_TRY(wf_grads_check_tied(tr->grads, step));
  double end = wf_now(), dt = step_seconds(tr, t0, end);
  if (tr->trace && wf_trace_on(tr->trace))
    wf_trace_span(tr->trace, "step end (reduction, norm, AdamW)", "optim", tr0, wf_now(), step, -1);
  fill_info(tr, step, dt, loss, norm, &oi, info);
  info->host_syncs = (int)(wf_dev_host_syncs(tr->dev) - syncs);
  info->compute_ms = ps.busy_s * 1e3;
  info->p2p_wait_ms = ps.wait_s * 1e3;
  info->act_bytes = (int64_t)ps.act_bytes;
  WF_TRY(expert_figures(tr, info));
  st = stage_stats(tr, &ps, info);
fail:
  return st;
}

wf_status wf__evaluate(wf__trainer *tr, double *val_loss)
{
  wf_status st = WF_OK;
  int n = tr->cfg->train.eval_batches;
  double sum = 0;
  tr->split = WF_DATA_VAL;
  for (int i = 0; i < n; i++) {
    double part = 0;
    tr->step = i;
    WF_TRY(data_ready(tr));
    WF_TRY(wf_pipe_forward(tr->pipe, wf__batch_cb, tr, &part));
    sum += part;
  }
  *val_loss = sum / ((double)n * tr->M);
  WF_TRY(dp_mean(tr, val_loss));
  st = from_last_stage(tr, val_loss);
fail:
  return st;
}
