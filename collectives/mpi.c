/*
 * mpi.c - the MPI transport (host buffers; comm_int.h) and request completion, which
 * every transport shares: a request's MPI part completes here, then its transport
 * finishes what it owes (finish).
 *
 * The caller's buffers go to MPI untouched: no staging copies. Two operations need
 * work after the transfer, done in finish() after the blocking call or at wait/test:
 *  - WF_COMM_AVG: MPI has no average, so the sum is scaled by 1/size in place;
 *  - in-place reduce-scatter on rank r > 0: MPI_IN_PLACE leaves the result at the
 *    start of the buffer, and weft's layout wants it at block r (one block copied).
 * A receive checks the size of the message it got, so a count mismatch between
 * sender and receiver is an error and not silent garbage.
 */
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"
#include "wf_check.h"

#define TAG 0x77ef

MPI_Datatype wf__coll_mpi_type(wf_comm_dtype dt)
{
  switch (dt) {
  case WF_COMM_I32: return MPI_INT32_T;
  case WF_COMM_I64: return MPI_INT64_T;
  case WF_COMM_U64: return MPI_UINT64_T;
  case WF_COMM_U8: return MPI_UINT8_T;
  /* 16-bit floats are only moved here (coll.c refuses their reductions): as 2-byte words */
  case WF_COMM_BF16: return MPI_UINT16_T;
  case WF_COMM_F16: return MPI_UINT16_T;
  default: return MPI_FLOAT; /* F32 */
  }
}

/* MPI has no average: AVG sums, and finish() scales. */
static MPI_Op mpi_op(wf_comm_redop op)
{
  return op == WF_COMM_MIN ? MPI_MIN : op == WF_COMM_MAX ? MPI_MAX : MPI_SUM;
}

wf_status wf__coll_finish_post(wf_req *r)
{
  if (r->move_bytes)
    memcpy(r->move_dst, r->move_src, r->move_bytes);
  for (size_t i = 0; i < r->scale_count; i++)
    r->scale_buf[i] *= r->scale;
  return WF_OK;
}

wf_status wf__coll_req_new(wf_comm *c, int n, wf_req **out)
{
  wf_req *r = c->spare;
  if (r && n <= 2)
    c->spare = NULL;
  else
    r = malloc(sizeof *r);
  if (!r)
    return WF_ENOMEM;
  memset(r, 0, sizeof *r);
  r->c = c;
  r->tp = &wf__mpi_transport;
  r->n = n;
  r->mreq = r->inline_req;
  r->expect = r->inline_expect;
  if (n > 2) {
    r->mreq = malloc((size_t)n * sizeof *r->mreq);
    r->expect = malloc((size_t)n * sizeof *r->expect);
    if (!r->mreq || !r->expect) {
      free(r->mreq);
      free(r->expect);
      free(r);
      return WF_ENOMEM;
    }
  }
  for (int i = 0; i < n; i++) {
    r->mreq[i] = MPI_REQUEST_NULL;
    r->expect[i] = -1;
  }
  *out = r;
  return WF_OK;
}

void wf__coll_req_free(wf_req *r)
{
  free(r->stage_mem); /* a request that ended without completing */
  r->stage_mem = NULL;
  if (r->mreq != r->inline_req)
    free(r->mreq);
  if (r->expect != r->inline_expect)
    free(r->expect);
  if (!r->c->spare)
    r->c->spare = r;
  else
    free(r);
}

/* Fill in the post-processing of `d` (average, in-place move) into `r`. */
static void plan_finish(wf_comm *c, const wf__op *d, wf_req *r)
{
  size_t blk = d->count * wf_comm_dtype_size(d->dt);
  bool rs_in_place = d->op == WF_OP_REDUCE_SCATTER && c->rank > 0 &&
                     (const char *)d->send + blk * (size_t)c->rank == (const char *)d->recv;
  if (rs_in_place) {
    r->move_dst = d->recv;
    r->move_src = d->send;
    r->move_bytes = blk;
  }
  if (d->redop == WF_COMM_AVG && c->size > 1 &&
      (d->op == WF_OP_ALLREDUCE || d->op == WF_OP_REDUCE_SCATTER)) {
    r->scale_buf = d->recv;
    r->scale_count = d->count;
    r->scale = 1.0f / (float)c->size;
  }
}

static wf_status check_recv(wf_comm *c, const MPI_Status *s, int expect, int peer)
{
  int got = 0;
  if (MPI_Get_count(s, MPI_BYTE, &got) != MPI_SUCCESS || got == expect)
    return WF_OK;
  WF_ERROR("comm '%s': recv from rank %d expected %d bytes but the message has %d; sender and "
           "receiver must pass the same count",
           c->name, peer, expect, got);
  return WF_EINVAL;
}

/* MPI_Alltoallv of d: its size_t counts and offsets as MPI's ints (coll.c checked that
 * they fit). Blocking only. */
