/*
 * wf_coordinator.h - job bootstrap and the 4-D mesh.
 *
 * Mesh layout (docs/architecture.md, Megatron's tp-cp-dp-pp order): tp varies fastest, then cp,
 * then dp, then pp, so tensor-parallel peers are adjacent ranks on one node and
 * context-parallel peers the next nearest:
 *
 *     rank = tp + TP * (cp + CP * (dp + DP * pp))
 *
 * Groups: tp (same pp, dp, cp), cp (same pp, dp, tp: a ring), dp (same pp, cp, tp),
 * pp (same dp, cp, tp), the embedding group (first and last pp stage with the same dp,
 * cp, tp) that holds the tied embedding, and dp x cp (same pp, tp), over which dense
 * gradients are reduced and ZeRO shards (every cp rank of a dp replica holds the same
 * parameters and computes gradients of its part of the sequence). With cp 1 the dp x
 * cp group is the dp group. Expert parallelism is carved from dp (Megatron-Core's): the
 * ep group is ep consecutive dp ranks (same pp, cp, tp), which shard the experts; the
 * expert-data-parallel group (edp: the dp ranks with the same dp % ep, every cp rank,
 * same pp, tp) holds the same experts and reduces their gradients. Both are absent (no
 * group) with ep = 1. The mesh math is pure; wf_job_bootstrap() builds MPI
 * communicators for each group and gathers every rank's facts on rank 0.
 */
#ifndef WF_COORDINATOR_H
#define WF_COORDINATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "wf_bind.h"
#include "wf_config.h"
#include "wf_gpu.h"
#include "wf_launch.h"
#include "wf_runtime.h"

/* ---- the mesh (pure) ------------------------------------------------------- */

typedef struct wf_mesh {
  int dp, tp, pp;
  int cp; /* 0 reads as 1: meshes written before context parallelism */
  int ep; /* expert parallelism inside dp; 0 or 1 = none */
} wf_mesh;

typedef struct wf_coords {
  int pp, dp, tp, cp;
} wf_coords;

typedef enum wf_axis {
  WF_AXIS_TP = 0,
  WF_AXIS_DP,
  WF_AXIS_PP,
  WF_AXIS_EMB,
  WF_AXIS_CP,
  WF_AXIS_DPCP,
  WF_AXIS_EP,  /* ep consecutive dp ranks: the experts' shards */
  WF_AXIS_EDP, /* the dp ranks holding the same experts */
  WF_NUM_AXES
} wf_axis;

int wf_mesh_size(const wf_mesh *m);
wf_coords wf_mesh_coords(const wf_mesh *m, int rank);
int wf_mesh_rank(const wf_mesh *m, wf_coords c);
const char *wf_axis_name(wf_axis a);
/* Members (world ranks, in group-rank order) of `rank`'s group along `axis`.
 * Returns the count; 0 for the embedding group of a middle pipeline stage and for the
 * expert groups without expert parallelism. */
int wf_mesh_group(const wf_mesh *m, wf_axis axis, int rank, int *members, int max);
/* A colour identifying `rank`'s group along `axis` (equal colours = same group);
 * -1 when the rank is in no group of that axis. */
int wf_mesh_group_color(const wf_mesh *m, wf_axis axis, int rank);

/* ---- the job ------------------------------------------------------------------ */

/* Facts each rank reports at start-up (fixed size: gathered with MPI as bytes). */
typedef struct wf_rank_facts {
  int rank, local_rank, local_size, pid;
  char host[64];
  char device[64];  /* "cpu" or "cuda:0 (NVIDIA H100 ...)" */
  char binding[64]; /* from wf_binding.desc */
  int threads;
  wf_coords coords;
} wf_rank_facts;

typedef struct wf_job wf_job;

typedef struct wf_job_opts {
  const wf_config *cfg; /* validated */
  wf_launch *launch;    /* cross-checked */
  const char *device;   /* this rank's device description */
  const wf_binding *binding;
  /* The device path of the job's communicators (wf_comm_set_device_path), given to its
   * world communicator when it is made, so that every communicator made from it (the
   * mesh axes here, and any the worker makes later) carries device buffers alike:
   * NCCL when `nccl` (every rank has a GPU of its own), else host staging. gpu NULL: a
   * CPU rank, host buffers only. */
  wf_gpu *gpu;
  bool nccl;
} wf_job_opts;

/* Gather facts, build the mesh communicators and verify them against MPI. Every
 * rank calls it after MPI_Init_thread; it is collective over MPI_COMM_WORLD. */
wf_status wf_job_bootstrap(wf_job **out, const wf_job_opts *opts);
void wf_job_destroy(wf_job *job); /* accepts NULL; frees communicators */

int wf_job_rank(const wf_job *job);
int wf_job_world(const wf_job *job);
const wf_mesh *wf_job_mesh(const wf_job *job);
/* All ranks' facts: valid on rank 0 only (NULL elsewhere). */
const wf_rank_facts *wf_job_facts(const wf_job *job);
/* This rank's facts (every rank). */
const wf_rank_facts *wf_job_my_facts(const wf_job *job);
/* The job id (same on every rank) e.g. "weft-host-12345-1732240000". */
const char *wf_job_id(const wf_job *job);

/* The communicator of this rank's group along `axis` (NULL for the embedding group
 * of a middle pipeline stage), and of the whole world. Owned by the job. */
typedef struct wf_comm wf_comm;
wf_comm *wf_job_comm(const wf_job *job, wf_axis axis);
wf_comm *wf_job_world_comm(const wf_job *job);

/* Rank 0: print the mesh table, one row per rank. */
void wf_job_print_table(const wf_job *job, FILE *out);

/* Whether every rank trains on the same kind of device (facts' device: "cpu" or
 * "cuda:N (MODEL)"). MODELS: GPUs of different models; MIXED: some ranks on the CPU,
 * others on GPUs. msg names the ranks of each kind ("ranks 0-3 on NVIDIA H100, rank 4
 * on the CPU"). Pure, for tests. */
typedef enum wf_devices_verdict {
  WF_DEVICES_SAME = 0,
  WF_DEVICES_MODELS,
  WF_DEVICES_MIXED
} wf_devices_verdict;
wf_devices_verdict wf_devices_compare(const wf_rank_facts *facts, int n, char *msg, size_t len);
/* Rank 0 checks every rank's device: GPUs of different models are a warning, ranks on
 * the CPU beside GPUs an error (WF_ECONFIG, said once); other ranks return WF_OK, so
 * the caller agrees on the outcome. */
wf_status wf_job_check_devices(const wf_job *job);

#endif /* WF_COORDINATOR_H */
