/*
 * train_int.h - private to worker/train: the trainer's state, shared by its set-up, its
 * step, its reporting and its loop.
 *
 * Error idiom: the worker's (WF_TRY / goto fail; errors logged where they arise, every
 * collective's status checked). Refusals every rank reaches alike from the same
 * configuration are logged by rank 0 alone (WF_REFUSE).
 */
#ifndef WF_TRAIN_INT_H
#define WF_TRAIN_INT_H

#include <stdbool.h>
#include <stdio.h>

#include "wf_check.h"
#include "wf_ckpt.h"
#include "wf_device.h"
#include "wf_io.h"
#include "wf_model.h"
#include "wf_optim.h"
#include "wf_parallel.h"
#include "wf_train.h"

typedef struct wf__trainer {
  const wf_config *cfg;
  const wf_train_hooks *hooks;
  FILE *out;
  bool talk;       /* rank 0 and not quiet: banner and step lines */
  bool bar;        /* progress bar on stderr (stdout is a terminal) */
  bool out_closed; /* writing to out failed with EPIPE: its reader has gone */
  bool can_eval;
  wf_dev *dev;
  wf_model *model;
  wf_tp *tpr;      /* tensor parallelism's region operators (tp > 1), the model's */
  wf_ep *epr;      /* expert parallelism's exchange (ep > 1), the model's */
  wf_grads *grads; /* the gradient path: zero, reductions, norm, parameter sync */
  wf_optim *optim; /* AdamW state (this rank's dp shard under ZeRO-1), clip, scaler, lr */
  wf_comm *dp_comm, *tp_comm, *pp_comm, *emb_comm, *world; /* borrowed; NULL = size 1 */
  wf_comm *ep_comm, *edp_comm; /* expert parallelism's groups (borrowed; NULL = none) */
  int dp_rank, D;              /* this rank's data-parallel slice of D */
  /* Context parallelism: the cp group (cp ranks, this one cp_rank) and the group
   * gradients are averaged over and ZeRO shards (dp x cp; dp_comm without cp) of
   * grad_size ranks. A micro-batch's sequences are T tokens, of which this rank holds
   * Tl = T / cp (chunks cp_rank and 2cp-1-cp_rank), fetched whole into seq_in/seq_tg. */
  wf_comm *cp_comm, *grad_comm;
  int cp, cp_rank, grad_size, Tl;
  wf_cp *cpr;
  int *seq_in, *seq_tg; /* (B, T) host: a micro-batch's whole sequences (cp > 1) */
  int tp, pp, pp_rank, world_size;
  int bounds[WF_MAX_STAGES + 1]; /* stage s holds layers [bounds[s], bounds[s+1]) */
  wf_pipe *pipe;
  wf_trace *trace;
  int chunks; /* model chunks per rank (interleaved schedule), else 1 */
  int step;   /* the step being run (for the batch callback) */
  wf_data_split split;
  wf_data *data;
  wf_model_dims dims;
  int B, T, M, steps;    /* micro-batch rows, sequence length, micro-batches, steps */
  int *inputs, *targets; /* (B, T), host */
  FILE *metrics;
  wf_tfevents *tb;         /* train.tensorboard's writer (world rank 0); NULL = none */
  double peak_tflops;      /* per rank, for MFU; 0 = unknown */
  const char *peak_source; /* how it was obtained, for the banner */
  double flops;            /* per step, for the whole global batch */
  double t0;               /* start of the loop */
  double last_end;         /* when the previous step's work ended; 0 = no previous step */
  double aside_s;          /* since then: evaluation, samples, checkpoints (not the step's) */
  wf_ckpt_target ck;       /* what checkpoints save and restore */
  bool fp16;               /* precision=fp16: loss scaling on */
  int start;               /* steps done before this run (a resumed checkpoint's step) */
  double loss_mean;        /* the loss-jump watch's running mean (report.c) */
  int loss_n;              /* steps in it */
  wf_tokenizer *tok;       /* data.tokenizer, loaded by the first sample; NULL = bytes */
  /* for the end-of-run summary (report.c): */
  int done;                  /* the last step trained (tr->start before the first) */
  bool stopped;              /* on_step stopped the run before train.steps */
  double first_loss;         /* the first step's loss this run; NAN before it */
  double last_loss;          /* the last step's */
  double last_val;           /* the last evaluation's; NAN when none ran */
  int saved_step;            /* the last checkpoint written this run; 0 = none */
  bool ckpt_deferred;        /* a checkpoint came due while a background write was under way */
  uint64_t launches;         /* the device's launch count at the last metrics line */
  float *router_stats;       /* (L, wf_model_stats_floats) a step's routers' statistics (MoE) */
  float *expert_load;        /* (L, 3) the step's min, max and imbalance of each layer's experts */
  struct wf__rescue *rescue; /* a stop's writer (rescue.c); NULL = none */
  bool abandoned;            /* the launcher's stop dropped this step before its update */
  int rescued_step;          /* the step the stop's writers write; 0 = none */
} wf__trainer;

