/*
 * nccl_int.h - the table of functions the weft_nccl module exports.
 *
 * The module (collectives/nccl/nccl_module.c) links libnccl and libcudart; the static
 * collectives library does not, so a CPU-only machine can run the same binary. The
 * static library dlopen()s the module and calls it only through this table, which
 * carries no NCCL or CUDA types: communicators, streams and events are void
 * pointers. MPI stays on the static side: the module never sees it, so the NCCL id
 * is broadcast by the caller (rank 0 get_unique_id -> MPI_Bcast -> comm_init).
 *
 * Every function returns a wf_status; errors are logged by the module through the
 * log function handed to init(). No entry but comm_destroy blocks the host on the
 * device: completion is ordered on streams (event_order, order_dep).
 */
#ifndef WF_NCCL_INT_H
#define WF_NCCL_INT_H

#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>

#include "wf_collectives.h"

/* Bumped whenever the table changes, so a stale module is refused, not misused. */
#define WF__NCCL_ABI 4
/* The symbol the module exports: const wf__nccl_ops *wf__nccl_ops_v1(void). */
#define WF__NCCL_ENTRY "wf__nccl_ops_v1"
/* sizeof(ncclUniqueId); checked with a static assertion inside the module. */
#define WF__NCCL_ID_BYTES 128

typedef void (*wf__vlog_fn)(int level, const char *file, int line, const char *fmt, va_list ap);

typedef struct wf__nccl_ops {
  int abi;
  /* Hand the module the process's logger; report NCCL's version (ncclGetVersion,
   * e.g. 22809) and count visible devices (0 when none, with the reason in why). */
  wf_status (*init)(wf__vlog_fn vlog, int *nccl_version, int *devices, char *why, size_t why_len);
  wf_status (*get_unique_id)(void *id);
  /* ncclCommInitRank on the current device, plus a communication stream. */
  wf_status (*comm_create)(void **nc, const void *id, int nranks, int rank);
  void (*comm_destroy)(void *nc);
  wf_status (*comm_abort)(void *nc);
  void (*set_dep_stream)(void *nc, void *stream);
  /* Enqueue on the communication stream (after the dependency stream). */
  wf_status (*allreduce)(void *nc, const void *send, void *recv, size_t count, wf_comm_dtype dt,
                         wf_comm_redop op);
  wf_status (*reduce_scatter)(void *nc, const void *send, void *recv, size_t recv_count,
                              wf_comm_dtype dt, wf_comm_redop op);
  wf_status (*allgather)(void *nc, const void *send, void *recv, size_t send_count,
                         wf_comm_dtype dt);
  wf_status (*bcast)(void *nc, void *buf, size_t count, wf_comm_dtype dt, int root);
  wf_status (*send)(void *nc, const void *buf, size_t count, wf_comm_dtype dt, int peer);
  wf_status (*recv)(void *nc, void *buf, size_t count, wf_comm_dtype dt, int peer);
  /* All-to-all as one NCCL group of a send and a receive per peer with a non-zero count
   * (counts and offsets in elements, nranks entries each). */
  wf_status (*alltoallv)(void *nc, const void *send, const size_t *scounts, const size_t *soffs,
                         void *recv, const size_t *rcounts, const size_t *roffs, wf_comm_dtype dt,
                         int nranks);
  wf_status (*group_start)(void);
  wf_status (*group_end)(void);
  /* Completion: an event recorded on the communication stream after the op. */
  wf_status (*event_record)(void *nc, void **event);
  wf_status (*event_query)(void *event, bool *done);
  /* The dependency (compute) stream waits for `event`; the host does not. */
  wf_status (*event_order)(void *nc, void *event);
  void (*event_destroy)(void *event);
  /* The dependency stream waits for everything queued on the communication stream. */
  wf_status (*order_dep)(void *nc);
} wf__nccl_ops;

typedef const wf__nccl_ops *(*wf__nccl_entry_fn)(void);

#endif /* WF_NCCL_INT_H */
