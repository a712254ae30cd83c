/*
 * parallel_int.h - private to worker/parallel.
 *
 * Error idiom: the worker's (WF_TRY / goto fail; errors logged where they arise, every
 * collective's status checked and returned).
 */
#ifndef WF_PARALLEL_INT_H
#define WF_PARALLEL_INT_H

#include "wf_check.h"
#include "wf_device.h"
#include "wf_parallel.h"

/* ---- schedules (schedule.c, schedule_check.c, schedule_sim.c) ----------------------
 * A schedule's generator, validator and clock share these. The validator describes the
 * first bad step in the caller's buffer (its answer is that description). */

/* Write the message into err (when given); returns WF_EINVAL. */
wf_status wf__sched_fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
bool wf__sched_is_compute(wf_sched_op op);
bool wf__sched_is_send(wf_sched_op op);
/* The pipeline stage chunk `chunk` of pp rank `rank` runs. */
int wf__sched_stage(const wf_sched_params *prm, int rank, int chunk);
wf_status wf__sched_check_params(const wf_sched_params *prm, char *err, size_t len);

/* Every rank's list run together under rendezvous p2p. */
typedef struct wf__sched_sim {
  const wf_schedule *ranks;
  int p;
  int *pos;   /* [p]: next step of each rank */
  int *off;   /* [p + 1]: rank r's steps are off[r] .. off[r+1]-1 in the flat arrays */
  int *match; /* [off[p]]: the partner's step of each message, -1 for compute */
} wf__sched_sim;
/* Set up m for ranks and simulate it to the end (WF_EINVAL with the first bad step in
 * err); wf__sched_sim_free releases it either way. */
wf_status wf__sched_sim_validate(wf__sched_sim *m, const wf_schedule *ranks, char *err, size_t len);
void wf__sched_sim_free(wf__sched_sim *m);

/* ---- ZeRO-1, 2 and 3 (zero.c) ------------------------------------------------------
 * Used by grads.c: begin at the step's start, ready from the grad hook, launch_layers
 * then (after the tp and tied sums) finish after the last backward, gather after the
 * update. */
/* tp.c: the collectives' element type of activations stored in format p (storage.h):
 * WF_COMM_F32, WF_COMM_BF16 or WF_COMM_F16. */
wf_comm_dtype wf__comm_dtype_of(wf_precision p);

typedef struct wf__zero wf__zero;
/* Which of a model's tensors a ZeRO instance shards: all of them, or under expert
 * parallelism the dense ones (over dp) and the experts' (over edp) apart, each class a
 * contiguous part of the flat vector (the families place the experts' tensors last). */
typedef enum wf__zclass { WF__Z_ALL = 0, WF__Z_DENSE, WF__Z_EXPERTS } wf__zclass;
/* The flat range [base, base + n) class c's tensors take on shard s of dims d. */
void wf__zero_class_range(const wf_model_dims *d, const wf_model_shard *s, wf__zclass c,
                          size_t *base, size_t *n);
/* dp: the group the shards span; rep: HSDP's replica group (NULL = none), across which
 * the finished shard is all-reduced (averaged); cls and post: the tensors it shards and
 * the factor its averaged gradients are multiplied by (the experts' 1 / ep; grads.c);
 * head: the instance whose unit hook calls this one's too (NULL: itself, the first). */
wf_status wf__zero_create(wf__zero **out, wf_model *m, wf_comm *dp, wf_comm *rep, int stage,
                          size_t bucket_bytes, bool keep, wf__zclass cls, float post,
                          wf__zero *head);
/* ZeRO-3: the rank's parameter shard (NULL below ZeRO-3). */
float *wf__zero_param_shard(wf__zero *z);
/* fsdp.c: the model was created without flat parameters: the shard holds them from the
 * start (filled by initialisation or a checkpoint, then gathered by wf__zero_gather). */
void wf__fsdp_start_sharded(wf__zero *z);
void wf__zero_destroy(wf__zero *z);
wf_status wf__zero_begin(wf__zero *z);
void wf__zero_arm(wf__zero *z);
wf_status wf__zero_ready(wf__zero *z, int group);
wf_status wf__zero_launch_layers(wf__zero *z);
wf_status wf__zero_finish(wf__zero *z);
wf_status wf__zero_gather(wf__zero *z);
float *wf__zero_shard(wf__zero *z);
void wf__zero_bounds(const wf__zero *z, size_t *s0, size_t *s1);
void wf__zero_stats(const wf__zero *z, double *wait_ms, double *comm_bytes, int *launched_early,
                    int *buckets);
size_t wf__zero_grad_bytes(const wf__zero *z);
size_t wf__zero_param_bytes(const wf__zero *z);
/* What wf__zero_create would allocate for a model of dims d and shard s (dp rank `rank`
 * of the `size` ranks the shards span), by the same plan, without a model: ZeRO's
 * parameter and gradient buffers, whether the model keeps its flat vectors, the
 * optimizer's range and the buckets (wf_grads_mem's fields but scalar and total). */
wf_status wf__zero_mem_plan(const wf_model_dims *d, const wf_model_shard *s, wf_precision prec,
                            int size, int rank, int stage, size_t bucket_bytes, bool keep,
                            wf__zclass cls, wf_grads_mem *out);

/* ---- ZeRO's state, shared by zero.c (gradients, HSDP, formulas) and fsdp.c (ZeRO-3's
 * parameters) -------------------------------------------------------------------- */
