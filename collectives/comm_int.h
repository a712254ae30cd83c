/*
 * comm_int.h - private structures of the collectives module.
 *
 * Transports. An operation runs on one of three transports, each a versioned table
 * (wf__transport), as NCCL's transports are: MPI for host buffers (mpi.c), and for
 * device buffers either NCCL (nccl.c) or MPI with host staging (staged.c). A
 * communicator holds the MPI table and, once it has a device path, the device table
 * (`dev`); coll.c asks the GPU backend where a buffer lives and hands the operation to
 * that table, and nothing else tests which transport it holds. A communicator made
 * from another (split, group) gets its parent's device path when it is made, so no
 * communicator of a job can miss it.
 *
 * Family. Every communicator made from one world communicator shares its `family`
 * (reference counted, its member list under a mutex), so the watchdog's thread can
 * abort all of them (wf_comm_abort_all) while the main thread may be blocked in one.
 *
 * Flight recorder: each communicator owns a ring of WF_COMM_TRACE_LEN slots.
 * `next_seq` is the single atomic index: an operation takes seq = next_seq and
 * writes slot seq % WF_COMM_TRACE_LEN. Each slot is a seqlock: its `version` is odd
 * while the driving thread writes it and even when it is stable, so a reader on
 * another thread (the watchdog) copies a slot, re-reads the version and retries on a
 * change. Fields are relaxed atomics, so the C11 memory model has no data race and
 * x86 pays nothing for them. Only the thread driving the communicator writes.
 *
 * Errors: WF_TRY, WF_CHECK and goto fail, one cleanup path per function (wf_check.h);
 * every failure is logged once, where it arises.
 */
#ifndef WF_COMM_INT_H
#define WF_COMM_INT_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

#include "nccl_int.h"
#include "wf_collectives.h"

/* One slot fills one cache line, so recording an operation touches a single line. */
typedef struct wf__trace_slot {
  _Alignas(64) atomic_uint_fast64_t version;
  atomic_uint_fast64_t seq, count, bytes, start_ns, end_ns;
  atomic_int peer;
  atomic_uchar op, state, dtype, device;
} wf__trace_slot;

/* One queued send or receive of an open group. */
typedef struct wf__p2p {
  void *buf;
  int count; /* elements */
  int peer;
  wf_comm_dtype dt;
  bool is_send;
  const struct wf__transport *tp; /* the transport its buffer belongs to */
  uint64_t seq;
} wf__p2p;

/* The communicators made from one world communicator (see the top of the file). */
typedef struct wf__family {
  pthread_mutex_t lock;
  wf_comm **members;
  int n, cap;
  int refs; /* members plus wf_comm_abort_all calls in progress */
} wf__family;

/* Hot fields (read by every operation) first; the ring is cache-line aligned, so
 * the struct is allocated with aligned_alloc. */
struct wf_comm {
  MPI_Comm mpi;
  int rank, size;
  bool check;                      /* cross-rank agreement check before each collective */
  bool precise_clock;              /* recorder times from CLOCK_MONOTONIC, not its coarse twin */
  int group_depth;                 /* open wf_comm_group_start calls */
  const struct wf__transport *dev; /* device buffers' transport; NULL: none (a CPU rank) */
  wf_gpu *gpu;                     /* borrowed with the device path: device vs host */
  void *nc;                        /* NCCL communicator (module-side), NULL when not NCCL */
  const wf__nccl_ops *nccl;
  wf_req *spare; /* one finished request kept for reuse: most calls never malloc */
  atomic_uint_fast64_t next_seq;
  atomic_bool aborted;             /* wf_comm_abort(_all): every later operation fails */
  atomic_uint_fast64_t host_syncs; /* times a device transport blocked the host */

  char name[32];
  wf__family *family;
  void *nccl_module;
  wf__p2p *group; /* queued operations of the open group */
  int group_len, group_cap;

  wf__trace_slot ring[WF_COMM_TRACE_LEN];
};

/* What a request finishes with after its transfers complete. */
struct wf_req {
  wf_comm *c;
  uint64_t seq_first; /* trace entries seq_first .. seq_first + nseq - 1 */
  int nseq;
  /* MPI path: n requests, inline for the usual one or two. */
  int n;
  MPI_Request *mreq;
  MPI_Request inline_req[2];
  int *expect; /* per request: expected receive bytes, or -1 when not a receive */
  int inline_expect[2];
  /* Post-processing of the MPI path: scale (avg), then move (in-place RS). */
  float *scale_buf;
  size_t scale_count;
  float scale;
  void *move_dst;
  const void *move_src;
  size_t move_bytes;
  /* Host staging of device buffers: after the above, `unstage_bytes` of the host
   * result at unstage_src go back to the device at unstage_dst; stage_mem is freed. */
  void *unstage_dst;
  const void *unstage_src;
  size_t unstage_bytes;
  void *stage_mem;
  /* NCCL path: an event on the communication stream. */
  void *event;
  /* The transport that finishes the request after its MPI part (MPI's own: nothing). */
  const struct wf__transport *tp;
};

