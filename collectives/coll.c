/*
 * coll.c - the collective operations: argument checks, transport choice, recording.
 *
 * Each public call fills a wf__op and goes through wf__coll_run(): validate (cheap, local),
 * pick the transport from where the buffer lives (comm_int.h), optionally check
 * agreement across ranks, take a sequence number, then hand over to the transport. Blocking
 * MPI calls go straight to the blocking MPI function (MPI_Allreduce, not
 * Iallreduce + Wait), so the host path costs one MPI call plus a few stores.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"
#include "wf_check.h"

/* [a, a+an) and [b, b+bn) share a byte. */
static bool overlaps(const void *a, size_t an, const void *b, size_t bn)
{
  const char *x = a, *y = b;
  return an && bn && x < y + bn && y < x + an;
}

/* The in-place layouts and the overlaps that are errors (see wf_collectives.h). */
static wf_status check_layout(const wf_comm *c, const wf__op *d)
{
  if (!d->send || !d->recv || d->count == 0)
    return WF_OK; /* one buffer (p2p, barrier) or nothing to touch */
  if (d->send == d->recv && (d->op == WF_OP_ALLREDUCE || d->op == WF_OP_BCAST || c->rank == 0))
    return WF_OK; /* in place; on rank 0 also for reduce-scatter and allgather */
  size_t es = wf_comm_dtype_size(d->dt), blk = d->count * es, full = blk * (size_t)c->size;
  const char *s = d->send, *r = d->recv;
  if (d->op == WF_OP_REDUCE_SCATTER && s + blk * (size_t)c->rank != r &&
      overlaps(s, full, r, blk)) {
    WF_ERROR("comm '%s': reduce_scatter buffers overlap but recv != send + rank * recv_count "
             "(rank %d); pass that exact pointer for in place, or disjoint buffers",
             c->name, c->rank);
    return WF_EINVAL;
  }
  if (d->op == WF_OP_ALLGATHER && r + blk * (size_t)c->rank != s && overlaps(r, full, s, blk)) {
    WF_ERROR("comm '%s': allgather buffers overlap but send != recv + rank * send_count "
             "(rank %d); pass that exact pointer for in place, or disjoint buffers",
             c->name, c->rank);
    return WF_EINVAL;
  }
  if (d->op == WF_OP_ALLREDUCE && s != r && overlaps(s, blk, r, blk)) {
    WF_ERROR("comm '%s': allreduce buffers partly overlap; use send == recv for in place", c->name);
    return WF_EINVAL;
  }
  return WF_OK;
}

/* Elements of one side of an all-to-all: the end of its last block. */
static size_t a2a_extent(const wf_comm *c, const size_t *counts, const size_t *offs)
{
  size_t end = 0;
  for (int p = 0; p < c->size; p++)
    if (counts[p])
      end = WF_MAX(end, offs[p] + counts[p]);
  return end;
}

/* An all-to-all's per-peer arrays: given, each count and each side's extent within
 * MPI's int, a buffer wherever something moves, and no overlap of the two sides. */
static wf_status check_alltoall(const wf_comm *c, const wf__op *d)
{
  if (!d->scounts || !d->soffs || !d->rcounts || !d->roffs) {
    WF_ERROR("comm '%s' alltoall: NULL count or offset array", c->name);
    return WF_EINVAL;
  }
  size_t es = wf_comm_dtype_size(d->dt);
  size_t ns = a2a_extent(c, d->scounts, d->soffs), nr = a2a_extent(c, d->rcounts, d->roffs);
  if (ns > (size_t)INT_MAX || nr > (size_t)INT_MAX) {
    WF_ERROR("comm '%s' alltoall: %zu elements sent or %zu received exceed the MPI int limit "
             "(%d); split the exchange",
             c->name, ns, nr, INT_MAX);
    return WF_EINVAL;
  }
  if ((ns && !d->send) || (nr && !d->recv)) {
    WF_ERROR("comm '%s' alltoall: NULL buffer with %zu elements to send and %zu to receive",
             c->name, ns, nr);
    return WF_EINVAL;
  }
  if (overlaps(d->send, ns * es, d->recv, nr * es)) {
    WF_ERROR("comm '%s' alltoall: the send and receive buffers overlap; use two buffers", c->name);
    return WF_EINVAL;
  }
  return WF_OK;
}

