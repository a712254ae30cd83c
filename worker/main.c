/*
 * main.c - the worker: one process per rank.
 *
 * Start-up order (docs/architecture.md): parse the command line against commands.c's tables;
 * MPI_Init_thread; read the config (file, WEFT_* environment, key=value arguments);
 * read the launch environment and cross-check it with MPI; validate the config against
 * the world the command names; then either run the command at once (it needs no mesh:
 * --print-config, --export, --plan, ...) or pick the device, bind with hwloc, bootstrap
 * the mesh and run it there (training, --dry-run, --generate, --dump-state).
 *
 * The commands are one table (commands.c; docs/architecture.md: seams as tables): a row says
 * what a command takes, what world its config is checked against, what it checks before the
 * mesh and which function runs it. The work is in each concern's folder; main only sequences.
 *
 * Failure policy: every check that can fail on one rank is agreed on with an
 * MPI_Allreduce before anyone acts on it, so either all ranks go on or all exit
 * non-zero together; user errors are printed once (by rank 0, or by the rank that
 * found them when only it knows), exit with WF_EXIT_INPUT, and never turn into a hang.
 */
#include <mpi.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__ /* defined by the headers above */
#include <malloc.h>
#endif

#include "commands.h"
#include "wf_bind.h"
#include "wf_gpu.h"
#include "wf_build_config.h"
#include "wf_build_id.h"
#include "wf_io.h"
#include "wf_kernels.h"
#include "wf_parallel.h"
#include "wf_runtime.h"
#include "wf_train.h"

extern char **environ;

/* The environment as the launcher gave it. Open MPI's singleton start-up adds
 * PMIX_* variables to the process environment inside MPI_Init, so the launch
 * environment is read from this copy, taken before MPI_Init_thread. */
static char **launch_env;

static char **copy_environ(void)
{
  size_t n = 0;
  while (environ[n])
    n++;
  char **copy = calloc(n + 1, sizeof *copy);
  for (size_t i = 0; copy && i < n; i++)
    copy[i] = strdup(environ[i]);
  return copy;
}

/* ---- the config and the launch ------------------------------------------------------ */

static wf_status load_config(wf_config *cfg, const wf__args *a, char *err, size_t len)
{
  wf_config_init(cfg);
  if (a->config_file) {
    wf_status st = wf_config_load_file(cfg, a->config_file, err, len);
    if (st != WF_OK)
      return st;
  }
  wf_status st = wf_config_load_env(cfg, launch_env, err, len);
  for (int i = 0; st == WF_OK && i < a->n_overrides; i++) {
    char key[256];
    const char *eq = strchr(a->overrides[i], '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - a->overrides[i]), a->overrides[i]);
    st = wf_config_set(cfg, key, eq + 1, WF_SRC_CLI, err, len);
  }
  return st;
}

static wf_status read_launch(wf_launch *l, const wf_config *cfg, int rank, int size, char *err,
                             size_t len)
{
  MPI_Comm node;
  int lrank = 0, lsize = 1;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_size(node, &lsize);
    MPI_Comm_free(&node);
  }
  wf_status st = wf_launch_detect(l, cfg->dist.rank, cfg->dist.world_size, wf_launch_getenv,
                                  launch_env, err, len);
  if (st == WF_OK)
    st = wf_launch_crosscheck(l, rank, size, lrank, lsize, err, len);
  return st;
}

/* The world size the config is validated against (0: the range rules report it). */
static int check_world(wf_config *cfg, wf__args *a, int size)
{
  switch (a->cmd->world) {
  case W_PLANNED: return wf_plan_world(cfg);
  case W_ANY: /* the plan picks the mesh: validate the rest, remember the world */
    a->pc.world = wf_plan_world(cfg);
    wf_plan_reset_mesh(cfg);
    return 0;
  case W_MESH: {
    long long w = (long long)(cfg->mesh.dp > 0 ? cfg->mesh.dp : 1) * cfg->mesh.tp * cfg->mesh.pp;
    return w > 0 && w <= 1 << 24 ? (int)w : 0;
  }
  case W_LAUNCH: break;
  }
  return size;
}

/* model.vocab is the tokenizer's when data.tokenizer is given and the vocabulary is not
 * (nor taken from model.init's file): one less number to keep in step. */
