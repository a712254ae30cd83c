/*
 * wf_collectives.h - one communicator type over a group of ranks.
 *
 * A wf_comm wraps an MPI communicator (always) and, once it has a device path
 * (wf_comm_set_device_path), a transport for device buffers: NCCL over the same ranks,
 * or MPI with host staging where NCCL cannot run. Every operation picks its transport
 * from where the buffer lives: device memory goes to the device path, host memory to
 * MPI. A communicator made from another (split, group) takes its parent's device path,
 * so every communicator of a job carries device buffers alike. The public API carries
 * no MPI, NCCL or CUDA types.
 *
 * Invariants and rules:
 *  - Functions return WF_OK or a negative wf_status; they never exit or abort.
 *  - Collectives must be called by every rank of the communicator in the same order
 *    with the same counts, as in MPI and NCCL. Set WEFT_COMM_CHECK=1 (or call
 *    wf_comm_set_check) to have each collective first verify that counts, dtype,
 *    operation and root agree on all ranks; a mismatch fails with WF_EINVAL on every
 *    rank, with a message naming the communicator and sequence number.
 *  - One thread drives a communicator at a time. Another thread may read its
 *    flight recorder (wf_comm_trace_snapshot, wf_comm_last_op) at any time: that read
 *    takes no lock and never blocks the driving thread.
 *  - Counts are in elements and must fit in an int (the MPI limit).
 *  - Element types: float32, the 16-bit floats bf16 and fp16 (mixed precision's
 *    activations), the integers int32, int64 and uint64 on both paths, so counters,
 *    flags and hashes travel as what they are, and bytes (u8, for text such as a
 *    manifest; moved, never reduced). NCCL reduces and moves bf16 and fp16 as its own
 *    ncclBfloat16 / ncclFloat16; MPI has no 16-bit float, so on the host (and staged)
 *    path they are moved as 2-byte words (MPI_UINT16_T: bcast, gather, p2p) and a
 *    reduction of them fails with WF_EUNSUPPORTED. Reductions: SUM, AVG
 *    (floating point only), MIN and MAX. On the host path weft adds no copies: the MPI
 * call gets the caller's buffers (the only exception is the in-place reduce-scatter of a rank > 0,
 * which moves its 1/size result block into place; see below).
 *
 * Buffer layouts (n = wf_comm_size, r = wf_comm_rank):
 *  - allreduce(send, recv, count): recv[i] = op over ranks of send[i], i < count.
 *    In place when send == recv.
 *  - reduce_scatter(send, recv, recv_count): send holds n * recv_count elements,
 *    block b = send[b*recv_count .. (b+1)*recv_count). Rank r receives the reduction
 *    of block r. In place when recv == send + r * recv_count (elements): the reduced
 *    block lands where it lives in the full buffer (NCCL's convention, what ZeRO
 *    wants), and the other blocks are left unspecified. Any other overlap of send
 *    and recv is WF_EINVAL. A total that does not divide by n must be padded by the
 *    caller (recv_count = ceil(total / n)).
 *  - allgather(send, recv, send_count): recv holds n * send_count elements; block b
 *    comes from rank b. In place when send == recv + r * send_count.
 *  - bcast(buf, count, root): buf of every rank becomes root's buf.
 *  - alltoallv(send, send_counts, send_offs, recv, recv_counts, recv_offs): rank r
 *    sends send_counts[p] elements from send + send_offs[p] to rank p, and receives
 *    recv_counts[p] elements from rank p into recv + recv_offs[p] (counts and offsets
 *    in elements, n entries each). send_counts[p] on rank r must equal recv_counts[r]
 *    on rank p. Any count may be 0, all of them too: a rank with nothing to send or
 *    receive still takes part (an expert that receives no tokens joins the exchange).
 *    send and recv must not overlap. alltoall(send, recv, count) is the case where
 *    every count is `count` and block p lies at p * count on both sides.
 *  - WF_COMM_AVG divides the sum by n (after summing, in float32).
 *
 * Device buffers on NCCL never block the host: a blocking call (and wf_req_wait) returns
 * once the compute stream (wf_comm_set_compute_stream) is ordered after the operation,
 * so later kernels and copies on it see the result. Read a device result through a
 * copy, which waits for the compute stream.
 *
 * Non-blocking calls return a wf_req. The buffers belong to the operation until
 * wf_req_wait() returns, or wf_req_test() reports it done; both free the request and
 * set the caller's handle to NULL. A request must be completed before its
 * communicator is destroyed. MPI moves a host operation along only while some MPI
 * call runs on that rank: to overlap communication with compute, call wf_req_test
 * now and then (e.g. between layers), as for MPI_Iallreduce itself.
 *
 * Grouped point-to-point: between wf_comm_group_start() and wf_comm_group_end() only
 * wf_comm_send and wf_comm_recv may be called; they only queue. group_end posts all
 * of them together (so a ring exchange cannot deadlock) and waits for all of them;
 * wf_comm_group_end_async() instead returns one request for the whole group.
 */
