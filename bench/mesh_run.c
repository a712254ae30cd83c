/*
 * mesh_run.c - the multi-rank benchmarks' shared harness (see mesh_run.h).
 *
 * Communicators are split from the world by the mesh arithmetic of coordinator/mesh.c,
 * as wf_job_bootstrap does (rank = tp + TP * (dp + DP * pp)), and handed to the
 * trainer in the same hooks the worker's main passes: tp only when tp > 1, pp and the
 * embedding group only when pp > 1.
 */
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_run.h"
#include "wf_bind.h"
#include "wf_kernels.h"
#include "wf_runtime.h"

static int env_init(bench_env *e, int *argc, char ***argv)
{
  int provided;
  memset(e, 0, sizeof *e);
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &e->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &e->size);
  wf_rt_set_rank(e->rank);
  wf_log_set_level(WF_LOG_WARN);
  wf_config_set_model_check(wf_model_config_check);
  MPI_Comm node;
  int lrank = 0, lsize = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, e->rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    MPI_Comm_free(&node);
  }
  wf_binding b;
  wf_bind_apply(&b, true, lrank, lsize, NULL);
  wf_kernels_set_threads(b.threads);
  e->threads = wf_kernels_threads();
  if (wf_comm_world_create(&e->world) != WF_OK) {
    fprintf(stderr, "bench: cannot create the world communicator\n");
    return 1;
  }
  return 0;
}

int bench_start(bench_env *e, int *argc, char ***argv, const char *name, int ranks, int *steps)
{
  if (env_init(e, argc, argv))
    return 1;
  int n = *argc > 1 ? atoi((*argv)[1]) : 6;
  *steps = n < 2 ? 2 : n > BENCH_MAX_STEPS ? BENCH_MAX_STEPS : n;
  if (e->size == ranks)
    return 0;
  if (e->rank == 0)
    fprintf(stderr, "%s: run it on %d ranks: mpirun -np %d build/bench/%s [steps]\n", name, ranks,
            ranks, name);
  bench_env_fini(e);
  return 2;
}

void bench_kv_add(bench_kv *kv, const char *fmt, ...)
{
  if (kv->n >= BENCH_MAX_KV)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kv->text[kv->n], sizeof kv->text[kv->n], fmt, ap);
  va_end(ap);
  kv->arg[kv->n] = kv->text[kv->n];
  kv->n++;
}

void bench_env_fini(bench_env *e)
{
  wf_comm_destroy(e->world);
  MPI_Finalize();
}

static bool record_step(void *user, const wf_train_step_info *info)
{
  bench_steps *s = user;
  if (s->n < BENCH_MAX_STEPS)
    s->step[s->n++] = *info;
  return true;
}

static wf_status make_config(const bench_env *e, wf_config *cfg, const char *const *kv, int n)
{
  char err[1024] = "", key[128];
  wf_config_init(cfg);
  /* Benchmarks time training steps: no evaluation. */
  wf_status st = wf_config_set(cfg, "train.eval_every", "0", WF_SRC_CLI, err, sizeof err);
  if (st == WF_OK)
    st = wf_config_set(cfg, "train.eval_batches", "0", WF_SRC_CLI, err, sizeof err);
  for (int i = 0; st == WF_OK && i < n; i++) {
    const char *eq = strchr(kv[i], '=');
    if (!eq) {
      snprintf(err, sizeof err, "'%s' is not key=value", kv[i]);
      st = WF_EINVAL;
      break;
    }
    snprintf(key, sizeof key, "%.*s", (int)(eq - kv[i]), kv[i]);
    st = wf_config_set(cfg, key, eq + 1, WF_SRC_CLI, err, sizeof err);
  }
  if (st == WF_OK)
    st = wf_config_validate(cfg, e->size, err, sizeof err);
  if (st != WF_OK && e->rank == 0)
    fprintf(stderr, "bench: config: %s\n", err);
  return st;
}

static wf_status split_axes(const bench_env *e, const wf_config *cfg, wf_comm *axis[WF_NUM_AXES])
{
  wf_mesh mesh = {cfg->mesh.dp, cfg->mesh.tp, cfg->mesh.pp, cfg->mesh.cp, cfg->mesh.ep};
  for (int a = 0; a < WF_NUM_AXES; a++) {
    int color = wf_mesh_group_color(&mesh, (wf_axis)a, e->rank);
    wf_status st = wf_comm_split(e->world, color, e->rank, wf_axis_name((wf_axis)a), &axis[a]);
    if (st != WF_OK)
      return st;
  }
  return WF_OK;
}

wf_status bench_train(const bench_env *e, const bench_kv *kv, bench_steps *out)
{
  wf_config cfg;
  wf_comm *axis[WF_NUM_AXES] = {0};
  memset(out, 0, sizeof *out);
  wf_status st = make_config(e, &cfg, kv->arg, kv->n);
  if (st == WF_OK)
    st = split_axes(e, &cfg, axis);
  if (st == WF_OK) {
    bool tp = cfg.mesh.tp > 1, pp = cfg.mesh.pp > 1;
    wf_train_hooks h = {.user = out,
                        .on_step = record_step,
                        .quiet = true,
                        .dp = axis[WF_AXIS_DP],
                        .world = e->world,
                        .tp = tp ? axis[WF_AXIS_TP] : NULL,
                        .pp = pp ? axis[WF_AXIS_PP] : NULL,
                        .emb = pp ? axis[WF_AXIS_EMB] : NULL};
    st = wf_train_run(&cfg, &h);
  }
  for (int a = 0; a < WF_NUM_AXES; a++)
    wf_comm_destroy(axis[a]);
  return st;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(const bench_steps *s, int first, double (*get)(const wf_train_step_info *))
{
  double v[BENCH_MAX_STEPS];
  int k = 0;
  for (int i = first; i < s->n; i++)
    v[k++] = get(&s->step[i]);
  if (k == 0)
    return NAN;
  qsort(v, (size_t)k, sizeof *v, cmp_double);
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

double bench_gemm_gflops(const bench_env *e, int n)
{
  size_t nn = (size_t)n * n;
  float *a = wf_mem_alloc(3 * nn * sizeof *a);
  double best = INFINITY;
  if (a) {
    wf_rng_fill_normal(a, 2 * nn, 1.0f, 7, 0, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int rep = 0; rep < 21; rep++) {
      double t = wf_now();
      wf_matmul_forward(a + 2 * nn, a, a + nn, NULL, n, n, n);
      t = wf_now() - t;
      if (rep > 0 && t < best) /* rep 0 warms up the threads and caches */
        best = t;
    }
    wf_mem_free(a);
  }
  double mine = isfinite(best) ? 2.0 * n * (double)nn / best * 1e-9 : 0, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  (void)e;
  return slowest;
}
