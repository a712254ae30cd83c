/*
 * wf_control.h - the control plane: the coordinator service, the worker's control
 * client, and the console client.
 *
 *   rank 0:      wf_service_start()  - a libuv thread: registry, heartbeats, watchdog,
 *                                      console server, job file, optional /metrics
 *   every rank:  wf_control_start()  - a libuv thread: Hello, a heartbeat every second,
 *                                      step reports, receives Abort and Commands
 *   console:     wf_console_*()      - blocking one-shot requests for the `coordinator`
 *                                      binary and for tests
 *
 * Neither thread ever touches MPI or NCCL, so the control plane keeps working while
 * they hang. Liveness (heartbeats from the control thread) is judged apart from
 * progress (step reports, phase and collective changes), so a slow step is not taken
 * for a dead rank. Library code never exits: when the job must end, the control
 * thread calls the caller's on_abort callback, and main decides how to exit.
 *
 * Orderly end: every rank calls wf_control_destroy() (which says Bye), the ranks
 * synchronise (MPI_Barrier), then rank 0 calls wf_service_destroy(). A connection
 * that drops without Bye is a dead rank and aborts the job.
 */
#ifndef WF_CONTROL_H
#define WF_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "wf_coordinator.h" /* wf_mesh, wf_rank_facts */
#include "wf_runtime.h"

#define WF_TOKEN_HEX 64 /* 32 random bytes as hex */

/* ---- coordinator service (world rank 0) ---------------------------------------- */

typedef struct wf_service wf_service;

typedef struct wf_service_opts {
  const char *job_id;         /* required; also names the job file and Unix socket */
  int world_size;             /* required, > 0 */
  wf_mesh mesh;               /* dp x tp x pp = world_size */
  const wf_rank_facts *facts; /* world_size entries (copied), or NULL: taken from Hello */
  const char *master_addr;    /* advertised TCP host (MASTER_ADDR); NULL = this host */
  const char *bind_addr;      /* runtime.listen_addr; NULL or "" = master_addr's address */
  int port;                   /* MASTER_PORT; 0 = any free port (tests) */
  const char *job_dir;        /* NULL = $WEFT_JOB_DIR, else /tmp/weft-$USER */
  const char *model_desc;     /* shown by `status`, e.g. "gpt2-tiny (4 layers, d 256)" */
  int64_t total_steps;        /* train.steps, for the ETA; 0 = unknown */
  double hang_timeout_s;      /* runtime.hang_timeout: no progress for this long aborts; 0 = off */
  int heartbeat_ms;           /* interval workers are told to use; 0 = 1000 */
  int dead_after_ms;          /* silence after which a worker is dead; 0 = 2000 */
  int register_timeout_ms;    /* every rank must say Hello within this; 0 = 120000 */
  int metrics_port;           /* runtime.metrics_port: Prometheus /metrics; 0 = off */
  const char *checkpoint_dir; /* train.checkpoint_dir; NULL or "" = the console's
                               * `checkpoint` is refused, naming the key */
} wf_service_opts;

/* Start listening (TCP and Unix socket), write the 0600 job file and start the
 * service thread. A port in use fails with a message naming the port and how to
 * choose another. */
wf_status wf_service_start(wf_service **out, const wf_service_opts *opts);
/* Tell the workers the job ends (Command SHUTDOWN), stop the thread, remove the job
 * file and the socket. Accepts NULL. */
void wf_service_destroy(wf_service *svc);

/* "host:port" the workers connect to, and what the console reads from the job file. */
const char *wf_service_endpoint(const wf_service *svc);
const char *wf_service_unix_path(const wf_service *svc);
const char *wf_service_job_file(const wf_service *svc);
const char *wf_service_token(const wf_service *svc); /* WF_TOKEN_HEX chars */
int wf_service_port(const wf_service *svc);          /* the bound TCP port */
/* The pipeline schedule drawn as text (one row per rank, one column per action), for
 * the console's `schedule`; until it is set, `schedule` says it is not available.
 * Copied; any thread. */
wf_status wf_service_set_schedule(wf_service *svc, const char *text);
/* Whether some process on this host already holds TCP `port` (on any address): the
 * default port then yields to a job already there. */
bool wf_service_port_taken(int port);
/* Before the job starts (rank 0): whether the service could listen where it is asked to,
 * on MASTER_ADDR's address (or bind_addr, when given) and on `port` when the user chose
 * it (0: the default, which yields). Logs what is wrong, with its fix: WF_ECONFIG for a
 * name that does not resolve, an address that is not one, a port another process
 * holds. */