#ifndef WF_COLLECTIVES_H
#define WF_COLLECTIVES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_gpu.h"
#include "wf_runtime.h"

typedef struct wf_comm wf_comm;
typedef struct wf_req wf_req;

typedef enum wf_comm_dtype {
  WF_COMM_F32 = 0,
  WF_COMM_BF16 = 1,
  WF_COMM_I32 = 2,
  WF_COMM_I64 = 3,
  WF_COMM_U64 = 4,
  WF_COMM_U8 = 5, /* bytes: moved (bcast, gather, p2p), never reduced */
  WF_COMM_F16 = 6,
} wf_comm_dtype;

typedef enum wf_comm_redop {
  WF_COMM_SUM = 0,
  WF_COMM_AVG = 1, /* floating point only */
  WF_COMM_MIN = 2,
  WF_COMM_MAX = 3,
} wf_comm_redop;

/* Bytes of one element, and "f32", "bf16", "i32", "i64", "u64", "u8", "f16". */
size_t wf_comm_dtype_size(wf_comm_dtype dt);
const char *wf_comm_dtype_name(wf_comm_dtype dt);

/* Operation kinds, as recorded in the flight recorder. */
typedef enum wf_comm_op {
  WF_OP_ALLREDUCE = 0,
  WF_OP_REDUCE_SCATTER,
  WF_OP_ALLGATHER,
  WF_OP_BCAST,
  WF_OP_SEND,
  WF_OP_RECV,
  WF_OP_BARRIER,
  WF_OP_ALLTOALL, /* all-to-all with per-peer counts (wf_comm_alltoallv) */
  WF_OP_COUNT_
} wf_comm_op;

/* The life of a recorded operation: queued (in an open group, not yet posted),
 * running (posted to MPI or enqueued on the NCCL stream), done, failed. */
typedef enum wf_comm_state {
  WF_STATE_QUEUED = 0,
  WF_STATE_RUNNING,
  WF_STATE_DONE,
  WF_STATE_FAILED
} wf_comm_state;

/* Number of entries each communicator's flight-recorder ring holds. */
#define WF_COMM_TRACE_LEN 64

/* One flight-recorder entry. Times are on wf_now_ns()'s clock (CLOCK_MONOTONIC) but,
 * to keep recording nearly free, read from its coarse twin (resolution of a few ms,
 * enough to tell a hang); WEFT_COMM_TRACE_CLOCK=precise gives full resolution. end_ns
 * is 0 until the operation completed; start_ns is 0 while it is queued. `peer` is the destination
 * (send), source (recv) or root (bcast) as a rank of the communicator, and -1 for the other
 * operations. `bytes` is what this rank contributes: count * dtype size (for reduce-scatter, the
 * full input, n * recv_count; for allgather, this rank's block). */
typedef struct wf_trace_entry {
  uint64_t seq;
  uint64_t count;
  uint64_t bytes;
  uint64_t start_ns;
  uint64_t end_ns;
  wf_comm_op op;
  wf_comm_state state;
  wf_comm_dtype dtype;
  int peer;
  bool device; /* true when it ran on NCCL */
} wf_trace_entry;

/* ---- communicators ---------------------------------------------------------- */

/* A communicator over all ranks of the job (a duplicate of MPI_COMM_WORLD, so weft's
 * traffic never matches the caller's). MPI must already be initialised. Collective. */
wf_status wf_comm_world_create(wf_comm **out);

/* Split `parent` as MPI_Comm_split does: ranks with the same color form one
 * communicator, ordered by key (ties by parent rank). A negative color means "not in
 * any": *out is set to NULL and WF_OK returned. Collective over `parent`. The child
 * inherits the parent's check setting. `name` (e.g. "tp", "dp") labels logs and the
 * console; it is copied. The child takes the parent's device path: staging at once,
 * NCCL through its own bootstrap over the child's ranks (collective over the child,
 * falling back to staging, agreed, where NCCL cannot start). */
wf_status wf_comm_split(wf_comm *parent, int color, int key, const char *name, wf_comm **out);

/* A communicator over ranks[0..n) of `parent`, in that order (ranks[i] becomes rank
 * i). Only the listed ranks communicate; a rank not in the list gets *out = NULL and
 * WF_OK without communicating. Every listed rank must pass the same list. The child
 * takes the parent's device path, as with wf_comm_split. */
wf_status wf_comm_create_group(wf_comm *parent, const int *ranks, int n, const char *name,
                               wf_comm **out);

