/*
 * nccl.c - the NCCL transport (comm_int.h): device buffers through NCCL, as seen from
 * the static library.
 *
 * NCCL and the CUDA runtime live in the weft_nccl module (collectives/nccl/), loaded
 * with dlopen so that this library, and the worker, start on machines without CUDA.
 * Bootstrap is the usual one over MPI: rank 0 of the communicator calls
 * ncclGetUniqueId, MPI_Bcast carries the id, every rank calls ncclCommInitRank.
 * Before that, all ranks agree (one MPI_Allreduce) that each of them can go on, so a
 * rank without a GPU makes every rank return WF_ENODEV instead of leaving the others
 * blocked in NCCL's bootstrap.
 *
 * Nothing here blocks the host: a blocking operation, and the wait of a non-blocking
 * one, only make the compute stream wait for the communication stream (an event and
 * cudaStreamWaitEvent), so the kernels after it see its result. The host learns a
 * device value by copying it, which waits for the compute stream anyway.
 */
#include <stdio.h>
#include <string.h>

#include "comm_int.h"
#include "wf_check.h"

/* dlopen the module, check its ABI, count devices. On failure `why` says which step. */
static wf_status load_module(void **mod, const wf__nccl_ops **ops, int *version, char *why,
                             size_t len)
{
  int devices = 0;
  char reason[512] = "";
  *ops = NULL;
  *mod = wf_module_open("weft_nccl", reason, sizeof reason);
  if (!*mod) {
    snprintf(why, len, "cannot load the NCCL module libweft_nccl.so: %s", reason);
    return WF_ENODEV;
  }
  wf__nccl_entry_fn entry;
  void *sym = wf_module_sym(*mod, WF__NCCL_ENTRY);
  memcpy(&entry, &sym, sizeof entry); /* object to function pointer, as dlsym intends */
  *ops = entry ? entry() : NULL;
  if (!*ops || (*ops)->abi != WF__NCCL_ABI) {
    snprintf(why, len, "libweft_nccl.so is from another build (ABI %d, want %d); rebuild",
             *ops ? (*ops)->abi : -1, WF__NCCL_ABI);
    return WF_ENODEV;
  }
  wf_status st = (*ops)->init(wf_vlog, version, &devices, reason, sizeof reason);
  if (st != WF_OK || devices <= 0) {
    snprintf(why, len, "NCCL %d loaded, but no CUDA device: %s", *version,
             reason[0] ? reason : "device count is 0");
    return WF_ENODEV;
  }
  return WF_OK;
}

wf_status wf_comm_nccl_probe(int *nccl_version, char *why, size_t why_len)
{
  void *mod = NULL;
  const wf__nccl_ops *o = NULL;
  int version = 0;
  char local[512] = "";
  wf_status st = load_module(&mod, &o, &version, local, sizeof local);
  wf_module_close(mod);
  if (nccl_version)
    *nccl_version = version;
  if (why && why_len)
    snprintf(why, why_len, "%s",
             st == WF_OK ? "NCCL module loaded and a CUDA device is visible" : local);
  return st;
}

static wf_status load_usable(wf_gpu *gpu, void **mod, const wf__nccl_ops **ops, char *why,
                             size_t len)
{
  int version = 0;
  if (!gpu) {
    snprintf(why, len, "no GPU backend is loaded (CPU run); collectives use MPI");
    return WF_ENODEV;
  }
  return load_module(mod, ops, &version, why, len);
}

/* Rank 0's unique id, with its status, so a failure there does not hang the others. */
static wf_status bcast_id(wf_comm *c, const wf__nccl_ops *o, unsigned char *id)
{
  wf_status st = WF_OK;
  struct {
    int st;
    unsigned char id[WF__NCCL_ID_BYTES];
  } msg = {0};
  if (c->rank == 0)
    msg.st = o->get_unique_id(msg.id);
  WF_CHECK_MPI(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, c->mpi));
  WF_CHECK(msg.st == WF_OK, WF_ENCCL, "comm '%s': ncclGetUniqueId failed on rank 0", c->name);
  memcpy(id, msg.id, sizeof msg.id);
fail:
  return st;
}

wf_status wf__coll_nccl_start(wf_comm *c, wf_gpu *gpu, char *why, size_t why_len)
{
  wf_status st = WF_OK;
  char local[512] = "";
  void *mod = NULL, *nc = NULL;
  const wf__nccl_ops *o = NULL;
  unsigned char id[WF__NCCL_ID_BYTES];
  int bad = -1;
  wf_status local_st = load_usable(gpu, &mod, &o, local, sizeof local);
  st = wf_comm_agree(c, local_st, &bad);
  if (st != WF_OK) {
    if (local_st == WF_OK && bad >= 0)
      snprintf(local, sizeof local, "rank %d of comm '%s' has no usable GPU", bad, c->name);
    goto fail;
  }
  WF_TRY(bcast_id(c, o, id));
  local_st = o->comm_create(&nc, id, c->size, c->rank);
  st = wf_comm_agree(c, local_st, &bad);
  WF_CHECK(st == WF_OK, WF_ENCCL, "comm '%s': ncclCommInitRank failed on rank %d%s", c->name, bad,
           local_st == WF_OK ? "" : " (this rank)");
  c->nccl_module = mod;
  c->nccl = o;
  c->nc = nc;
  c->gpu = gpu;
  c->dev = &wf__nccl_transport;
  WF_DEBUG("comm '%s': NCCL enabled (%d ranks)", c->name, c->size);
  return WF_OK;
fail:
  if (nc)
    o->comm_destroy(nc);
  wf_module_close(mod);
  if (why && why_len)
    snprintf(why, why_len, "%s", local[0] ? local : wf_status_str(st));
  return st;
}

