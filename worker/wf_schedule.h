/*
 * wf_schedule.h - pipeline schedules as data.
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
#ifndef WF_SCHEDULE_H
#define WF_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "wf_config.h" /* wf_schedule_kind: WF_SCHED_1F1B, WF_SCHED_GPIPE, WF_SCHED_INTERLEAVED */
#include "wf_runtime.h"

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

#endif /* WF_SCHEDULE_H */
