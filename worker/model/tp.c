/*
 * tp.c - tensor-parallel region operators (see model_int.h).
 *
 * Each operator is one blocking collective on the tp group. They sit between GEMMs
 * that need their result, so there is nothing to overlap them with on the CPU path;
 * the time spent is accumulated for the step log.
 */
#include <string.h>

#include "model_int.h"
#include "wf_io.h"

static bool tp_active(const wf_tp *tp) { return tp->comm && tp->size > 1 && tp->err == WF_OK; }

static void note(wf_tp *tp, const char *what, wf_status st, double t0, size_t bytes)
{
  double t1 = wf_now();
  tp->comm_s += t1 - t0;
  if (wf_trace_on(tp->trace))
    wf_trace_span(tp->trace, what, "comm", t0, t1, -1, -1);
  tp->comm_bytes += (double)bytes;
  if (st != WF_OK && tp->err == WF_OK)
    tp->err = st;
}

static void allgather(wf_tp *tp, const float *x, float *full, size_t rows, size_t C)
{
  double t0 = wf_now();
  wf_status st = wf_comm_allgather(tp->comm, x, full, rows * C, WF_COMM_F32);
  note(tp, "tp all-gather", st, t0, rows * C * sizeof(float));
}

static void reduce_scatter(wf_tp *tp, float *y, const float *full, size_t rows, size_t C)
{
  double t0 = wf_now();
  wf_status st = wf_comm_reduce_scatter(tp->comm, full, y, rows * C, WF_COMM_F32, WF_COMM_SUM);
  note(tp, "tp reduce-scatter", st, t0, rows * C * (size_t)tp->size * sizeof(float));
}

void wf_tp_allreduce(wf_tp *tp, float *x, size_t n)
{
  if (!tp_active(tp))
    return;
  double t0 = wf_now();
  wf_status st = wf_comm_allreduce(tp->comm, x, x, n, WF_COMM_F32, WF_COMM_SUM);
  note(tp, "tp all-reduce", st, t0, n * sizeof(float));
}

const float *wf_tp_enter_fwd(wf_tp *tp, const float *x, float *full, size_t N, size_t C)
{
  if (!tp_active(tp) || !tp->sequence)
    return x; /* f: identity */
  allgather(tp, x, full, wf_tp_rows(tp, N), C);
  return full;
}

void wf_tp_enter_bwd(wf_tp *tp, float *dx, float *dfull, size_t N, size_t C)
{
  if (!tp_active(tp)) {
    if (dx != dfull)
      memcpy(dx, dfull, N * C * sizeof(float));
    return;
  }
  if (tp->sequence)
    reduce_scatter(tp, dx, dfull, wf_tp_rows(tp, N), C);
  else {
    wf_tp_allreduce(tp, dfull, N * C); /* f's backward: all-reduce */
    if (dx != dfull)
      memcpy(dx, dfull, N * C * sizeof(float));
  }
}

void wf_tp_leave_fwd(wf_tp *tp, float *y, float *partial, size_t N, size_t C)
{
  if (tp_active(tp) && tp->sequence) {
    reduce_scatter(tp, y, partial, wf_tp_rows(tp, N), C);
    return;
  }
  wf_tp_allreduce(tp, partial, N * C); /* g: all-reduce (nothing at tp = 1) */
  if (y != partial)
    memcpy(y, partial, N * C * sizeof(float));
}

const float *wf_tp_leave_bwd(wf_tp *tp, const float *dy, float *full, size_t N, size_t C)
{
  if (!tp_active(tp) || !tp->sequence)
    return dy; /* g's backward: identity */
  allgather(tp, dy, full, wf_tp_rows(tp, N), C);
  return full;
}