wf_status wf_comm_enable_nccl(wf_comm *c, wf_gpu *gpu, char *why, size_t why_len)
{
  if (!c)
    return WF_EINVAL;
  if (c->nc)
    return WF_OK;
  return wf__coll_nccl_start(c, gpu, why, why_len);
}

bool wf_comm_has_nccl(const wf_comm *c) { return c && c->nc; }

void wf_comm_set_compute_stream(wf_comm *c, void *stream)
{
  if (c && c->nc)
    c->nccl->set_dep_stream(c->nc, stream);
}

/* ---- the transport ---------------------------------------------------------------- */

static wf_status nccl_abort(wf_comm *c) { return c->nccl->comm_abort(c->nc); }

/* NCCL on the child too (collective over it), or staging where it cannot start. */
static wf_status nccl_inherit(const wf_comm *parent, wf_comm *child)
{
  return wf_comm_set_device_path(child, parent->gpu, true, NULL, 0);
}

static void nccl_fini(wf_comm *c)
{
  if (c->nc)
    c->nccl->comm_destroy(c->nc);
  wf_module_close(c->nccl_module);
  c->nc = NULL;
  c->nccl = NULL;
  c->nccl_module = NULL;
}

static wf_status enqueue(wf_comm *c, const wf__op *d)
{
  const wf__nccl_ops *o = c->nccl;
  switch (d->op) {
  case WF_OP_ALLREDUCE: return o->allreduce(c->nc, d->send, d->recv, d->count, d->dt, d->redop);
  case WF_OP_REDUCE_SCATTER:
    return o->reduce_scatter(c->nc, d->send, d->recv, d->count, d->dt, d->redop);
  case WF_OP_ALLGATHER: return o->allgather(c->nc, d->send, d->recv, d->count, d->dt);
  case WF_OP_BCAST: return o->bcast(c->nc, d->recv, d->count, d->dt, d->peer);
  case WF_OP_SEND: return o->send(c->nc, d->send, d->count, d->dt, d->peer);
  case WF_OP_RECV: return o->recv(c->nc, d->recv, d->count, d->dt, d->peer);
  case WF_OP_ALLTOALL:
    return o->alltoallv(c->nc, d->send, d->scounts, d->soffs, d->recv, d->rcounts, d->roffs, d->dt,
                        c->size);
  default: return WF_EINVAL;
  }
}

/* Blocking: enqueue, then make the compute stream wait for the communication stream,
 * so the kernels after it see the result and the host is not held up (it reads a
 * device result through a copy, which waits for the compute stream anyway).
 * Non-blocking: an event after the operation, which wf_req_wait has the compute stream
 * wait for in the same way. */
static wf_status nccl_post(wf_comm *c, const wf__op *d, uint64_t seq, wf_req **req)
{
  wf_status st = WF_OK;
  wf_req *r = NULL;
  WF_TRY(enqueue(c, d));
  if (!req)
    return c->nccl->order_dep(c->nc);
  WF_TRY(wf__coll_req_new(c, 0, &r));
  r->seq_first = seq;
  r->nseq = 1;
  r->tp = &wf__nccl_transport;
  st = c->nccl->event_record(c->nc, &r->event);
  if (st != WF_OK) {
    r->nseq = 0;
    wf_req_wait(&r);
    return st;
  }
  *req = r;
fail:
  return st;
}

/* One NCCL group for the open group's device entries; an event on the stream marks its
 * end. */
static wf_status nccl_group_post(wf_comm *c, wf_req *r)
{
  wf_status st = WF_OK;
  const wf__nccl_ops *o = c->nccl;
  WF_TRY(o->group_start());
  for (int i = 0; i < c->group_len; i++) {
    wf__p2p *e = &c->group[i];
    if (e->tp != &wf__nccl_transport)
      continue;
    st = e->is_send ? o->send(c->nc, e->buf, (size_t)e->count, e->dt, e->peer)
                    : o->recv(c->nc, e->buf, (size_t)e->count, e->dt, e->peer);
    if (st != WF_OK)
      break;
  }
  wf_status st_end = o->group_end();
  WF_TRY(st != WF_OK ? st : st_end);
  WF_TRY(o->event_record(c->nc, &r->event));
  r->tp = &wf__nccl_transport;
fail:
  return st;
}

static wf_status nccl_test(wf_req *r, bool *done)
{
  *done = true;
  return r->event ? r->c->nccl->event_query(r->event, done) : WF_OK;
}

/* The compute stream waits for the operation's event; the host does not. */
static wf_status nccl_finish(wf_req *r)
{
  wf_status st = WF_OK;
  if (!r->event)
    return WF_OK;
  st = r->c->nccl->event_order(r->c->nc, r->event);
  r->c->nccl->event_destroy(r->event); /* released by CUDA once it has completed */
  r->event = NULL;
  return st;
}

const wf__transport wf__nccl_transport = {
    .version = WF__TRANSPORT_VERSION,
    .name = "nccl",
    .on_device = true,
    .half_reduce = true,
    .groupable = true,
    .post = nccl_post,
    .group_post = nccl_group_post,
    .test = nccl_test,
    .finish = nccl_finish,
    .abort = nccl_abort,
    .inherit = nccl_inherit,
    .fini = nccl_fini,
};
