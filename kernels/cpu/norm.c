/*
 * norm.c - sum of squares (for the global gradient norm) and scaling (clipping).
 *
 * The sum accumulates in double: per-thread partials over fixed chunks, added in
 * thread order, so it is deterministic for a given thread budget.
 */
#include <omp.h>

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

double wf_sumsq(const float *x, size_t n)
{
  double part[MAX_PARTIALS] = {0};
  int nt = wf__threads_for(n);
  nt = nt > MAX_PARTIALS ? MAX_PARTIALS : nt;
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    int tid = omp_get_thread_num();
    wf__split(n, tid, omp_get_num_threads(), 16, &lo, &hi);
    part[tid] = sumsq_range(x, lo, hi);
  }
  double total = 0.0;
  for (int i = 0; i < nt; i++)
    total += part[i];
  return total;
}

void wf_scale(float *x, float s, size_t n)
{
  int nt = wf__threads_for(n);
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split(n, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
#pragma omp simd
    for (size_t i = lo; i < hi; i++)
      x[i] *= s;
  }
}