static wf_status vocab_from_tokenizer(wf_config *cfg, char *err, size_t len)
{
  int k = wf_config_key_find("model.vocab"), v = 0;
  wf_config_source src = (wf_config_source)cfg->source[k];
  if (!cfg->data.tokenizer[0] || cfg->model.init[0] || src > WF_SRC_PRESET)
    return WF_OK;
  wf_status st = wf_tokenizer_vocab_of(cfg->data.tokenizer, &v, err, len);
  if (st == WF_OK) {
    cfg->model.vocab = v;
    cfg->source[k] = WF_SRC_DERIVED;
  }
  return st;
}

/* All ranks learn whether every rank succeeded (over the start-up communicator, a
 * duplicate of the world made right after MPI_Init, before the mesh exists). */
static bool all_ok(wf_comm *world, bool ok)
{
  return wf_comm_agree(world, ok ? WF_OK : WF_ECONFIG, NULL) == WF_OK;
}

/* Say a user error once: by rank 0 when it has it (every rank validates the same config,
 * so they agree), else by each rank that found it. */
static int fail_all(wf_comm *world, bool mine_failed, const char *msg, int rank)
{
  int32_t rank0_failed = mine_failed;
  if (wf_comm_bcast(world, &rank0_failed, 1, WF_COMM_I32, 0) != WF_OK)
    rank0_failed = 0; /* the broadcast failed (logged): every rank says its own */
  if (mine_failed && msg[0] && (rank == 0 || !rank0_failed)) /* "": said where it arose */
    WF_ERROR("%s", msg);
  return WF_EXIT_INPUT;
}

/* ---- before the mesh: what a command can check once for the whole job -------------- */

/* model.init's shape meets the config's model keys on every rank (collective): rank 0
 * reads the file's header first and says once what is wrong with it (err is then ""),
 * then every rank reads it and meets it. */
static bool init_meets(wf_comm *world, wf_config *cfg, int rank, char *err, size_t len)
{
  wf_model_dims d = {0};
  err[0] = '\0';
  bool ok = rank != 0 || wf_weights_peek(cfg->model.init, "model.init", &d) == WF_OK;
  if (!all_ok(world, ok))
    return false;
  if (rank != 0 && !wf_weights_probe(cfg->model.init, &d)) {
    snprintf(err, len,
             "model.init=%s: rank %d on %s cannot read it, though rank 0 can: put the weights "
             "where every host sees them",
             cfg->model.init, rank, wf_rt_host());
    return false;
  }
  return wf_model_dims_meet_config(&d, cfg->model.init, cfg, err, len) == WF_OK;
}

/* model.init read whole by rank 0, so a bad file is said once; *vocab gets its V. */
static bool init_ok(const wf__cmd_ctx *c, int *vocab)
{
  const wf_config *cfg = c->cfg;
  wf_model_dims d = {0};
  bool ok = true;
  if (c->rank == 0 && cfg->model.init[0])
    ok = wf_weights_check(cfg->model.init, "model.init", &d) == WF_OK;
  ok = all_ok(c->world, c->rank == 0 ? ok : true);
  int32_t v = d.V;
  if (ok && cfg->model.init[0] && wf_comm_bcast(c->world, &v, 1, WF_COMM_I32, 0) == WF_OK)
    *vocab = v;
  return ok;
}

/* What a command checks of its inputs on each rank before the mesh, without MPI: that it
 * has a model to sample from, the data (cheaply, never blocking on a FIFO) and the
 * sample's prompt, against the model's vocabulary (model.init's, once it met the
 * config). */
static wf_status check_inputs(const wf_config *cfg, const wf__args *a, char *err, size_t len)
{
  int checks = a->cmd->checks, vocab = cfg->model.vocab;
  if ((checks & C_NEED_INIT) && !cfg->model.init[0]) {
    snprintf(err, len,
             "%s needs the model to sample from: add model.init=FILE (an llm.c or safetensors "
             "file, or a weft checkpoint directory)",
             a->cmd->flag);
    return WF_ECONFIG;
  }
  wf_status st = (checks & C_DATA) ? wf_data_check(cfg, vocab, err, len) : WF_OK;
  if (st == WF_OK && (checks & (C_SAMPLE | C_PROMPT)))
    st = wf_sample_check(cfg, (checks & C_PROMPT) ? a->val[0] : NULL, vocab, err, len);
  return st;
}

/* model.init, the data, the sample prompt and where the coordinator listens, as the
 * command asks; once for the job (`early`: the last three were checked before MPI_Init,
 * on every rank). Returns the exit status (WF_EXIT_OK: go on). */