wf_status wf_service_check_listen(const char *master_addr, const char *bind_addr, int port);
/* Before the job starts (rank 0): WF_ECONFIG (logged) when a running job on this host
 * already has the name runtime.job_name gives (a job file of that name in the job
 * directory); WF_OK for "" (an id of its own) or a free name. */
wf_status wf_service_check_name(const char *job_name);
/* Remove the job file and the Unix socket now, for a process about to end without
 * wf_service_destroy (an abort, a second SIGINT). Async-signal-safe; accepts NULL. */
void wf_service_remove_files(const wf_service *svc);
/* True once the watchdog aborted the job; copies the reason. */
bool wf_service_aborted(wf_service *svc, char *reason, size_t reason_len);

/* ---- control client (every rank) ------------------------------------------------ */

typedef struct wf_control wf_control;

/* Called once, from the control thread, when the coordinator sends Abort or the
 * connection to it drops. `reason` names the dead rank, its host, pid, device and
 * step. The callback may exit the process (MPI_Abort, _exit); if it returns, the
 * control thread stays up and wf_control_aborted() is true. */
typedef void (*wf_control_abort_fn)(void *user, const char *reason);

typedef struct wf_control_opts {
  const char *endpoint; /* "host:port" or "unix:/path/to/job.sock" */
  const char *token;
  const char *job_id;     /* NULL = accept any */
  wf_rank_facts facts;    /* this rank */
  const char *stage_desc; /* e.g. "layers 0-5"; NULL = "" */
  wf_control_abort_fn on_abort;
  void *user;
  int connect_timeout_ms; /* keep retrying while rank 0 starts, then fail naming the
                           * address and port tried; 0 = 30000 */
  const char *gpu_bus;    /* the rank's GPU's PCI bus id: heartbeats carry its NVML
                           * utilisation and memory; NULL or "" = no GPU */
} wf_control_opts;

/* Connect, register (Hello -> Welcome) and start heartbeats. Returns only once the
 * coordinator accepted this rank, or with an error saying why it did not. */
wf_status wf_control_start(wf_control **out, const wf_control_opts *opts);
/* Say Bye, close and join the thread. Accepts NULL. */
void wf_control_destroy(wf_control *ctl);

/* Non-blocking calls for the training loop (any thread). Strings are copied. A NULL
 * `ctl` (no control plane) makes them no-ops and the predicates false. */
void wf_control_report_step(wf_control *ctl, int64_t step, double loss, double tokens_per_s,
                            double step_ms, uint64_t mem_bytes);

/* Everything a step tells the coordinator, for the console and /metrics. Times in
 * seconds and this rank's own; NAN where a figure does not apply (see weft.proto). */
#define WF_STEP_FIGURES 16 /* named figures a report carries (a model's; weft.proto's Figure) */
typedef struct wf_step_figure {
  char name[48]; /* as the metrics file names it: letters, digits, '_' and '/' */
  double value;
} wf_step_figure;
typedef struct wf_step_report {
  int64_t step, steps;
  double loss, tokens_per_s, step_ms;
  uint64_t mem_bytes;
  double tokens; /* the job's tokens in this step */
  int world_size;
  double lr, grad_norm, val_loss, loss_scale, mfu;
  double compute_s, p2p_wait_s, tp_s, dp_s, bubble;
  uint64_t act_bytes, optim_bytes, param_bytes, grad_bytes; /* memory by kind */
  int64_t skipped_steps;
  double ckpt_wall;    /* wall time (s since the epoch) the last checkpoint ended; 0 = none */
  int64_t checkpoints; /* checkpoints written by this run */
  int n_figures;       /* a model's named figures of the step (a MoE router's) */
  wf_step_figure figures[WF_STEP_FIGURES];
} wf_step_report;
void wf_control_report(wf_control *ctl, const wf_step_report *r);
/* "forward", "backward", "optimizer", ... A phase beginning with "checkpoint" is never
 * taken for a hang, however long it lasts (liveness still comes from heartbeats). */
void wf_control_set_phase(wf_control *ctl, const char *phase);
/* The collective this rank entered last (active) or finished last (!active); the
 * heartbeat carries it, and the hang diagnosis compares it across ranks. */
