/*
 * wf_plan.h - the planner: per-rank memory and step time of a run predicted without
 * running it, hardware profiles, and the search over meshes that ranks plans by
 * predicted tokens/s (worker --estimate, --plan, --profile-hw).
 *
 * Memory is the trainer's own allocation arithmetic: wf_plan_stage_mem adds up
 * wf_model_mem_plan, wf_grads_mem_plan and wf_pipe_mem_plan, the functions the model,
 * the gradient path and the pipeline engine allocate with, for the shard
 * wf_pipe_stage_shard gives the trainer. On the CPU device it equals the memory the
 * trainer reports (mem= in the step line) byte for byte, train.trace's recorder aside.
 *
 * Time is a model: GEMMs at the rates of their shapes (measured by --profile-hw, or a
 * GPU's datasheet peak), elementwise work at memory bandwidth, collectives as latency
 * plus bytes over bandwidth per group size, the pipeline's bubble by simulating the
 * schedule's own action lists (wf_schedule_simulate), and AdamW at memory bandwidth.
 */
#ifndef WF_PLAN_H
#define WF_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "wf_config.h"
#include "wf_model.h"

/* ---- hardware profiles ------------------------------------------------------------ */

#define WF_HW_MAX_GEMM 96
#define WF_HW_MAX_COLL 16

/* One measured GEMM: (m, k) x (k, n) at `threads` compute threads; or (attention) the
 * attention kernel over T = m = n positions of head size hs = k, priced as the
 * (T, hs) x (hs, T) products of Q.K^T and att.V: 4 T^2 hs flops per head. */
typedef struct wf_hw_gemm {
  int m, n, k, threads;
  double tflops;
  bool attention;
} wf_hw_gemm;

/* Collectives over a group of `size` ranks, measured: seconds = alpha + bytes / bw for
 * a (blocking) all-reduce of `bytes`, alpha + bytes / ag_bw for an all-gather into a
 * vector of `bytes` (each rank's piece bytes / size), alpha + bytes / dp_bw for the
 * gradient path's non-blocking all-reduce waited for, alpha + bytes / a2a_bw for an
 * all-to-all of a rank's `bytes` (bytes / size to each rank). ag_bw 0: not measured (half
 * an all-reduce); dp_bw 0: not measured (bw); a2a_bw 0: not measured (an all-gather's). */
typedef struct wf_hw_coll {
  int size;
  double alpha_s, bw; /* seconds, bytes per second */
  double ag_bw, dp_bw, a2a_bw;
} wf_hw_coll;

typedef struct wf_hw {
  char name[64];
  char source[256];               /* where the numbers come from */
  bool gpu;                       /* a GPU: flash attention, compute and copies overlap */
  double peak_tflops[3];          /* dense, by wf_precision: fp32 (TF32 on GPUs), fp16, bf16 */
  double gemm_eff;                /* share of the peak large GEMMs reach (datasheet profiles) */
  double mem_bw;                  /* bytes/s of device memory (elementwise work, AdamW) */
  double mem_bytes;               /* device memory per rank (0 = the host's memory / ranks) */
  int gpus_per_node;              /* ranks per node (tp stays inside a node) */
  int cores;                      /* CPU profiles: cores the ranks of a node share */
  double busy_cores;              /* what they deliver with every rank computing at once
                                   * (other load included; measured by --profile-hw under
                                   * mpirun; 0 = cores) */
  double intra_alpha_s, intra_bw; /* within a node (NVLink; shared memory) */
  double inter_alpha_s, inter_bw; /* across nodes (InfiniBand), per rank */
  double overlap;                 /* share of backward that dp communication can hide behind */
  double op_s;                    /* fixed cost of one kernel call (a launch; a CPU op's set-up) */
  /* CPU kernels that are not GEMMs, measured at one thread (0 = not measured: memory
   * bandwidth prices them): seconds per element of a layernorm's forward + backward and
   * a GELU's, and backward over forward of the attention kernel and of a matmul. */
  double ln_s, gelu_s, attn_bwd, matmul_bwd;
  wf_hw_gemm gemm[WF_HW_MAX_GEMM];
  int n_gemm;
  wf_hw_coll coll[WF_HW_MAX_COLL]; /* measured within a node, by group size */
  int n_coll;
} wf_hw;

/* A built-in profile: "h100-sxm", "h200", "a100-80gb" (datasheet numbers; the README
 * gives each one's source). WF_EINVAL for another name. */
wf_status wf_hw_builtin(const char *name, wf_hw *out);
/* A profile from a JSON file written by wf_hw_save (worker --profile-hw), or a
 * built-in name. Errors name the file and the field. */