static wf_status validate(const wf_comm *c, const wf__op *d)
{
  const char *name = wf_comm_op_name(d->op); /* a table load; used by messages only */
  if (!c) {
    WF_ERROR("%s: communicator is NULL", name);
    return WF_EINVAL;
  }
  if ((unsigned)d->dt > WF_COMM_F16 || (unsigned)d->redop > WF_COMM_MAX) {
    WF_ERROR("comm '%s' %s: unknown dtype %d or reduction %d", c->name, name, (int)d->dt,
             (int)d->redop);
    return WF_EINVAL;
  }
  bool floating = d->dt == WF_COMM_F32 || d->dt == WF_COMM_BF16 || d->dt == WF_COMM_F16;
  bool reduces = d->op == WF_OP_ALLREDUCE || d->op == WF_OP_REDUCE_SCATTER;
  if (reduces && d->dt == WF_COMM_U8) {
    WF_ERROR("comm '%s' %s: bytes are moved, not reduced; use an integer type", c->name, name);
    return WF_EINVAL;
  }
  if (reduces && d->redop == WF_COMM_AVG && !floating) {
    WF_ERROR("comm '%s' %s: an average of %s integers is not an integer; sum them instead", c->name,
             name, wf_comm_dtype_name(d->dt));
    return WF_EINVAL;
  }
  size_t blocks = d->op == WF_OP_ALLGATHER || d->op == WF_OP_REDUCE_SCATTER ? (size_t)c->size : 1;
  if (d->count > (size_t)INT_MAX || d->count * blocks > (size_t)INT_MAX) {
    WF_ERROR("comm '%s' %s: count %zu x %zu blocks exceeds the MPI int limit (%d); split the "
             "buffer",
             c->name, name, d->count, blocks, INT_MAX);
    return WF_EINVAL;
  }
  if (c->group_depth == 0 && d->op == WF_OP_ALLTOALL)
    return check_alltoall(c, d);
  if (d->count && ((!d->send && d->op != WF_OP_RECV) || (!d->recv && d->op != WF_OP_SEND))) {
    WF_ERROR("comm '%s' %s: NULL buffer with count %zu", c->name, name, d->count);
    return WF_EINVAL;
  }
  if (d->has_peer && (d->peer < 0 || d->peer >= c->size)) {
    WF_ERROR("comm '%s' %s: %s %d out of range (size %d)", c->name, name,
             d->op == WF_OP_BCAST ? "root" : "peer", d->peer, c->size);
    return WF_EINVAL;
  }
  if (c->group_depth > 0 && d->op != WF_OP_SEND && d->op != WF_OP_RECV) {
    WF_ERROR("comm '%s': %s inside a group; only send and recv may be grouped", c->name, name);
    return WF_EINVAL;
  }
  return check_layout(c, d);
}

/* WEFT_COMM_CHECK: every rank learns the min and max of each argument with one small
 * MPI_Allreduce (MAX of v and -v), so a mismatch fails on every rank alike instead of
 * hanging or corrupting memory. It talks to MPI directly: it runs inside every
 * collective, which it must not recurse into. */
static wf_status check_args(wf_comm *c, const wf__op *d)
{
  wf_status st = WF_OK;
  static const char *what[] = {"operation", "dtype", "reduction", "count", "root"};
  int64_t mine[5] = {d->op, d->dt, d->redop, (int64_t)d->count, d->peer}, v[10];
  for (int i = 0; i < 5; i++) {
    v[i] = mine[i];
    v[5 + i] = -mine[i];
  }
  WF_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 10, MPI_INT64_T, MPI_MAX, c->mpi));
  for (int i = 0; i < 5; i++)
    WF_CHECK(v[i] == -v[5 + i], WF_EINVAL,
             "comm '%s' seq %llu: %s %s differs across ranks (min %lld, max %lld, this rank "
             "%lld); every rank must call the same collective with the same arguments",
             c->name, (unsigned long long)wf_comm_next_seq(c), wf_comm_op_name(d->op), what[i],
             (long long)-v[5 + i], (long long)v[i], (long long)mine[i]);
fail:
  return st;
}

