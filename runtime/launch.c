/*
 * launch.c - reading the launch environment and checking it against MPI.
 *
 * Sources in precedence order: explicit flags, torchrun-style variables, Open MPI,
 * PMI/PMIx, Slurm. The first source that names a rank wins and is recorded; the
 * others are ignored for rank/size (an sbatch script's SLURM_* variables are still
 * set inside an mpirun it starts, and must not override OMPI_*).
 *
 * Everything here is pure: the environment comes through a lookup function, so
 * unit tests can exercise every source and every contradiction without MPI.
 * Messages say which variable said what, what MPI says, and what to do.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_launch.h"

#define DEFAULT_MASTER_PORT 29500

const char *wf_launch_getenv(void *ctx, const char *name)
{
  char *const *env = ctx;
  if (!env)
    return getenv(name);
  size_t n = strlen(name);
  for (; *env; env++)
    if (!strncmp(*env, name, n) && (*env)[n] == '=')
      return *env + n + 1;
  return NULL;
}

const char *wf_launch_source_str(wf_launch_source s)
{
  switch (s) {
  case WF_LAUNCH_NONE: return "none (singleton)";
  case WF_LAUNCH_FLAGS: return "flags (dist.rank/dist.world_size)";
  case WF_LAUNCH_TORCHRUN: return "torchrun variables (RANK/WORLD_SIZE)";
  case WF_LAUNCH_OMPI: return "Open MPI (OMPI_COMM_WORLD_*)";
  case WF_LAUNCH_PMI: return "PMI/PMIx (PMI_RANK/PMI_SIZE, PMIX_RANK)";
  case WF_LAUNCH_SLURM: return "Slurm (SLURM_PROCID/SLURM_NTASKS)";
  }
  return "unknown";
}

typedef struct env_reader {
  wf_getenv_fn get;
  void *ctx;
  char *err;
  size_t err_len;
  bool bad;
} env_reader;

/* Reads a non-negative integer variable. Returns -1 when unset; sets r->bad and
 * the message when it is set but not a number. */
static int env_int(env_reader *r, const char *name)
{
  const char *v = r->get(r->ctx, name);
  if (!v || !*v)
    return -1;
  char *end = NULL;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end != '\0' || x < 0 || x > INT_MAX) {
    if (!r->bad)
      snprintf(r->err, r->err_len, "%s='%s' is not a non-negative integer; fix or unset it", name,
               v);
    r->bad = true;
    return -1;
  }
  return (int)x;
}

/* One source's names for rank, size, local rank and local size (NULL = none). */
typedef struct source_vars {
  wf_launch_source src;
  const char *rank, *size, *local_rank, *local_size;
} source_vars;

