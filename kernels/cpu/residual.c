/*
 * residual.c - residual connection out = a + b, elementwise over N values.
 * Backward adds dout into both da and db (which may be the same buffer).
 */
#include <omp.h>

#include "cpu_int.h"
#include "wf_kernels.h"

void wf_residual_forward(float *out, const float *a, const float *b, size_t N)
{
  int nt = wf__threads_for(N);
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split(N, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
#pragma omp simd
    for (size_t i = lo; i < hi; i++)
      out[i] = a[i] + b[i];
  }
}

void wf_residual_backward(float *da, float *db, const float *dout, size_t N)
{
  int nt = wf__threads_for(N);
#pragma omp parallel num_threads(nt)
  {
    size_t lo, hi;
    wf__split(N, omp_get_thread_num(), omp_get_num_threads(), 16, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
      da[i] += dout[i];
      db[i] += dout[i];
    }
  }
}
