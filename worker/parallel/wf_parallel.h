/*
 * wf_parallel.h - data and pipeline parallelism: pipeline schedules as data
 * (wf_schedule_*), the engine that runs them (wf_pipe_*), the partition of layers into
 * stages, and the gradient path (wf_grads_*): data-parallel reduction and ZeRO
 * sharding, tensor-parallel and tied-embedding sums, the global norm; and tensor
 * parallelism's region operators (wf_tp_*), which the model's forward and backward call
 * through the table wf_model.h defines.
 */
#ifndef WF_PARALLEL_H
#define WF_PARALLEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "wf_collectives.h"
#include "wf_device.h"
#include "wf_trace.h"
#include "wf_config.h" /* wf_schedule_kind: WF_SCHED_1F1B, WF_SCHED_GPIPE, WF_SCHED_INTERLEAVED */
#include "wf_model.h"
#include "wf_runtime.h"

/*
 * Tensor parallelism (tp.c): the region operators over the tp group (copy-to /
 * reduce-from / gather / scatter and their sequence-parallel forms, wf_model.h's
 * wf_tp_ops), handed to the model as wf_tp_regions_of(tp); the time and bytes they
 * spend (the step log's tp figures) and a trace span per collective.
 */
typedef struct wf_tp wf_tp;
/* Over tp group `comm` (size >= 1), activations on `dev`, with sequence parallelism. */
wf_status wf_tp_create(wf_tp **out, wf_comm *comm, wf_dev *dev, bool sequence);
void wf_tp_destroy(wf_tp *tp); /* accepts NULL */
/* The operators for wf_model_opts.tp: none (the identity) with one tp rank. */
wf_tp_regions wf_tp_regions_of(wf_tp *tp);
/* Sum n floats of device memory in place over the tp group, counted in the tp time like
 * the region operators (gradients of replicated parameters that each tp rank computed
 * from its own token rows). A no-op for NULL or one rank. */
wf_status wf_tp_allreduce(wf_tp *tp, float *x, size_t n);
/* Record each tp collective as a "comm" span while `trace` is on (NULL = none). */
void wf_tp_set_trace(wf_tp *tp, wf_trace *trace);
/* Seconds and bytes of tp communication since the last call (then reset). */
void wf_tp_stats(wf_tp *tp, double *seconds, double *bytes);

/*
 * Context parallelism (cp.c): attention of each cp rank's two chunks of every sequence
 * against every rank's keys and values, by ring (K/V blocks passed around the cp group
 * overlapped with each block's attention, dK/dV passed back) or by all-gather
 * (parallel.cp_mode), merged by log-sum-exp; handed to the model as wf_cp_regions_of(cp)
 * (wf_model.h's wf_cp_ops). The shape of the largest call sizes its buffers, which are
 * the rank's communication scratch (wf_cp_scratch_bytes, which the planner counts too).
 */
typedef struct wf_cp wf_cp;
typedef struct wf_cp_geo {
  int B, T;  /* micro-batch rows and this rank's rows per sequence (T = the sequence / cp) */
  int C, NH; /* width of q and out, query heads (this tp rank's) */
  int KW;    /* width of one row of keys and values: 2 x kv heads x head size */
  int fmt;   /* the activations' format (a wf_precision) */
} wf_cp_geo;
typedef struct wf_cp_opts {
  wf_comm *comm; /* the cp group */
  wf_dev *dev;
  wf_cp_mode mode;
  wf_cp_geo max;
} wf_cp_opts;
/* Fails (naming the device) where the device has no block attention kernels. */
wf_status wf_cp_create(wf_cp **out, const wf_cp_opts *o);
void wf_cp_destroy(wf_cp *cp); /* accepts NULL */
wf_cp_regions wf_cp_regions_of(wf_cp *cp);
size_t wf_cp_scratch_bytes(wf_cp_mode mode, int P, const wf_cp_geo *g);
/* The geometry of a model of dims d on tp ranks: micro-batches of B sequences, T rows of
 * each on this rank, activations in format fmt. */
wf_cp_geo wf_cp_geo_of(const wf_model_dims *d, int tp, int B, int T, int fmt);
/* Seconds spent waiting for cp communication (exposed) and bytes sent, since the last
 * call (then reset). */