void wf_comm_destroy(wf_comm *c); /* accepts NULL; collective when NCCL is enabled */

int wf_comm_rank(const wf_comm *c);
int wf_comm_size(const wf_comm *c);
const char *wf_comm_name(const wf_comm *c);
/* The rank in the world communicator of rank `r` of `c`, or -1. */
int wf_comm_world_rank(const wf_comm *c, int r);
/* Turn the cross-rank agreement check on or off (default: $WEFT_COMM_CHECK). */
void wf_comm_set_check(wf_comm *c, bool on);

/* ---- device buffers ------------------------------------------------------------ */

/* Give c its device path: NCCL when `nccl` and it starts on every rank of c (agreed,
 * see wf_comm_enable_nccl), else MPI with host staging (rank 0 of c says why NCCL did
 * not start, and `why` gets it; "" otherwise). Collective over c when `nccl`; every rank
 * must pass the same `nccl`. gpu NULL (a CPU rank): nothing to do. The communicators
 * made from c later take the same path. */
wf_status wf_comm_set_device_path(wf_comm *c, wf_gpu *gpu, bool nccl, char *why, size_t why_len);
/* "nccl", "staged" or "none" (host buffers only). */
const char *wf_comm_device_path(const wf_comm *c);
/* Times an operation on c held the host until the device was done: each copy of
 * host staging (to the host and back) counts one; NCCL counts none. */
uint64_t wf_comm_host_syncs(const wf_comm *c);

/* Bootstrap NCCL over this communicator's MPI group: rank 0 calls ncclGetUniqueId,
 * MPI_Bcast sends the id, every rank calls ncclCommInitRank on the current CUDA
 * device (the one wf_gpu_set_device selected). Collective. From then on a buffer for
 * which wf_gpu_is_device_ptr(gpu, buf) holds goes to NCCL; `gpu` is borrowed and must
 * outlive the communicator. On a machine without a GPU
 * (gpu == NULL, the weft_nccl module or CUDA libraries missing, no device on some
 * rank) every rank returns WF_ENODEV and writes the reason into `why`; the
 * communicator stays usable for host buffers. */
wf_status wf_comm_enable_nccl(wf_comm *c, wf_gpu *gpu, char *why, size_t why_len);
bool wf_comm_has_nccl(const wf_comm *c);
/* Device buffers without NCCL: when ranks share a GPU (NCCL refuses duplicate GPUs),
 * operations on device memory (as `gpu` tells it) copy it to host memory, run on MPI,
 * and copy the result back. Local, no communication; a no-op once NCCL is enabled.
 * Grouped point-to-point of staged device buffers is refused (post them one by one). */
wf_status wf_comm_enable_staging(wf_comm *c, wf_gpu *gpu);
bool wf_comm_is_staged(const wf_comm *c);
/* Local, no communication: load the weft_nccl module and count CUDA devices. WF_OK
 * when NCCL could be used here; otherwise WF_ENODEV and `why` says what is missing
 * (module not built, CUDA libraries absent, no driver or device). *nccl_version is
 * NCCL's code (e.g. 22809 for 2.28.9) once the module loaded, else 0. */
wf_status wf_comm_nccl_probe(int *nccl_version, char *why, size_t why_len);
/* Make the communication stream wait for work already queued on `stream` (a
 * cudaStream_t, the compute stream) before each device operation. NULL (the default):
 * the legacy default stream, where the model computes. */
void wf_comm_set_compute_stream(wf_comm *c, void *stream);
/* Abort c: every later operation on it fails with WF_EABORTED, and on NCCL the
 * communicator is aborted (ncclCommAbort) so that an operation stuck on the device
 * returns. Safe from another thread (the watchdog). The communicator is unusable
 * afterwards; destroy it. WF_EUNSUPPORTED when nothing in flight can be interrupted
 * (MPI, staging: a stuck MPI call is ended by MPI_Abort from main). */
wf_status wf_comm_abort(wf_comm *c);
/* wf_comm_abort on every communicator of c's family: the world communicator c was made
 * from and every communicator made from it since, still alive. Safe from another
 * thread while the driving thread is blocked in one of them. Returns how many were
 * aborted; `names` (may be NULL) gets them as "name(path) ...". */
int wf_comm_abort_all(wf_comm *c, char *names, size_t len);

/* ---- blocking operations ---------------------------------------------------- */

wf_status wf_comm_allreduce(wf_comm *c, const void *send, void *recv, size_t count,
                            wf_comm_dtype dt, wf_comm_redop op);
wf_status wf_comm_reduce_scatter(wf_comm *c, const void *send, void *recv, size_t recv_count,
                                 wf_comm_dtype dt, wf_comm_redop op);
