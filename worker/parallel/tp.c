/*
 * tp.c - tensor parallelism's region operators over the tp group (wf_model.h's
 * wf_tp_ops: enter / leave and their sequence-parallel forms, and the plain all-gather
 * of the vocabulary-parallel loss), which the model calls where its forward and
 * backward cross a region, and the sum of tp-partial gradients the gradient path asks.
 *
 * Each operator is one blocking collective on the tp group. They sit between GEMMs that
 * need their result, so there is nothing to overlap them with; the time spent is
 * accumulated for the step log, and each call is a span of the trace while it records.
 * A failed collective is logged by the collectives layer and returned.
 */
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

struct wf_tp {
  wf_comm *comm;
  wf_dev *dev; /* where the activations live (the copies of the identity cases) */
  int size;
  bool sequence;     /* sequence parallelism */
  double comm_s;     /* seconds spent in tp collectives (for the step log) */
  double comm_bytes; /* bytes this rank sent into tp collectives */
  wf_trace *trace;   /* spans of each collective while it records; NULL = none */
};

static size_t rows(const wf_tp *tp, size_t N) { return tp->sequence ? N / (size_t)tp->size : N; }

static wf_status note(wf_tp *tp, const char *what, wf_status st, double t0, size_t bytes)
{
  double t1 = wf_now();
  tp->comm_s += t1 - t0;
  if (wf_trace_on(tp->trace))
    wf_trace_span(tp->trace, what, "comm", t0, t1, -1, -1);
  tp->comm_bytes += (double)bytes;
  return st;
}

static wf_status allgather(void *ctx, const float *x, float *all, size_t n)
{
  wf_tp *tp = ctx;
  double t0 = wf_now();
  wf_status st = wf_comm_allgather(tp->comm, x, all, n, WF_COMM_F32);
  return note(tp, "tp all-gather", st, t0, n * sizeof(float));
}

static wf_status reduce_scatter(wf_tp *tp, float *y, const float *full, size_t r, size_t C)
{
  double t0 = wf_now();
  wf_status st = wf_comm_reduce_scatter(tp->comm, full, y, r * C, WF_COMM_F32, WF_COMM_SUM);
  return note(tp, "tp reduce-scatter", st, t0, r * C * (size_t)tp->size * sizeof(float));
}

static wf_status allreduce(wf_tp *tp, float *x, size_t n)
{
  double t0 = wf_now();
  wf_status st = wf_comm_allreduce(tp->comm, x, x, n, WF_COMM_F32, WF_COMM_SUM);
  return note(tp, "tp all-reduce", st, t0, n * sizeof(float));
}

static wf_status copy(wf_tp *tp, float *dst, const float *src, size_t n)
{
  if (dst == src)
    return WF_OK;
  return wf_dev_copy(tp->dev, dst, src, n * sizeof(float), WF_COPY_D2D, NULL);
}

wf_comm_dtype wf__comm_dtype_of(wf_precision p)
{
  return p == WF_PREC_BF16 ? WF_COMM_BF16 : p == WF_PREC_FP16 ? WF_COMM_F16 : WF_COMM_F32;
}

/* f: identity; with sequence parallelism, the all-gather of the rows, in the
 * activations' own format (16 bits under mixed precision, as Megatron-LM gathers). */
static wf_status enter_fwd(void *ctx, const void **out, const void *x, void *full, size_t N,
                           size_t C, int fmt)
{
  wf_tp *tp = ctx;
  *out = x;
  if (!tp->sequence)
    return WF_OK;
  *out = full;
  wf_comm_dtype dt = wf__comm_dtype_of((wf_precision)fmt);
  size_t n = rows(tp, N) * C;
  double t0 = wf_now();
  wf_status st = wf_comm_allgather(tp->comm, x, full, n, dt);
  return note(tp, "tp all-gather", st, t0, n * wf_comm_dtype_size(dt));
}

/* f's backward: all-reduce; with sequence parallelism, reduce-scatter. */
static wf_status enter_bwd(void *ctx, float *dx, float *dfull, size_t N, size_t C)
{
  wf_tp *tp = ctx;
  if (tp->sequence)
    return reduce_scatter(tp, dx, dfull, rows(tp, N), C);
  wf_status st = allreduce(tp, dfull, N * C);
  return st == WF_OK ? copy(tp, dx, dfull, N * C) : st;
}

/* g: all-reduce; with sequence parallelism, reduce-scatter. */
static wf_status leave_fwd(void *ctx, float *y, float *partial, size_t N, size_t C)
{
  wf_tp *tp = ctx;
  if (tp->sequence)
    return reduce_scatter(tp, y, partial, rows(tp, N), C);
  wf_status st = allreduce(tp, partial, N * C);
  return st == WF_OK ? copy(tp, y, partial, N * C) : st;
}

/* g's backward: identity; with sequence parallelism, the all-gather. */
static wf_status leave_bwd(void *ctx, const float **out, const float *dy, float *full, size_t N,
                           size_t C)
{
  wf_tp *tp = ctx;
  *out = dy;
  if (!tp->sequence)
    return WF_OK;
  *out = full;
  return allgather(tp, dy, full, rows(tp, N) * C);
}

static wf_status sum(void *ctx, float *x, size_t n) { return allreduce(ctx, x, n); }

static const wf_tp_ops ops = {
    .version = WF_TP_OPS_VERSION,
    .enter_fwd = enter_fwd,
    .enter_bwd = enter_bwd,
    .leave_fwd = leave_fwd,
    .leave_bwd = leave_bwd,
    .gather = allgather,
    .sum = sum,
};

wf_status wf_tp_create(wf_tp **out, wf_comm *comm, wf_dev *dev, bool sequence)
{
  wf_status st = WF_OK;
  wf_tp *tp = NULL;
  *out = NULL;
  WF_CHECK(comm, WF_EINVAL, "tensor parallelism needs its tp communicator");
  WF_CHECK_ALLOC(tp = calloc(1, sizeof *tp));
  *tp = (wf_tp){.comm = comm, .dev = dev, .size = wf_comm_size(comm), .sequence = sequence};
  *out = tp;
fail:
  return st;
}

void wf_tp_destroy(wf_tp *tp) { free(tp); }

wf_tp_regions wf_tp_regions_of(wf_tp *tp)
{
  return tp && tp->size > 1 ? (wf_tp_regions){&ops, tp} : (wf_tp_regions){NULL, NULL};
}

wf_status wf_tp_allreduce(wf_tp *tp, float *x, size_t n)
{
  return tp && tp->size > 1 ? allreduce(tp, x, n) : WF_OK;
}

void wf_tp_set_trace(wf_tp *tp, wf_trace *trace)
{
  if (tp)
    tp->trace = trace;
}

void wf_tp_stats(wf_tp *tp, double *seconds, double *bytes)
{
  *seconds = tp ? tp->comm_s : 0;
  *bytes = tp ? tp->comm_bytes : 0;
  if (tp)
    tp->comm_s = tp->comm_bytes = 0;
}

wf_status wf_gather_full(wf_model *m, int which, float *full, wf_comm *world, bool contribute)
{
  wf_status st = WF_OK;
  size_t n = wf_model_num_params(wf_model_get_dims(m));
  memset(full, 0, n * sizeof *full);
  if (contribute)
    WF_TRY(wf_model_export_full(m, which, full));
  if (world)
    WF_TRY(wf_comm_allreduce(world, full, full, n, WF_COMM_F32, WF_COMM_SUM));
fail:
  return st;
}