/* One operation as the public call described it. `count` is per the public API
 * (recv_count for reduce-scatter, send_count for allgather); `peer` is the root,
 * destination or source as the caller passed it when has_peer, else -1. */
typedef struct wf__op {
  wf_comm_op op;
  const void *send;
  void *recv;
  size_t count;
  wf_comm_dtype dt;
  wf_comm_redop redop;
  int peer;
  bool has_peer;
  /* all-to-all: per-peer counts and offsets in elements (size entries each); `count` is
   * then the total this rank sends */
  const size_t *scounts, *soffs, *rcounts, *roffs;
} wf__op;

/* One transport: how an operation on buffers of its kind runs (see the top of the
 * file). Every entry is required. */
#define WF__TRANSPORT_VERSION 1
typedef struct wf__transport {
  int version;      /* WF__TRANSPORT_VERSION */
  const char *name; /* "mpi", "staged", "nccl" */
  bool on_device;   /* the flight recorder's `device`: the operation runs on the GPU */
  bool half_reduce; /* reduces bf16 and fp16 (MPI has no such types: it only moves them) */
  bool groupable;   /* may be queued in a group of point-to-point operations */
  /* Post d; blocking when req == NULL. Blocking device operations are ordered before
   * later work on the compute stream, and need not have finished on return. */
  wf_status (*post)(wf_comm *c, const wf__op *d, uint64_t seq, wf_req **req);
  /* Post the open group's entries of this transport into r. */
  wf_status (*group_post)(wf_comm *c, wf_req *r);
  /* Whether r's own part (beyond its MPI requests) has completed; never blocks. */
  wf_status (*test)(wf_req *r, bool *done);
  /* After r's MPI requests completed and their host results were post-processed:
   * what the transport still owes (the device ordering, the copies back). */
  wf_status (*finish)(wf_req *r);
  /* Make a stuck operation return (the watchdog); WF_EUNSUPPORTED where it cannot. */
  wf_status (*abort)(wf_comm *c);
  /* Give `child`, just made from `parent` (whose device transport this is), the same
   * device path; collective over the child where the path needs it (NCCL). */
  wf_status (*inherit)(const wf_comm *parent, wf_comm *child);
  void (*fini)(wf_comm *c); /* release the transport's state on c */
} wf__transport;

extern const wf__transport wf__mpi_transport, wf__staged_transport, wf__nccl_transport;
/* mpi.c: the entries of a transport with nothing of its own to wait for or interrupt
 * (MPI's, shared by staging): test says done, abort says it cannot. */
wf_status wf__coll_test_done(wf_req *r, bool *done);
wf_status wf__coll_no_abort(wf_comm *c);

/* coll.c: validate, record and dispatch; req == NULL means blocking. */
wf_status wf__coll_run(wf_comm *c, const wf__op *d, wf_req **req);

/* mpi.c: post on MPI; blocking when req == NULL. The MPI type of an element type. */
MPI_Datatype wf__coll_mpi_type(wf_comm_dtype dt);
wf_status wf__coll_mpi_post(wf_comm *c, const wf__op *d, uint64_t seq, wf_req **req);
wf_status wf__coll_req_new(wf_comm *c, int n, wf_req **out);
/* The post-processing MPI leaves to weft (average, in-place move). */
wf_status wf__coll_finish_post(wf_req *r);
void wf__coll_req_free(wf_req *r);

/* group.c */
wf_status wf__coll_group_add(wf_comm *c, const wf__op *d, const wf__transport *tp);

/* trace.c */
uint64_t wf__coll_rec_begin(wf_comm *c, wf_comm_op op, size_t count, wf_comm_dtype dt, size_t bytes,
                            int peer, bool device, wf_comm_state state);
/* `now` (wf_now_ns) is the start time for RUNNING and the end time for DONE/FAILED,
 * so that a group of operations costs one clock read. */
void wf__coll_rec_set_state(wf_comm *c, uint64_t seq, wf_comm_state state, uint64_t now);
void wf__coll_rec_end(wf_comm *c, uint64_t seq, wf_status st);
/* The recorder's clock: wf_now_ns's clock, coarse unless WEFT_COMM_TRACE_CLOCK=precise. */
uint64_t wf__coll_rec_now(const wf_comm *c);

/* nccl.c: bootstrap NCCL on c (collective over c); see wf_comm_enable_nccl. */
wf_status wf__coll_nccl_start(wf_comm *c, wf_gpu *gpu, char *why, size_t why_len);

#endif /* WF_COMM_INT_H */
