/*
 * wf_train.h - the training loop: model, data, schedule, logging and metrics.
 *
 * One step is: gather the micro-batches of this rank's slice of the global batch ->
 * forward and backward of each with loss gradient 1/M (gradient accumulation, through
 * the pipeline schedule) -> the gradient path (dp, tp and tied-embedding reductions,
 * global norm) -> the optimizer (clip, fp16 loss scaling, AdamW with the scheduled
 * learning rate) -> the parameters synchronised again. The mathematics of a step never
 * depends on the mesh.
 *
 * Rank 0 prints one line per step, in a stable key=value form:
 *   step 12/300 loss=3.1234 lr=1.20e-03 grad_norm=0.812 tok/s=5123 tok/s/gpu=1281
 *   tflops=0.041 tflops/gpu=0.010 mfu=23.1% step_ms=99.8 mem=45.2MiB eta=28s
 * (tok/s and tflops for the job, /gpu per rank) and after an evaluation
 *   eval 12/300 val_loss=3.2011 floor=1.5021 gap=1.6990 eval_ms=31.0
 * (floor and gap only for the synthetic source). Every step is also appended to
 * train.metrics as one JSON object (step, time (unix seconds), timestamp (ISO 8601 UTC),
 * rank (the writer's), loss, lr, grad_norm, tokens_per_s, tokens_per_s_per_gpu, step_ms,
 * tflops, tflops_per_gpu, mfu_pct (a percent, as on the line), mem_mib, host_syncs (the
 * times the writer's host waited for its device in the step: 2, the loss and the norm); val_loss
 * when evaluated; with tp, pp or cp > 1 also tp_ms, bubble, bubble_theory, and per stage act_mib
 * and act_slots; with cp > 1 cp_ms (the wait for context parallelism's keys and values that
 * compute did not hide) and cp_mib (what this rank sent); with precision=fp16 also loss_scale,
 * skipped_steps and step_skipped, which the step line shows as "loss_scale=65536 skipped=0" after
 * eta). A step whose loss exceeds train.loss_jump_factor times its running mean gets one WARN.
 */
#ifndef WF_TRAIN_H
#define WF_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "wf_ckpt.h"
#include "wf_collectives.h"
#include "wf_config.h"
#include "wf_runtime.h"

#define WF_TRAIN_MAX_EXTRA 32 /* named figures a step can add (wf_train_step_info.extra) */

