/*
 * norm.c - sum of squares (for the global gradient norm) and scaling (clipping).
 *
 * The sum accumulates in double: per-thread partials over fixed chunks, added in
 * thread order, so it is deterministic for a given thread budget.
 */

#include "cpu_int.h"
#include "wf_kernels.h"

#define MAX_PARTIALS 256

WF__CLONES static double sumsq_range(const float *x, size_t lo, size_t hi)
{
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = lo; i < hi; i++)
    s += (double)x[i] * x[i];
  return s;
}

struct norm_task {
  float *x;
  const float *cx;
  float s;
  size_t n;
  double part[MAX_PARTIALS];
};

static void sumsq_share(void *p, int tid, int nt)
{
  struct norm_task *t = p;
  size_t lo, hi;
  wf__split(t->n, tid, nt, 16, &lo, &hi);
  t->part[tid] = sumsq_range(t->cx, lo, hi);
}

double wf_sumsq(const float *x, size_t n)
{
  struct norm_task t = {.cx = x, .n = n};
  int nt = wf__threads_for(n);
  nt = nt > MAX_PARTIALS ? MAX_PARTIALS : nt;
  wf__parallel(nt, sumsq_share, &t);
  double total = 0.0;
  for (int i = 0; i < nt; i++)
    total += t.part[i];
  return total;
}

static void scale_share(void *p, int tid, int nt)
{
  const struct norm_task *t = p;
  size_t lo, hi;
  wf__split(t->n, tid, nt, 16, &lo, &hi);
  float *x = t->x;
  const float s = t->s;
#pragma omp simd
  for (size_t i = lo; i < hi; i++)
    x[i] *= s;
}

void wf_scale(float *x, float s, size_t n)
{
  struct norm_task t = {.x = x, .s = s, .n = n};
  wf__parallel(wf__threads_for(n), scale_share, &t);
}

void wf_sumsq_acc(double *acc, const float *x, size_t n) { *acc += wf_sumsq(x, n); }

/* ---- the op (wf_kreg.h) ---------------------------------------------------------------- */

static void sumsq_acc(double *acc, const float *x, size_t n, wf_stream *s)
{
  wf_sumsq_acc(acc, x, n);
}
static void scale(float *x, float f, size_t n, wf_stream *s) { wf_scale(x, f, n); }

static const wf_norm_op op = {sumsq_acc, scale};
const wf_kvariants wf__cpu_norm = WF_KV_ANY(norm, WF_OP_VERSION_norm, &op);
