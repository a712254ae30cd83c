/*
 * job.c - the training job on the mesh: the control plane, the stop requests and the
 * way a failure ends the job; and --generate and --dump-state, which use the mesh's
 * groups without the control plane.
 *
 * Stopping. SIGINT and SIGTERM ask for a graceful stop, as the console's `stop` does:
 * the signal handler only sets a flag, every rank agrees on it at the next step
 * boundary (an all-reduce: a signal reaches ranks at different moments, and one rank
 * leaving the loop alone would leave the others waiting in the next step's
 * collectives), the trainer writes its checkpoint when train.checkpoint_dir is set,
 * and the job exits 0 with its job file and socket removed. A request that arrives
 * while a checkpoint is being written stops the job right after that checkpoint.
 *
 * Launchers do not pass a terminal's Ctrl-C on: mpirun and orted end a job by sending
 * each rank SIGCONT, then SIGTERM a second later (Open MPI's odls_base_sigkill_timeout,
 * 1 s), then SIGKILL after as long again; slurmstepd sends SIGCONT and SIGTERM, then
 * SIGKILL after KillWait (30 s). So a SIGCONT from the parent process while this rank
 * was not stopped by job control is the launcher ending the job: it starts the graceful
 * stop at once (under mpirun it has to be done within those 2 s; where a step and a
 * checkpoint take longer, the ranks leave the checkpoint to writers that outlive the job,
 * worker/train/rescue.c), and what the launcher sends next belongs to the same request. Any other
 * second SIGINT or SIGTERM (Ctrl-C twice in a terminal, a second `kill`, the launcher's death)
 * stops at once: rank 0 removes the job file and the socket, and the process exits with 128 + the
 * signal.
 *
 * Rank 0's standard output closed by its reader (`worker ... | head`) stops the job the
 * same graceful way: SIGPIPE is ignored (main.c), the trainer sees the step line's
 * write fail with EPIPE, and this rank asks for the stop as a signal would.
 */
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "commands.h"
#include "plane.h"
#include "wf_control.h"
#include "wf_kernels.h"
#include "wf_launch.h"
#include "wf_train.h"

int wf__exit_status(wf_status st)
{
  switch (st) {
  case WF_OK: return WF_EXIT_OK;
  case WF_ECONFIG:
  case WF_ELAUNCH:
  case WF_EFORMAT: return WF_EXIT_INPUT;
  case WF_EABORTED: return WF_EXIT_ABORTED;
  default: return WF_EXIT_FAILED;
  }
}

/* ---- stop requests ------------------------------------------------------------------ */

static volatile sig_atomic_t stop_sig;       /* the request's signal; 0 = none */
static volatile sig_atomic_t job_stopped;    /* stopped by SIGTSTP: the next SIGCONT resumes */
static volatile sig_atomic_t launcher_asked; /* the request came from the launcher, which
                                                repeats itself (SIGCONT, SIGTERM, ...) */
static const wf_plane *sig_plane;            /* rank 0: the job file and socket to remove */
static int sig_rank = -1;

static void say(const char *msg)
{
  ssize_t w = write(STDERR_FILENO, msg, strlen(msg));
  (void)w;
}

/* A second request: end here. Only async-signal-safe calls (write, unlink, _exit). */
static void stop_at_once(int sig)
{
  wf_plane_remove_files(sig_plane);
  say(sig == SIGINT ? "weft: a second SIGINT: stopping at once, without a checkpoint\n"
                    : "weft: a second SIGTERM: stopping at once, without a checkpoint\n");
  _exit(WF_EXIT_SIGNAL + sig);
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
  (void)uc;
  bool from_launcher = si && si->si_code == SI_USER && si->si_pid == getppid();
  if (sig == SIGTSTP) { /* Ctrl-Z, or mpirun passing it on: stop as the default would */
    job_stopped = 1;
    raise(SIGSTOP);
    return;
  }
  if (sig == SIGCONT && (job_stopped || !from_launcher)) { /* `fg`, or someone else's */
    job_stopped = 0;
    return;
  }
  if (from_launcher) /* a SIGKILL follows: the writers of a stop's checkpoint (rescue.c) */
    wf_train_rescue_request();
  if (stop_sig) {
    if (launcher_asked && from_launcher)
      return; /* the launcher's next signal of the same request */
    stop_at_once(sig);
  }
  stop_sig = sig;
  launcher_asked = from_launcher;
  if (sig_rank == 0)
    say(sig == SIGCONT && wf_train_rescue_armed()
            ? "weft: the launcher is ending the job, and would kill it before a step and a "
              "checkpoint: stopping after the last completed step\n"
        : sig == SIGCONT
            ? "weft: the launcher is ending the job: stopping at the next step boundary\n"
        : sig == SIGINT
            ? "weft: SIGINT: stopping at the next step boundary (Ctrl-C again stops at once)\n"
            : "weft: SIGTERM: stopping at the next step boundary (a second one stops at once)\n");
}