void wf_cp_stats(wf_cp *cp, double *seconds, double *bytes);
/* Record each wait as a "comm" span ("cp wait") while `trace` is on (NULL = none). */
void wf_cp_set_trace(wf_cp *cp, wf_trace *trace);

/*
 * Expert parallelism (ep.c): the exchange of tokens and their counts over the ep group
 * (all-to-all(v), wf_model.h's wf_ep_ops), handed to the model as wf_ep_regions_of(ep);
 * the time and bytes it spends (the step log's ep figures) and a trace span per exchange.
 */
typedef struct wf_ep wf_ep;
wf_status wf_ep_create(wf_ep **out, wf_comm *comm);
void wf_ep_destroy(wf_ep *ep); /* accepts NULL */
/* The exchange for wf_model_opts.ep: none with one ep rank. */
wf_ep_regions wf_ep_regions_of(wf_ep *ep);
void wf_ep_set_trace(wf_ep *ep, wf_trace *trace);
/* Seconds and bytes of ep communication since the last call (then reset). */
void wf_ep_stats(wf_ep *ep, double *seconds, double *bytes);

/* The whole model's parameters (which 0) or gradients (1) in `full` on every rank of
 * `world`: the ranks with `contribute` add their counted slices into zeros and a sum
 * over the world assembles the model (one model-parallel replica contributes; world
 * NULL: this rank alone). `full` is the only whole-model allocation it needs. */
wf_status wf_gather_full(wf_model *m, int which, float *full, wf_comm *world, bool contribute);

/*
 * wf_schedule - pipeline schedules as data.
 *
 * A schedule is a pure function of (kind, pp size p, pp rank r, micro-batches m,
 * virtual stages v): the list of actions rank r runs in one training step. The
 * engine executes the list in order; nothing else decides what runs when.
 *
 * Stages. The model is cut into S = p * v stages. Rank r holds v model chunks;
 * chunk c on rank r runs stage s = c * p + r (Megatron's interleaved placement; with
 * v = 1 stage s is rank s). Activations flow s -> s + 1, gradients s + 1 -> s.
 *
 * Actions. FORWARD(mb, chunk) and BACKWARD(mb, chunk) are compute. SEND_F/RECV_F
 * carry the activation of (mb) into the next stage, SEND_B/RECV_B the gradient of
 * that activation back. For a message, `chunk` is always this rank's own chunk: the
 * one that produced it (SEND) or will consume it (RECV); `peer` is the other rank.
 * Neighbouring stages on the same rank (p = 1 with v > 1) hand over locally, with no
 * message.
 *
 * How an engine runs the list. A RECV is placed where the engine should post the
 * receive: ahead of the compute that consumes it, at the point the simulated sender
 * produced the data. A SEND comes right after the compute that produced the data
 * (after receives posted in the same tick). An engine may post both as non-blocking
 * operations and wait for a receive only before its consumer; but the generated lists
 * are safe even when every SEND and RECV blocks until its partner is there
 * (rendezvous), so consecutive comm actions can also be issued one by one or as one
 * NCCL group. Between two ranks, messages in one direction are matched in list
 * order (NCCL has no tags), so both lists name them in the same order.
 *
 * Validation (wf_schedule_validate) takes every rank's list of one mesh. It checks
 * each list alone (ranges, peers, every micro-batch's forward and backward exactly
 * once per chunk, no backward before its forward or its gradient, no forward before
 * its input, no send before its data exists), then simulates all ranks together under
 * rendezvous p2p: a SEND and the RECV it pairs with complete only when both are at the
 * head of their lists, and must then describe the same message. If no rank can move,
 * the schedule could deadlock. Errors name the first bad step: "rank R step I (ACTION):
 * what is wrong".
 */

typedef enum wf_sched_op {
  WF_ACT_FORWARD = 0,
  WF_ACT_BACKWARD,
  WF_ACT_SEND_F, /* activation to the next stage */
  WF_ACT_RECV_F, /* activation from the previous stage */
  WF_ACT_SEND_B, /* gradient to the previous stage */
  WF_ACT_RECV_B  /* gradient from the next stage */
} wf_sched_op;

typedef struct wf_sched_action {
  wf_sched_op op;
  int mb;    /* micro-batch, 0 .. m-1 */
  int chunk; /* this rank's model chunk, 0 .. v-1 (stage chunk * p + rank) */
  int peer;  /* SEND/RECV: the other pp rank; -1 for compute */
} wf_sched_action;