/* Hooks for a one-off run inside the job (--dump-state, --generate): comms' groups and
 * device, nothing printed, no dp group (each dp replica computes alone). */
wf_train_hooks wf__quiet_hooks(const wf_train_hooks *comms);
int wf__comm_size(wf_comm *c);
int wf__comm_rank(wf_comm *c);

/* rescue.c: a stop the launcher would cut short, written by processes that outlive the
 * job. setup (collective) arms it where it can work: under mpirun (hooks->kill_grace_s),
 * with train.checkpoint_dir, the state in host memory and written without collectives (no
 * ZeRO-3). enter and leave bracket the optimizer's update (enter is collective; *skip:
 * drop this step, the launcher is ending the job); checkpoint brackets a checkpoint
 * written at a step boundary (its time, for the estimate). at_stop: the stop on_step agreed is the
 * launcher's, and the writers (started here if need be) write its checkpoint: skip the graceful
 * one. */
wf_status wf__rescue_setup(wf__trainer *tr);
void wf__rescue_teardown(wf__trainer *tr);
wf_status wf__rescue_enter(wf__trainer *tr, bool *skip);
void wf__rescue_leave(wf__trainer *tr, int step, bool updated);
void wf__rescue_checkpoint(wf__trainer *tr, bool begin);
bool wf__rescue_at_stop(wf__trainer *tr);

/* setup.c: everything before the first step, and after the last. M micro-batches;
 * checkpoints: honour train.checkpoint_dir and train.resume. */
wf_status wf__train_setup(wf__trainer *tr, const wf_config *cfg, const wf_train_hooks *hooks, int M,
                          bool checkpoints);
void wf__train_teardown(wf__trainer *tr);

/* step.c: one training step and its figures; evaluation; forward and backward of this
 * rank's micro-batches through the schedule (the step's summed micro-batch losses, the
 * mean over the global batch in *loss); the gradient path's finish. */
wf_status wf__train_step(wf__trainer *tr, int step, wf_train_step_info *info);
wf_status wf__evaluate(wf__trainer *tr, double *val_loss);
/* A mixture of experts: the figures an evaluation's forwards added, dropped. */
wf_status wf__discard_expert_figures(wf__trainer *tr);
wf_status wf__accumulate(wf__trainer *tr, int step, double *loss, wf_pipe_stats *ps);
wf_status wf__batch_cb(void *user, int mb, int *inputs, int *targets, int *starts);

/* sample.c: train.sample_tokens tokens after `prompt` ("" = train.sample_prompt's
 * default start) drawn on every rank alike, the text printed by world rank 0 on out: one
 * line "sample STEP/STEPS: ..." for a step > 0, else the raw text (--generate). dp_rank:
 * this rank's dp replica (only replica 0's logits are summed). Collective over the
 * world. */
wf_status wf__sample(wf__trainer *tr, int step, const char *prompt, int dp_rank, FILE *out);

/* report.c: the banner, the per-step lines, the metrics file, MFU's peak. */
void wf__print_banner(const wf__trainer *tr);
wf_status wf__setup_peak(wf__trainer *tr);
void wf__report_step(wf__trainer *tr, const wf_train_step_info *in, double eta, double eval_ms);
void wf__clear_bar(const wf__trainer *tr);
/* Rank 0, after the run: steps, wall time, tokens/s, the losses and where every output
 * went (checkpoint, metrics, trace, saved model). */
void wf__print_summary(const wf__trainer *tr);
wf_status wf__open_metrics(wf__trainer *tr);
/* train.tensorboard: world rank 0 opens its writer (WF_ECONFIG when the directory cannot
 * be written); the other ranks return WF_OK. */
wf_status wf__open_tensorboard(wf__trainer *tr);

#endif /* WF_TRAIN_INT_H */
