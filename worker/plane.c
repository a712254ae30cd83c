/*
 * plane.c - joining the control plane from the worker.
 *
 * World rank 0 starts the coordinator service (a libuv thread), then tells every
 * rank over MPI where it listens and the job's access token. Every rank, rank 0
 * included, then starts its control thread, which registers and heartbeats once a
 * second independently of training. If the coordinator declares the job dead (a
 * rank died or hung) or the coordinator itself disappears, the control thread calls
 * on_abort, which ends this process with a non-zero status: mpirun or srun then
 * take the rest down, and nothing waits for a 30-minute NCCL or MPI timeout.
 *
 * Failure to start the service (a port in use, say) is agreed on with MPI, so every
 * rank exits with rank 0's message rather than waiting to connect.
 */
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "wf_collectives.h"
#include "wf_ckpt.h"
#include "wf_control.h"
#include "wf_launch.h"
#include "wf_model.h"
#include "wf_parallel.h"
#include "plane.h"

/* The control thread's heartbeat interval (the coordinator's default, which plane.c
 * does not change). */
#define WF_PLANE_HEARTBEAT_MS 1000

typedef struct plane_facts {
  int ok;
  int status; /* rank 0's wf_service_start status when not ok */
  char endpoint[300];
  char token[WF_TOKEN_HEX + 1];
} plane_facts;

/* The longest the launcher can take to see, on its own, that a host it cannot reach
 * is gone, in ms; 0 when that is unknown or too long to wait for.
 *
 * Open MPI's mpirun learns that a host's daemon is gone only from its TCP connection to
 * it: a keepalive that goes unanswered (oob_tcp_keepalive_time, _intvl, _probes; 300 s
 * + 9 x 20 s by default), or a send that fails. A send never fails fast over a link that
 * is down: TCP retransmits it for tcp_retries2 (about 15 minutes), and keepalive stops
 * as soon as data is waiting. The first rank to exit non-zero makes mpirun send every
 * daemon the order to kill its ranks, so a rank that exits before mpirun has seen the
 * lost host queues that order on the dead link, and mpirun then waits for its answer
 * (issue 30: ~2 minutes, then a crash inside Open MPI). Waiting out the keepalive
 * instead lets mpirun mark the host's daemon lost while its link is idle; it then kills
 * the ranks it can reach and exits, and the lost host's daemon, seeing mpirun gone the
 * same way, kills its own. mpirun passes its --mca settings to the ranks as
 * OMPI_MCA_* variables, which is where they are read. Under srun (no OMPI_COMM_WORLD_*)
 * Slurm's own node health checks decide, and nothing is waited for. */
#define LAUNCHER_DETECT_MAX_MS 30000

static double detect_ms_of(const wf_ompi_limits *lim)
{
  double ms = lim->keepalive_s * 1000.0;
  return ms > 0 && ms <= LAUNCHER_DETECT_MAX_MS ? ms : 0;
}

static double launcher_detect_ms(void)
{
  if (!getenv("OMPI_COMM_WORLD_SIZE"))
    return 0;
  wf_ompi_limits lim;
  wf_launch_ompi_limits(&lim, wf_launch_getenv, NULL, NULL);
  return detect_ms_of(&lim);
}

/* Rank 0 at start-up, once: mpirun over several hosts whose keepalive would keep it up
 * for minutes after a host is lost or cut off (weft-run and the Slurm scripts set it). */
static void say_launcher_settings(const wf_job *job)
{
  const wf_rank_facts *f = wf_job_my_facts(job);
  if (!getenv("OMPI_COMM_WORLD_SIZE") || f->local_size <= 0 || f->local_size >= wf_job_world(job))
    return;
  wf_ompi_limits lim;
  wf_launch_ompi_limits(&lim, wf_launch_getenv, NULL, NULL);
  if (detect_ms_of(&lim) > 0)
    return;
  char how_long[64] = "minutes (its TCP keepalive is off)";
  if (lim.keepalive_s > 0)
    snprintf(how_long, sizeof how_long, "%.0f s", lim.keepalive_s);
  WF_WARN("mpirun would stay up for %s after a host is lost or cut off (Open MPI's "
          "oob_tcp_keepalive_time + _intvl x _probes), though weft ends the job within its "
          "hang window: launch with scripts/weft-run, or with OMPI_MCA_oob_tcp_keepalive_time=1 "
          "OMPI_MCA_oob_tcp_keepalive_intvl=1 OMPI_MCA_oob_tcp_keepalive_probes=2 "
          "(docs/multi-node.md)",
          how_long);
}