typedef struct wf_sched_params {
  wf_schedule_kind kind;
  int pp;             /* p >= 1 */
  int microbatches;   /* m >= 1; interleaved needs m % p == 0 */
  int virtual_stages; /* v: 1 for GPipe and 1F1B, >= 2 for interleaved */
} wf_sched_params;

/* One rank's action list. Lives in the caller's memory; `actions` is owned. */
typedef struct wf_schedule {
  wf_sched_params prm;
  int rank;
  int n; /* number of actions */
  wf_sched_action *actions;
} wf_schedule;

/* Simulation costs in ticks (>= 1). Unit costs are {1, 1}. Messages take no time. */
typedef struct wf_sched_cost {
  int forward, backward;
} wf_sched_cost;

/* Generate rank `rank`'s list. Invalid parameters give WF_EINVAL and a message. */
wf_status wf_schedule_init(wf_schedule *s, const wf_sched_params *prm, int rank, char *err,
                           size_t err_len);
/* Generate every rank's list at once: ranks[0 .. p-1]. */
wf_status wf_schedule_init_all(wf_schedule *ranks, const wf_sched_params *prm, char *err,
                               size_t err_len);
void wf_schedule_fini(wf_schedule *s); /* accepts NULL and a zeroed schedule */
void wf_schedule_fini_all(wf_schedule *ranks, int pp);

/* Check ranks[0 .. p-1] (p = ranks[0].prm.pp) as described above. WF_OK, or
 * WF_EINVAL with the first bad step in err. */
wf_status wf_schedule_validate(const wf_schedule *ranks, char *err, size_t err_len);

/* Peak number of (micro-batch, chunk) activations held: forward done, backward not.
 * With v = 1 this is micro-batches in flight: min(p - r, m) under 1F1B, m under GPipe. */
int wf_schedule_peak_inflight(const wf_schedule *s);

/* The message buffers a list needs, when a received message occupies its buffer from
 * the receive's post until its consumer (the forward or backward of its work item) has
 * run, and a gradient to send occupies one until the send completes. The engine sizes
 * its buffers by these, so they are exact, not bounds. Receives are posted where the
 * data comes into being (see schedule.c), a few actions ahead of their consumer: for
 * GPipe and 1F1B the counts do not grow with p or m. */
typedef struct wf_sched_bufs {
  int recv_f; /* activations received whose forward has not run */
  int recv_b; /* gradients received whose backward has not run */
  int send_b; /* gradients being sent: at most 2 (a third send waits for the oldest) */
} wf_sched_bufs;
wf_sched_bufs wf_schedule_buffers(const wf_schedule *s);

/* Run all ranks' lists on a clock, as an engine with non-blocking p2p would: compute
 * takes its cost, SENDs and RECV posts take none and never wait, and a compute starts
 * once its rank is free and the SEND of its input has been issued. Gives the makespan
 * in ticks and the bubble, the idle fraction 1 - busy / (p * makespan). The lists must
 * be valid (WF_EINVAL otherwise). */
wf_status wf_schedule_simulate(const wf_schedule *ranks, wf_sched_cost cost, int *makespan,
                               double *bubble);

/* The textbook bubble with equal per-stage costs: (p - 1) / (m + p - 1) for GPipe and
 * 1F1B, (p - 1) / (v * m + p - 1) for interleaved (each chunk 1/v of a stage). */
double wf_schedule_bubble_theory(const wf_sched_params *prm);

/* Short name of an action as drawn: F3, B3, SF3>1, RF3<0, SB3>0, RB3<1; a chunk letter
 * follows the micro-batch when v > 1 (F3a = chunk 0, F3b = chunk 1). */
void wf_schedule_action_str(const wf_schedule *s, const wf_sched_action *a, char *buf, size_t len);

/* Draw ranks x ticks (compute only; idle ticks as ".."), at `cost`. */
wf_status wf_schedule_draw(FILE *out, const wf_schedule *ranks, wf_sched_cost cost);

/* What `worker --print-schedule` prints: generate, validate, draw at unit cost, each
 * rank's action list, peak in-flight per rank, and the theoretical and simulated
 * bubble. */
wf_status wf_schedule_print(FILE *out, const wf_sched_params *prm, char *err, size_t err_len);

