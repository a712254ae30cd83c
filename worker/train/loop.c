/*
 * loop.c - the training loop behind wf_train_run, and the debug-state dump.
 *
 * After every step: evaluate when due, report, let the caller decide whether to go on
 * (on_step: signals and the console's stop, agreed by every rank), and checkpoint when
 * due (always before stopping). After the last step: the trace and --save.
 *
 * Invariant: a non-finite loss or norm stops the run with an error before it can
 * poison the weights (the optimizer refuses it, fp16's skipped steps aside).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train_int.h"

static bool eval_due(const wf__trainer *tr, int step)
{
  int every = tr->cfg->train.eval_every;
  return tr->can_eval && (step == tr->steps || (every > 0 && step % every == 0));
}

/* After step's on_step: write a checkpoint when one is due. stopping: on_step ended the
 * run (SIGTERM, the console's stop), so this is the last chance. */
static wf_status maybe_checkpoint(wf__trainer *tr, int step, bool stopping, bool *wrote)
{
  const wf_config *cfg = tr->cfg;
  const wf_train_hooks *h = tr->hooks;
  int every = cfg->train.checkpoint_every;
  if (!cfg->train.checkpoint_dir[0])
    return WF_OK;
  bool last = stopping || step == tr->steps;
  bool due = last || tr->ckpt_deferred || (every > 0 && step % every == 0) ||
             (h && h->checkpoint_now && h->checkpoint_now(h->user));
  if (!due)
    return WF_OK;
  if (stopping && wf__rescue_at_stop(tr))
    return WF_OK; /* the launcher's stop: its writers write it */
  if (h && h->on_phase)
    h->on_phase(h->user, "checkpoint");
  /* The step's tied check is read now, not with the next norm: no checkpoint holds
   * copies that differ. ZeRO-3 stays sharded: each dp rank streams its shard to the
   * model file's writer (the checkpoint is ZeRO-1/2's format: optimizer shards, whole
   * model). The last checkpoint, and a stop's, are written at once: the job ends next. */
  wf_status st = wf_grads_check_tied_end(tr->grads);
  bool deferred = false;
  wf__rescue_checkpoint(tr, true); /* its time counts in the rescue's estimate */
  if (st == WF_OK && tr->ck.saver && !last)
    st = wf_ckpt_save_async(&tr->ck, step, &deferred);
  else if (st == WF_OK)
    st = wf_ckpt_save(&tr->ck, step);
  tr->ckpt_deferred = deferred;
  *wrote = !deferred;
  if (!deferred && st == WF_OK)
    tr->saved_step = step;
  wf__rescue_checkpoint(tr, false);
  if (h && h->on_phase) /* a deferred one was not written: "train" alone ends the phase */
    h->on_phase(h->user, deferred ? WF_TRAIN_PHASE_DEFERRED : "train");
  if (st != WF_OK && wf_rt_rank() <= 0)
    WF_ERROR("step %d: the checkpoint could not be written (see above); training stops here so "
             "no progress goes unsaved",
             step);
  return st;
}

static bool sample_due(const wf__trainer *tr, int step)
{
  int every = tr->cfg->train.sample_every;
  return every > 0 && step % every == 0;
}

/* train.sample_every: a sample line after the step's report (every rank draws it). */
static wf_status sample(wf__trainer *tr, int step)
{
  wf_trace_set_on(tr->trace, false); /* the trace shows training steps */
  if (tr->talk)
    wf__clear_bar(tr);
  return wf__sample(tr, step, tr->cfg->train.sample_prompt, tr->dp_rank, tr->talk ? tr->out : NULL);
}