#define WF__ZPOOL 2 /* ZeRO-2/3 gradient windows: one filling while one is in flight */

typedef struct wf__zrange {
  size_t flat, n, pos; /* flat offset, length, offset in the bucket's natural order */
  int tensor, j;       /* the tensor (its description's index), local layer (0: unlayered) */
} wf__zrange;

typedef struct wf__zpiece {
  size_t flat, pos, n; /* flat offset, offset in the bucket, length */
  int owner;
} wf__zpiece;

typedef struct wf__zbucket {
  wf__zrange *r; /* sorted by flat offset: the natural order */
  wf__zpiece *p; /* in the natural order, hence by owner */
  size_t *seg;   /* (size + 1) owner r's pieces are [seg[r], seg[r + 1]) of the bucket */
  int nr, np, first_group, last_group;
  size_t count; /* elements */
  size_t base;  /* ZeRO-1: where the bucket lies in the model's (re-laid) gradient buffer */
  size_t sent;  /* elements whose all-reduce has started (a bucket goes in parts: zero.c) */
  wf_req *req;  /* the part in flight */
  bool launched;
  unsigned long seq; /* launch order */
} wf__zbucket;

struct wf__zero {
  wf_model *m; /* NULL in a memory plan (wf__zero_mem_plan) */
  wf_dev *dev; /* NULL in a memory plan */
  wf_model_dims d;
  wf_model_shard s; /* the model's: the plan reads its layout from these alone */
  wf_precision prec;
  wf_comm *dp, *rep; /* the shards' group; HSDP's replica group (NULL = none) */
  int stage, rank, size, nl;
  int nt;                  /* the model's tensors (its description's) */
  wf__zclass cls;          /* the tensors it shards */
  size_t base;             /* their flat range [base, base + n) */
  float post;              /* the averaged gradients' factor (1: none) */
  struct wf__zero *head;   /* the first instance: its unit hook runs every instance's */
  struct wf__zero *next;   /* the next instance of the chain (NULL: the last) */
  int lc;                  /* local layers per model chunk (nl without interleaving) */
  bool lazy;               /* ZeRO-2/3 over chunks (interleaved): buckets stay inside a chunk and a
                            * window opens when backward reaches its bucket (the unit hook), not in
                            * 1F1B's predicted order */
  size_t n, shard, s0, s1; /* n of the class's elements; this rank's [s0, s1) of them */
  wf__zbucket *b, late;
  int nb;
  float *gshard; /* (shard) this rank's averaged gradient */
  /* ZeRO-2 */
  float *edge, *win[WF__ZPOOL]; /* the late tensors' gradients; the bucket windows */
  size_t win_count, edge_count;
  size_t part; /* the most elements one all-reduce of a bucket carries (zero.c's launch) */
  int win_bucket[WF__ZPOOL];  /* the bucket a window holds, -1 free */
  wf_req *win_req[WF__ZPOOL]; /* its all-reduce */
  bool win_flying[WF__ZPOOL];
  unsigned long win_seq[WF__ZPOOL];
  int open; /* the window backward writes into now, -1 none */
  /* ZeRO-3 (fsdp.c's part of this file, below) */
  float *pshard;           /* (shard) this rank's parameters: what AdamW updates */
  float *pedge;            /* the late tensors' parameters, gathered for the whole step */
  float **pwin;            /* npw windows of one layer bucket's parameters (natural order) */
  void **plow, *pedge_low; /* mixed precision: their GEMM weights in 16 bits (else NULL) */
  bool low;                /* mixed precision */
  int *pwin_bucket;        /* the bucket a window holds (-1 none) */
  wf_req **pwin_req;       /* (npw x size) its gather in flight: one broadcast per owner */
  int npw, pcur;           /* windows (2, or every bucket's with keep); the one in use */
  bool keep;               /* parallel.reshard_after_forward=false */
  bool sharded;            /* the model has no flat parameters: created without them
                            * (wf_model_opts.zero = 3), or dropped at the first step
                            * (else whole: a model created with them) */
  wf_status hook_err;      /* the first failure in the unit hook, for finish */
  unsigned long seq;
  double wait_ms, comm_bytes;
  int launched_early;
  bool armed;
  bool final; /* the step's last micro-batch (armed by wf__zero_arm) */
};

wf_status wf__zero_copy(wf__zero *z, float *dst, const float *src, size_t n);
/* The layer bucket holding readiness group gr (-1 none). */
int wf__zero_bucket_of(const wf__zero *z, int gr);
int wf__zero_chunk_of(const wf__zero *z, int i); /* the model chunk bucket i lies in */
/* The model's unit hook (ZeRO-3, and ZeRO-2 over chunks): local layer j computes next; it
 * runs the chain of instances from the first, which wf__zero_set_hook installs. */
void wf__zero_unit_hook(void *user, int j, bool backward);
void wf__zero_set_hook(wf__zero *z);
wf_status wf__fsdp_unit(wf__zero *z, int i, bool backward); /* bucket i gathered */
/* fsdp.c: ZeRO-3's buffers (at creation), the shard taken from the flat parameters and
 * these dropped (at a step's start, when the model holds them whole), the embeddings regathered and
 * the units forgotten (after an update), and the buffers freed. */
wf_status wf__fsdp_alloc(wf__zero *z);
wf_status wf__fsdp_reshard(wf__zero *z);
wf_status wf__fsdp_refresh(wf__zero *z);
void wf__fsdp_free(wf__zero *z);

#endif /* WF_PARALLEL_INT_H */