static int preflight(const wf__cmd_ctx *c, bool early)
{
  char err[2048] = "";
  int checks = c->a->cmd->checks, vocab = c->cfg->model.vocab;
  if ((checks & C_INIT) && !init_ok(c, &vocab))
    return WF_EXIT_INPUT;
  if ((checks & C_PROMPT) && !c->cfg->data.tokenizer[0] && vocab > 256 && c->rank == 0)
    WF_WARN("%s without data.tokenizer: the model's %d-token vocabulary is not bytes, so the "
            "prompt is read as bytes and the sample printed as <id>s; add data.tokenizer=DIR "
            "(the tokenizer the model was trained with) to read and write text",
            c->a->cmd->flag, vocab);
  if (early)
    return WF_EXIT_OK;
  /* Data that cannot work is a config-level error: every rank checks it, rank 0 says it */
  bool ok = check_inputs(c->cfg, c->a, err, sizeof err) == WF_OK;
  if (!all_ok(c->world, ok))
    return fail_all(c->world, !ok, err, c->rank);
  /* where the coordinator will listen: rank 0's to check, and to say */
  if (!(checks & C_PLANE))
    return WF_EXIT_OK;
  return wf__exit_status(wf_comm_agree(c->world, wf__cmd_train_precheck(c), NULL));
}

/* ---- the mesh ----------------------------------------------------------------------- */

/* Bind this rank with hwloc and size its compute threads. */
static void bind_rank(const wf_config *cfg, const wf_launch *launch, wf__rank_device *rd,
                      wf_binding *binding)
{
  wf_bind_apply(binding, cfg->runtime.bind, launch->local_rank, launch->local_size,
                rd->bus[0] ? rd->bus : NULL);
  if (binding->shared && launch->local_rank == 0)
    WF_INFO("%d ranks share %d cores on %s: one compute thread each", launch->local_size,
            binding->node_cores, wf_rt_host());
  if (cfg->runtime.threads > 0 && cfg->runtime.threads != binding->threads) {
    if (launch->local_rank == 0)
      WF_INFO("runtime.threads=%d compute threads per rank (the binding gives %d)",
              cfg->runtime.threads, binding->threads);
    binding->threads = cfg->runtime.threads;
  }
  wf_kernels_set_threads(binding->threads);
  /* ranks sharing cores share their peak too: the job's sum is the node's */
  double cores =
      binding->shared ? (double)binding->node_cores / launch->local_size : binding->threads;
  if (!rd->gpu)
    wf__cpu_peak(rd, cores, cfg);
}

#define GIB (1024.0 * 1024.0 * 1024.0)

static void log_launch(const wf__cmd_ctx *c)
{
  bool launched = c->a->cmd->world == W_LAUNCH || c->a->cmd->world == W_MESH;
  if (c->rank == 0 && launched)
    WF_INFO("weft " WF_VERSION " (build %s); launch: rank/size from %s; %d rank%s", wf_build_id(),
            wf_launch_source_str(c->launch->source), c->size, c->size == 1 ? "" : "s");
}

/* Training: whether the model fits this rank's memory as --estimate sizes it, before
 * anything is allocated: the GPU's memory, or on the CPU the host's shared by the ranks
 * on it. */
static wf_status check_fits(const wf__cmd_ctx *c, const wf__rank_device *rd, char *err, size_t len)
{
  const wf_config *cfg = c->cfg;
  wf_model_dims d = wf_model_dims_from_config(cfg);
  char desc[192];
  double limit = 0;
  err[0] = '\0';
  if (!(c->a->cmd->checks & C_PLANE) ||
      (cfg->model.init[0] && !wf_weights_probe(cfg->model.init, &d)))
    return WF_OK;
  if (rd->gpu) {
    size_t free_b = 0, total = 0;
    if (wf_gpu_mem_info(rd->gpu, &free_b, &total) == WF_OK)
      limit = (double)total;
    snprintf(desc, sizeof desc, "the memory of %s", rd->desc);
  } else {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int ranks = c->launch->local_size > 0 ? c->launch->local_size : 1;
    double host = pages > 0 && page > 0 ? (double)pages * page : 0;
    limit = host / ranks;
    snprintf(desc, sizeof desc, "%.1f GiB of memory on %s shared by %d rank%s", host / GIB,
             wf_rt_host(), ranks, ranks == 1 ? "" : "s");
  }
  return wf_plan_fits(cfg, &d, limit, desc, wf_dev_kernels(rd->dev, WF_DT_F32), err, len);
}