/* WEFT_COMM_CHECK for an all-to-all: every rank's send counts reach their peers (an
 * MPI_Alltoall of one count each) and must equal what each peer expects to receive;
 * the verdict is agreed, so a mismatch fails on every rank alike. */
static wf_status check_a2a_counts(wf_comm *c, const wf__op *d)
{
  wf_status st = WF_OK;
  int64_t *mine = malloc(2 * (size_t)c->size * sizeof *mine), bad = -1;
  WF_CHECK_ALLOC(mine);
  int64_t *theirs = mine + c->size;
  for (int p = 0; p < c->size; p++)
    mine[p] = (int64_t)d->scounts[p];
  WF_CHECK_MPI(MPI_Alltoall(mine, 1, MPI_INT64_T, theirs, 1, MPI_INT64_T, c->mpi));
  for (int p = 0; p < c->size && bad < 0; p++)
    if (theirs[p] != (int64_t)d->rcounts[p])
      bad = p;
  int64_t v[2] = {bad >= 0 ? c->rank : INT64_MAX, bad};
  WF_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT64_T, MPI_MIN, c->mpi));
  WF_CHECK(v[0] == INT64_MAX, WF_EINVAL,
           "comm '%s' seq %llu: alltoall counts disagree: rank %lld expects a count from a peer "
           "other than the one that peer sends%s; each rank's send_counts[p] must equal rank "
           "p's recv_counts[r]",
           c->name, (unsigned long long)wf_comm_next_seq(c), (long long)v[0],
           bad >= 0 ? " (this rank among them)" : "");
fail:
  free(mine);
  return st;
}

static size_t trace_bytes(const wf_comm *c, const wf__op *d)
{
  size_t b = d->count * wf_comm_dtype_size(d->dt);
  return d->op == WF_OP_REDUCE_SCATTER ? b * (size_t)c->size : b;
}

/* The transport for an operation on `buf`: the device path's for device memory, MPI's
 * for host memory (and for operations without a buffer, the barrier). */
static const wf__transport *transport_of(const wf_comm *c, const void *buf)
{
  return c->dev && buf && wf_gpu_is_device_ptr(c->gpu, buf) ? c->dev : &wf__mpi_transport;
}

/* What the chosen transport cannot carry, refused before anything is posted. */
static wf_status check_transport(const wf_comm *c, const wf__op *d, const wf__transport *tp)
{
  if (atomic_load_explicit(&((wf_comm *)c)->aborted, memory_order_relaxed)) {
    WF_ERROR("comm '%s' %s: the communicator was aborted (the job is ending)", c->name,
             wf_comm_op_name(d->op));
    return WF_EABORTED;
  }
  bool half = d->dt == WF_COMM_BF16 || d->dt == WF_COMM_F16;
  bool reduces = d->op == WF_OP_ALLREDUCE || d->op == WF_OP_REDUCE_SCATTER;
  if (half && reduces && !tp->half_reduce) {
    WF_ERROR("comm '%s' %s of %s: the %s transport has no 16-bit float to add in (MPI has no "
             "such type); reduce in f32, or on device buffers, which NCCL reduces",
             c->name, wf_comm_op_name(d->op), wf_comm_dtype_name(d->dt), tp->name);
    return WF_EUNSUPPORTED;
  }
  bool p2p = d->op == WF_OP_SEND || d->op == WF_OP_RECV;
  if (p2p && d->peer == c->rank && tp->on_device && c->group_depth == 0) {
    WF_ERROR("comm '%s' %s of a device buffer to itself (rank %d): NCCL pairs a rank's send "
             "to itself only with its receive in the same group; post both between "
             "wf_comm_group_start and wf_comm_group_end",
             c->name, wf_comm_op_name(d->op), c->rank);
    return WF_EUNSUPPORTED;
  }
  if (c->group_depth > 0 && !tp->groupable) {
    WF_ERROR("comm '%s': a grouped %s of a device buffer needs NCCL, and this communicator "
             "stages device buffers through MPI (ranks share a GPU); post it on its own",
             c->name, wf_comm_op_name(d->op));
    return WF_EUNSUPPORTED;
  }
  return WF_OK;
}

