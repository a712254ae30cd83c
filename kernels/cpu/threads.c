/*
 * threads.c - the kernels' thread budget, shared by OpenMP loops and GEMM splits.
 *
 * The budget is process-wide state, like OpenBLAS's own thread count which it
 * replaces: main() sets it once from the rank's CPU binding. Until then it defaults
 * to OpenMP's default (OMP_NUM_THREADS, else the CPUs this process may run on).
 * OpenBLAS is always pinned to 1 thread (see cpu_int.h for the measurement).
 */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "cpu_int.h"
#include "wf_kernels.h"

static atomic_int budget; /* 0 until set */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void pin_blas(void) { openblas_set_num_threads(1); }

void wf_kernels_set_threads(int n)
{
  pthread_once(&blas_once, pin_blas);
  atomic_store(&budget, n < 1 ? 1 : n);
}

int wf_kernels_threads(void) { return wf__threads(); }

int wf__threads(void)
{
  int n = atomic_load_explicit(&budget, memory_order_relaxed);
  if (n > 0)
    return n;
  wf_kernels_set_threads(omp_get_max_threads());
  return atomic_load(&budget);
}
