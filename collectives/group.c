/*
 * group.c - grouped point-to-point operations.
 *
 * Between group_start and group_end, send and recv only queue (state "queued" in
 * the flight recorder). group_end posts every queued operation before waiting for
 * any, so a ring exchange (everyone sends right and receives left) cannot deadlock
 * whatever the order of the calls. Host buffers become MPI_Isend/MPI_Irecv completed
 * by one MPI_Waitall; device buffers go to their transport's group_post (NCCL: one
 * ncclGroupStart/End block). Groups
 * nest; only the outermost end posts. Queued operations have contiguous sequence
 * numbers because nothing else may be called on the communicator inside a group.
 */
#include <stdlib.h>

#include "comm_int.h"
#include "wf_check.h"

wf_status wf_comm_group_start(wf_comm *c)
{
  if (!c)
    return WF_EINVAL;
  c->group_depth++;
  return WF_OK;
}

wf_status wf__coll_group_add(wf_comm *c, const wf__op *d, const wf__transport *tp)
{
  if (c->group_len == c->group_cap) {
    int cap = c->group_cap ? 2 * c->group_cap : 16;
    wf__p2p *g = realloc(c->group, (size_t)cap * sizeof *g);
    if (!g)
      return WF_ENOMEM;
    c->group = g;
    c->group_cap = cap;
  }
  wf__p2p *e = &c->group[c->group_len++];
  e->is_send = d->op == WF_OP_SEND;
  e->buf = e->is_send ? (void *)d->send : d->recv;
  e->count = (int)d->count;
  e->peer = d->peer;
  e->tp = tp;
  e->dt = d->dt;
  e->seq = wf__coll_rec_begin(c, d->op, d->count, d->dt, d->count * wf_comm_dtype_size(d->dt),
                              d->peer, tp->on_device, WF_STATE_QUEUED);
  return WF_OK;
}

static wf_status group_post(wf_comm *c, wf_req **out)
{
  wf_status st = WF_OK;
  wf_req *r = NULL;
  int n_host = 0, n_dev = 0;
  for (int i = 0; i < c->group_len; i++)
    c->group[i].tp == &wf__mpi_transport ? n_host++ : n_dev++;
  WF_TRY(wf__coll_req_new(c, n_host, &r));
  r->seq_first = c->group[0].seq;
  r->nseq = c->group_len;
  uint64_t now = wf__coll_rec_now(c);
  for (int i = 0; i < c->group_len; i++)
    wf__coll_rec_set_state(c, c->group[i].seq, WF_STATE_RUNNING, now);
  if (n_dev) /* the device entries are all of the device path's transport */
    WF_TRY(c->dev->group_post(c, r));
  WF_TRY(wf__mpi_transport.group_post(c, r));
  c->group_len = 0;
  *out = r;
  return WF_OK;
fail:
  WF_ERROR("comm '%s': posting a group of %d point-to-point operations failed", c->name,
           c->group_len);
  if (r) { /* complete what was posted, so nothing is left writing into the buffers */
    r->nseq = 0;
    wf_req_wait(&r);
  }
  uint64_t end = wf__coll_rec_now(c);
  for (int i = 0; i < c->group_len; i++)
    wf__coll_rec_set_state(c, c->group[i].seq, WF_STATE_FAILED, end);
  c->group_len = 0;
  return st;
}

wf_status wf_comm_group_end_async(wf_comm *c, wf_req **req)
{
  if (req)
    *req = NULL;
  if (!c || !req)
    return WF_EINVAL;
  if (c->group_depth == 0) {
    WF_ERROR("comm '%s': group_end without group_start", c->name);
    return WF_EINVAL;
  }
  if (--c->group_depth > 0 || c->group_len == 0)
    return WF_OK;
  return group_post(c, req);
}

wf_status wf_comm_group_end(wf_comm *c)
{
  wf_req *r = NULL;
  wf_status st = wf_comm_group_end_async(c, &r);
  if (st != WF_OK)
    return st;
  return wf_req_wait(&r);
}
