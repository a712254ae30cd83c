/*
 * nccl_module.c - libweft_nccl.so: NCCL and the CUDA runtime behind the table of
 * collectives/nccl_int.h.
 *
 * This is the only file of the collectives module that links libnccl and
 * libcudart; the static library dlopen()s it. Each communicator gets its own
 * communication stream, created on the current device (the one the GPU backend
 * selected: both modules share the process's libcudart), so communication overlaps
 * compute. The compute stream (by default the legacy default stream) is waited on
 * through an event before each operation, and waits in turn, through another event,
 * for what the caller completes (a blocking operation, a request's wait): no call but
 * comm_destroy holds the host until the device is done. Aborting (the watchdog) only calls
 * ncclCommAbort and marks the communicator, which destroy then skips freeing twice.
 *
 * The module does not link the runtime library: logging goes through the function
 * the static side hands to init(), reached by a local wf_log.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "nccl_int.h"
#include "wf_check.h"

_Static_assert(sizeof(ncclUniqueId) == WF__NCCL_ID_BYTES, "ncclUniqueId size changed");

typedef struct ncomm {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaStream_t dep;       /* borrowed; NULL: the legacy default stream (cudaStreamLegacy) */
  cudaEvent_t dep_event;  /* compute stream -> communication stream */
  cudaEvent_t done_event; /* communication stream -> compute stream (blocking ops) */
  atomic_int aborted;
} ncomm;

static wf__vlog_fn host_vlog;

/* The check macros call wf_log; here it forwards to the process's logger. */
__attribute__((visibility("hidden"))) void wf_log(int level, const char *file, int line,
                                                  const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  if (host_vlog)
    host_vlog(level, file, line, fmt, ap);
  else
    vfprintf(stderr, fmt, ap);
  va_end(ap);
}

static wf_status init(wf__vlog_fn vlog, int *nccl_version, int *devices, char *why, size_t why_len)
{
  host_vlog = vlog;
  *devices = 0;
  if (ncclGetVersion(nccl_version) != ncclSuccess)
    *nccl_version = 0;
  cudaError_t e = cudaGetDeviceCount(devices);
  if (e != cudaSuccess) {
    *devices = 0;
    snprintf(why, why_len, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
    return WF_ENODEV;
  }
  return WF_OK;
}

static wf_status get_unique_id(void *id)
{
  wf_status st = WF_OK;
  WF_CHECK_NCCL(ncclGetUniqueId((ncclUniqueId *)id));
fail:
  return st;
}

static wf_status comm_create(void **out, const void *id, int nranks, int rank)
{
  wf_status st = WF_OK;
  ncclUniqueId uid;
  ncomm *n = calloc(1, sizeof *n);
  WF_CHECK_ALLOC(n);
  memcpy(&uid, id, sizeof uid);
  WF_CHECK_CUDA(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking));
  WF_CHECK_CUDA(cudaEventCreateWithFlags(&n->dep_event, cudaEventDisableTiming));
  WF_CHECK_CUDA(cudaEventCreateWithFlags(&n->done_event, cudaEventDisableTiming));
  WF_CHECK_NCCL(ncclCommInitRank(&n->comm, nranks, uid, rank));
  *out = n;
  return WF_OK;
fail:
  if (n && n->done_event)
    cudaEventDestroy(n->done_event);
  if (n && n->dep_event)
    cudaEventDestroy(n->dep_event);
  if (n && n->stream)
    cudaStreamDestroy(n->stream);
  free(n);
  return st;
}

static void comm_destroy(void *p)
{
  ncomm *n = p;
  if (!n)
    return;
  if (!atomic_load(&n->aborted)) {
    cudaStreamSynchronize(n->stream);
    ncclCommDestroy(n->comm);
  }
  cudaEventDestroy(n->done_event);
  cudaEventDestroy(n->dep_event);
  cudaStreamDestroy(n->stream);
  free(n);
}

static wf_status comm_abort(void *p)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  if (atomic_exchange(&n->aborted, 1))
    return WF_OK;
  WF_CHECK_NCCL(ncclCommAbort(n->comm));
fail:
  return st;
}

static void set_dep_stream(void *p, void *stream) { ((ncomm *)p)->dep = stream; }

static cudaStream_t dep_of(const ncomm *n) { return n->dep ? n->dep : cudaStreamLegacy; }

/* The communication stream waits for the work already on the dependency stream: the
 * compute stream, or by default the legacy default stream, where the model computes.
 * The communication stream is non-blocking (it must overlap compute), so without this
 * wait an operation could read a buffer the compute has not written yet. */
static wf_status order_after_dep(ncomm *n)
{
  wf_status st = WF_OK;
  WF_CHECK_CUDA(cudaEventRecord(n->dep_event, dep_of(n)));
  WF_CHECK_CUDA(cudaStreamWaitEvent(n->stream, n->dep_event, 0));
fail:
  return st;
}

static ncclDataType_t nt(wf_comm_dtype dt)
{
  switch (dt) {
  case WF_COMM_BF16: return ncclBfloat16;
  case WF_COMM_F16: return ncclFloat16;
  case WF_COMM_I32: return ncclInt32;
  case WF_COMM_I64: return ncclInt64;
  case WF_COMM_U64: return ncclUint64;
  case WF_COMM_U8: return ncclUint8;
  default: return ncclFloat32;
  }
}
static ncclRedOp_t nop(wf_comm_redop op)
{
  static const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMin, ncclMax};
  return ops[op];
}