const char *wf_schedule_kind_str(wf_schedule_kind kind);

/*
 * wf_pipe - the pipeline engine: runs one rank's schedule (wf_schedule, above) over the
 * pp group, and the stage partition.
 *
 * One training step on a rank: the schedule's actions in order. FORWARD and BACKWARD
 * run the local stage (wf_model_stage_*) in an activation slot taken at the forward
 * and given back when its backward ends, so a stage holds exactly the micro-batches
 * the schedule has in flight (1F1B: min(p - r, m); GPipe: m). SEND and RECV are
 * non-blocking point-to-point on the pp communicator, posted where the list puts
 * them (receives ahead of their consumer); the engine waits for a receive only right
 * before the compute that consumes it, and for a send only before the buffer it reads
 * is reused. Activations leave from the slot's output, gradients from a send ring.
 * Messages between two neighbours flow one way per kind (activations up, gradients
 * down), so MPI's in-order matching pairs them as the validated lists name them.
 *
 * With pp = 1 the schedule is 1F1B on one stage (F0 B0 F1 B1 ...): one slot, plain
 * gradient accumulation, no messages. With the interleaved schedule the rank's model
 * holds v chunks (wf_model_chunk_forward) and work items are (micro-batch, chunk).
 */

typedef struct wf_pipe wf_pipe;

typedef struct wf_pipe_opts {
  wf_comm *pp;     /* the pp group; NULL with one stage */
  wf_model *model; /* this rank's stage (borrowed) */
  wf_schedule_kind kind;
  int microbatches;   /* m */
  int virtual_stages; /* v: model chunks per rank (interleaved); the model holds them */
  int B, T;           /* micro-batch */
  wf_trace *trace;    /* spans of compute and waits; NULL = none */
  bool docs;          /* packed documents (data.document_mask): every stage reads each
                       * micro-batch's document starts, which its attention keeps to */
} wf_pipe_opts;

/* Fills micro-batch mb's inputs, targets and starts (B*T each; starts NULL unless the
 * pipeline was made with docs): starts[b,t] is where the document of position t begins
 * in its row (wf_io.h's wf_data_batch). */
typedef wf_status (*wf_pipe_batch_fn)(void *user, int mb, int *inputs, int *targets, int *starts);
/* Called once per step right before the rank's last backward (data parallelism arms
 * its overlapped reduction there). */
typedef void (*wf_pipe_arm_fn)(void *user);

typedef struct wf_pipe_stats {
  double wall_s;    /* the schedule's wall time on this rank */
  double busy_s;    /* forward + backward compute */
  double wait_s;    /* waiting for a receive or a send */
  int peak_slots;   /* micro-batches whose activations were held at once */
  size_t act_bytes; /* peak_slots x one slot's activations */
} wf_pipe_stats;

/* Slots the model needs on pp rank `rank` for this schedule (each holds one chunk of
 * one micro-batch). */
int wf_pipe_slots(wf_schedule_kind kind, int pp, int rank, int microbatches, int v);

/* The message buffers of pp rank `rank` (wf_schedule_buffers of its list; none with
 * one stage). recv_f is the spare stage inputs its model must hold (wf_model_opts.inbox):
 * activations are received in place. */
wf_sched_bufs wf_pipe_buffers(wf_schedule_kind kind, int pp, int rank, int microbatches, int v);

/* Bytes the engine of pp rank `rank` allocates (wf_pipe_create's own arithmetic): the
 * gradients' receive and send buffers (wf_pipe_buffers), io bytes each (wf_model_mem.io:
 * in the model's storage format, 16 bits under mixed precision) and the token batch of
 * B x T (inputs, targets and document starts). */
size_t wf_pipe_mem_plan(wf_schedule_kind kind, int pp, int rank, int m, int v, size_t io, int B,
                        int T);

wf_status wf_pipe_create(wf_pipe **out, const wf_pipe_opts *o);
void wf_pipe_destroy(wf_pipe *p); /* accepts NULL */

/* One step: every action of the schedule, loss gradient 1/m per micro-batch.
 * *loss_sum is the sum of the micro-batch losses on the last stage, 0 elsewhere. */
wf_status wf_pipe_step(wf_pipe *p, int step, wf_pipe_batch_fn batch, wf_pipe_arm_fn arm, void *user,
                       double *loss_sum, wf_pipe_stats *stats);
