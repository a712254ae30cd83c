/*
 * tp.c - the tensor-parallel region operators (see model_int.h).
 *
 * Each operator is one blocking collective on the tp group. They sit between GEMMs
 * that need their result, so there is nothing to overlap them with; the time spent is
 * accumulated for the step log, and each call is a span of the trace while it records.
 * A failed collective is logged by the collectives layer and returned.
 */
#include "model_int.h"

static bool tp_active(const wf_tp *tp) { return tp->comm && tp->size > 1; }

static wf_status note(wf_tp *tp, const char *what, wf_status st, double t0, size_t bytes)
{
  double t1 = wf_now();
  tp->comm_s += t1 - t0;
  if (wf_trace_on(tp->trace))
    wf_trace_span(tp->trace, what, "comm", t0, t1, -1, -1);
  tp->comm_bytes += (double)bytes;
  return st;
}

wf_status wf__tp_allgather(wf_tp *tp, const float *x, float *all, size_t n)
{
  double t0 = wf_now();
  wf_status st = wf_comm_allgather(tp->comm, x, all, n, WF_COMM_F32);
  return note(tp, "tp all-gather", st, t0, n * sizeof(float));
}

static wf_status reduce_scatter(wf_tp *tp, float *y, const float *full, size_t rows, size_t C)
{
  double t0 = wf_now();
  wf_status st = wf_comm_reduce_scatter(tp->comm, full, y, rows * C, WF_COMM_F32, WF_COMM_SUM);
  return note(tp, "tp reduce-scatter", st, t0, rows * C * (size_t)tp->size * sizeof(float));
}

static wf_status allreduce(wf_tp *tp, float *x, size_t n)
{
  double t0 = wf_now();
  wf_status st = wf_comm_allreduce(tp->comm, x, x, n, WF_COMM_F32, WF_COMM_SUM);
  return note(tp, "tp all-reduce", st, t0, n * sizeof(float));
}

static wf_status copy(wf_tp *tp, float *dst, const float *src, size_t n)
{
  return wf_dev_copy(tp->dev, dst, src, n * sizeof(float), WF_COPY_D2D, NULL);
}

wf_status wf__tp_enter_fwd(wf_tp *tp, const float **out, const float *x, float *full, size_t N,
                           size_t C)
{
  *out = x; /* f: identity */
  if (!tp_active(tp) || !tp->sequence)
    return WF_OK;
  *out = full;
  return wf__tp_allgather(tp, x, full, wf__tp_rows(tp, N) * C);
}

wf_status wf__tp_enter_bwd(wf_tp *tp, float *dx, float *dfull, size_t N, size_t C)
{
  wf_status st = WF_OK;
  if (tp_active(tp) && tp->sequence)
    return reduce_scatter(tp, dx, dfull, wf__tp_rows(tp, N), C);
  if (tp_active(tp))
    st = allreduce(tp, dfull, N * C); /* f's backward: all-reduce */
  return st == WF_OK ? copy(tp, dx, dfull, N * C) : st;
}

wf_status wf__tp_leave_fwd(wf_tp *tp, float *y, float *partial, size_t N, size_t C)
{
  wf_status st = WF_OK;
  if (tp_active(tp) && tp->sequence)
    return reduce_scatter(tp, y, partial, wf__tp_rows(tp, N), C);
  if (tp_active(tp))
    st = allreduce(tp, partial, N * C); /* g: all-reduce */
  return st == WF_OK ? copy(tp, y, partial, N * C) : st;
}

wf_status wf__tp_leave_bwd(wf_tp *tp, const float **out, const float *dy, float *full, size_t N,
                           size_t C)
{
  *out = dy; /* g's backward: identity */
  if (!tp_active(tp) || !tp->sequence)
    return WF_OK;
  *out = full;
  return wf__tp_allgather(tp, dy, full, wf__tp_rows(tp, N) * C);
}

wf_status wf_gpt_tp_allreduce(wf_gpt *m, float *x, size_t n)
{
  return tp_active(&m->tp) ? allreduce(&m->tp, x, n) : WF_OK;
}