typedef struct wf_train_step_info {
  int step, steps;      /* step is 1-based */
  double loss;          /* mean cross-entropy over the global batch, nats per token */
  double lr;            /* learning rate used by this step's update */
  double grad_norm;     /* global gradient norm before clipping */
  double step_ms;       /* wall time of the step (not of the evaluation) */
  double tokens_per_s;  /* global batch tokens / step time */
  double tflops;        /* achieved, from wf_model_flops_per_step */
  double mfu;           /* tflops / peak, in [0, 1]; 0 when no peak is known */
  double val_loss;      /* NAN unless an evaluation ran after this step */
  double entropy_floor; /* synthetic source: its entropy rate in nats; else NAN */
  int64_t mem_bytes;    /* memory this rank holds (host + device) */
  double comm_ms;       /* gradient communication not hidden behind backward */
  double tp_ms;         /* time in tensor-parallel collectives (this rank) */
  double cp_ms;         /* context parallelism: exposed K/V communication (this rank) */
  double cp_bytes;      /* and the bytes it sent */
  double ep_ms;         /* expert parallelism: in the tokens' all-to-all (this rank) */
  double ep_bytes;      /* and the bytes it sent */
  double bubble;        /* pipeline: idle share of the schedule's span, 1 - mean busy / longest */
  double bubble_theory; /* (p - 1) / (m + p - 1) */
  int n_stages;         /* pp */
  int64_t stage_act_bytes[WF_MAX_STAGES]; /* peak activations held by each stage */
  int stage_peak_slots[WF_MAX_STAGES];    /* most micro-batches (x chunks) it held at once */
  int64_t optim_bytes; /* AdamW state this rank holds (about 1/dp of it under ZeRO-1) */
  double peak_tflops;  /* the peak MFU divides by, per rank (see the banner for its source) */
  int64_t params;      /* parameters this rank holds (its tp shard of its stage's layers) */
  double loss_scale;   /* precision=fp16: this step's loss scale S (a dp rank's backward
                        * scales its loss gradient by S / dp, see train.c); else NAN */
  bool skipped;        /* fp16: this step's gradients overflowed, so it made no update */
  int skipped_steps;   /* fp16: steps skipped so far in the run (0 otherwise) */
  /* Megatron-style per-GPU figures (a rank is one GPU, or one CPU core set): the job's
   * tokens_per_s and tflops over its ranks. */
  double tokens_per_s_gpu;
  double tflops_gpu;
  double compute_ms;  /* this rank's forward + backward compute (the pipeline's busy time) */
  double p2p_wait_ms; /* this rank's wait in pipeline sends and receives */
  /* This rank's memory by kind, in bytes (param + grad + optim_bytes is what ZeRO shards;
   * wf_parallel.h has the formulas): */
  int64_t param_bytes; /* parameters, their bf16/fp16 GEMM copy, ZeRO-3's shard and units */
  int64_t grad_bytes;  /* gradients and the dp reduction's buffers (wf_grads_bytes) */
  int host_syncs;      /* the step's waits of the host for the device (wf_dev_host_syncs) */
  int64_t act_bytes;   /* activations this step held at its peak (the pipeline's slots) */
  bool out_closed;     /* the step lines' stream (hooks->out) is a pipe whose reader has
                        * gone (`| head`): what follows is lost; on_step decides */
  /* Further figures of the step, by name, for a model family or feature that has them (a
   * mixture-of-experts router's "router/aux_loss", "router/tokens_per_expert_min",
   * "router/dropped_tokens", ...): train.tensorboard writes each as a scalar of that tag
   * and train.metrics as a key of that name. Names are static strings. */
  int n_extra;
  struct {
    const char *name;
    double value;
  } extra[WF_TRAIN_MAX_EXTRA];
  /* A mixture of experts (NAN and 0 for a dense family): the step's load-balancing loss and
   * router z-loss, each the mean over its micro-batches (without their coefficients), the
   * (token, expert) choices a capacity dropped in the global batch, and for each of its
   * n_expert_layers layers the tokens its least and most chosen expert received over the
   * global batch and their imbalance, the most over the mean (expert_load: min, max,
   * imbalance for each layer; valid until the next step). */
  double aux_loss, z_loss;
  int64_t dropped_tokens;
  int n_expert_layers;
  const float *expert_load;
} wf_train_step_info;