/* Forward only, micro-batch after micro-batch (evaluation). */
wf_status wf_pipe_forward(wf_pipe *p, wf_pipe_batch_fn batch, void *user, double *loss_sum);

/* Split L layers into pp stages. With pp_layers (n == pp entries) that split; else
 * balanced by cost: a layer costs its forward FLOPs, the first stage also pays the
 * embedding and the last the final norm and the vocabulary head, and the split
 * minimises the most expensive stage (ties: earlier stages lighter). bounds[0..pp]:
 * stage s holds layers [bounds[s], bounds[s+1]). */
wf_status wf_pipe_partition(const wf_model_dims *d, int T, int pp, const int *pp_layers, int n,
                            int *bounds);

/* The shard pp rank `rank` (tp rank tp_rank of tp) holds: its layers from
 * wf_pipe_partition, or the interleaved schedule's v chunks of L / (pp v) layers each.
 * The trainer builds its model from it and the planner sizes one from it. Refusals
 * (a bad parallel.pp_layers, interleaving on one stage) are logged once per job. */
typedef struct wf_pipe_stage_opts {
  const wf_model_dims *dims;
  int T, pp, rank;
  wf_schedule_kind kind;
  int v; /* parallel.virtual_stages (interleaved only) */
  const int *pp_layers;
  int n_pp_layers;
  int tp, tp_rank;
  bool sequence;
  int ep, ep_rank; /* expert parallelism (0 or 1: none) */
} wf_pipe_stage_opts;
wf_status wf_pipe_stage_shard(const wf_pipe_stage_opts *o, wf_model_shard *out);

/*
 * The gradient path (wf_grads_*): the one owner of a step's gradients from zero to
 * the update. In order:
 *
 *   zero          before the step's first backward (ZeRO-2/3 listen to every
 *                 micro-batch's backward from here; ZeRO-3 shards the parameters of a
 *                 model that holds them whole: one created without them
 *                 (wf_model_opts.zero = 3) is sharded from the start, its shard
 *                 initialised or resumed in place, then wf_grads_sync_params);
 *   arm           before its last backward: each bucket of gradients is reduced over
 *                 dp as soon as backward has finished it (the model's grad hook), so
 *                 communication overlaps the rest of backward;
 *   finish        the rest of the dp reduction, the sums over tp of the sequence-
 *                 parallel norms' partial gradients, and the sum of the tied
 *                 embedding's gradient over the embedding group;
 *   norm          the global gradient norm over dp (ZeRO shards), tp and pp;
 *   (the optimizer updates the range [lo, hi) with wf_grads_for_update's gradients)
 *   sync_params   ZeRO-1/2: all-gather the updated parameter shards; ZeRO-3: forget
 *                 the gathered units, regather the embeddings'; then mixed
 *                 precision's rounded weights follow;
 *   check_tied    the two copies of the tied embedding are still bit-identical.
 *
 * Plain data parallelism (optim.zero = 0): gradients are averaged with bucketed,
 * non-blocking all-reduces. wf_grads_finish() waits for what is still in flight; the
 * time it waits is the gradient communication that was NOT hidden (the step log shows
 * it). ZeRO-1 (optim.zero = 1): each dp rank keeps the average of one contiguous
 * shard of ceil(n/dp) elements of the flat gradient (the last one shorter), the
 * optimizer updates that shard only, and the updated shards are all-gathered back.
 * ZeRO-1 reduces bucket by bucket during the last backward; ZeRO-2 also frees the flat gradient
 * (one-bucket windows, every micro-batch), ZeRO-3 the flat parameters (units gathered around their
 * forward and backward), and HSDP (fsdp > 0) shards within fsdp groups and averages the shards
 * across them (zero.c says how). Either way the average over dp ranks of per-rank mean
 * gradients is the mean over the global batch: every mesh computes one rank's step.
 *
 * The linear sums over tp and the embedding group commute with the dp average: without
 * ZeRO they follow the dp reduction (which may have started during backward); under
 * ZeRO the tensors they touch (the tied embedding, the sequence-parallel norms) are reduced last,
 * after them, since each rank then holds only its shard.
 */
typedef struct wf_grads wf_grads;