wf_status wf_hw_load(const char *path_or_name, wf_hw *out, char *err, size_t len);
wf_status wf_hw_save(const wf_hw *hw, const char *path, char *err, size_t len);
/* GEMM seconds for (m, k) x (k, n) at `threads` threads and precision p. */
double wf_hw_gemm_s(const wf_hw *hw, double m, double n, double k, int threads, wf_precision p);
/* Attention seconds (forward) of `heads` (batch rows x local heads) heads of T
 * positions and head size hs. */
double wf_hw_attention_s(const wf_hw *hw, double heads, double T, double hs, int threads,
                         wf_precision p);
/* All-reduce seconds of `bytes` over `size` ranks; intra: within a node. */
double wf_hw_allreduce_s(const wf_hw *hw, double bytes, int size, bool intra);
/* All-gather seconds into a vector of `bytes` over `size` ranks (each rank's piece bytes
 * / size): measured where the profile has it, else half an all-reduce of the vector (a
 * ring's half). ZeRO's parameter gathers are these (one broadcast per owner, in place). */
double wf_hw_allgather_s(const wf_hw *hw, double bytes, int size, bool intra);
/* The dp gradient reduction's seconds: an all-reduce of `bytes` as grads.c and zero.c
 * issue it (non-blocking, then waited for), where the profile measured that; else
 * wf_hw_allreduce_s. */
double wf_hw_dp_allreduce_s(const wf_hw *hw, double bytes, int size, bool intra);
/* All-to-all seconds of a rank's `bytes` over `size` ranks (bytes / size to each, its own
 * included), as expert parallelism exchanges tokens: measured where the profile has it,
 * else an all-gather's of the same vector (each rank moves (size-1)/size of it). */
double wf_hw_alltoall_s(const wf_hw *hw, double bytes, int size, bool intra);

/* ---- one plan ---------------------------------------------------------------------- */

typedef struct wf_plan_mesh {
  int dp, tp, pp;
  int v; /* virtual stages (interleaved), else 1 */
  int M; /* micro-batches per step and dp rank */
  int B; /* rows of a micro-batch */
  int T; /* sequence length */
  wf_schedule_kind kind;
  int zero;  /* ZeRO stage: 0, 1, 2 or 3 */
  int fsdp;  /* HSDP: ZeRO shards within groups of fsdp dp ranks (mesh.fsdp); 0 = all of dp */
  bool keep; /* ZeRO-3: parallel.reshard_after_forward=false (every unit stays gathered) */
  bool sp;
  wf_recompute recompute;
  wf_precision prec;
  int threads; /* compute threads per rank (runtime.threads); 0 = the node's cores shared */
  size_t bucket_bytes;
  const int *pp_layers; /* parallel.pp_layers, or NULL */
  int n_pp_layers;
  int cp;             /* context parallelism (0 or 1: none): a rank holds T / cp of each
                       * sequence, gradients and ZeRO over dp x cp */
  wf_cp_mode cp_mode; /* parallel.cp_mode: its scratch (ring blocks, or every rank's K/V) */
  int ep;             /* expert parallelism (0 or 1: none): groups of ep consecutive dp ranks
                       * each hold E / ep experts; their gradients reduce over dp / ep */
  bool docs;          /* data.document_mask: slots keep document starts and positions */
  bool stream;        /* data.source: the loader's ring of rows (wf_data_loader_bytes) */
} wf_plan_mesh;

/* What a rank holds, in bytes, by kind. */
typedef enum wf_plan_mem_kind {
  WF_PM_PARAMS = 0, /* fp32 masters (+ mixed precision's rounded GEMM weights); ZeRO-3:
                     * the shard and the gathered units instead */
  WF_PM_GRADS,      /* the flat gradients (not ZeRO-2/3) and the dp reduction's buffers: plain
                     * dp's staging, ZeRO's shard and ZeRO-2/3's windows */
  WF_PM_OPTIM,      /* AdamW's m and v over the rank's range (1/dp of it under ZeRO) */
  WF_PM_ACTS,       /* activation slots in flight, the recompute layer, backward scratch */
  WF_PM_COMM,       /* the pipeline's p2p rings, the norm's scalar */
  WF_PM_OTHER,      /* token batches */
  WF_PM_N
} wf_plan_mem_kind;

typedef struct wf_plan_stage_mem {
  size_t bytes[WF_PM_N];
  size_t total;
  int slots;            /* activation slots the schedule keeps in flight */
  size_t params;        /* parameters (elements) on this rank */
  size_t expert_params; /* of them, the experts' (their gradients reduce over dp / ep) */
  int l0, l1, chunks;   /* layers */
  int n_buckets;        /* plain dp's gradient buckets */
  size_t act;           /* the activation slots in flight and the recompute layer: the
                         * trainer's act= (its step line) at the schedule's peak */
} wf_plan_stage_mem;

/* Memory of pp rank `pp_rank`, dp rank `dp_rank` (tp ranks all hold the same). k: the
 * kernels whose attention sizes apply (NULL = the CPU's). Refuses (WF_ECONFIG, logged
 * once) what the trainer refuses. */