static wf_status allreduce(void *p, const void *send, void *recv, size_t count, wf_comm_dtype dt,
                           wf_comm_redop op)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclAllReduce(send, recv, count, nt(dt), nop(op), n->comm, n->stream));
fail:
  return st;
}

static wf_status reduce_scatter(void *p, const void *send, void *recv, size_t recv_count,
                                wf_comm_dtype dt, wf_comm_redop op)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclReduceScatter(send, recv, recv_count, nt(dt), nop(op), n->comm, n->stream));
fail:
  return st;
}

static wf_status allgather(void *p, const void *send, void *recv, size_t send_count,
                           wf_comm_dtype dt)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclAllGather(send, recv, send_count, nt(dt), n->comm, n->stream));
fail:
  return st;
}

static wf_status bcast(void *p, void *buf, size_t count, wf_comm_dtype dt, int root)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclBroadcast(buf, buf, count, nt(dt), root, n->comm, n->stream));
fail:
  return st;
}

static wf_status p2p_send(void *p, const void *buf, size_t count, wf_comm_dtype dt, int peer)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclSend(buf, count, nt(dt), peer, n->comm, n->stream));
fail:
  return st;
}

static wf_status p2p_recv(void *p, void *buf, size_t count, wf_comm_dtype dt, int peer)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclRecv(buf, count, nt(dt), peer, n->comm, n->stream));
fail:
  return st;
}

static size_t dt_size(wf_comm_dtype dt)
{
  switch (dt) {
  case WF_COMM_BF16:
  case WF_COMM_F16: return 2;
  case WF_COMM_I64:
  case WF_COMM_U64: return 8;
  case WF_COMM_U8: return 1;
  default: return 4;
  }
}

/* NCCL has no all-to-all-v: one group of point-to-point operations, the send to and
 * receive from each peer that has something to move (the self pair included: NCCL
 * matches a rank's send to itself with its receive in the same group). */
static wf_status alltoallv(void *p, const void *send, const size_t *scounts, const size_t *soffs,
                           void *recv, const size_t *rcounts, const size_t *roffs, wf_comm_dtype dt,
                           int nranks)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  size_t es = dt_size(dt);
  WF_TRY(order_after_dep(n));
  WF_CHECK_NCCL(ncclGroupStart());
  for (int q = 0; q < nranks && st == WF_OK; q++) {
    if (scounts[q] && ncclSend((const char *)send + soffs[q] * es, scounts[q], nt(dt), q, n->comm,
                               n->stream) != ncclSuccess)
      st = WF_ENCCL;
    if (rcounts[q] && ncclRecv((char *)recv + roffs[q] * es, rcounts[q], nt(dt), q, n->comm,
                               n->stream) != ncclSuccess)
      st = WF_ENCCL;
  }
  WF_CHECK_NCCL(ncclGroupEnd());
  WF_CHECK(st == WF_OK, st, "ncclSend/ncclRecv of an all-to-all over %d ranks failed", nranks);
fail:
  return st;
}

static wf_status group_start(void)
{
  wf_status st = WF_OK;
  WF_CHECK_NCCL(ncclGroupStart());
fail:
  return st;
}

static wf_status group_end(void)
{
  wf_status st = WF_OK;
  WF_CHECK_NCCL(ncclGroupEnd());
fail:
  return st;
}

static wf_status event_record(void *p, void **out)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  cudaEvent_t ev = NULL;
  WF_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  WF_CHECK_CUDA(cudaEventRecord(ev, n->stream));
  *out = ev;
  return WF_OK;
fail:
  if (ev)
    cudaEventDestroy(ev);
  return st;
}

static wf_status event_query(void *ev, bool *done)
{
  wf_status st = WF_OK;
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  *done = e == cudaSuccess;
  if (e == cudaErrorNotReady)
    return WF_OK;
  WF_CHECK_CUDA(e);
fail:
  return st;
}

static wf_status event_order(void *p, void *ev)
{
  wf_status st = WF_OK;
  WF_CHECK_CUDA(cudaStreamWaitEvent(dep_of(p), (cudaEvent_t)ev, 0));
fail:
  return st;
}

static void event_destroy(void *ev) { cudaEventDestroy((cudaEvent_t)ev); }

/* A blocking operation: the compute stream waits for it, the host does not. */
static wf_status order_dep(void *p)
{
  wf_status st = WF_OK;
  ncomm *n = p;
  WF_CHECK_CUDA(cudaEventRecord(n->done_event, n->stream));
  WF_CHECK_CUDA(cudaStreamWaitEvent(dep_of(n), n->done_event, 0));
fail:
  return st;
}

static const wf__nccl_ops ops = {
    .abi = WF__NCCL_ABI,
    .init = init,
    .get_unique_id = get_unique_id,
    .comm_create = comm_create,
    .comm_destroy = comm_destroy,
    .comm_abort = comm_abort,
    .set_dep_stream = set_dep_stream,
    .allreduce = allreduce,
    .reduce_scatter = reduce_scatter,
    .allgather = allgather,
    .bcast = bcast,
    .send = p2p_send,
    .recv = p2p_recv,
    .alltoallv = alltoallv,
    .group_start = group_start,
    .group_end = group_end,
    .event_record = event_record,
    .event_query = event_query,
    .event_order = event_order,
    .event_destroy = event_destroy,
    .order_dep = order_dep,
};

__attribute__((visibility("default"))) const wf__nccl_ops *wf__nccl_ops_v1(void) { return &ops; }