wf_status wf__coll_run(wf_comm *c, const wf__op *d, wf_req **req)
{
  wf_status st = WF_OK;
  if (req)
    *req = NULL;
  WF_TRY(validate(c, d));
  const void *buf =
      d->op == WF_OP_SEND || (d->op == WF_OP_ALLTOALL && !d->recv) ? d->send : d->recv;
  const wf__transport *tp = transport_of(c, buf);
  WF_CHECK(d->op != WF_OP_ALLTOALL || !d->send || !d->recv || transport_of(c, d->send) == tp,
           WF_EINVAL,
           "comm '%s' alltoall: one buffer is device memory and the other host memory; pass "
           "two of the same kind",
           c->name);
  WF_TRY(check_transport(c, d, tp));
  if (c->group_depth > 0)
    return wf__coll_group_add(c, d, tp);
  if (c->check && d->op == WF_OP_ALLTOALL)
    WF_TRY(check_a2a_counts(c, d));
  else if (c->check && d->op != WF_OP_SEND && d->op != WF_OP_RECV)
    WF_TRY(check_args(c, d));
  uint64_t seq = wf__coll_rec_begin(c, d->op, d->count, d->dt, trace_bytes(c, d), d->peer,
                                    tp->on_device, WF_STATE_RUNNING);
  st = tp->post(c, d, seq, req);
  if (st != WF_OK || !req)
    wf__coll_rec_end(c, seq, st);
fail:
  return st;
}

static wf__op mk(wf_comm_op op, const void *send, void *recv, size_t count, wf_comm_dtype dt,
                 wf_comm_redop redop, int peer)
{
  bool has_peer = op == WF_OP_BCAST || op == WF_OP_SEND || op == WF_OP_RECV;
  wf__op d = {op,       send, recv, count, dt,  redop, has_peer ? peer : -1,
              has_peer, NULL, NULL, NULL,  NULL};
  return d;
}

