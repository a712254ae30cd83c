/*
 * staged.c - the staged transport (comm_int.h): device buffers through MPI with host
 * staging, for communicators that cannot use NCCL because their ranks share a GPU (NCCL refuses
 * duplicate GPUs): a workstation with more ranks than GPUs, or the multi-rank GPU tests on one GPU.
 *
 * An operation copies its device input to a host buffer, runs the MPI path on host
 * buffers exactly as for host memory (so averaging, in-place layouts and receive-size
 * checks are the same code), and copies the host result back to the device: at once
 * for a blocking call, at completion (wf_req_wait/test) for a non-blocking one. The
 * copies are synchronous on the legacy default stream, where the model computes, so
 * the device input is complete when it is read and the result is in place before any
 * later kernel runs.
 *
 * In-place layouts survive staging: when one buffer lies inside the other (send ==
 * recv, reduce-scatter into its own block, all-gather from its own block) both are
 * staged in one host buffer at the same offsets.
 *
 * Staging is the one device path that blocks the host, by nature: each copy to the host
 * waits for the compute stream. Each operation counts its copies in the communicator's
 * host_syncs (wf_comm_host_syncs).
 */
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"
#include "wf_check.h"

wf_status wf_comm_enable_staging(wf_comm *c, wf_gpu *gpu)
{
  if (!c || !gpu)
    return WF_EINVAL;
  if (c->nc)
    return WF_OK; /* NCCL carries device buffers already */
  c->gpu = gpu;
  c->dev = &wf__staged_transport;
  WF_DEBUG("comm '%s': device buffers staged through host memory for MPI", c->name);
  return WF_OK;
}

bool wf_comm_is_staged(const wf_comm *c) { return c && c->dev == &wf__staged_transport; }

static void count_sync(wf_comm *c)
{
  atomic_fetch_add_explicit(&c->host_syncs, 1, memory_order_relaxed);
}

/* Bytes of the send and receive buffers of d on this communicator. */
static void extents(const wf_comm *c, const wf__op *d, size_t *send, size_t *recv)
{
  size_t b = d->count * wf_comm_dtype_size(d->dt), n = (size_t)c->size;
  *send = *recv = 0;
  switch (d->op) {
  case WF_OP_ALLREDUCE: *send = *recv = b; break;
  case WF_OP_REDUCE_SCATTER: *send = n * b, *recv = b; break;
  case WF_OP_ALLGATHER: *send = b, *recv = n * b; break;
  case WF_OP_BCAST: *send = *recv = b; break;
  case WF_OP_SEND: *send = b; break;
  case WF_OP_RECV: *recv = b; break;
  case WF_OP_ALLTOALL: /* the ends of the last blocks */
    for (size_t p = 0; p < n; p++) {
      if (d->scounts[p])
        *send = WF_MAX(*send, (d->soffs[p] + d->scounts[p]) * wf_comm_dtype_size(d->dt));
      if (d->rcounts[p])
        *recv = WF_MAX(*recv, (d->roffs[p] + d->rcounts[p]) * wf_comm_dtype_size(d->dt));
    }
    break;
  default: break;
  }
}

/* [p, p + pn) contains [q, q + qn). */
static bool contains(const char *p, size_t pn, const char *q, size_t qn)
{
  return p && q && q >= p && q + qn <= p + pn;
}

/* One host buffer for both sides: the outer one staged whole, the inner one at its
 * offset inside it. *hs, *hr: the host send and receive pointers. */
static wf_status stage(const wf_comm *c, const wf__op *d, void **mem, void **hs, void **hr)
{
  wf_status st = WF_OK;
  size_t ns, nr;
  extents(c, d, &ns, &nr);
  const char *s = d->send, *r = d->recv;
  bool r_in_s = contains(s, ns, r, nr), s_in_r = !r_in_s && contains(r, nr, s, ns);
  size_t total = r_in_s ? ns : s_in_r ? nr : ns + nr;
  WF_CHECK_ALLOC(*mem = malloc(total ? total : 1));
  char *h = *mem;
  *hs = ns ? (s_in_r ? h + (s - r) : h) : NULL;
  *hr = nr ? (r_in_s ? h + (r - s) : s_in_r ? h : h + ns) : NULL;
  if (ns)
    WF_TRY(wf_gpu_memcpy_d2h(c->gpu, *hs, s, ns)); /* waits for the compute stream */
  if (nr && d->op == WF_OP_BCAST && *hr != *hs)
    WF_TRY(wf_gpu_memcpy_d2h(c->gpu, *hr, r, nr));
  if (ns || nr)
    count_sync((wf_comm *)c);
fail:
  if (st != WF_OK) {
    free(*mem);
    *mem = NULL;
  }
  return st;
}

static wf_status staged_post(wf_comm *c, const wf__op *d, uint64_t seq, wf_req **req)
{
  wf_status st = WF_OK;
  void *mem = NULL, *hs = NULL, *hr = NULL;
  size_t ns, nr;
  extents(c, d, &ns, &nr);
  WF_TRY(stage(c, d, &mem, &hs, &hr));
  wf__op h = *d;
  h.send = hs, h.recv = hr;
  if (d->op == WF_OP_BCAST) /* one buffer: send == recv */
    h.send = h.recv = hr ? hr : hs;
  WF_TRY(wf__coll_mpi_post(c, &h, seq, req));
  if (req) { /* the request finishes the copy back at completion */
    (*req)->tp = &wf__staged_transport;
    (*req)->unstage_dst = d->recv;
    (*req)->unstage_src = h.recv;
    (*req)->unstage_bytes = nr;
    (*req)->stage_mem = mem;
    return WF_OK;
  }
  if (nr)
    st = wf_gpu_memcpy_h2d(c->gpu, d->recv, h.recv, nr);
  if (nr)
    count_sync(c);
fail:
  free(mem);
  return st;
}

/* The request's host result back to the device, and its staging freed. */
static wf_status staged_finish(wf_req *r)
{
  wf_status st = WF_OK;
  if (r->unstage_bytes) {
    st = wf_gpu_memcpy_h2d(r->c->gpu, r->unstage_dst, r->unstage_src, r->unstage_bytes);
    count_sync(r->c);
  }
  free(r->stage_mem);
  r->stage_mem = NULL;
  r->unstage_bytes = 0;
  return st;
}

static wf_status staged_group_post(wf_comm *c, wf_req *r)
{
  (void)r;
  WF_ERROR("comm '%s': staged buffers cannot be grouped", c->name); /* coll.c refuses first */
  return WF_EUNSUPPORTED;
}

static wf_status staged_inherit(const wf_comm *parent, wf_comm *child)
{
  return wf_comm_enable_staging(child, parent->gpu);
}

static void staged_fini(wf_comm *c) { (void)c; }

const wf__transport wf__staged_transport = {
    .version = WF__TRANSPORT_VERSION,
    .name = "staged",
    .on_device = false,
    .half_reduce = false,
    .groupable = false,
    .post = staged_post,
    .group_post = staged_group_post,
    .test = wf__coll_test_done,
    .finish = staged_finish,
    .abort = wf__coll_no_abort, /* MPI's: a call in progress cannot be interrupted */
    .inherit = staged_inherit,
    .fini = staged_fini,
};