static wf_status alltoallv(wf_comm *c, const wf__op *d)
{
  wf_status st = WF_OK;
  size_t n = (size_t)c->size;
  int *a = malloc(4 * n * sizeof *a);
  MPI_Datatype t = wf__coll_mpi_type(d->dt);
  WF_CHECK_ALLOC(a);
  for (size_t p = 0; p < n; p++) {
    a[p] = (int)d->scounts[p], a[n + p] = d->scounts[p] ? (int)d->soffs[p] : 0;
    a[2 * n + p] = (int)d->rcounts[p], a[3 * n + p] = d->rcounts[p] ? (int)d->roffs[p] : 0;
  }
  WF_CHECK_MPI(MPI_Alltoallv(d->send, a, a + n, t, d->recv, a + 2 * n, a + 3 * n, t, c->mpi));
fail:
  free(a);
  return st;
}

/* Start the MPI operation; `r` receives the request (non-blocking) or is NULL. */
static wf_status post(wf_comm *c, const wf__op *d, wf_req *r)
{
  wf_status st = WF_OK;
  MPI_Request *q = r ? &r->mreq[0] : NULL;
  int n = (int)d->count, p = d->peer, es = (int)wf_comm_dtype_size(d->dt);
  MPI_Datatype t = wf__coll_mpi_type(d->dt);
  MPI_Op op = mpi_op(d->redop);
  const void *s = d->send == d->recv ? MPI_IN_PLACE : d->send;
  size_t blk = (size_t)n * (size_t)es * (size_t)c->rank; /* this rank's block, in bytes */
  MPI_Status status;
  switch (d->op) {
  case WF_OP_ALLREDUCE:
    WF_CHECK_MPI(q ? MPI_Iallreduce(s, d->recv, n, t, op, c->mpi, q)
                   : MPI_Allreduce(s, d->recv, n, t, op, c->mpi));
    break;
  case WF_OP_REDUCE_SCATTER: {
    bool inplace = (const char *)d->send + blk == (const char *)d->recv;
    const void *sb = inplace ? MPI_IN_PLACE : d->send;
    void *rb = inplace ? (void *)d->send : d->recv;
    WF_CHECK_MPI(q ? MPI_Ireduce_scatter_block(sb, rb, n, t, op, c->mpi, q)
                   : MPI_Reduce_scatter_block(sb, rb, n, t, op, c->mpi));
    break;
  }
  case WF_OP_ALLGATHER: {
    bool inplace = (const char *)d->recv + blk == (const char *)d->send;
    const void *sb = inplace ? MPI_IN_PLACE : d->send;
    WF_CHECK_MPI(q ? MPI_Iallgather(sb, n, t, d->recv, n, t, c->mpi, q)
                   : MPI_Allgather(sb, n, t, d->recv, n, t, c->mpi));
    break;
  }
  case WF_OP_BCAST:
    WF_CHECK_MPI(q ? MPI_Ibcast(d->recv, n, t, p, c->mpi, q) : MPI_Bcast(d->recv, n, t, p, c->mpi));
    break;
  case WF_OP_SEND:
    WF_CHECK_MPI(q ? MPI_Isend(d->send, n, t, p, TAG, c->mpi, q)
                   : MPI_Send(d->send, n, t, p, TAG, c->mpi));
    break;
  case WF_OP_RECV:
    if (q)
      r->expect[0] = n * es;
    WF_CHECK_MPI(q ? MPI_Irecv(d->recv, n, t, p, TAG, c->mpi, q)
                   : MPI_Recv(d->recv, n, t, p, TAG, c->mpi, &status));
    if (!q)
      WF_TRY(check_recv(c, &status, n * es, p));
    break;
  case WF_OP_BARRIER: WF_CHECK_MPI(q ? MPI_Ibarrier(c->mpi, q) : MPI_Barrier(c->mpi)); break;
  case WF_OP_ALLTOALL:
    WF_CHECK(!q, WF_EUNSUPPORTED, "comm '%s': alltoall is blocking only", c->name);
    WF_TRY(alltoallv(c, d));
    break;
  default: return WF_EINVAL;
  }
fail:
  return st;
}

wf_status wf__coll_mpi_post(wf_comm *c, const wf__op *d, uint64_t seq, wf_req **req)
{
  wf_status st = WF_OK;
  wf_req *r = NULL;
  if (!req) {
    WF_TRY(post(c, d, NULL));
    if (d->redop != WF_COMM_AVG && d->op != WF_OP_REDUCE_SCATTER)
      return WF_OK; /* the common case: nothing to finish */
    wf_req plan;
    plan.move_bytes = plan.scale_count = 0;
    plan_finish(c, d, &plan);
    return wf__coll_finish_post(&plan);
  }
  WF_TRY(wf__coll_req_new(c, 1, &r));
  r->seq_first = seq;
  r->nseq = 1;
  plan_finish(c, d, r);
  WF_TRY(post(c, d, r));
  *req = r;
  return WF_OK;
fail:
  if (r)
    wf__coll_req_free(r);
  return st;
}

/* ---- completion ---------------------------------------------------------------- */