/* One step, its evaluation, its report and its sample; *go_on from the caller's on_step. */
static wf_status one_step(wf__trainer *tr, int step, bool *go_on)
{
  wf_status st = WF_OK;
  wf_train_step_info info;
  double eval_ms = 0;
  WF_TRY(wf__train_step(tr, step, &info));
  if (tr->abandoned) { /* the launcher is ending the job: the writers have step - 1 */
    if (wf_rt_rank() <= 0)
      WF_INFO("stopping after step %d: the launcher is ending the job (step %d is dropped "
              "before its update)",
              step - 1, step);
    *go_on = false;
    return WF_OK;
  }
  if (eval_due(tr, step)) {
    double t = wf_now();
    wf_trace_set_on(tr->trace, false); /* the trace shows training steps */
    WF_TRY(wf__evaluate(tr, &info.val_loss));
    WF_TRY(wf__discard_expert_figures(tr));
    eval_ms = (wf_now() - t) * 1e3;
    tr->aside_s += eval_ms * 1e-3;
  }
  double eta = (wf_now() - tr->t0) / (step - tr->start) * (tr->steps - step);
  wf__report_step(tr, &info, eta, eval_ms);
  double t = wf_now();
  if (sample_due(tr, step)) {
    WF_TRY(sample(tr, step));
    WF_TRY(wf__discard_expert_figures(tr));
  }
  tr->aside_s += wf_now() - t;
  info.out_closed = tr->out_closed;
  *go_on = !tr->hooks || !tr->hooks->on_step || tr->hooks->on_step(tr->hooks->user, &info);
  t = wf_now();
  bool wrote = false;
  st = maybe_checkpoint(tr, step, !*go_on, &wrote);
  if (st == WF_OK && wrote && *go_on && tr->hooks && tr->hooks->after_checkpoint)
    *go_on = tr->hooks->after_checkpoint(tr->hooks->user);
  tr->aside_s += wf_now() - t;
fail:
  return st;
}

static wf_status run_loop(wf__trainer *tr)
{
  wf_status st = WF_OK;
  bool go_on = true;
  tr->t0 = wf_now();
  if (tr->start >= tr->steps && tr->talk)
    fprintf(tr->out, "the checkpoint is at step %d of train.steps %d: nothing to train\n",
            tr->start, tr->steps);
  tr->done = tr->start, tr->first_loss = tr->last_val = NAN;
  for (int step = tr->start + 1; step <= tr->steps && go_on; step++)
    WF_TRY(one_step(tr, step, &go_on));
  tr->stopped = !go_on && tr->done < tr->steps;
  st = wf_grads_check_tied_end(tr->grads); /* the last step's */
fail:
  wf__clear_bar(tr);
  return st;
}

/* The final model (--save, in --save-format), written by world rank 0: every rank passes
 * its parameters to it in bounded chunks (wf_ckpt_collect_model; under ZeRO-3 its dp
 * shard, so no rank gathers the flat parameters), which assemble the whole model on rank 0
 * alone, the array the format writers take. */
static wf_status save_final(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const char *path = tr->hooks ? tr->hooks->save_llmc : NULL;
  float *full = NULL;
  if (!path)
    return WF_OK;
  WF_TRY(wf_ckpt_collect_model(&tr->ck, &full));
  if (wf_rt_rank() <= 0)
    st = wf_weights_write(path, tr->hooks->save_format, &tr->dims, full,
                          (size_t)(tr->cfg->model.shard_mb * 1e6));
fail:
  free(full);
  return st;
}

/* train.trace: every rank's spans into one Chrome trace file (collective). */
static wf_status write_trace(wf__trainer *tr)
{
  if (!tr->trace)
    return WF_OK;
  return wf_trace_write(tr->trace, tr->world, tr->cfg->train.trace); /* the summary says where */
}

wf_status wf_train_run(const wf_config *cfg, const wf_train_hooks *hooks)
{
  wf_status st = WF_OK;
  wf__trainer tr;
  WF_TRY(wf__train_setup(&tr, cfg, hooks, cfg->train.microbatches, true));
  WF_TRY(run_loop(&tr));
  WF_TRY(write_trace(&tr));
  WF_TRY(save_final(&tr));
  wf_grads_stats gs;
  wf_grads_get_stats(tr.grads, &gs);
  if (gs.tied_checks > 0 && tr.talk)
    fprintf(tr.out,
            "tied embedding: the first and last stage's copies were identical after each of %ld "
            "steps\n",
            gs.tied_checks);
  wf__print_summary(&tr);
fail:
  wf__train_teardown(&tr);
  return st;
}

/* ---- the debug state -------------------------------------------------------------------- */