wf_status wf_comm_allgather(wf_comm *c, const void *send, void *recv, size_t send_count,
                            wf_comm_dtype dt);
wf_status wf_comm_bcast(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int root);
/* Inside a group these only queue; see wf_comm_group_start. A recv whose message has
 * a different size than `count` fails with WF_EINVAL. */
wf_status wf_comm_send(wf_comm *c, const void *buf, size_t count, wf_comm_dtype dt, int peer);
wf_status wf_comm_recv(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int peer);
wf_status wf_comm_barrier(wf_comm *c);
/* All-to-all, with per-peer counts and offsets (see the layouts above), and with one
 * count for every peer. Blocking; the recorder counts the elements this rank sends.
 * With WEFT_COMM_CHECK every rank also checks that what each peer says it sends is what
 * it expects to receive. */
wf_status wf_comm_alltoallv(wf_comm *c, const void *send, const size_t *send_counts,
                            const size_t *send_offs, void *recv, const size_t *recv_counts,
                            const size_t *recv_offs, wf_comm_dtype dt);
wf_status wf_comm_alltoall(wf_comm *c, const void *send, void *recv, size_t count,
                           wf_comm_dtype dt);

/* Agree on an outcome: every rank passes its own status and gets the same answer,
 * WF_OK when every rank passed WF_OK, else the status of the lowest-numbered failing
 * rank, whose rank (in this communicator) goes to *first_bad (-1 when none failed;
 * first_bad may be NULL). Ranks use it before acting on anything that can fail on one
 * rank alone (a file write, a device probe), so none waits in a collective the others
 * have left. One int64 MIN all-reduce. If the agreement itself fails, its error is
 * returned (logged where it arose) and *first_bad is -1. c NULL: one rank alone. */
wf_status wf_comm_agree(wf_comm *c, wf_status mine, int *first_bad);

/* ---- non-blocking operations ------------------------------------------------
 * On success *req is a request to complete with wf_req_wait/test. On failure *req
 * is NULL and nothing is in flight. */

wf_status wf_comm_iallreduce(wf_comm *c, const void *send, void *recv, size_t count,
                             wf_comm_dtype dt, wf_comm_redop op, wf_req **req);
wf_status wf_comm_ireduce_scatter(wf_comm *c, const void *send, void *recv, size_t recv_count,
                                  wf_comm_dtype dt, wf_comm_redop op, wf_req **req);
wf_status wf_comm_iallgather(wf_comm *c, const void *send, void *recv, size_t send_count,
                             wf_comm_dtype dt, wf_req **req);
wf_status wf_comm_ibcast(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int root,
                         wf_req **req);
wf_status wf_comm_isend(wf_comm *c, const void *buf, size_t count, wf_comm_dtype dt, int peer,
                        wf_req **req);
wf_status wf_comm_irecv(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int peer,
                        wf_req **req);

/* Wait for *req, free it and set *req = NULL. A NULL *req is already complete. */
wf_status wf_req_wait(wf_req **req);
/* Set *done; when the operation completed, free it and set *req = NULL. */
wf_status wf_req_test(wf_req **req, bool *done);
/* Wait for all n requests (NULL entries allowed); returns the first error. */
wf_status wf_req_waitall(wf_req **reqs, int n);

/* ---- grouped point-to-point -------------------------------------------------- */

wf_status wf_comm_group_start(wf_comm *c);
wf_status wf_comm_group_end(wf_comm *c);
wf_status wf_comm_group_end_async(wf_comm *c, wf_req **req);

/* ---- flight recorder ----------------------------------------------------------
 * Every operation gets the communicator's next sequence number (0, 1, 2, ...). The
 * last WF_COMM_TRACE_LEN operations stay in a ring. Safe from any thread. */

/* Copy up to `max` of the most recent entries into out, oldest first. Returns the
 * number copied. */
int wf_comm_trace_snapshot(const wf_comm *c, wf_trace_entry *out, int max);
/* The most recent operation; false when the communicator has done none yet. */
bool wf_comm_last_op(const wf_comm *c, wf_trace_entry *out);
/* The sequence number the next operation will get (= operations so far). */
uint64_t wf_comm_next_seq(const wf_comm *c);

const char *wf_comm_op_name(wf_comm_op op);       /* "allreduce", "send", ... */
const char *wf_comm_state_name(wf_comm_state st); /* "queued", "running", ... */
/* One line for logs and the console, e.g.
 * "dp#17 allreduce 1031 x f32 (4124 B) running for 12.3 ms". Returns buf. */
char *wf_comm_trace_format(const wf_comm *c, const wf_trace_entry *e, char *buf, size_t len);

#endif /* WF_COLLECTIVES_H */