/* After the MPI requests completed: check receive sizes, post-process, record. */
static wf_status complete(wf_req *r, MPI_Status *statuses, wf_status st)
{
  for (int i = 0; st == WF_OK && i < r->n; i++)
    if (r->expect[i] >= 0)
      st = check_recv(r->c, &statuses[i], r->expect[i], statuses[i].MPI_SOURCE);
  if (st == WF_OK)
    st = wf__coll_finish_post(r);
  wf_status f = r->tp->finish(r); /* releases the transport's part whatever the outcome */
  st = st == WF_OK ? f : st;
  uint64_t now = wf__coll_rec_now(r->c);
  wf_comm_state state = st == WF_OK ? WF_STATE_DONE : WF_STATE_FAILED;
  for (int i = 0; i < r->nseq; i++)
    wf__coll_rec_set_state(r->c, r->seq_first + (uint64_t)i, state, now);
  wf__coll_req_free(r);
  return st;
}

static MPI_Status *statuses_for(wf_req *r, MPI_Status *small, int small_len)
{
  return r->n <= small_len ? small : malloc((size_t)r->n * sizeof(MPI_Status));
}

wf_status wf_req_wait(wf_req **req)
{
  wf_status st = WF_OK;
  MPI_Status small[4], *stat = NULL;
  if (!req || !*req)
    return WF_OK;
  wf_req *r = *req;
  *req = NULL;
  stat = statuses_for(r, small, 4);
  WF_CHECK_ALLOC(stat);
  if (r->n)
    WF_CHECK_MPI(MPI_Waitall(r->n, r->mreq, stat));
exit:
  st = complete(r, stat, st);
  if (stat != small)
    free(stat);
  return st;
fail:
  goto exit;
}

wf_status wf_req_test(wf_req **req, bool *done)
{
  wf_status st = WF_OK;
  MPI_Status small[4], *stat = NULL;
  int flag = 1;
  bool ev_done = true;
  if (!done)
    return WF_EINVAL;
  *done = true;
  if (!req || !*req)
    return WF_OK;
  wf_req *r = *req;
  *done = false;
  stat = statuses_for(r, small, 4);
  WF_CHECK_ALLOC(stat);
  if (r->n)
    WF_CHECK_MPI(MPI_Testall(r->n, r->mreq, &flag, stat));
  if (flag)
    WF_TRY(r->tp->test(r, &ev_done));
  if (flag && ev_done) {
    *done = true;
    *req = NULL;
    st = complete(r, stat, WF_OK);
  }
exit:
  if (stat != small)
    free(stat);
  return st;
fail: /* the request ends here, failed, so that nobody waits on it forever */
  *done = true;
  *req = NULL;
  st = complete(r, stat, st);
  goto exit;
}

wf_status wf_req_waitall(wf_req **reqs, int n)
{
  wf_status first = WF_OK;
  for (int i = 0; reqs && i < n; i++) {
    wf_status st = wf_req_wait(&reqs[i]);
    if (first == WF_OK)
      first = st;
  }
  return first;
}

/* ---- the transport --------------------------------------------------------------- */

/* The open group's host entries as MPI_Isend/MPI_Irecv, in r's MPI requests. */
static wf_status mpi_group_post(wf_comm *c, wf_req *r)
{
  wf_status st = WF_OK;
  int k = 0;
  for (int i = 0; i < c->group_len; i++) {
    wf__p2p *e = &c->group[i];
    if (e->tp != &wf__mpi_transport)
      continue;
    MPI_Datatype t = wf__coll_mpi_type(e->dt);
    if (e->is_send) {
      WF_CHECK_MPI(MPI_Isend(e->buf, e->count, t, e->peer, TAG, c->mpi, &r->mreq[k]));
    } else {
      r->expect[k] = e->count * (int)wf_comm_dtype_size(e->dt);
      WF_CHECK_MPI(MPI_Irecv(e->buf, e->count, t, e->peer, TAG, c->mpi, &r->mreq[k]));
    }
    k++;
  }
fail:
  return st;
}

wf_status wf__coll_test_done(wf_req *r, bool *done)
{
  (void)r;
  *done = true;
  return WF_OK;
}

static wf_status mpi_finish(wf_req *r)
{
  (void)r;
  return WF_OK;
}

/* An MPI call in progress cannot be interrupted (MPI_Abort from main ends it);
 * wf_comm_abort marks the communicator so no later operation starts. */
wf_status wf__coll_no_abort(wf_comm *c)
{
  (void)c;
  return WF_EUNSUPPORTED;
}

static wf_status mpi_inherit(const wf_comm *parent, wf_comm *child)
{
  (void)parent, (void)child;
  return WF_OK; /* host buffers: nothing to carry over */
}

static void mpi_fini(wf_comm *c) { (void)c; }

const wf__transport wf__mpi_transport = {
    .version = WF__TRANSPORT_VERSION,
    .name = "mpi",
    .on_device = false,
    .half_reduce = false,
    .groupable = true,
    .post = wf__coll_mpi_post,
    .group_post = mpi_group_post,
    .test = wf__coll_test_done,
    .finish = mpi_finish,
    .abort = wf__coll_no_abort,
    .inherit = mpi_inherit,
    .fini = mpi_fini,
};