typedef struct wf_grads_opts {
  wf_model *model;     /* borrowed */
  wf_comm *dp;         /* the dp group; NULL = one rank alone (no dp at all) */
  wf_comm *pp, *emb;   /* the pp and embedding groups; NULL = one stage */
  wf_comm *tp;         /* the tp group; NULL = no tp */
  wf_comm *ep, *edp;   /* expert parallelism's ep and expert-data-parallel groups; NULL =
                        * none: the experts' gradients reduce over edp (wf_grads' top) */
  wf_tp *tp_regions;   /* its region operators (the tp-partial sums go through them) */
  size_t bucket_bytes; /* optim.bucket_mb; 0 = one bucket per layer */
  int zero;            /* 0, 1 (optimizer state sharded) or 2 (and gradients) */
  bool keep_gathered;  /* ZeRO-3: parallel.reshard_after_forward=false */
  int fsdp;            /* HSDP: shard within groups of fsdp consecutive dp ranks and
                        * all-reduce the shards across the groups; 0 = one group */
} wf_grads_opts;

/* What the gradient path of a rank allocates, in bytes, and the element range its
 * optimizer updates: wf_grads_create allocates exactly this, by the same plan (zero.c's
 * for ZeRO, the bucket plan for plain dp), and the planner adds up the same figures.
 * Pure: no model or communicator needed, nothing allocated at the model's size. */
typedef struct wf_grads_mem {
  size_t param;      /* parameter buffers it adds: ZeRO-3's shard, edge and windows (and
                      * their rounded copies) */
  size_t grad;       /* gradient buffers it adds: plain dp's staging (dp > 1), ZeRO's
                      * shard, ZeRO-2/3's edge and windows */
  size_t scalar;     /* the device scalar of the norm */
  size_t total;      /* param + grad + scalar */
  bool model_params; /* the model keeps its flat parameters (and rounded copy): not ZeRO-3 */
  bool model_grads;  /* the model keeps its flat gradients: neither ZeRO-2 nor 3 */
  int n_buckets;
  size_t lo, hi;   /* wf_grads_range */
  size_t lo2, hi2; /* ZeRO under expert parallelism: the experts' range (wf_grads_parts) */
} wf_grads_mem;
/* The plan of a rank of dims d and shard s at precision prec: dp_size 0 = no dp group at
 * all (a model used alone), else the group's size, whose rank is dp_rank (with s->ep > 1
 * the experts' group is its dp_size / ep ranks of the same dp_rank % ep); zero, fsdp
 * (HSDP's group, 0 = the whole dp group), bucket_bytes and keep (ZeRO-3's
 * reshard_after_forward=false) as in wf_grads_opts. Fails only for want of host memory
 * (the buckets' lists). */
wf_status wf_grads_mem_plan(const wf_model_dims *d, const wf_model_shard *s, wf_precision prec,
                            int dp_size, int dp_rank, int zero, int fsdp, size_t bucket_bytes,
                            bool keep, wf_grads_mem *out);

typedef struct wf_grads_stats {
  double exposed_ms;           /* time waiting for gradient communication after backward */
  double comm_bytes;           /* bytes reduced this step (per rank) */
  int buckets, launched_early; /* buckets, and how many started during backward */
  long tied_checks;            /* steps whose tied-embedding copies were checked equal */
} wf_grads_stats;

wf_status wf_grads_create(wf_grads **out, const wf_grads_opts *o);
/* Bytes of gradient memory this rank holds (the model's flat buffer and the reduction's
 * buffers), and the parameter memory the gradient path adds (ZeRO-3's shard and units). */
size_t wf_grads_bytes(const wf_grads *g);
size_t wf_grads_param_bytes(const wf_grads *g);
/* ZeRO-3: where the rank's parameter shard lives (the optimizer's parameters), NULL
 * below ZeRO-3 (checkpoints and --save stream it to their writer, wf_ckpt.h). */
float *wf_grads_param_shard(wf_grads *g);
/* HSDP: the fsdp group this rank shards within, and its replica index (which fsdp group
 * it is in, 0 first); NULL (replica 0) without HSDP. */
wf_comm *wf_grads_hsdp_group(const wf_grads *g, int *replica);

/* Memory by kind of one rank, in bytes. */
typedef struct wf_mem_kinds {
  size_t param, grad, optim;
} wf_mem_kinds;