/* This rank's logits (N, Vl) into their columns of the whole (N, Vp). */
static wf_status place_logits(wf__trainer *tr, float *logits, size_t N)
{
  wf_status st = WF_OK;
  int Vl = tr->dims.Vp / tr->tp, r = wf__comm_rank(tr->tp_comm);
  float *mine = NULL;
  WF_CHECK_ALLOC(mine = malloc(N * (size_t)Vl * sizeof *mine));
  WF_TRY(wf_model_logits_read(tr->model, mine, 0, N * (size_t)Vl));
  for (size_t i = 0; i < N; i++)
    memcpy(logits + i * tr->dims.Vp + (size_t)r * Vl, mine + i * Vl, Vl * sizeof(float));
fail:
  free(mine);
  return st;
}

/* A debug state: one forward and backward of the global batch through the stages, then
 * the whole gradients and the logits assembled by sums over the world (only dp rank 0
 * contributes: every dp replica computed the same whole batch, the trainer having been
 * set up without the dp group). */
static wf_status dump_state(wf__trainer *tr, const char *path, int dp_rank)
{
  wf_status st = WF_OK;
  size_t np = wf_model_num_params(&tr->dims), N = (size_t)tr->B * tr->T;
  size_t nl = N * (size_t)tr->dims.Vp;
  double loss = 0;
  float *grads = NULL, *logits = NULL;
  WF_CHECK_ALLOC(grads = malloc(np * sizeof *grads));
  WF_CHECK_ALLOC(logits = calloc(nl, sizeof *logits));
  tr->split = WF_DATA_TRAIN, tr->step = 1;
  /* the logits of the forward, before backward turns them into their gradient */
  WF_TRY(wf_pipe_forward(tr->pipe, wf__batch_cb, tr, &loss));
  if (wf_model_get_shard(tr->model)->last && dp_rank == 0)
    WF_TRY(place_logits(tr, logits, N));
  WF_TRY(wf__accumulate(tr, 1, &loss, NULL));
  WF_TRY(wf_grads_finish(tr->grads));
  WF_TRY(wf_gather_full(tr->model, 1, grads, tr->world, dp_rank == 0));
  if (tr->world)
    WF_TRY(wf_comm_allreduce(tr->world, logits, logits, nl, WF_COMM_F32, WF_COMM_SUM));
  if (wf_rt_rank() <= 0) {
    WF_TRY(wf_data_batch(tr->data, tr->inputs, tr->targets, NULL, WF_DATA_TRAIN, 0, 0, 1, 0, 1));
    st = wf_llmc_write_state(path, &tr->dims, tr->B, tr->T, tr->inputs, tr->targets, logits,
                             (float)loss, grads);
  }
fail:
  free(grads);
  free(logits);
  return st;
}

wf_train_hooks wf__quiet_hooks(const wf_train_hooks *comms)
{
  wf_train_hooks quiet = {.quiet = true};
  if (comms) {
    quiet.tp = comms->tp, quiet.pp = comms->pp, quiet.emb = comms->emb;
    quiet.ep = comms->ep; /* the experts are sharded over it: every exchange needs it */
    quiet.world = comms->world, quiet.dev = comms->dev;
  }
  return quiet;
}

wf_status wf_train_dump_state(const wf_config *cfg, const char *path, const wf_train_hooks *comms)
{
  wf_status st = WF_OK;
  wf__trainer tr;
  wf_train_hooks quiet = wf__quiet_hooks(comms);
  WF_TRY(wf__train_setup(&tr, cfg, &quiet, 1, false)); /* the whole global batch at once */
  if (tr.tp > 1 || tr.pp > 1) {
    st = dump_state(&tr, path, comms && comms->dp ? wf_comm_rank(comms->dp) : 0);
  } else {
    WF_TRY(wf_data_batch(tr.data, tr.inputs, tr.targets, NULL, WF_DATA_TRAIN, 0, 0, 1, 0, 1));
    st = wf_model_dump_state(tr.model, path, tr.inputs, tr.targets, tr.B, tr.T);
  }
fail:
  wf__train_teardown(&tr);
  return st;
}
