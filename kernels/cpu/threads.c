/*
 * threads.c - the kernels' thread budget and the one pool that runs their parallel
 * loops and GEMM shares.
 *
 * The budget is process-wide state, like OpenBLAS's own thread count which it
 * replaces: main() sets it once from the rank's CPU binding. Until then it defaults to
 * the CPUs this process may run on. OpenBLAS is pinned to 1 thread (cpu_int.h says
 * why).
 *
 * Why a pool of our own rather than OpenMP's: libgomp reads its wait policy only from
 * the environment when it loads, and its default spins for milliseconds after every
 * region. When other processes share the cores, a spinning idle worker loses its
 * time slice, so the next region waits a scheduler tick (4 ms here) for it: measured,
 * a 0.12 ms layernorm took 8-16 ms. Our workers spin ~0.4 ms (well below a tick,
 * enough to catch back-to-back kernels on free cores), then sleep on a futex, and a
 * woken sleeper is scheduled promptly.
 *
 * Invariants: wf__parallel runs fn(ctx, tid, nt) once for every tid in [0, nt), tid 0
 * on the calling thread, and returns when all have finished. Calls are serialised;
 * a call from inside a task runs serially on the caller (no nesting).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_int.h"
#include "wf_kernels.h"

#define MAX_WORKERS 255
#define SPIN_ITERS  20000 /* x ~21 ns per pause here: ~0.4 ms */

static struct {
  pthread_mutex_t lock; /* one wf__parallel at a time; guards nworkers */
  int nworkers;
  atomic_uint gen;                     /* bumped to publish a task */
  atomic_int active;                   /* workers that have not yet finished the current task */
  unsigned start_gen[MAX_WORKERS + 1]; /* gen when worker i was started */
  wf__task_fn fn;
  void *ctx;
  int nt;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER};

static atomic_int budget; /* 0 until set */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static _Thread_local int in_task;

static void futex_wait(void *addr, int val)
{
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(void *addr, int n)
{
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg)
{
  int tid = (int)(intptr_t)arg;
  unsigned seen = pool.start_gen[tid]; /* written before pthread_create */
  in_task = 1;
  for (;;) {
    unsigned g;
    for (int i = 0; i < SPIN_ITERS; i++) {
      if ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) != seen)
        break;
      relax();
    }
    while ((g = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen)
      futex_wait(&pool.gen, (int)seen);
    seen = g;
    /* Every worker reports, needed or not, so none can still be reading this task
     * when the next one is published. */
    if (tid < pool.nt)
      pool.fn(pool.ctx, tid, pool.nt);
    if (atomic_fetch_sub_explicit(&pool.active, 1, memory_order_acq_rel) == 1)
      futex_wake(&pool.active, 1);
  }
  return NULL;
}

/* Starts workers 1 .. n-1 (under pool.lock); returns how many threads can run. */
static int grow(int n)
{
  while (pool.nworkers < n - 1 && pool.nworkers < MAX_WORKERS) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pool.start_gen[pool.nworkers + 1] = atomic_load(&pool.gen);
    int rc = pthread_create(&t, &attr, worker_main, (void *)(intptr_t)(pool.nworkers + 1));
    pthread_attr_destroy(&attr);
    if (rc != 0)
      break; /* run with the threads we have */
    pool.nworkers++;
  }
  return pool.nworkers + 1 < n ? pool.nworkers + 1 : n;
}

void wf__parallel(int nt, wf__task_fn fn, void *ctx)
{
  if (nt <= 1 || in_task) {
    nt = nt < 1 ? 1 : nt;
    for (int t = 0; t < nt; t++)
      fn(ctx, t, nt);
    return;
  }
  pthread_mutex_lock(&pool.lock);
  nt = grow(nt);
  pool.fn = fn, pool.ctx = ctx, pool.nt = nt;
  /* the stores above are published by the release increment of gen below */
  atomic_store_explicit(&pool.active, pool.nworkers, memory_order_relaxed);
  atomic_fetch_add_explicit(&pool.gen, 1, memory_order_release);
  futex_wake(&pool.gen, INT_MAX);
  in_task = 1;
  fn(ctx, 0, nt);
  in_task = 0;
  int a;
  for (int i = 0; i < SPIN_ITERS; i++) {
    if (atomic_load_explicit(&pool.active, memory_order_acquire) == 0)
      break;
    relax();
  }
  while ((a = atomic_load_explicit(&pool.active, memory_order_acquire)) != 0)
    futex_wait(&pool.active, a);
  pthread_mutex_unlock(&pool.lock);
}

static void pin_blas(void) { openblas_set_num_threads(1); }

void wf_kernels_set_threads(int n)
{
  pthread_once(&blas_once, pin_blas);
  atomic_store(&budget, n < 1 ? 1 : n);
}

int wf_kernels_threads(void) { return wf__threads(); }

static int default_threads(void)
{
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int wf__threads(void)
{
  int n = atomic_load_explicit(&budget, memory_order_relaxed);
  if (n > 0)
    return n;
  wf_kernels_set_threads(default_threads());
  return atomic_load(&budget);
}
