/*
 * wf_pipe.h - the pipeline engine: runs one rank's schedule (wf_schedule.h) over the
 * pp group, and the stage partition.
 *
 * One training step on a rank: the schedule's actions in order. FORWARD and BACKWARD
 * run the local stage (wf_gpt_stage_*) in an activation slot taken at the forward
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
 * holds v chunks (wf_gpt_chunk_forward) and work items are (micro-batch, chunk).
 */
#ifndef WF_PIPE_H
#define WF_PIPE_H

#include "wf_collectives.h"
#include "wf_model.h"
#include "wf_schedule.h"
#include "wf_trace.h"

typedef struct wf_pipe wf_pipe;

typedef struct wf_pipe_opts {
  wf_comm *pp;   /* the pp group; NULL with one stage */
  wf_gpt *model; /* this rank's stage (borrowed) */
  wf_schedule_kind kind;
  int microbatches;   /* m */
  int virtual_stages; /* v: model chunks per rank (interleaved); the model holds them */
  int B, T;           /* micro-batch */
  wf_trace *trace;    /* spans of compute and waits; NULL = none */
} wf_pipe_opts;

/* Fills micro-batch mb's inputs and targets (B*T each). */
typedef wf_status (*wf_pipe_batch_fn)(void *user, int mb, int *inputs, int *targets);
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

wf_status wf_pipe_create(wf_pipe **out, const wf_pipe_opts *o, char *err, size_t err_len);
void wf_pipe_destroy(wf_pipe *p); /* accepts NULL */

/* One step: every action of the schedule, loss gradient 1/m per micro-batch.
 * *loss_sum is the sum of the micro-batch losses on the last stage, 0 elsewhere. */
wf_status wf_pipe_step(wf_pipe *p, int step, wf_pipe_batch_fn batch, wf_pipe_arm_fn arm, void *user,
                       double *loss_sum, wf_pipe_stats *stats);
/* Forward only, micro-batch after micro-batch (evaluation). */
wf_status wf_pipe_forward(wf_pipe *p, wf_pipe_batch_fn batch, void *user, double *loss_sum);

/* Split L layers into pp stages. With pp_layers (n == pp entries) that split; else
 * balanced by cost: a layer costs its forward FLOPs, the first stage also pays the
 * embedding and the last the final layernorm and the vocabulary head, and the split
 * minimises the most expensive stage (ties: earlier stages lighter). bounds[0..pp]:
 * stage s holds layers [bounds[s], bounds[s+1]). */
wf_status wf_pipe_partition(const wf_gpt_dims *d, int T, int pp, const int *pp_layers, int n,
                            int *bounds, char *err, size_t err_len);

#endif /* WF_PIPE_H */