static const source_vars sources[] = {
    {WF_LAUNCH_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {WF_LAUNCH_OMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {WF_LAUNCH_PMI, "PMI_RANK", "PMI_SIZE", NULL, NULL},
    {WF_LAUNCH_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

/* Fill rank/size from one source. Returns true when the source named a rank. */
static bool read_source(env_reader *r, const source_vars *s, wf_launch *out)
{
  int rank = env_int(r, s->rank);
  int size = env_int(r, s->size);
  if (s->src == WF_LAUNCH_PMI && rank < 0)
    rank = env_int(r, "PMIX_RANK");
  if (s->src == WF_LAUNCH_SLURM && r->get(r->ctx, "SLURM_STEP_NUM_TASKS"))
    size = env_int(r, "SLURM_STEP_NUM_TASKS");
  if (r->bad || (rank < 0 && size < 0))
    return false;
  if (rank < 0 || size < 0) {
    if (s->src == WF_LAUNCH_PMI) /* PMIx gives no size; MPI will. */
      size = -1;
    else if (!r->bad) {
      snprintf(r->err, r->err_len, "%s is set but %s is not: set both or neither",
               rank < 0 ? s->size : s->rank, rank < 0 ? s->rank : s->size);
      r->bad = true;
      return false;
    }
  }
  out->source = s->src;
  out->rank = rank;
  out->world_size = size;
  out->local_rank = s->local_rank ? env_int(r, s->local_rank) : -1;
  out->local_size = s->local_size ? env_int(r, s->local_size) : -1;
  return true;
}

static void read_slurm(env_reader *r, wf_launch *out)
{
  const char *procid = r->get(r->ctx, "SLURM_PROCID");
  const char *job = r->get(r->ctx, "SLURM_JOB_ID");
  out->slurm = procid != NULL || job != NULL;
  out->slurm_ntasks = -1;
  if (!out->slurm)
    return;
  /* The batch step (the sbatch script itself) has SLURM_PROCID=0 and the
   * allocation's SLURM_NTASKS but no step id: its SLURM_NTASKS is not our world. */
  out->slurm_batch = job && procid && strcmp(procid, "0") == 0 &&
                     !r->get(r->ctx, "SLURM_STEP_ID") && !r->get(r->ctx, "SLURM_STEPID");
  out->slurm_ntasks = env_int(r, "SLURM_STEP_NUM_TASKS");
  if (out->slurm_ntasks < 0)
    out->slurm_ntasks = env_int(r, "SLURM_NTASKS");
  int nnodes = env_int(r, "SLURM_NNODES");
  if (nnodes > 0 && out->num_nodes < 0)
    out->num_nodes = nnodes;
  if (job)
    wf_strlcpy(out->slurm_job_id, job, sizeof out->slurm_job_id);
  const char *list = r->get(r->ctx, "SLURM_JOB_NODELIST");
  if (!list)
    list = r->get(r->ctx, "SLURM_NODELIST");
  if (list && *list) {
    char e[256];
    int n = wf_nodelist_expand(list, NULL, 0, 256, e, sizeof e);
    char *names = n > 0 ? malloc((size_t)n * 256) : NULL;
    if (names && wf_nodelist_expand(list, names, n, 256, e, sizeof e) == n) {
      wf_strlcpy(out->slurm_first_host, names, sizeof out->slurm_first_host);
    } else if (!r->bad) {
      snprintf(r->err, r->err_len, "SLURM_JOB_NODELIST='%s': %s", list, e);
      r->bad = true;
    }
    free(names);
  }
}

static void read_master(env_reader *r, wf_launch *out)
{
  const char *addr = r->get(r->ctx, "MASTER_ADDR");
  if (addr && *addr) {
    wf_strlcpy(out->master_addr, addr, sizeof out->master_addr);
    out->master_source = WF_LAUNCH_TORCHRUN;
  }
  int port = env_int(r, "MASTER_PORT");
  if (port == 0 || port > 65535) {
    if (!r->bad)
      snprintf(r->err, r->err_len, "MASTER_PORT=%d is not a TCP port (1-65535)", port);
    r->bad = true;
  } else if (port > 0) {
    out->master_port = port;
  }
}

wf_status wf_launch_detect(wf_launch *out, int flag_rank, int flag_world, wf_getenv_fn getenv_fn,
                           void *ctx, char *err, size_t err_len)
{
  memset(out, 0, sizeof *out);
  out->rank = out->world_size = out->local_rank = out->local_size = -1;
  out->num_nodes = -1;
  env_reader r = {getenv_fn, ctx, err, err_len, false};
  err[0] = '\0';

  if (flag_rank >= 0 || flag_world > 0) {
    out->source = WF_LAUNCH_FLAGS;
    out->rank = flag_rank;
    out->world_size = flag_world > 0 ? flag_world : -1;
  }
  for (size_t i = 0; i < WF_ARRAY_LEN(sources) && out->source == WF_LAUNCH_NONE && !r.bad; i++)
    read_source(&r, &sources[i], out);
  read_slurm(&r, out);
  read_master(&r, out);
  if (r.bad)
    return WF_ELAUNCH;
  if (out->rank >= 0 && out->world_size > 0 && out->rank >= out->world_size) {
    snprintf(err, err_len, "rank %d is not below world size %d (from %s); fix the variables",
             out->rank, out->world_size, wf_launch_source_str(out->source));
    return WF_ELAUNCH;
  }
  if (out->local_rank >= 0 && out->local_size > 0 && out->local_rank >= out->local_size) {
    snprintf(err, err_len, "local rank %d is not below local size %d (from %s)", out->local_rank,
             out->local_size, wf_launch_source_str(out->source));
    return WF_ELAUNCH;
  }
  return WF_OK;
}

wf_status wf_launch_precheck(wf_getenv_fn getenv_fn, void *ctx, char *err, size_t err_len)
{
  const char *step = getenv_fn(ctx, "SLURM_STEP_ID");
  if (!step)
    step = getenv_fn(ctx, "SLURM_STEPID");
  err[0] = '\0';
  /* mpirun's ranks (OMPI_*) and srun --mpi=pmix tasks (PMIX_RANK) can join a job. */
  if (!step || !getenv_fn(ctx, "SLURM_PROCID") || getenv_fn(ctx, "PMIX_RANK") ||
      getenv_fn(ctx, "OMPI_COMM_WORLD_SIZE"))
    return WF_OK;
  const char *n = getenv_fn(ctx, "SLURM_STEP_NUM_TASKS");
  const char *job = getenv_fn(ctx, "SLURM_JOB_ID");
  bool pmi2 = getenv_fn(ctx, "PMI_FD") != NULL;
  snprintf(err, err_len,
           "srun started this task (job %s, step %s, %s tasks) with %s, which this Open MPI "
           "cannot use: it would abort in MPI_Init. Launch with `srun --mpi=pmix ...` "
           "(`srun --mpi=list` shows what the cluster offers), or run `mpirun` inside the "
           "allocation",
           job ? job : "?", step, n ? n : "?",
           pmi2 ? "PMI-2 (--mpi=pmi2)" : "no PMIx (--mpi=none, or the cluster's MpiDefault)");
  return WF_ELAUNCH;
}

bool wf_launch_is_singleton(wf_getenv_fn getenv_fn, void *ctx)
{
  /* mpirun's ranks, PMIx clients (srun --mpi=pmix, prterun) and PMI-1/2 clients. */
  static const char *const launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMIX_NAMESPACE",
                                         "PMI_FD", "PMI_RANK"};
  for (size_t i = 0; i < WF_ARRAY_LEN(launched); i++)
    if (getenv_fn(ctx, launched[i]))
      return false;
  return true;
}

void wf_launch_isolate_singleton(void)
{
  if (wf_launch_is_singleton(wf_launch_getenv, NULL))
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
}

/* The message for N processes that each found an MPI world of one. */
static void singleton_message(const wf_launch *l, char *err, size_t err_len)
{
  if (l->source == WF_LAUNCH_SLURM && l->slurm_batch)
    snprintf(err, err_len,
             "this is the batch script of Slurm job %s, which has %d tasks, but the worker ran "
             "as one process. Start the ranks from the script with `srun --mpi=pmix ./worker "
             "...` or `mpirun ./worker ...`, or submit with --ntasks=1 to train on one rank",
             l->slurm_job_id, l->world_size);
  else if (l->source == WF_LAUNCH_SLURM)
    snprintf(err, err_len,
             "Slurm started %d tasks but MPI sees a world of 1: srun launched independent "
             "singletons because it has no PMI this Open MPI understands. Launch with "
             "`srun --mpi=pmix ...` (Open MPI here supports PMIx, not PMI-2 or --mpi=none), "
             "or run `mpirun` inside the allocation",
             l->world_size);
  else
    snprintf(err, err_len,
             "%s says world size %d but MPI sees a world of 1: each process started alone. "
             "weft ranks are MPI processes: launch with `mpirun -np %d ./worker ...` or "
             "`srun --mpi=pmix -n %d ./worker ...`, or unset the variables",
             wf_launch_source_str(l->source), l->world_size, l->world_size, l->world_size);
}

static wf_status check_local(wf_launch *l, int mpi_local_rank, int mpi_local_size, char *err,
                             size_t err_len)
{
  if (l->local_rank >= 0 && l->local_rank != mpi_local_rank) {
    snprintf(err, err_len,
             "local rank %d (from %s) contradicts the node: MPI finds this process is local "
             "rank %d of %d on %s; fix or unset LOCAL_RANK",
             l->local_rank, wf_launch_source_str(l->source), mpi_local_rank, mpi_local_size,
             wf_rt_host());
    return WF_ELAUNCH;
  }
  if (l->local_size > 0 && l->local_size != mpi_local_size) {
    snprintf(err, err_len,
             "local world size %d (from %s) contradicts the node: MPI finds %d processes on "
             "%s; fix or unset LOCAL_WORLD_SIZE",
             l->local_size, wf_launch_source_str(l->source), mpi_local_size, wf_rt_host());
    return WF_ELAUNCH;
  }
  l->local_rank = mpi_local_rank;
  l->local_size = mpi_local_size;
  return WF_OK;
}

wf_status wf_launch_crosscheck(wf_launch *l, int mpi_rank, int mpi_size, int mpi_local_rank,
                               int mpi_local_size, char *err, size_t err_len)
{
  if (l->world_size > 1 && mpi_size == 1) {
    singleton_message(l, err, err_len);
    return WF_ELAUNCH;
  }
  if (l->world_size > 0 && l->world_size != mpi_size) {
    snprintf(err, err_len,
             "world size %d (from %s) disagrees with MPI's world of %d processes; launch "
             "%d processes or fix the variables",
             l->world_size, wf_launch_source_str(l->source), mpi_size, l->world_size);
    return WF_ELAUNCH;
  }
  if (l->rank >= 0 && l->rank != mpi_rank) {
    snprintf(err, err_len,
             "rank %d (from %s) disagrees with MPI rank %d: the variables do not describe "
             "this process; unset them or fix the launcher",
             l->rank, wf_launch_source_str(l->source), mpi_rank);
    return WF_ELAUNCH;
  }
  l->rank = mpi_rank;
  l->world_size = mpi_size;
  return check_local(l, mpi_local_rank, mpi_local_size, err, err_len);
}

void wf_launch_default_master(wf_launch *l, const char *rank0_host)
{
  if (l->master_addr[0] == '\0')
    wf_strlcpy(l->master_addr, l->slurm_first_host[0] ? l->slurm_first_host : rank0_host,
               sizeof l->master_addr);
  if (l->master_port == 0) {
    /* Jobs sharing a node under Slurm get distinct ports: 20000 + id mod 20000
     * stays clear of the ephemeral range (32768+) and of privileged ports. */
    long id = l->slurm_job_id[0] ? strtol(l->slurm_job_id, NULL, 10) : -1;
    l->master_port = id >= 0 ? 20000 + (int)(id % 20000) : DEFAULT_MASTER_PORT;
  }
}

/* ---- Open MPI's settings ------------------------------------------------------------------ */

/* `name` in an Open MPI parameter file ("name = value" lines, '#' comments). */
static bool param_in_file(const char *path, const char *name, char *val, size_t len)
{
  char line[1024];
  bool found = false;
  FILE *f = path ? fopen(path, "r") : NULL;
  while (f && fgets(line, sizeof line, f)) {
    char *k = line + strspn(line, " \t"), *eq = strchr(k, '=');
    size_t n = strcspn(k, " \t=");
    if (*k == '#' || !eq || n != strlen(name) || strncmp(k, name, n))
      continue;
    char *v = eq + 1 + strspn(eq + 1, " \t");
    v[strcspn(v, " \t\r\n#")] = '\0';
    snprintf(val, len, "%s", v);
    found = true; /* the last setting wins, as in Open MPI */
  }
  if (f)
    fclose(f);
  return found;
}

bool wf_launch_ompi_param(const char *name, wf_getenv_fn getenv_fn, void *ctx, const char *sysconf,
                          char *val, size_t len)
{
  char var[256], user[4096];
  snprintf(var, sizeof var, "OMPI_MCA_%s", name);
  const char *v = getenv_fn(ctx, var), *home = getenv_fn(ctx, "HOME");
  if (v) {
    snprintf(val, len, "%s", v);
    return true;
  }
  snprintf(user, sizeof user, "%s/.openmpi/mca-params.conf", home ? home : "");
  return (home && param_in_file(user, name, val, len)) ||
         param_in_file(sysconf ? sysconf : WF_OMPI_SYSCONF, name, val, len);
}

static double param_or(const char *name, double def, wf_getenv_fn g, void *ctx, const char *sc)
{
  char v[64], *end;
  if (!wf_launch_ompi_param(name, g, ctx, sc, v, sizeof v))
    return def;
  double x = strtod(v, &end);
  return end != v ? x : def;
}

void wf_launch_ompi_limits(wf_ompi_limits *out, wf_getenv_fn getenv_fn, void *ctx,
                           const char *sysconf)
{
  /* Open MPI 4.1's defaults (ompi_info --param odls base / oob tcp --level 9) */
  double t = param_or("oob_tcp_keepalive_time", 300, getenv_fn, ctx, sysconf);
  double i = param_or("oob_tcp_keepalive_intvl", 20, getenv_fn, ctx, sysconf);
  double n = param_or("oob_tcp_keepalive_probes", 9, getenv_fn, ctx, sysconf);
  out->sigkill_timeout_s = param_or("odls_base_sigkill_timeout", 1, getenv_fn, ctx, sysconf);
  out->keepalive_s = t > 0 ? t + i * n : 0;
}