typedef struct wf_train_hooks {
  void *user;
  /* Called after every step (and its evaluation, if any); return false to stop. */
  bool (*on_step)(void *user, const wf_train_step_info *info);
  FILE *out;  /* banner and per-step lines; NULL = stdout */
  bool quiet; /* print nothing but errors (tests) */
  /* The data-parallel group this rank trains in (NULL = one rank alone): each dp
   * rank trains on its slice of the global batch and gradients are averaged. */
  struct wf_comm *dp;
  const char *save_llmc;      /* write the final model there (world rank 0) ... */
  wf_weights_fmt save_format; /* ... in this format (default: llm.c version 3) */
  /* Checkpoints (train.checkpoint_dir): one is written every train.checkpoint_every
   * steps, after the last step, and when on_step stops the run. checkpoint_now is
   * asked at the other step boundaries, after on_step; it must answer the same on
   * every rank (NULL = never). on_phase hears "checkpoint" while one is written and
   * "train" after (NULL = nobody). world is every rank of the job, for agreeing on
   * checkpoint errors (NULL = dp). */
  bool (*checkpoint_now)(void *user);
  /* Asked after a checkpoint written at a step boundary where the run goes on; false
   * stops the run there (a stop request that came during the write). It must answer
   * the same on every rank (NULL = go on). */
  bool (*after_checkpoint)(void *user);
  void (*on_phase)(void *user, const char *phase);
/* on_phase's phase after a checkpoint that was deferred, not written (back to training) */
#define WF_TRAIN_PHASE_DEFERRED "train (checkpoint deferred)"
  struct wf_comm *world;
  /* Model parallelism: the tp group (heads, MLP and vocabulary split over it), the pp
   * group (pipeline stages) and the embedding group (first and last stage, which both
   * hold the tied wte). NULL = size 1. */
  struct wf_comm *tp, *pp, *emb;
  /* Context parallelism: the cp group (each sequence split over it, a ring) and the dp x
   * cp group over which gradients are averaged and ZeRO shards (dp stays the group the
   * data is split over). NULL = no context parallelism. */
  struct wf_comm *cp, *dpcp;
  /* Expert parallelism (NULL: none): the ep group of ep consecutive dp ranks, which shard
   * the experts and exchange tokens by all-to-all, and the expert-data-parallel group of
   * the dp ranks holding the same experts, over which their gradients reduce. */
  struct wf_comm *ep, *edp;
  /* The device this rank trains on (borrowed; NULL = the CPU). */
  struct wf_dev *dev;
  /* Its nominal peak in TFLOP/s for MFU, and where that comes from (0: unknown, so it
   * is measured; train.peak_tflops overrides both). */
  double peak_tflops;
  const char *peak_source;
  /* > 0: the launcher kills the ranks this long after it begins ending the job (mpirun
   * outside Slurm): where a step and a checkpoint take longer, the launcher's stop is
   * written by processes that outlive the job (rescue.c; wf_train_rescue_request).
   * stop_by_launcher: whether the stop on_step agreed is the launcher's (NULL = never). */
  double kill_grace_s;
  bool (*stop_by_launcher)(void *user);
} wf_train_hooks;

/* Async-signal-safe: the launcher is ending the job (its first signal, and each one
 * after). */
void wf_train_rescue_request(void);
/* Whether this process's training has a stop's writer ready (its stop does not depend on
 * the kill grace). */
bool wf_train_rescue_ready(void);
/* Async-signal-safe: whether the launcher's stop would go to the writers now (a step and
 * a checkpoint outlast the kill grace). */
bool wf_train_rescue_armed(void);

/* Build the model (random init from train.seed, or model.init, or the checkpoint
 * train.resume names), open the data and run train.steps steps (those the checkpoint
 * has not done). hooks may be NULL. Errors are logged; returns the first one. */
wf_status wf_train_run(const wf_config *cfg, const wf_train_hooks *hooks);

/* Write llm.c's debug state (wf_model_dump_state) for the first global batch of the
 * config's data source and model, then return. comms (NULL = one rank) gives the tp,
 * pp, emb, dp and world groups of a model-parallel run: the state is then computed by
 * the stages and shards together and assembled whole by world rank 0. */
wf_status wf_train_dump_state(const wf_config *cfg, const char *path, const wf_train_hooks *comms);

/* One draw of a sample: the id among logits[0 .. V) (the whole vocabulary's row, divided
 * by temperature > 0) drawn from the softmax over its top_k (0 = all; equal logits
 * ranked by the lower id), with u = wf_rng_uniform(seed, a stream of `stream`, index):
 * the first id, most likely first, whose cumulative probability exceeds u. A pure
 * function of its arguments; -1 when out of memory. */
int wf_sample_token(const float *logits, int V, int top_k, double temperature, uint64_t seed,
                    uint64_t stream, uint64_t index);

/* Before a job: the prompt (NULL: train.sample_prompt, checked only with
 * train.sample_every) encodes under data.tokenizer (or as bytes) into ids below the
 * model's vocabulary V; else the reason in err. Not collective. */
wf_status wf_sample_check(const wf_config *cfg, const char *prompt, int V, char *err, size_t len);

/* worker --generate: the model of model.init on the mesh comms gives (NULL = one rank),
 * train.sample_tokens tokens sampled after `prompt` (see "Samples" in sample.c), printed
 * by world rank 0 on stdout (prompt and continuation, decoded), then return. */
wf_status wf_train_generate(const wf_config *cfg, const char *prompt, const wf_train_hooks *comms);

#endif /* WF_TRAIN_H */