/* Pick the device, bind, bootstrap the mesh and run the command on it. */
static int run_on_mesh(wf__cmd_ctx *c)
{
  char err[2048] = "";
  wf__rank_device rd;
  bool ok = wf__pick_device(c->cfg, c->launch, &rd, err, sizeof err) == WF_OK;
  if (!all_ok(c->world, ok)) { /* the node's device, not the command: a restart may do */
    fail_all(c->world, !ok, err, c->rank);
    return WF_EXIT_FAILED;
  }
  ok = check_fits(c, &rd, err, sizeof err) == WF_OK;
  if (!all_ok(c->world, ok)) {
    wf__rank_device_close(&rd);
    return fail_all(c->world, !ok, err, c->rank);
  }
  log_launch(c);
  wf_binding binding;
  bind_rank(c->cfg, c->launch, &rd, &binding);
  char device[64], model[48] = "";
  if (rd.gpu) /* "cuda:0 (NVIDIA H100 80GB HBM3)": the job checks every rank has the same */
    wf_gpu_device_name(rd.gpu, wf_gpu_current_device(rd.gpu), model, sizeof model);
  snprintf(device, sizeof device, model[0] ? "%s (%s)" : "%s", rd.desc, model);
  wf_job *job = NULL;
  wf_job_opts jo = {c->cfg, c->launch, device, &binding, rd.gpu, false};
  ok = wf__survey_gpus(c->world, &rd, &jo.nccl) == WF_OK;
  ok = ok && wf_job_bootstrap(&job, &jo) == WF_OK;
  int rc = WF_EXIT_FAILED;
  if (!all_ok(c->world, ok)) {
    if (c->rank == 0)
      WF_ERROR("mesh bootstrap failed (see the log above)");
  } else if (!all_ok(c->world, wf_job_check_devices(job) == WF_OK)) {
    rc = WF_EXIT_INPUT; /* said by rank 0, which holds every rank's facts */
  } else {
    c->job = job, c->rd = &rd;
    rc = c->a->cmd->run(c);
  }
  wf_job_destroy(job);
  wf__rank_device_close(&rd);
  return rc;
}

/* What main found before MPI_Init, on every rank alike: the command line, the config
 * (file, WEFT_* variables, key=value arguments) and, where the launcher's variables give
 * the world size, the config's check against it. */
typedef struct early {
  wf__args a;
  wf_config cfg;
  bool ok;
  int exit;    /* the exit status when not ok */
  bool inputs; /* the data, the prompt and the coordinator's address were checked too */
  char err[2048];
} early;

/* The world size the launcher's variables state before MPI_Init, where MPI will agree
 * with it (mpirun's, or a singleton's 1); 0 when only MPI can tell. */
static int early_world(void)
{
  wf_launch l;
  char err[256];
  if (wf_launch_is_singleton(wf_launch_getenv, launch_env))
    return wf_launch_getenv(launch_env, "RANK") || wf_launch_getenv(launch_env, "WORLD_SIZE")
               ? 0 /* started by hand as one of several: the launch check says what to do */
               : 1;
  if (wf_launch_detect(&l, -1, -1, wf_launch_getenv, launch_env, err, sizeof err) != WF_OK)
    return 0;
  return l.source == WF_LAUNCH_OMPI && l.world_size > 0 ? l.world_size : 0;
}

/* The model's shape within the bounds every model size is computed in (model.init's
 * file is checked when it is read). */
static wf_status check_shape(const wf_config *cfg, char *err, size_t len)
{
  wf_model_dims d = wf_model_dims_from_config(cfg);
  const char *bad = cfg->model.init[0] ? NULL : wf_model_dims_check(&d);
  if (!bad)
    return WF_OK;
  snprintf(err, len,
           "model.family=%s model.layers=%d model.d_model=%d model.heads=%d model.kv_heads=%d "
           "model.ffn=%d model.seq_len=%d model.vocab=%d: %s; choose a smaller model",
           cfg->model.family, d.L, d.C, d.NH, d.KV, d.F, d.maxT, d.V, bad);
  return WF_ECONFIG;
}

/* Whether a mistake found before MPI_Init can be said there once (said_early): under
 * mpirun, or in a process no launcher started. */
static bool sayable_early(void)
{
  return getenv("OMPI_COMM_WORLD_RANK") || wf_launch_is_singleton(wf_launch_getenv, NULL);
}

