/*
 * ep.c - expert parallelism's exchange over the ep group (wf_model.h's wf_ep_ops): the
 * counts that size an all-to-all of tokens and the all-to-all of their rows, which the
 * model calls where its experts' forward and backward cross ranks; the time and bytes they
 * spend (the step log's ep figures) and a trace span per exchange.
 *
 * Each exchange is one blocking all-to-all(v) on the ep group (collectives/: MPI for host
 * buffers, NCCL's grouped sends and receives or host staging for device ones). Every rank
 * calls every exchange, so a rank whose experts drew no tokens still takes part with
 * zero counts: nobody waits for a rank that skipped one.
 */
#include <stdlib.h>

#include "parallel_int.h"

struct wf_ep {
  wf_comm *comm;
  int size;
  size_t *a;         /* (4 size) counts and offsets of the rows exchange, in elements */
  double comm_s;     /* seconds in ep exchanges (for the step log) */
  double comm_bytes; /* bytes this rank sent */
  wf_trace *trace;
};

static wf_status note(wf_ep *ep, const char *what, wf_status st, double t0, size_t bytes)
{
  double t1 = wf_now();
  ep->comm_s += t1 - t0;
  ep->comm_bytes += (double)bytes;
  if (wf_trace_on(ep->trace))
    wf_trace_span(ep->trace, what, "comm", t0, t1, -1, -1);
  return st;
}

static wf_status counts(void *ctx, const int *send, int *recv, size_t n)
{
  wf_ep *ep = ctx;
  double t0 = wf_now();
  wf_status st = wf_comm_alltoall(ep->comm, send, recv, n, WF_COMM_I32);
  return note(ep, "ep counts all-to-all", st, t0, n * (size_t)ep->size * sizeof(int));
}

/* Row counts as element counts and offsets (rows laid out peer after peer). */
static size_t layout(size_t *count, size_t *off, const size_t *rows, int n, size_t width)
{
  size_t at = 0;
  for (int p = 0; p < n; p++)
    count[p] = rows[p] * width, off[p] = at, at += count[p];
  return at;
}

static wf_status rows(void *ctx, const void *send, const size_t *send_rows, void *recv,
                      const size_t *recv_rows, size_t width, int fmt)
{
  wf_ep *ep = ctx;
  size_t n = (size_t)ep->size, *sc = ep->a, *so = sc + n, *rc = so + n, *ro = rc + n;
  wf_comm_dtype dt = wf__comm_dtype_of((wf_precision)fmt);
  size_t sent = layout(sc, so, send_rows, ep->size, width);
  layout(rc, ro, recv_rows, ep->size, width);
  double t0 = wf_now();
  wf_status st = wf_comm_alltoallv(ep->comm, send, sc, so, recv, rc, ro, dt);
  return note(ep, "ep all-to-all", st, t0, sent * wf_comm_dtype_size(dt));
}

static const wf_ep_ops ops = {.version = WF_EP_OPS_VERSION, .counts = counts, .rows = rows};

wf_status wf_ep_create(wf_ep **out, wf_comm *comm)
{
  wf_status st = WF_OK;
  wf_ep *ep = NULL;
  *out = NULL;
  WF_CHECK(comm, WF_EINVAL, "expert parallelism needs its ep communicator");
  WF_CHECK_ALLOC(ep = calloc(1, sizeof *ep));
  ep->comm = comm;
  ep->size = wf_comm_size(comm);
  WF_CHECK_ALLOC(ep->a = calloc(4 * (size_t)ep->size, sizeof *ep->a));
  *out = ep;
  return WF_OK;
fail:
  wf_ep_destroy(ep);
  return st;
}

void wf_ep_destroy(wf_ep *ep)
{
  if (!ep)
    return;
  free(ep->a);
  free(ep);
}

wf_ep_regions wf_ep_regions_of(wf_ep *ep)
{
  return ep && ep->size > 1 ? (wf_ep_regions){&ops, ep} : (wf_ep_regions){NULL, NULL};
}

void wf_ep_set_trace(wf_ep *ep, wf_trace *trace)
{
  if (ep)
    ep->trace = trace;
}

void wf_ep_stats(wf_ep *ep, double *seconds, double *bytes)
{
  *seconds = ep ? ep->comm_s : 0;
  *bytes = ep ? ep->comm_bytes : 0;
  if (ep)
    ep->comm_s = ep->comm_bytes = 0;
}