static void install_signals(const wf_plane *plane, int rank, const wf_launch *launch)
{
  struct sigaction sa;
  sig_plane = rank == 0 ? plane : NULL;
  sig_rank = rank;
  /* A rank never outlives its launcher (mpirun, orted, slurmstepd): when it dies (a
   * second Ctrl-C to mpirun, kill -9), the kernel sends SIGTERM, which stops at once if
   * a request came before and gracefully otherwise. Not for a worker started by hand or
   * by a script (alone, or with RANK/WORLD_SIZE): `nohup worker &` must survive its
   * shell. */
  wf_launch_source s = launch->source;
  if (s == WF_LAUNCH_OMPI || s == WF_LAUNCH_PMI || s == WF_LAUNCH_SLURM)
    prctl(PR_SET_PDEATHSIG, SIGTERM);
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGCONT, &sa, NULL);
  sigaction(SIGTSTP, &sa, NULL);
}

/* Back to the defaults before the plane goes: a signal now ends the process. */
static void restore_signals(void)
{
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGCONT, SIG_DFL);
  signal(SIGTSTP, SIG_DFL);
  prctl(PR_SET_PDEATHSIG, 0);
  sig_plane = NULL;
}

static const char *stop_reason(int sig)
{
  switch (sig) {
  case SIGINT: return "SIGINT (Ctrl-C)";
  case SIGTERM: return "SIGTERM";
  case SIGCONT: return "the launcher is ending the job (SIGCONT, then SIGTERM)";
  case SIGPIPE: return "standard output is a closed pipe (its reader, e.g. `head`, exited)";
  default: return "a signal";
  }
}

/* ---- the step boundary ---------------------------------------------------------------- */

/* What the step boundary agreed on, for the trainer's hooks. */
typedef struct boundary {
  wf_plane *plane;
  const wf_job *job;
  wf_control *ctl;
  wf_comm *world;   /* the agreement is a collective like any other: flight-recorded */
  bool checkpoint;  /* the console asked for a checkpoint */
  bool failed;      /* the agreement itself failed: stop, and exit non-zero */
  bool by_launcher; /* the stop agreed on is the launcher's (it reached some rank) */
  bool out_closed;  /* this rank's step lines go to a pipe whose reader has gone */
  int last_step;    /* the last step reported (0 before the first) */
  bool in_ckpt;     /* inside the "checkpoint" phase */
  double ckpt_wall; /* when the last checkpoint after a step ended (wall time); 0 = none */
  int64_t checkpoints;
  /* train.checkpoint_minutes, by rank 0's clock: the period runs from the first step's
   * end, then from each checkpoint's end */
  double period_s, period_from; /* 0 = no periodic checkpoints; not started */
  double ckpt_from, step_ms;    /* the checkpoint under way began; the last step took */
  double kill_after_s;          /* mpirun kills the ranks this long after a stop; < 0: no mpirun */
  bool grace_said;
  /* --check-estimate: after the first step (with train.checkpoint_every, the first that
   * follows a checkpoint, whose peak it then includes), predicted beside measured memory */
  const wf_config *check_cfg; /* NULL = no check */
  int rank, pp_rank, dp_rank;
  const wf_kset *k;
  wf_plan_rss base;
} boundary;

/* Rank 0: train.checkpoint_minutes have passed since the period began. Rank 0's clock
 * alone, so the ranks cannot disagree; the step boundary's all-reduce carries it. */
static bool period_due(const boundary *b)
{
  return b->period_s > 0 && b->period_from > 0 && wf_now() - b->period_from >= b->period_s;
}

/* Whether any rank has a stop request (a signal or the console's stop), agreed by all;
 * *checkpoint: whether any rank's console asked for a checkpoint, or the period is due. */