wf_status wf_plan_stage_mem_get(const wf_model_dims *d, const wf_plan_mesh *m, int pp_rank,
                                int dp_rank, const struct wf_kset *k, wf_plan_stage_mem *out);
const char *wf_plan_mem_kind_name(wf_plan_mem_kind k);

/* Before the model is built: whether the largest stage's memory (dp rank 0's, as
 * --estimate computes it for the config's mesh, of the model `d`) fits in `limit` bytes,
 * the rank's memory, which `limit_desc` describes ("cuda:0, NVIDIA H100: 80.0 GiB").
 * WF_ECONFIG with a message naming the sizes and the keys that shrink them when it does
 * not; WF_OK when it does or limit is 0 (unknown). A mesh the planner refuses is
 * refused (rank 0 says why; err is then empty). */
wf_status wf_plan_fits(const wf_config *cfg, const wf_model_dims *d, double limit,
                       const char *limit_desc, const struct wf_kset *k, char *err, size_t len);

/* Predicted step time, in seconds, by part. */
typedef struct wf_plan_time {
  double compute;    /* one stage's forwards and backwards of all its micro-batches */
  double tp_comm;    /* tensor-parallel collectives (inside compute's stages) */
  double pp_comm;    /* p2p activations and gradients, the tied embedding's sum */
  double bubble;     /* pipeline idle time from the simulated schedule */
  double dp_comm;    /* gradient reduction (and ZeRO-1's all-gather) */
  double dp_exposed; /* the part of dp_comm backward does not hide */
  double optim;      /* gradient norm and AdamW */
  double step;
  double tokens_per_s;
  double sim_bubble; /* idle share of the simulated schedule */
  double cp_comm;    /* context parallelism's K/V traffic (ring or all-gather) */
  double cp_exposed; /* the part of cp_comm the blocks' compute does not hide (in step) */
  double ep_comm;    /* expert parallelism's all-to-alls of tokens (inside compute's stages) */
} wf_plan_time;

wf_status wf_plan_time_get(const wf_model_dims *d, const wf_plan_mesh *m, const wf_hw *hw,
                           wf_plan_time *out);

/* A mesh from a validated config (world: dist.world_size, nodes x procs per node, or the
 * mesh keys). */
wf_status wf_plan_mesh_from_config(const wf_config *cfg, int world, wf_plan_mesh *m);

/* ---- the commands ------------------------------------------------------------------------ */

typedef struct wf_plan_cli {
  bool json;
  const char *hw;        /* profile file or built-in name; NULL = this machine, measured now */
  double device_mem_gib; /* 0 = the profile's */
  int gpus_per_node;     /* 0 = the profile's */
  int top;               /* plans to print (0 = 10) */
  int world;             /* ranks to plan for (0 = wf_plan_world of the config) */
} wf_plan_cli;

/* The world a config describes without launching it: dist.world_size, else
 * dist.num_nodes x dist.procs_per_node, else mesh.dp x mesh.tp x mesh.pp, else 1. */
int wf_plan_world(const wf_config *cfg);
/* worker --estimate, --plan and --profile-hw; print to out; 0 or 1 (errors said).
 * --plan chooses the mesh keys itself: its config is validated with them reset (mesh
 * 1 x 1 x derived dp, one micro-batch, 1F1B) and no world (wf_plan_reset_mesh). */
void wf_plan_reset_mesh(wf_config *cfg);
int wf_plan_estimate(const wf_config *cfg, const wf_plan_cli *cli, FILE *out);
int wf_plan_search(const wf_config *cfg, const wf_plan_cli *cli, FILE *out);
struct wf_comm;
struct wf_gpu;
int wf_plan_profile_hw(const wf_config *cfg, struct wf_comm *world, const char *path, FILE *out);

/* worker --check-estimate: train as usual, and after the first step every rank prints
 * its predicted memory beside what the trainer reports (mem=) and the growth of the
 * process's resident memory since `base` (read before the trainer's set-up); on a GPU,
 * the growth of the device's used memory (cudaMemGetInfo) instead, which is where the
 * model lives there (a GPU has no high-water mark to read: no peak/steady). */
typedef struct wf_plan_rss {
  long rss_kb, hwm_kb; /* VmRSS and VmHWM of /proc/self/status */
  long long dev_used;  /* the GPU's used bytes; -1: on the CPU */
  struct wf_gpu *gpu;  /* NULL: on the CPU */
} wf_plan_rss;
void wf_plan_rss_read(wf_plan_rss *r, struct wf_gpu *gpu);
void wf_plan_check_print(const wf_config *cfg, int pp_rank, int dp_rank, int rank,
                         const struct wf_kset *k, const wf_plan_rss *base, long long reported,
                         FILE *out);

#endif /* WF_PLAN_H */
