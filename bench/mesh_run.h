/*
 * mesh_run.h - what the multi-rank benchmarks share: MPI start-up with the worker's
 * hwloc binding, the mesh's communicators, one training run of the real trainer
 * (wf_train_run) on a config given as key=value pairs, and the machine's GEMM rate.
 *
 * The benchmarks measure the trainer the worker runs, not a copy of its loop: each run
 * is wf_train_run with a quiet hook that records every step's wf_train_step_info.
 * Never a test.
 */
#ifndef BENCH_MESH_RUN_H
#define BENCH_MESH_RUN_H

#include "wf_collectives.h"
#include "wf_coordinator.h"
#include "wf_train.h"

enum { BENCH_MAX_STEPS = 64 };

typedef struct bench_env {
  int rank, size;
  int threads; /* compute threads of this rank (its hwloc share) */
  wf_comm *world;
} bench_env;

/* MPI_Init, bind this rank as the worker does, set the kernels' threads, and read the
 * optional first argument, the steps per run (default 6, at least 2). `name` must run
 * on `ranks` ranks. Returns 0, or the exit status after saying why not (MPI is then
 * finalised). */
int bench_start(bench_env *e, int *argc, char ***argv, const char *name, int ranks, int *steps);
void bench_env_fini(bench_env *e); /* MPI_Finalize */

/* Config overrides of one run, as key=value strings. */
enum { BENCH_MAX_KV = 24 };
typedef struct bench_kv {
  int n;
  char text[BENCH_MAX_KV][64];
  const char *arg[BENCH_MAX_KV];
} bench_kv;
void bench_kv_add(bench_kv *kv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Steps recorded by one run. */
typedef struct bench_steps {
  int n;
  wf_train_step_info step[BENCH_MAX_STEPS];
} bench_steps;

/* Train on the mesh the config describes (mesh.tp, mesh.pp; dp derived from the
 * world) with the config's defaults overridden by kv. Evaluation is off. Every rank
 * calls it; every rank gets the steps (as on_step saw them on this rank). Returns
 * WF_OK or the error (printed by rank 0). */
wf_status bench_train(const bench_env *e, const bench_kv *kv, bench_steps *out);

/* Median over steps [first, n) of a field read by `get`. */
double bench_median(const bench_steps *s, int first, double (*get)(const wf_train_step_info *));

/* GFLOP/s of an n^3 sgemm through the kernels (wf_matmul_forward, this rank's threads),
 * best of 20 after one warm-up (the machine is shared: the best is the undisturbed rate), run by
 * every rank at once (the load training puts on the machine); returns the slowest rank's figure. */
double bench_gemm_gflops(const bench_env *e, int n);

#endif /* BENCH_MESH_RUN_H */
