/*
 * wf_launch.h - who am I in this job: rank, world size, local rank, master address.
 *
 * Sources, highest precedence first: explicit flags (the config's dist.* keys),
 * torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*), PMI/PMIx (PMI_RANK,
 * PMI_SIZE, PMIX_RANK), then Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...).
 *
 * Detection is pure: it reads a caller-supplied environment, so every source and
 * every disagreement is unit-testable without MPI. wf_launch_crosscheck() compares
 * the result with what MPI says and writes one message a user can act on.
 */
#ifndef WF_LAUNCH_H
#define WF_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_runtime.h"

typedef enum wf_launch_source {
  WF_LAUNCH_NONE = 0, /* nothing found: a singleton started by hand */
  WF_LAUNCH_FLAGS,
  WF_LAUNCH_TORCHRUN,
  WF_LAUNCH_OMPI,
  WF_LAUNCH_PMI,
  WF_LAUNCH_SLURM,
} wf_launch_source;

typedef struct wf_launch {
  wf_launch_source source;    /* where rank and world size came from */
  int rank, world_size;       /* -1 when no source gave them */
  int local_rank, local_size; /* -1 when unknown (MPI's shared-memory split decides) */
  int num_nodes;              /* -1 when unknown */
  char master_addr[256];
  int master_port;
  wf_launch_source master_source; /* where master_addr came from (NONE = default) */
  bool slurm;                     /* running inside a Slurm step */
  bool slurm_batch;               /* the batch script's own process (sbatch), not an srun task */
  int slurm_ntasks;               /* -1 when not under Slurm */
  char slurm_job_id[64];
  char slurm_first_host[256];
} wf_launch;

/* Environment lookup: returns the value or NULL. `ctx` is passed through. */
typedef const char *(*wf_getenv_fn)(void *ctx, const char *name);

/* Looks `name` up in ctx, a NULL-terminated "NAME=value" array like environ (a
 * snapshot, or a test's fake environment), or in the process environment when ctx
 * is NULL. */
const char *wf_launch_getenv(void *ctx, const char *name);

/* Fill `out` from flags (flag_rank/flag_world < 0 when not given) and the
 * environment. Returns WF_ELAUNCH with a message when the environment contradicts
 * itself (e.g. RANK >= WORLD_SIZE, a number that does not parse). */
wf_status wf_launch_detect(wf_launch *out, int flag_rank, int flag_world, wf_getenv_fn getenv_fn,
                           void *ctx, char *err, size_t err_len);

/* Before MPI_Init: refuse a task that srun started without PMIx (--mpi=none or
 * --mpi=pmi2). Open MPI would abort inside MPI_Init with a message about building
 * Slurm, so this says which --mpi to use instead. WF_OK when not in an srun step. */
wf_status wf_launch_precheck(wf_getenv_fn getenv_fn, void *ctx, char *err, size_t err_len);

/* True when no MPI launcher started this process (no mpirun, no PMIx or PMI server):
 * MPI_Init will make it a singleton, a world of one. */
bool wf_launch_is_singleton(wf_getenv_fn getenv_fn, void *ctx);

/* Before MPI_Init of a process no launcher started: a singleton needs no daemon, so tell
 * Open MPI not to fork its `orted` (OMPI_MCA_ess_singleton_isolated=1, unless the user
 * set it). The fork costs seconds beside busy ranks and needs orted installed. */
void wf_launch_isolate_singleton(void);

/* ---- Open MPI's settings that bound weft's own handling ----------------------------------
 * How long mpirun gives the ranks when it ends a job (a Ctrl-C, a failed rank): SIGCONT,
 * SIGTERM sigkill_timeout_s later, SIGKILL to each rank's process group as long again,
 * and mpirun exits only after both waits, whatever the ranks did (odls_base_sigkill_timeout,
 * default 1). And how long it takes to see, by itself, that a host it cannot reach is
 * gone: oob_tcp_keepalive_time + _intvl x _probes (300 + 20 x 9 s by default).
 * mpirun passes its --mca settings and its OMPI_MCA_* variables to the ranks as OMPI_MCA_*
 * variables, which are read first; then the parameter files, the user's
 * ($HOME/.openmpi/mca-params.conf) before the system's (`sysconf`, NULL: Debian's
 * /etc/openmpi/openmpi-mca-params.conf); then Open MPI's defaults. */
typedef struct wf_ompi_limits {
  double sigkill_timeout_s; /* odls_base_sigkill_timeout */
  double keepalive_s;       /* time + intvl x probes; 0: keepalive off (time <= 0) */
} wf_ompi_limits;
#define WF_OMPI_SYSCONF "/etc/openmpi/openmpi-mca-params.conf"
void wf_launch_ompi_limits(wf_ompi_limits *out, wf_getenv_fn getenv_fn, void *ctx,
                           const char *sysconf);
/* One Open MPI parameter's value as above (without the default), into val; false when
 * nothing sets it. */
bool wf_launch_ompi_param(const char *name, wf_getenv_fn getenv_fn, void *ctx, const char *sysconf,
                          char *val, size_t len);

/* Compare with MPI's view. mpi_local_rank/size come from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Fills unknown fields from MPI.
 * Returns WF_ELAUNCH with a message naming the variables and the fix. */
wf_status wf_launch_crosscheck(wf_launch *l, int mpi_rank, int mpi_size, int mpi_local_rank,
                               int mpi_local_size, char *err, size_t err_len);

/* Default MASTER_ADDR/MASTER_PORT when no variable gave them: the first host of the
 * Slurm node list, else `rank0_host`; port 29500, or derived from SLURM_JOB_ID. */
void wf_launch_default_master(wf_launch *l, const char *rank0_host);

const char *wf_launch_source_str(wf_launch_source s);

/* Expand a Slurm node list ("gpu[01-04,07],cpu3") into `n_max` names of `name_len`
 * bytes each. Returns the number of hosts, or -1 with `err` set when malformed or
 * when there are more than n_max. Pass names = NULL to only count. */
int wf_nodelist_expand(const char *list, char *names, int n_max, size_t name_len, char *err,
                       size_t err_len);

#endif /* WF_LAUNCH_H */