static bool agree_stop(boundary *b, int step, bool *checkpoint)
{
  /* Each rank's signal (the largest wins, for the message; a closed output counts as
   * SIGPIPE), the console's stop and its checkpoint. */
  int32_t sig = stop_sig ? stop_sig : b->out_closed ? SIGPIPE : 0;
  int32_t req[4] = {sig, wf_control_stop_requested(b->ctl),
                    checkpoint ? wf_control_checkpoint_requested(b->ctl) || period_due(b) : 0,
                    launcher_asked};
  if (wf_comm_allreduce(b->world, req, req, 4, WF_COMM_I32, WF_COMM_MAX) != WF_OK) {
    b->failed = true; /* logged where it failed */
    return true;
  }
  if (checkpoint)
    *checkpoint = req[2] > 0;
  bool stop = req[0] > 0 || req[1] > 0;
  b->by_launcher = stop && req[3] > 0;
  if (stop && wf_rt_rank() == 0)
    WF_INFO("stopping after step %d: %s", step,
            req[0] > 0 ? stop_reason(req[0]) : "the console asked");
  return stop;
}

/* --check-estimate waits for the first step after a checkpoint while checkpoints are due
 * before the last step. */
static bool check_waits(const boundary *b, int step)
{
  const wf_config *c = b->check_cfg;
  return c->train.checkpoint_dir[0] && c->train.checkpoint_every > 0 && b->checkpoints == 0 &&
         c->train.checkpoint_every < c->train.steps && step < c->train.steps;
}

/* After every step: tell the coordinator, then agree with every rank whether to stop or
 * checkpoint. The trainer checkpoints before it stops. */
static bool on_step(void *user, const wf_train_step_info *info)
{
  boundary *b = user;
  b->last_step = info->step;
  b->out_closed = info->out_closed;
  b->step_ms = info->step_ms;
  if (b->period_from <= 0)
    b->period_from = wf_now();
  wf_plane_report_step(b->plane, b->job, info, b->ckpt_wall, b->checkpoints);
  if (b->check_cfg && !check_waits(b, info->step)) {
    wf_plan_check_print(b->check_cfg, b->pp_rank, b->dp_rank, b->rank, b->k, &b->base,
                        (long long)info->mem_bytes, stdout);
    b->check_cfg = NULL;
  }
  return !agree_stop(b, info->step, &b->checkpoint);
}

static bool checkpoint_now(void *user) { return ((boundary *)user)->checkpoint; }

static bool stop_by_launcher(void *user) { return ((boundary *)user)->by_launcher; }

/* A checkpoint just written at a step boundary: a request that came in during it stops
 * the job here, its checkpoint being this one. */
static bool after_checkpoint(void *user)
{
  boundary *b = user;
  return !agree_stop(b, b->last_step, NULL);
}

/* Rank 0, once, under mpirun: a stop needs a step and a checkpoint, and mpirun's kill
 * would come first. mpirun ends a job (Ctrl-C, a failed rank's peers) with SIGCONT,
 * SIGTERM and SIGKILL, odls_base_sigkill_timeout apart, and every rank stops at its
 * step boundary and writes the checkpoint within those two graces. A longer grace holds
 * mpirun's own exit as long whatever the ranks do, so the console's stop, which no
 * launcher times, is the way to stop a job whose checkpoint takes longer. Said after
 * the first checkpoint, which is when both times are known (a checkpoint written in the
 * background shows only its snapshot here, so the warning then errs towards silence).
 * Not where the stop's writers (rescue.c) take over: their checkpoint outlives the kill. */
static void say_kill_grace(boundary *b, double ckpt_s)
{
  double need_s = b->step_ms * 1e-3 + ckpt_s;
  if (b->grace_said || b->kill_after_s < 0 || need_s <= b->kill_after_s || wf_rt_rank() != 0 ||
      wf_train_rescue_ready()) /* its writers outlive the kill */
    return;
  b->grace_said = true;
  WF_WARN("a stop takes about %.1f s here (a step, %.1f s, and a checkpoint, %.1f s), but mpirun "
          "kills the ranks %.0f s after it asks them to stop (Open MPI's "
          "odls_base_sigkill_timeout): a Ctrl-C to mpirun would end the job without its last "
          "checkpoint. Stop it with `coordinator stop` (docs/operations.md), or launch with "
          "OMPI_MCA_odls_base_sigkill_timeout=%.0f (mpirun then takes twice that to exit)",
          need_s, b->step_ms * 1e-3, ckpt_s, b->kill_after_s, ceil(need_s));
}

/* The checkpoint phase also covers reading one at start-up; only those after a step are
 * written ones, whose age /metrics reports. */
static void on_phase(void *user, const char *phase)
{
  boundary *b = user;
  bool ckpt = strcmp(phase, "checkpoint") == 0;
  bool deferred = strcmp(phase, WF_TRAIN_PHASE_DEFERRED) == 0; /* not written: not counted */
  if (deferred)
    phase = "train";
  if (ckpt && !b->in_ckpt)
    b->ckpt_from = wf_now();
  if (b->in_ckpt && !ckpt && !deferred && b->last_step > 0) {
    b->ckpt_wall = wf_wall_time();
    b->checkpoints++;
    b->period_from = wf_now();
    say_kill_grace(b, b->period_from - b->ckpt_from);
  }
  b->in_ckpt = ckpt;
  wf_control_set_phase(b->ctl, phase);
}