void wf_control_set_collective(wf_control *ctl, uint64_t seq, const char *op, bool active);
/* Optional pull-style source of the last collective, called from the control
 * thread before each heartbeat; overrides wf_control_set_collective(). */
typedef void (*wf_control_collective_fn)(void *user, uint64_t *seq, char *op, size_t op_len,
                                         bool *active);
void wf_control_set_collective_fn(wf_control *ctl, wf_control_collective_fn fn, void *user);
/* Optional source of the rank's recent collectives for the console's `trace`: write
 * them into buf, one line each, oldest first, NUL-terminated. Called from the control
 * thread when a console asks; it must not block (the flight recorder's snapshot is
 * safe from any thread). */
typedef void (*wf_control_trace_fn)(void *user, char *buf, size_t len);
void wf_control_set_trace_fn(wf_control *ctl, wf_control_trace_fn fn, void *user);
/* Tell the coordinator this rank is failing, so it can abort the others with the
 * message. Waits at most `wait_ms` for the message to leave. */
void wf_control_report_error(wf_control *ctl, wf_status code, const char *message, int wait_ms);

bool wf_control_stop_requested(wf_control *ctl);       /* console `stop` (sticky) */
bool wf_control_checkpoint_requested(wf_control *ctl); /* console `checkpoint`; consumes it */
bool wf_control_aborted(wf_control *ctl);
/* For on_abort: > 0 when the job ends because peers went silent with their connections
 * open (a host down or cut off: the coordinator heard nothing from ranks elsewhere, or
 * this rank nothing from the coordinator), for that many ms; 0 when a peer died (its
 * connection closed) or reported an error. */
double wf_control_abort_silent_ms(const wf_control *ctl);
/* After on_abort: whether this rank speaks for the aborted job (rank 0, or the rank that
 * said that the coordinator is lost): what else it says about the abort is said once
 * for the job (or once per host, when rank 0's is lost) rather than by every rank. */
bool wf_control_abort_spoke(const wf_control *ctl);

/* ---- console client ------------------------------------------------------------- */

typedef struct wf_console_job {
  char id[128];
  char endpoint[300];  /* host:port */
  char unix_path[512]; /* "" when none */
  char token[WF_TOKEN_HEX + 1];
  char view[320]; /* the live view's http://HOST:PORT/; "" when the job serves none */
  int pid, world_size;
  char host[256];    /* rank 0's host; "" in job files written before it was recorded */
  double start_time; /* seconds since the epoch */
  char file[600];    /* the job file it came from */
} wf_console_job;

typedef enum wf_console_cmd {
  WF_CONSOLE_STATUS = 0,
  WF_CONSOLE_RANKS,
  WF_CONSOLE_MESH,
  WF_CONSOLE_SCHEDULE,
  WF_CONSOLE_TRACE,
  WF_CONSOLE_CHECKPOINT,
  WF_CONSOLE_STOP,
  WF_CONSOLE_NUM_CMDS
} wf_console_cmd;

/* "status", "ranks", ...; parse returns -1 when unknown. */
const char *wf_console_cmd_name(wf_console_cmd cmd);
int wf_console_cmd_parse(const char *name);

/* The job directory: $WEFT_JOB_DIR, else /tmp/weft-$USER. Returns `buf`. */
const char *wf_job_dir_default(char *buf, size_t len);
/* Read one job file. */
wf_status wf_console_job_load(const char *path, wf_console_job *out, char *err, size_t err_len);
/* Jobs in `dir` (NULL = default) whose process is alive, newest first. Returns the
 * count (at most `max`), or -1 when the directory cannot be read. */
int wf_console_find_jobs(const char *dir, wf_console_job *jobs, int max);
/* Job files in `dir` whose process is gone (a job killed with its reaper, a host that
 * went down): what the console names as stale. Same return as wf_console_find_jobs. */
int wf_console_find_stale(const char *dir, wf_console_job *jobs, int max);
/* Whether the job's rank 0 is known to be gone: its pid, on this host, is not running. */
bool wf_console_job_stale(const wf_console_job *job);

/* Send one query or command and wait for the reply (JSON, malloc()ed, caller
 * frees). Uses the Unix socket when the job has one, else TCP with the token. */
wf_status wf_console_request(const wf_console_job *job, wf_console_cmd cmd, int timeout_ms,
                             char **json, char *err, size_t err_len);
/* Print a reply as text for people. */
wf_status wf_console_render(wf_console_cmd cmd, const char *json, FILE *out);

#endif /* WF_CONTROL_H */