/* The inputs a mesh command checks (preflight's), before MPI_Init: the data and the
 * sample's prompt on every rank, where the coordinator will listen on rank 0 (which
 * says what is wrong there itself: err is then ""). cfg: the validated copy. */
static void early_inputs(early *e, const wf_config *cfg)
{
  wf_launch l;
  char why[256];
  e->ok = check_inputs(cfg, &e->a, e->err, sizeof e->err) == WF_OK;
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  bool rank0 = !r || !strcmp(r, "0");
  if (e->ok && rank0 && (e->a.cmd->checks & C_PLANE) &&
      wf_launch_detect(&l, cfg->dist.rank, cfg->dist.world_size, wf_launch_getenv, launch_env, why,
                       sizeof why) == WF_OK) {
    wf__cmd_ctx c = {cfg, &e->a, NULL, 0, 1, &l, NULL, NULL};
    wf_status st = wf__cmd_train_precheck(&c);
    e->ok = st == WF_OK;
    e->exit = wf__exit_status(st);
    e->err[0] = '\0'; /* said by the check */
  }
  e->inputs = e->ok;
}

/* model.init cannot be read here, before MPI_Init: rank 0 reads it again and says why
 * (err ""); another rank says that it alone cannot, if rank 0 can (said_early waits).
 * Returns false; true when rank 0 reads it after all. */
static bool unreadable_init(early *e, const char *init)
{
  wf_model_dims d;
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (!r || !strcmp(r, "0")) {
    e->err[0] = '\0';
    return wf_weights_peek(init, "model.init", &d) == WF_OK;
  }
  snprintf(e->err, sizeof e->err,
           "model.init=%s: rank %s on %s cannot read it, though rank 0 can: put the weights "
           "where every host sees them",
           init, r, wf_rt_host());
  return false;
}

static void early_checks(early *e, int argc, char **argv)
{
  wf_model_dims d;
  e->exit = WF_EXIT_INPUT;
  e->ok = wf__parse_args(argc, argv, &e->a, e->err, sizeof e->err) == 0;
  if (!e->ok || e->a.help || e->a.version)
    return;
  e->ok = load_config(&e->cfg, &e->a, e->err, sizeof e->err) == WF_OK;
  if (e->ok) /* what is said from here on says it at runtime.log_level */
    wf_log_set_level(e->cfg.runtime.log_level);
  e->ok = e->ok && vocab_from_tokenizer(&e->cfg, e->err, sizeof e->err) == WF_OK;
  /* model.init decides the model: a file that cannot be read is rank 0's to report,
   * once (here when it can be said here, else after MPI_Init) */
  const char *init = e->cfg.model.init;
  if (e->ok && init[0] && !wf_weights_probe(init, &d)) {
    e->ok = !sayable_early() || unreadable_init(e, init);
    return;
  }
  if (e->ok && init[0])
    e->ok = wf_model_dims_meet_config(&d, init, &e->cfg, e->err, sizeof e->err) == WF_OK;
  if (e->ok) {
    int w = early_world();
    wf_config cfg = e->cfg; /* validated again after MPI_Init, against MPI's world */
    e->ok = wf_config_validate(&cfg,
                               e->a.cmd->world == W_LAUNCH && !w ? 0 : check_world(&cfg, &e->a, w),
                               e->err, sizeof e->err) == WF_OK;
    e->ok = e->ok && check_shape(&cfg, e->err, sizeof e->err) == WF_OK;
    if (e->ok && e->a.cmd->mesh && sayable_early())
      early_inputs(e, &cfg);
  }
}

/* How long mpirun's ranks other than 0 wait for rank 0 to report a mistake they all
 * found before MPI_Init (rank 0's exit makes mpirun end them). Rank 0 needs
 * milliseconds; the wait covers ranks started late on a loaded host. */
#define EARLY_WAIT_S 3

/* mpirun ends a job's ranks with SIGCONT, then SIGTERM a second later: the first is
 * enough for a rank that only waits to be ended. */
static void on_ended_early(int sig, siginfo_t *si, void *uc)
{
  (void)uc;
  if (sig != SIGCONT || (si && si->si_pid == getppid()))
    _exit(WF_EXIT_INPUT);
}