/* ---- failure ------------------------------------------------------------------------ */

/* How long a rank whose training failed waits for the others to fail with it before
 * it takes the failure for its own and has the coordinator abort the job. Ranks that
 * agreed on a failure arrive within milliseconds of each other. */
#define FAIL_SETTLE_MS 3000

/* Whether every rank reaches this call within timeout_ms (a failure they agreed on),
 * by a non-blocking barrier over the world; one that does not complete stays posted
 * (the process then ends by the coordinator's Abort). wf_plane_fail waits the same way
 * for its own barrier, which follows at once when this one completed. */
static bool all_arrive(int timeout_ms)
{
  MPI_Request req;
  int done = 0;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return false;
  double end = wf_now() + timeout_ms * 1e-3;
  while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && wf_now() < end)
    usleep(1000);
  return done != 0;
}

/* Training failed with st on this rank: say so once for the job, agree on the exit
 * status when every rank failed together, or have the coordinator end the job when
 * this rank failed alone (the others wait in a collective). Returns the exit status. */
static int training_failed(wf_plane *plane, wf_status st, int rank)
{
  /* A failure every rank agreed on meets here at once: rank 0 says so once for the
   * job (the error itself was logged once, where it arose), and the job exits with the
   * most telling status any rank has (a user error over a failure). */
  bool together = all_arrive(FAIL_SETTLE_MS);
  int rc = wf__exit_status(st);
  if (together)
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  /* A user error was said once where it was found, with its fix: a second line adds
   * nothing (and a wrapper reading the last line would lose the fix). */
  if (together && rank == 0 && rc != WF_EXIT_INPUT)
    WF_ERROR("training failed on every rank: %s (see the log above)", wf_status_str(st));
  else if (!together)
    WF_ERROR("training failed on rank %d: %s (see the log above)", rank, wf_status_str(st));
  char what[64];
  snprintf(what, sizeof what, "its first error is in rank %d's log above", rank);
  if (!wf_plane_fail(plane, st, what, together ? FAIL_SETTLE_MS : 0)) {
    sleep(10);             /* the coordinator's Abort ends this process (exit 3) well before */
    _exit(WF_EXIT_FAILED); /* the control plane is gone too: MPI_Finalize would wait */
  }
  return rc;
}

/* ---- the commands ------------------------------------------------------------------- */

/* The mesh's groups as the trainer's hooks. */
static wf_train_hooks mesh_hooks(const wf__cmd_ctx *c)
{
  const wf_job *job = c->job;
  bool tp = c->cfg->mesh.tp > 1, pp = c->cfg->mesh.pp > 1, cp = c->cfg->mesh.cp > 1;
  return (wf_train_hooks){.dp = wf_job_comm(job, WF_AXIS_DP),
                          .cp = cp ? wf_job_comm(job, WF_AXIS_CP) : NULL,
                          .dpcp = cp ? wf_job_comm(job, WF_AXIS_DPCP) : NULL,
                          .ep = wf_job_comm(job, WF_AXIS_EP),
                          .edp = wf_job_comm(job, WF_AXIS_EDP),
                          .world = wf_job_world_comm(job),
                          .tp = tp ? wf_job_comm(job, WF_AXIS_TP) : NULL,
                          .pp = pp ? wf_job_comm(job, WF_AXIS_PP) : NULL,
                          .emb = pp ? wf_job_comm(job, WF_AXIS_EMB) : NULL,
                          .dev = c->rd->dev,
                          .peak_tflops = c->rd->peak_tflops,
                          .peak_source = c->rd->peak_source};
}

/* --generate and --dump-state run whole sequences on one rank's replica of the model;
 * mesh.cp splits them, so both are refused there (said once, by rank 0). */
static bool cp_refused(const wf__cmd_ctx *c, const char *what)
{
  if (c->cfg->mesh.cp <= 1)
    return false;
  if (c->rank == 0)
    WF_ERROR("%s runs whole sequences, which mesh.cp=%d splits over ranks; run it on a mesh "
             "without cp (mesh.cp=1)",
             what, c->cfg->mesh.cp);
  return true;
}

int wf__cmd_generate(const wf__cmd_ctx *c)
{
  if (cp_refused(c, "--generate"))
    return wf__exit_status(WF_ECONFIG);
  wf_train_hooks comms = mesh_hooks(c);
  return wf__exit_status(wf_train_generate(c->cfg, c->a->val[0], &comms));
}