/* Whether this rank speaks for the aborted job (wf_control_abort_spoke): only it says
 * that it waits for the launcher and that the launcher ended it, which is what the wait
 * was for, so not an error; the job's reason was said once already. */
static volatile sig_atomic_t leaving_speaks;

static void on_signal_while_leaving(int sig)
{
  static const char msg[] = "weft: ended by the launcher while leaving the aborted job\n";
  (void)sig;
  if (leaving_speaks && write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
  }
  _exit(3);
}

/* The job ends because peers went silent (a host down or cut off): stay until the
 * launcher has seen it too (launcher_detect_ms), or until it ends this process, which
 * it does with SIGTERM. The peers were last heard `silent` ms ago, and at most one
 * heartbeat before the link went, so that is where the launcher's clock started. */
static void leave_after_launcher(const wf_plane *p)
{
  double silent = wf_control_abort_silent_ms(p->ctl);
  double bound = launcher_detect_ms();
  if (silent <= 0)
    return;
  if (bound <= 0) {
    if (getenv("OMPI_COMM_WORLD_SIZE") && p->local_rank == 0)
      fprintf(stderr, "weft: mpirun may wait for the lost host's daemon until TCP gives up "
                      "(minutes): launch with OMPI_MCA_oob_tcp_keepalive_time=1 "
                      "OMPI_MCA_oob_tcp_keepalive_intvl=1 OMPI_MCA_oob_tcp_keepalive_probes=2 "
                      "so that it sees a lost host in seconds (docs/multi-node.md)\n");
    return;
  }
  double wait_ms = bound + WF_PLANE_HEARTBEAT_MS + 250 - silent;
  if (wait_ms <= 0)
    return;
  /* the launcher's "end now" replaces main's graceful stop, which would wait for a step
   * boundary that will not come */
  leaving_speaks = wf_control_abort_spoke(p->ctl);
  signal(SIGTERM, on_signal_while_leaving);
  signal(SIGINT, on_signal_while_leaving);
  if (leaving_speaks) {
    fprintf(stderr,
            "weft: waiting up to %.1f s for mpirun to see the lost host (its daemons' "
            "keepalive), so that it ends too\n",
            wait_ms / 1000.0);
    fflush(stderr);
  }
  struct timespec ts = {(time_t)(wait_ms / 1000), (long)(fmod(wait_ms, 1000) * 1e6)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* How much later than the rank that speaks for an aborted job the others end. The first
 * rank to exit makes the launcher kill the rest within milliseconds, and the speaker,
 * rank 0, is told last: the coordinator shares its process, so it tells rank 0's worker
 * 100 ms after the others (WF__RANK0_ABORT_DELAY_MS, coordinator/control_int.h), and
 * rank 0 would be killed before it said what it aborted. */
#define QUIET_LAG_MS 250

static void on_abort(void *user, const char *reason)
{
  wf_plane *p = user;
  (void)reason; /* logged once for the job: by the coordinator, or by the control thread */
  /* Called on the control thread: the main thread may be stuck inside MPI or waiting
   * for a kernel NCCL runs, so the only safe way out is to end the process here. First
   * abort every communicator of the job (NCCL's ncclCommAbort), so that no NCCL kernel
   * keeps this GPU, or a peer's, waiting for a rank that is gone. On rank 0 that skips
   * wf_service_destroy(), so remove the job file (it holds the token) and the socket
   * here: an aborted job leaves nothing behind for a console to find. A rank that does
   * not speak for the job waits first, its main thread still held in whatever it was
   * waiting in (aborting the communicators would free it to report its own error). */
  if (p && p->ctl && !wf_control_abort_spoke(p->ctl))
    usleep(QUIET_LAG_MS * 1000);
  if (p && p->job) {
    char names[1024];
    int n = wf_comm_abort_all(wf_job_world_comm(p->job), names, sizeof names);
    if (wf_control_abort_spoke(p->ctl))
      fprintf(stderr, "weft: aborted %d communicators: %s\n", n, names);
    else
      WF_DEBUG("aborted %d communicators: %s", n, names);
  }
  wf_plane_remove_files(p);
  if (p && p->ctl)
    leave_after_launcher(p);
  _exit(3);
}

void wf_plane_remove_files(const wf_plane *p)
{
  if (p)
    wf_service_remove_files(p->svc);
}

/* The job's communicators, for the flight-recorder feeds below. */
static int job_comms(const wf_job *job, wf_comm **out)
{
  int n = 0;
  out[n++] = wf_job_world_comm(job);
  for (int a = 0; a < WF_NUM_AXES; a++)
    if (wf_job_comm(job, (wf_axis)a))
      out[n++] = wf_job_comm(job, (wf_axis)a);
  return n;
}

static bool active(const wf_trace_entry *e)
{
  return e->state == WF_STATE_QUEUED || e->state == WF_STATE_RUNNING;
}

/* Heartbeats carry the operation a hang diagnosis should compare across ranks: the
 * oldest one this rank still has in flight on any communicator (a pipeline posts its
 * receives ahead, and the oldest is the one it waits for), else the one it entered
 * last. Runs on the control thread; the flight recorder is safe to read from there.
 * (Start times come from a coarse clock, so "last" breaks ties by the recorder's
 * order within a communicator, and an op in flight always wins.) */
static void last_collective(void *user, uint64_t *seq, char *op, size_t op_len, bool *is_active)
{
  enum { PER_COMM = 16 };
  wf_comm *comms[WF_NUM_AXES + 1];
  wf_trace_entry e[PER_COMM], best = {0};
  const wf_comm *where = NULL;
  int n = job_comms(user, comms);
  for (int i = 0; i < n; i++) {
    int k = wf_comm_trace_snapshot(comms[i], e, PER_COMM);
    for (int j = 0; j < k; j++) {
      bool better = !where || (active(&e[j]) && !active(&best)) ||
                    (active(&e[j]) && e[j].start_ns < best.start_ns) ||
                    (!active(&e[j]) && !active(&best) && e[j].start_ns >= best.start_ns);
      if (better)
        best = e[j], where = comms[i];
    }
  }
  if (!where)
    return;
  *seq = best.seq;
  /* A pipeline hang is a chain of point-to-point waits: name the peer (world rank),
   * so the diagnosis shows who waits for whom. */
  if ((best.op == WF_OP_SEND || best.op == WF_OP_RECV) && best.peer >= 0)
    snprintf(op, op_len, "%s(%s %s rank %d)", wf_comm_op_name(best.op), wf_comm_name(where),
             best.op == WF_OP_SEND ? "to" : "from", wf_comm_world_rank(where, best.peer));
  else
    snprintf(op, op_len, "%s(%s)", wf_comm_op_name(best.op), wf_comm_name(where));
  *is_active = active(&best);
}

/* The flight recorder's clock resolution in ms: the coarse clock's unless
 * WEFT_COMM_TRACE_CLOCK=precise (collectives/trace.c), which the trace says, so that
 * "0.000 ms" is read as "under 4 ms", not as free. */
static double trace_resolution_ms(void)
{
  const char *e = getenv("WEFT_COMM_TRACE_CLOCK");
  struct timespec res = {0, 1};
#ifdef CLOCK_MONOTONIC_COARSE
  if (!(e && strcmp(e, "precise") == 0) && clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0)
    res = (struct timespec){0, 1};
#endif
  return (double)res.tv_sec * 1e3 + (double)res.tv_nsec * 1e-6;
}

/* One recorder entry, peers as world ranks (what `ranks` shows), times at the clock's
 * resolution: "pp#12 recv 4096 x f32 (16384 B) from rank 3 done in 1.234 ms". */
static void format_entry(const wf_comm *c, const wf_trace_entry *e, double res_ms, char *buf,
                         size_t len)
{
  uint64_t end = e->end_ns ? e->end_ns : wf_now_ns();
  double ms = end > e->start_ns ? (double)(end - e->start_ns) * 1e-6 : 0.0;
  char peer[48] = "", took[48];
  if (e->peer >= 0)
    snprintf(peer, sizeof peer, " %s rank %d",
             e->op == WF_OP_BCAST  ? "root"
             : e->op == WF_OP_SEND ? "to"
                                   : "from",
             wf_comm_world_rank(c, e->peer));
  if (res_ms >= 0.01 && ms < res_ms)
    snprintf(took, sizeof took, "under %.0f ms", res_ms);
  else
    snprintf(took, sizeof took, "%.3f ms", ms);
  snprintf(buf, len, "%s#%" PRIu64 " %s %" PRIu64 " x %s (%" PRIu64 " B)%s%s %s %s %s",
           wf_comm_name(c), e->seq, wf_comm_op_name(e->op), e->count, wf_comm_dtype_name(e->dtype),
           e->bytes, peer, e->device ? " nccl" : "", wf_comm_state_name(e->state),
           e->end_ns ? "in" : "for", took);
}

/* The console's `trace`: the clock, then each communicator's recent operations, oldest
 * first. */
static void recent_collectives(void *user, char *buf, size_t len)
{
  enum { PER_COMM = 16 };
  wf_comm *comms[WF_NUM_AXES + 1];
  wf_trace_entry e[PER_COMM];
  int n = job_comms(user, comms);
  double res = trace_resolution_ms();
  size_t used = 0;
  buf[0] = '\0';
  if (res >= 0.01)
    used = (size_t)snprintf(buf, len,
                            "clock: coarse, %.0f ms resolution (WEFT_COMM_TRACE_CLOCK=precise for "
                            "ns)\n",
                            res);
  else
    used = (size_t)snprintf(buf, len, "clock: precise (ns)\n");
  for (int i = 0; i < n && used + 1 < len; i++) {
    int k = wf_comm_trace_snapshot(comms[i], e, PER_COMM);
    for (int j = 0; j < k && used + 1 < len; j++) {
      char line[256];
      format_entry(comms[i], &e[j], res, line, sizeof line);
      used += (size_t)snprintf(buf + used, len - used, "%s\n", line);
    }
  }
}

/* Append "a-b" (or "a" for one layer) to buf at *used. */
static void add_range(char *buf, size_t len, size_t *used, int a, int b)
{
  if (*used >= len)
    return;
  int k = a == b ? snprintf(buf + *used, len - *used, "%s%d", *used ? "," : "layers ", a)
                 : snprintf(buf + *used, len - *used, "%s%d-%d", *used ? "," : "layers ", a, b);
  *used += k > 0 ? (size_t)k : 0;
}

/* This rank's share of the model for the console's `ranks`, e.g. "layers 0-1 +emb",
 * "layers 2-3 +head", interleaved "layers 0,2 +emb": the same split the trainer makes
 * (wf_pipe_partition, or the interleaved chunks). Empty when it cannot be worked out
 * (the trainer then reports the error). */
static void stage_desc(const wf_config *cfg, int pp_rank, char *buf, size_t len)
{
  wf_model_dims d = wf_model_dims_from_config(cfg);
  int pp = cfg->mesh.pp, T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len;
  int bounds[WF_MAX_STAGES + 1];
  size_t used = 0;
  buf[0] = '\0';
  if (cfg->model.init[0] && !wf_weights_probe(cfg->model.init, &d))
    return;
  if (cfg->train.schedule == WF_SCHED_INTERLEAVED && pp > 1) {
    int v = cfg->parallel.virtual_stages, lc = d.L / (pp * v);
    for (int c = 0; c < v && lc > 0; c++)
      add_range(buf, len, &used, (c * pp + pp_rank) * lc, (c * pp + pp_rank + 1) * lc - 1);
  } else if (pp <= d.L && wf_pipe_partition(&d, T, pp, cfg->parallel.pp_layers,
                                            cfg->parallel.n_pp_layers, bounds) == WF_OK) {
    add_range(buf, len, &used, bounds[pp_rank], bounds[pp_rank + 1] - 1);
  }
  if (used && used < len)
    snprintf(buf + used, len - used, "%s%s", pp_rank == 0 ? " +emb" : "",
             pp_rank == pp - 1 ? " +head" : "");
}

/* The console's `schedule`: the pipeline's action grid, as --print-schedule draws it. */
static void publish_schedule(wf_service *svc, const wf_config *cfg)
{
  char *text = NULL, err[512];
  size_t n = 0;
  if (cfg->mesh.pp == 1) {
    wf_service_set_schedule(svc, "no pipeline (mesh.pp=1): every rank holds all layers and "
                                 "runs its micro-batches one after another");
    return;
  }
  FILE *f = open_memstream(&text, &n);
  if (!f)
    return;
  wf_sched_params prm = {cfg->train.schedule, cfg->mesh.pp, cfg->train.microbatches,
                         cfg->parallel.virtual_stages};
  wf_status st = wf_schedule_print(f, &prm, err, sizeof err);
  fclose(f);
  wf_service_set_schedule(svc, st == WF_OK ? text : err);
  free(text);
}

/* The port rank 0 listens on. A port the user named (MASTER_PORT, dist.master_port)
 * is kept, and a clash is an error. The default one (29500, or Slurm's 20000 + job id)
 * yields to a job already there: the coordinator takes any free port, which reaches
 * the other ranks in the endpoint broadcast below and the console in the job file. */
static int service_port(const wf_plane_opts *o)
{
  int port = o->launch->master_port;
  if (!o->port_default || !wf_service_port_taken(port))
    return port;
  WF_INFO("port %d is taken (another job on this host?); the coordinator listens on a free "
          "port instead, recorded in the job file",
          port);
  return 0;
}

static void start_service(wf_plane *p, const wf_plane_opts *o, plane_facts *pf)
{
  const wf_config *cfg = o->cfg;
  char model[160];
  snprintf(model, sizeof model, "%s (%d layers, d_model %d, %d heads, vocab %d)", cfg->model.preset,
           cfg->model.layers, cfg->model.d_model, cfg->model.heads, cfg->model.vocab);
  wf_service_opts so = {
      .job_id = wf_job_id(o->job),
      .world_size = wf_job_world(o->job),
      .mesh = *wf_job_mesh(o->job),
      .facts = wf_job_facts(o->job),
      .master_addr = o->launch->master_addr,
      .bind_addr = cfg->runtime.listen_addr,
      .port = service_port(o),
      .model_desc = model,
      .total_steps = cfg->train.steps,
      .hang_timeout_s = cfg->runtime.hang_timeout,
      .dead_after_ms = (int)(cfg->runtime.heartbeat_timeout * 1000.0),
      .metrics_port = cfg->runtime.metrics_port,
      .checkpoint_dir = cfg->train.checkpoint_dir,
  };
  wf_status st = wf_service_start(&p->svc, &so);
  if (st != WF_OK) { /* logged once, with its fix, where it arose */
    pf->status = st;
    return;
  }
  publish_schedule(p->svc, cfg);
  pf->ok = 1;
  wf_strlcpy(pf->endpoint, wf_service_endpoint(p->svc), sizeof pf->endpoint);
  wf_strlcpy(pf->token, wf_service_token(p->svc), sizeof pf->token);
}

wf_status wf_plane_start(wf_plane *p, const wf_plane_opts *o, char *err, size_t err_len)
{
  plane_facts pf;
  memset(p, 0, sizeof *p);
  memset(&pf, 0, sizeof pf);
  p->job = o->job;
  p->local_rank = wf_job_my_facts(o->job)->local_rank;
  if (wf_job_rank(o->job) == 0) {
    say_launcher_settings(o->job);
    start_service(p, o, &pf);
  }
  MPI_Bcast(&pf, sizeof pf, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (!pf.ok) {
    err[0] = '\0'; /* rank 0 said why */
    return (wf_status)pf.status;
  }
  char stage[64];
  stage_desc(o->cfg, wf_job_my_facts(o->job)->coords.pp, stage, sizeof stage);
  wf_control_opts co = {
      .endpoint = pf.endpoint,
      .token = pf.token,
      .job_id = wf_job_id(o->job),
      .facts = *wf_job_my_facts(o->job),
      .stage_desc = stage,
      .on_abort = on_abort,
      .user = p,
      .connect_timeout_ms = (int)(o->cfg->runtime.connect_timeout * 1000.0),
      .gpu_bus = o->gpu_bus,
  };
  wf_status st = wf_control_start(&p->ctl, &co);
  if (st == WF_OK) {
    wf_control_set_collective_fn(p->ctl, last_collective, (void *)o->job);
    wf_control_set_trace_fn(p->ctl, recent_collectives, (void *)o->job);
  }
  /* Which ranks could not register, so that the one message names them (each says why
   * in its own log: the address and port it tried, and the error). */
  int n = wf_job_world(o->job), mine = st == WF_OK, bad = 0;
  int *ok = calloc((size_t)n, sizeof *ok);
  if (!ok)
    return WF_ENOMEM;
  MPI_Allgather(&mine, 1, MPI_INT, ok, 1, MPI_INT, MPI_COMM_WORLD);
  size_t at = 0;
  for (int r = 0; r < n; r++) {
    if (ok[r])
      continue;
    if (bad++ < 16 && at < err_len)
      at += (size_t)snprintf(err + at, err_len - at, "%s%d", bad > 1 ? "," : "rank(s) ", r);
  }
  free(ok);
  if (bad) {
    if (at < err_len)
      snprintf(err + at, err_len - at,
               "%s could not register with the coordinator at %s (each says why above)",
               bad > 16 ? ",..." : "", pf.endpoint);
    wf_plane_stop(p);
    return WF_EUV;
  }
  return WF_OK;
}

bool wf_plane_fail(wf_plane *p, wf_status st, const char *what, int timeout_ms)
{
  MPI_Request req;
  int done = 0;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS) {
    double end = wf_now() + timeout_ms * 1e-3;
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && wf_now() < end)
      usleep(1000);
  }
  if (done)
    return true;
  /* The barrier stays posted: this process ends by the coordinator's Abort. */
  char msg[512];
  snprintf(msg, sizeof msg, "training failed on this rank alone (%s): %s", wf_status_str(st), what);
  wf_control_report_error(p->ctl, st, msg, 2000);
  return false;
}

void wf_plane_report_step(wf_plane *p, const wf_job *job, const wf_train_step_info *info,
                          double ckpt_wall, int64_t checkpoints)
{
  int stage = info->n_stages > 1 ? wf_job_my_facts(job)->coords.pp : 0;
  wf_step_report r = {
      .step = info->step,
      .steps = info->steps,
      .loss = info->loss,
      .tokens_per_s = info->tokens_per_s,
      .step_ms = info->step_ms,
      .mem_bytes = (uint64_t)info->mem_bytes,
      /* tokens_per_s is the global batch's tokens / the step time: a whole number back */
      .tokens = round(info->tokens_per_s * info->step_ms * 1e-3),
      .world_size = wf_job_world(job),
      .lr = info->lr,
      .grad_norm = info->grad_norm,
      .val_loss = info->val_loss,
      .loss_scale = info->loss_scale,
      .mfu = info->mfu,
      .compute_s = info->compute_ms * 1e-3,
      .p2p_wait_s = info->p2p_wait_ms * 1e-3,
      .tp_s = info->tp_ms * 1e-3,
      .dp_s = info->comm_ms * 1e-3,
      .bubble = info->bubble,
      .act_bytes = (uint64_t)info->stage_act_bytes[stage < WF_MAX_STAGES ? stage : 0],
      .optim_bytes = (uint64_t)info->optim_bytes,
      .param_bytes = (uint64_t)info->param_bytes,
      .grad_bytes = (uint64_t)info->grad_bytes,
      .skipped_steps = info->skipped_steps,
      .ckpt_wall = ckpt_wall,
      .checkpoints = checkpoints,
  };
  for (int i = 0; i < info->n_extra && r.n_figures < WF_STEP_FIGURES; i++) {
    wf_step_figure *f = &r.figures[r.n_figures++];
    wf_strlcpy(f->name, info->extra[i].name, sizeof f->name);
    f->value = info->extra[i].value;
  }
  wf_control_report(p->ctl, &r);
}

void wf_plane_stop(wf_plane *p)
{
  /* Every rank says Bye before rank 0 stops the service, so no rank's departure is
   * taken for a death. */
  wf_control_destroy(p->ctl);
  p->ctl = NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  wf_service_destroy(p->svc);
  p->svc = NULL;
}