/* A mistake found before MPI_Init, alike on every rank: say it once. A singleton says it
 * at once. Under mpirun rank 0 says it and exits 2, and mpirun ends the other ranks,
 * which wait for that so that rank 0 is the first to exit; one still running after
 * EARLY_WAIT_S says it itself (rank 0 did not find it: its files or variables differ).
 * Under srun or another PMI launcher nothing would end the others, so the ranks agree
 * over MPI instead: returns false. */
static bool said_early(const char *err)
{
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  if (!r && !wf_launch_is_singleton(wf_launch_getenv, NULL))
    return false;
  if (r && strcmp(r, "0") != 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_ended_early;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGCONT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct timespec ts = {EARLY_WAIT_S, 0};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  if (err[0]) /* "": said where it was found */
    WF_ERROR("%s", err);
  return true;
}

static int run(wf_comm *world, early *e, int rank, int size)
{
  char *err = e->err;
  wf__args *a = &e->a;
  wf_config *cfg = &e->cfg;
  wf_launch launch;
  const wf__command *cmd = a->cmd;
  bool ok = e->ok;
  memset(&launch, 0, sizeof launch); /* --estimate and --plan plan a world, launch none */
  bool launched = cmd->world == W_LAUNCH || cmd->world == W_MESH;
  ok = ok && (!launched || read_launch(&launch, cfg, rank, size, err, sizeof e->err) == WF_OK);
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  ok = !cfg->model.init[0] || init_meets(world, cfg, rank, err, sizeof e->err);
  ok = ok && wf_config_validate(cfg, check_world(cfg, a, size), err, sizeof e->err) == WF_OK;
  if (!all_ok(world, ok))
    return fail_all(world, !ok, err, rank);
  wf_log_set_level(cfg->runtime.log_level);
  wf__cmd_ctx c = {cfg, a, world, rank, size, &launch, NULL, NULL};
  int rc = cmd->mesh ? preflight(&c, e->inputs) : WF_EXIT_OK;
  if (rc != WF_EXIT_OK)
    return rc;
  if (!cmd->mesh)
    log_launch(&c);
  return cmd->mesh ? run_on_mesh(&c) : cmd->run(&c);
}

static void free_early(early *e)
{
  free(e->a.overrides);
  for (char **p = launch_env; p && *p; p++)
    free(*p);
  free(launch_env);
}

int main(int argc, char **argv)
{
  static early e; /* the config is large */
  int provided, rank = 0, size = 1;
#ifdef __GLIBC__
  /* Large blocks stay mmapped, so what is freed goes back to the system: Open MPI's
   * reduction buffers and --save's whole model on rank 0 are freed after use, and glibc's
   * default (a threshold that rises to the largest block freed) would then serve later
   * blocks from the heap and keep the freed block resident, out of --check-estimate's
   * sight. */
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  /* A write into a closed pipe or socket (`worker ... | head`, a console that hung up)
   * fails with EPIPE instead of ending the process without a word: training then stops
   * at the step boundary, checkpointed, and says why (job.c). */
  signal(SIGPIPE, SIG_IGN);
  wf_config_set_model_check(wf_model_config_check);
  /* srun without PMIx: Open MPI would abort in MPI_Init without saying what to do. */
  if (wf_launch_precheck(wf_launch_getenv, NULL, e.err, sizeof e.err) != WF_OK) {
    const char *task = getenv("SLURM_PROCID");
    if (!task || strcmp(task, "0") == 0)
      WF_ERROR("%s", e.err);
    return WF_EXIT_INPUT;
  }
  launch_env = copy_environ();
  early_checks(&e, argc, argv);
  if (e.ok && (e.a.help || e.a.version)) {
    if (e.a.help)
      wf__print_usage(stdout);
    else
      printf("weft " WF_VERSION " (build %s)\n", wf_build_id());
    free_early(&e);
    return WF_EXIT_OK;
  }
  if (!e.ok && said_early(e.err)) {
    free_early(&e);
    return e.exit;
  }
  /* One rank and the tools (--estimate, --plan, --export, ...) need no MPI daemon. */
  wf_launch_isolate_singleton();
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    WF_ERROR("MPI_Init_thread failed");
    return WF_EXIT_FAILED;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  wf_rt_set_rank(rank);
  wf_comm *world = NULL;
  int rc = WF_EXIT_FAILED;
  if (wf_comm_world_create(&world) == WF_OK)
    rc = run(world, &e, rank, size);
  else
    WF_ERROR("cannot create the start-up communicator (see above)");
  wf_comm_destroy(world);
  free_early(&e);
  MPI_Finalize();
  return rc;
}