int wf__cmd_dump_state(const wf__cmd_ctx *c)
{
  if (cp_refused(c, "--dump-state"))
    return wf__exit_status(WF_ECONFIG);
  wf_train_hooks comms = mesh_hooks(c);
  return wf__exit_status(wf_train_dump_state(c->cfg, c->a->val[0], &comms));
}

/* Where rank 0's coordinator listens: MASTER_ADDR and MASTER_PORT, dist.master_port
 * beating the variable, the defaults where neither is given. Returns whether the port is
 * the default (which yields to a job already there). */
static bool master_endpoint(const wf__cmd_ctx *c, wf_launch *launch)
{
  if (c->cfg->dist.master_port)
    launch->master_port = c->cfg->dist.master_port; /* the key beats MASTER_PORT */
  bool port_default = launch->master_port == 0;
  wf_launch_default_master(launch, wf_rt_host());
  return port_default;
}

wf_status wf__cmd_train_precheck(const wf__cmd_ctx *c)
{
  wf_launch l = *c->launch;
  if (c->rank != 0)
    return WF_OK;
  bool port_default = master_endpoint(c, &l);
  wf_status st = wf_service_check_listen(l.master_addr, c->cfg->runtime.listen_addr,
                                         port_default ? 0 : l.master_port);
  return st == WF_OK ? wf_service_check_name(c->cfg->runtime.job_name) : st;
}

static wf_status start_plane(const wf__cmd_ctx *c, wf_plane *plane)
{
  char err[1024];
  wf_launch *launch = c->launch;
  bool port_default = master_endpoint(c, launch);
  wf_plane_opts po = {c->cfg, launch, c->job, port_default, c->rd->bus};
  wf_status st = wf_plane_start(plane, &po, err, sizeof err);
  if (st != WF_OK && c->rank == 0 && err[0])
    WF_ERROR("%s", err);
  return st;
}

/* Train on this rank's share of the mesh, with the control plane up so the console can
 * attach and the watchdog can act. */
int wf__cmd_train(const wf__cmd_ctx *c)
{
  wf_plane plane;
  const wf_job *job = c->job;
  wf_status st = start_plane(c, &plane);
  if (st != WF_OK)
    return wf__exit_status(st);
  install_signals(&plane, c->rank, c->launch);
  wf_control_set_phase(plane.ctl, "train");
  boundary bd = {.plane = &plane, .job = job, .ctl = plane.ctl, .world = wf_job_world_comm(job)};
  if (c->cfg->train.checkpoint_dir[0])
    bd.period_s = c->cfg->train.checkpoint_minutes * 60;
  bd.kill_after_s = -1;
  if (getenv("OMPI_COMM_WORLD_SIZE")) { /* under mpirun (srun's KillWait is 30 s) */
    wf_ompi_limits lim;
    wf_launch_ompi_limits(&lim, wf_launch_getenv, NULL, NULL);
    bd.kill_after_s = 2 * lim.sigkill_timeout_s;
  }
  if (c->a->check_estimate) {
    bd.check_cfg = c->cfg, bd.rank = c->rank, bd.k = wf_dev_kernels(c->rd->dev, WF_DT_F32);
    bd.pp_rank = wf_comm_rank(wf_job_comm(job, WF_AXIS_PP));
    /* the ZeRO shard's index: the rank in dp x cp (the dp group itself without cp) */
    bd.dp_rank = wf_comm_rank(wf_job_comm(job, WF_AXIS_DPCP));
    wf_plan_rss_read(&bd.base, c->rd->gpu);
  }
  wf_train_hooks hooks = mesh_hooks(c);
  hooks.user = &bd;
  hooks.on_step = on_step;
  hooks.checkpoint_now = checkpoint_now;
  hooks.after_checkpoint = after_checkpoint;
  hooks.on_phase = on_phase;
  hooks.stop_by_launcher = stop_by_launcher;
  if (!getenv("SLURM_JOB_ID")) /* a Slurm step's cgroup ends the writers with it */
    hooks.kill_grace_s = bd.kill_after_s;
  hooks.save_llmc = c->a->save;
  hooks.save_format = c->a->format;
  st = wf_train_run(c->cfg, &hooks);
  if (st == WF_OK && bd.failed)
    st = WF_EMPI;
  int rc = st == WF_OK ? WF_EXIT_OK : training_failed(&plane, st, c->rank);
  restore_signals();
  wf_plane_stop(&plane);
  return rc;
}