/* What dp rank `rank` of `dp` holds for a rank's local parameters (n of them, shard =
 * ceil(n / dp), its range [s0, s1) = [rank * shard, ...) cut at n) at optim.zero `zero`
 * with optim.bucket_mb = bucket_bytes, without allocating (a planner's figures; the
 * trainer reports the same from its allocations):
 *   param = 4n (x2 with a bf16/fp16 GEMM copy; the all-gather is in place); zero 3: no
 *           4n but 4 (shard + edge + windows x the
 *           largest layer bucket), windows = 2, or every bucket with keep
 *           (parallel.reshard_after_forward=false: the windows are then the buckets);
 *   optim = 8n, or 8 (s1 - s0) under ZeRO (AdamW's m and v of the shard);
 *   grad  zero 0: 4n, + 4 (n + buckets) of staging when dp > 1;
 *         zero 1: 4n + 4 shard (the 4n re-laid bucket by bucket, reduced in place);
 *         zero 2 and 3: 4 shard + 4 edge + 4 x 2 x the largest layer bucket, edge = the
 *                 tensors that are not layered (embeddings, final norm, head) and the
 *                 tp-partial norms.
 * So ZeRO-2's params + grads + optim <= 4n + 12n / dp + 4 (edge + 2 bucket)
 * (+ 4 x 3 for the shard's rounding), and ZeRO-3's <= 16n / dp + 8 (edge + 2 bucket)
 * + 16 x 3: the whole model's 1/dp plus two gathered units (edge and a layer
 * bucket, in parameters and gradients) and their in-flight successors. */
wf_status wf_zero_mem_plan(const wf_model_dims *d, const wf_model_shard *s, wf_precision prec,
                           int dp, int rank, int zero, size_t bucket_bytes, bool keep,
                           wf_mem_kinds *out);
/* The same for model m's dims, shard and precision. */
wf_status wf_zero_mem(wf_model *m, int dp, int rank, int zero, size_t bucket_bytes, bool keep,
                      wf_mem_kinds *out);
void wf_grads_destroy(wf_grads *g); /* accepts NULL */

wf_status wf_grads_zero(wf_grads *g);
void wf_grads_arm(wf_grads *g);
wf_status wf_grads_finish(wf_grads *g);
/* The global gradient norm, identical on every rank. The gradients are `scale` times
 * the true ones (fp16 loss scaling's backward scale, else 1): the sum of squares is
 * divided by scale^2 (in double, before it narrows to float) so *norm is the true norm. */
wf_status wf_grads_norm(wf_grads *g, double scale, float *norm);
/* The element ranges of the flat parameter vector this rank updates: one (all of it, or
 * its ZeRO dp shard), or under ZeRO with expert parallelism two (the dense tensors' dp
 * shard, then the experts' edp shard); each with the gradient of its element lo (device
 * memory) and under ZeRO-3 where parameter lo lives (its shard; else NULL, the model's
 * flat vector). Returns how many. */
#define WF_GRADS_PARTS 2
typedef struct wf_grads_part {
  size_t lo, hi;
  const float *grads;
  float *params;
} wf_grads_part;
int wf_grads_parts(wf_grads *g, wf_grads_part parts[WF_GRADS_PARTS]);
/* The first part's range and gradient (wf_grads_parts). */
void wf_grads_range(const wf_grads *g, size_t *lo, size_t *hi);
const float *wf_grads_for_update(wf_grads *g);
/* After an update: ZeRO's parameter all-gather (ZeRO-3: the gathered units go stale),
 * then the rounded weights of mixed precision follow, unless the update wrote them
 * itself (low_written: wf_optim_writes_low) and no gather changed the parameters since. */
wf_status wf_grads_sync_params(wf_grads *g, bool low_written);
/* After every step (with pipeline stages): the first and last stage's copies of the
 * tied embedding must still be identical. A checksum of each is compared over the
 * embedding group on the device; the answer comes back with the next norm (no wait of
 * its own), or with wf_grads_check_tied_end after the last step. An error names the
 * step. */
wf_status wf_grads_check_tied(wf_grads *g, int step);
/* The last step's tied check, read now (one wait for the device); WF_OK when none is
 * pending. */
wf_status wf_grads_check_tied_end(wf_grads *g);
void wf_grads_get_stats(const wf_grads *g, wf_grads_stats *out);

#endif /* WF_PARALLEL_H */