wf_status wf_comm_allreduce(wf_comm *c, const void *send, void *recv, size_t count,
                            wf_comm_dtype dt, wf_comm_redop op)
{
  wf__op d = mk(WF_OP_ALLREDUCE, send, recv, count, dt, op, -1);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_iallreduce(wf_comm *c, const void *send, void *recv, size_t count,
                             wf_comm_dtype dt, wf_comm_redop op, wf_req **req)
{
  wf__op d = mk(WF_OP_ALLREDUCE, send, recv, count, dt, op, -1);
  return req ? wf__coll_run(c, &d, req) : WF_EINVAL;
}

wf_status wf_comm_reduce_scatter(wf_comm *c, const void *send, void *recv, size_t recv_count,
                                 wf_comm_dtype dt, wf_comm_redop op)
{
  wf__op d = mk(WF_OP_REDUCE_SCATTER, send, recv, recv_count, dt, op, -1);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_ireduce_scatter(wf_comm *c, const void *send, void *recv, size_t recv_count,
                                  wf_comm_dtype dt, wf_comm_redop op, wf_req **req)
{
  wf__op d = mk(WF_OP_REDUCE_SCATTER, send, recv, recv_count, dt, op, -1);
  return req ? wf__coll_run(c, &d, req) : WF_EINVAL;
}

wf_status wf_comm_allgather(wf_comm *c, const void *send, void *recv, size_t send_count,
                            wf_comm_dtype dt)
{
  wf__op d = mk(WF_OP_ALLGATHER, send, recv, send_count, dt, WF_COMM_SUM, -1);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_iallgather(wf_comm *c, const void *send, void *recv, size_t send_count,
                             wf_comm_dtype dt, wf_req **req)
{
  wf__op d = mk(WF_OP_ALLGATHER, send, recv, send_count, dt, WF_COMM_SUM, -1);
  return req ? wf__coll_run(c, &d, req) : WF_EINVAL;
}

wf_status wf_comm_bcast(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int root)
{
  wf__op d = mk(WF_OP_BCAST, buf, buf, count, dt, WF_COMM_SUM, root);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_ibcast(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int root,
                         wf_req **req)
{
  wf__op d = mk(WF_OP_BCAST, buf, buf, count, dt, WF_COMM_SUM, root);
  return req ? wf__coll_run(c, &d, req) : WF_EINVAL;
}

wf_status wf_comm_barrier(wf_comm *c)
{
  wf__op d = mk(WF_OP_BARRIER, NULL, NULL, 0, WF_COMM_F32, WF_COMM_SUM, -1);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_send(wf_comm *c, const void *buf, size_t count, wf_comm_dtype dt, int peer)
{
  wf__op d = mk(WF_OP_SEND, buf, NULL, count, dt, WF_COMM_SUM, peer);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_recv(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int peer)
{
  wf__op d = mk(WF_OP_RECV, NULL, buf, count, dt, WF_COMM_SUM, peer);
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_isend(wf_comm *c, const void *buf, size_t count, wf_comm_dtype dt, int peer,
                        wf_req **req)
{
  wf__op d = mk(WF_OP_SEND, buf, NULL, count, dt, WF_COMM_SUM, peer);
  if (req)
    *req = NULL;
  if (c && c->group_depth > 0) {
    WF_ERROR("comm '%s': isend inside a group; use wf_comm_send there", c->name);
    return WF_EINVAL;
  }
  return req ? wf__coll_run(c, &d, req) : WF_EINVAL;
}

wf_status wf_comm_irecv(wf_comm *c, void *buf, size_t count, wf_comm_dtype dt, int peer,
                        wf_req **req)
{
  wf__op d = mk(WF_OP_RECV, NULL, buf, count, dt, WF_COMM_SUM, peer);
  if (req)
    *req = NULL;
  if (c && c->group_depth > 0) {
    WF_ERROR("comm '%s': irecv inside a group; use wf_comm_recv there", c->name);
    return WF_EINVAL;
  }
  return req ? wf__coll_run(c, &d, req) : WF_EINVAL;
}

wf_status wf_comm_alltoallv(wf_comm *c, const void *send, const size_t *send_counts,
                            const size_t *send_offs, void *recv, const size_t *recv_counts,
                            const size_t *recv_offs, wf_comm_dtype dt)
{
  size_t total = 0;
  for (int p = 0; c && send_counts && p < c->size; p++)
    total += send_counts[p];
  wf__op d = mk(WF_OP_ALLTOALL, send, recv, total, dt, WF_COMM_SUM, -1);
  d.scounts = send_counts, d.soffs = send_offs, d.rcounts = recv_counts, d.roffs = recv_offs;
  return wf__coll_run(c, &d, NULL);
}

wf_status wf_comm_alltoall(wf_comm *c, const void *send, void *recv, size_t count, wf_comm_dtype dt)
{
  wf_status st = WF_OK;
  size_t *a = NULL;
  if (!c)
    return wf_comm_alltoallv(c, send, NULL, NULL, recv, NULL, NULL, dt); /* says why */
  size_t n = (size_t)c->size;
  WF_CHECK_ALLOC(a = malloc(2 * n * sizeof *a));
  for (size_t p = 0; p < n; p++)
    a[p] = count, a[n + p] = p * count;
  st = wf_comm_alltoallv(c, send, a, a + n, recv, a, a + n, dt);
fail:
  free(a);
  return st;
}

size_t wf_comm_dtype_size(wf_comm_dtype dt)
{
  static const size_t size[] = {4, 2, 4, 8, 8, 1, 2};
  return (unsigned)dt < WF_ARRAY_LEN(size) ? size[dt] : 0;
}

const char *wf_comm_dtype_name(wf_comm_dtype dt)
{
  static const char *name[] = {"f32", "bf16", "i32", "i64", "u64", "u8", "f16"};
  return (unsigned)dt < WF_ARRAY_LEN(name) ? name[dt] : "?";
}

/* A failing rank contributes rank * 64 + |status| (statuses are > -64), the others
 * INT64_MAX, so the MIN is the lowest failing rank and its status. */
wf_status wf_comm_agree(wf_comm *c, wf_status mine, int *first_bad)
{
  if (first_bad)
    *first_bad = c || mine == WF_OK ? -1 : 0;
  if (!c)
    return mine;
  int64_t v = mine == WF_OK ? INT64_MAX : (int64_t)c->rank * 64 - (int64_t)mine;
  wf_status st = wf_comm_allreduce(c, &v, &v, 1, WF_COMM_I64, WF_COMM_MIN);
  if (st != WF_OK || v == INT64_MAX)
    return st;
  if (first_bad)
    *first_bad = (int)(v / 64);
  return (wf_status)(-(v % 64));
}
