/*
 * rescue.c - a stop the launcher would cut short: the checkpoint of the last completed
 * step written by processes that outlive the job (wf_ckpt.h, "a stop's writer").
 *
 * mpirun ends a job with SIGCONT, SIGTERM one second later and SIGKILL one second after
 * that (odls_base_sigkill_timeout). The graceful stop finishes the step, then writes the
 * checkpoint; when the two take longer, SIGKILL comes first. But the state a checkpoint
 * holds (parameters, AdamW's moments, the data position) changes only in the optimizer's
 * update, so outside the update it is a whole step's: a thread waiting for the launcher's
 * signal forks the rank there, at once, and the copy, in a session of its own, writes the
 * checkpoint while the rank goes on to end with the job.
 *
 * Every rank's copy must hold the same step, with no collective after the signal (the
 * others may be anywhere in the step). Before each update every rank all-reduces whether
 * the launcher's signal has reached it: the "window", which runs from that all-reduce to
 * the update's end, and which the forking thread waits out unless the rank entered it
 * with the signal. A rank that forks before its window says so there, so no rank updates
 * that step: it is dropped and the job ends after the step before. A rank that forks
 * after its window forks after an update every rank made. Either way the copies agree.
 *
 * Whether it is armed at all is rank 0's estimate (a step and a checkpoint against the
 * kill grace), carried by the same all-reduce and applied by every rank at the same
 * window; unarmed, a stop is the graceful one. A checkpoint being written at a step
 * boundary only reads the state: a writer forked meanwhile writes the same step again, in
 * a staging directory of its own, and whichever publishes last publishes the same bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "train_int.h"
#include "wf_io.h"

/* A checkpoint not yet timed is this fast to write (bytes/s): slow disks' pace, so the
 * estimate arms a rescue when in doubt. */
#define EST_WRITE_BPS 2e8

typedef struct wf__rescue {
  wf__trainer *tr;
  pthread_t thread;
  bool has_thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool active;        /* the trainer is there (false from teardown on) */
  bool in_window;     /* the main thread is in the window */
  bool entered_asked; /* ... and entered it with the launcher's request (no update follows) */
  bool armed, armed_next;
  bool started;   /* this rank's writer was started, or there was nothing to write */
  int state_step; /* the step the state is of, outside the window */
  uint64_t tag;   /* the job's, alike on every rank */
  uint64_t *pos;  /* the data position of state_step (this rank's share); npos long */
  size_t npos;
  bool carries_pos;
  double grace_s, last_leave, step_s;
  double ckpt_from, ckpt_s; /* the last checkpoint at a step boundary: began, took */
} wf__rescue;

static volatile sig_atomic_t g_asked; /* the launcher's request reached this rank */
static sem_t g_sem;
static volatile sig_atomic_t g_sem_ready;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static volatile bool g_ready;         /* a rescue is set up in this process */
static volatile sig_atomic_t g_armed; /* ... and armed (a copy for signal handlers) */

static void init_sem(void) { g_sem_ready = sem_init(&g_sem, 0, 0) == 0; }

void wf_train_rescue_request(void)
{
  g_asked = 1;
  if (g_sem_ready)
    sem_post(&g_sem); /* async-signal-safe */
}

/* ---- the writer ------------------------------------------------------------------------- */

/* The forked copy, in a session of its own, so the launcher's kill (to the rank's process
 * group) does not reach it; when the rank ends, init adopts it. Nothing of the job's stays
 * open (mpirun waits for its ranks' output to close): its lines go to the writers' log.
 * It starts with every signal blocked, so none of the rank's handlers runs in it. */
static _Noreturn void writer(wf__rescue *r, int step, int lock, int log)
{
  int sigs[] = {SIGINT, SIGTERM, SIGCONT, SIGTSTP, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
    signal(sigs[i], SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  if (setsid() < 0)
    _exit(1);
  __fpurge(stdout); /* the rank's unwritten lines are the rank's */
  int null = open("/dev/null", O_RDWR);
  dup2(null, 0), dup2(log, 1), dup2(log, 2);
  close_range(3, (unsigned)lock - 1, 0);
  close_range((unsigned)lock + 1, ~0u, 0);
  prctl(PR_SET_NAME, "weft-stop-writer");
  wf_status st = wf_ckpt_write_detached(&r->tr->ck, step, r->tag, r->pos, r->npos);
  _exit(st == WF_OK ? 0 : 1);
}

/* Fork this rank's writer of step `step` (r->lock held: the state is that step's). */
static void start_writer(wf__rescue *r, int step)
{
  wf__trainer *tr = r->tr;
  const char *root = tr->cfg->train.checkpoint_dir;
  bool lead = wf_rt_rank() <= 0;
  r->started = true;
  if (step <= tr->start || (step == tr->saved_step && !tr->ck.saver)) {
    if (lead)
      WF_INFO("stopping: the checkpoint of step %d is already written", step);
    return;
  }
  char path[WF_PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", root, WF_CKPT_WRITERS_LOG);
  int lock = wf_ckpt_writers_lock(root);
  int log = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pid_t pid = lock >= 0 && log >= 0 ? fork() : -1;
  if (pid == 0)
    writer(r, step, lock, log);
  int err = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (lock >= 0)
    close(lock); /* the writer holds it */
  if (log >= 0)
    close(log);
  if (pid < 0) {
    WF_ERROR("stopping: cannot start the writer of step %d's checkpoint (%s): the job ends "
             "without it",
             step, strerror(err));
    return;
  }
  tr->rescued_step = step;
  if (lead)
    WF_INFO("stopping: the checkpoint of step %d is written by processes that outlive the job "
            "(rank 0's: pid %d): %s/step-%06d when they are done; their lines go to %s",
            step, (int)pid, root, step, path);
}

static void *watch(void *arg)
{
  wf__rescue *r = arg;
  for (;;) {
    while (sem_wait(&g_sem) != 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&r->lock);
    while (r->active && r->in_window && !r->entered_asked)
      pthread_cond_wait(&r->cond, &r->lock);
    if (r->active && r->armed && !r->started)
      start_writer(r, r->state_step);
    bool active = r->active;
    pthread_mutex_unlock(&r->lock);
    if (!active)
      return NULL;
  }
}

/* ---- the trainer's side ----------------------------------------------------------------- */

/* Rank 0's estimate: a step and a checkpoint outlast the kill grace. */
static bool propose(const wf__rescue *r)
{
  const wf__trainer *tr = r->tr;
  double ckpt = r->ckpt_s;
  if (ckpt <= 0) {
    size_t lo, hi;
    float *m, *v;
    wf_optim_state(tr->optim, &lo, &hi, &m, &v);
    ckpt =
        (double)(wf_model_local_params(tr->model) + 2 * (hi - lo)) * sizeof(float) / EST_WRITE_BPS;
  }
  return r->step_s + ckpt > r->grace_s;
}

wf_status wf__rescue_setup(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_train_hooks *h = tr->hooks;
  if (!h || h->kill_grace_s <= 0 || !tr->cfg->train.checkpoint_dir[0] ||
      !wf_dev_host_visible(tr->dev) || tr->ck.param_shard || tr->ck.expert_shard.params)
    return WF_OK; /* a GPU's state is the device's; ZeRO-3 writes collectively */
  wf__rescue *r = calloc(1, sizeof *r);
  WF_CHECK_ALLOC(r);
  tr->rescue = r; /* teardown frees it, whatever follows */
  r->tr = tr, r->grace_s = h->kill_grace_s, r->state_step = tr->start, r->active = true;
  r->carries_pos = tr->pp_rank == 0 && wf__comm_rank(tr->tp_comm) == 0;
  r->npos = tr->data ? wf_data_state_len(tr->data) : 0;
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->cond, NULL);
  if (r->npos)
    WF_CHECK_ALLOC(r->pos = calloc(r->npos, sizeof *r->pos));
  r->tag = wf_rt_rank() <= 0 ? (uint64_t)getpid() << 32 ^ (uint64_t)(wf_wall_time() * 1e6) : 0;
  if (tr->world)
    st = wf_comm_allreduce(tr->world, &r->tag, &r->tag, 1, WF_COMM_U64, WF_COMM_MAX);
  pthread_once(&g_once, init_sem);
  if (st == WF_OK && !g_sem_ready)
    st = WF_ESYS;
  if (st == WF_OK && pthread_create(&r->thread, NULL, watch, r) == 0)
    r->has_thread = true;
  else if (st == WF_OK)
    st = WF_ESYS;
  g_ready = st == WF_OK;
  if (st != WF_OK)
    WF_ERROR("stopping: cannot set up the writer of a stop's checkpoint (%s)", wf_status_str(st));
fail:
  return st;
}

void wf__rescue_teardown(wf__trainer *tr)
{
  wf__rescue *r = tr->rescue;
  if (!r)
    return;
  g_ready = false, g_armed = 0;
  pthread_mutex_lock(&r->lock);
  r->active = false;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  if (r->has_thread) {
    sem_post(&g_sem);
    pthread_join(r->thread, NULL);
  }
  pthread_mutex_destroy(&r->lock);
  pthread_cond_destroy(&r->cond);
  free(r->pos);
  free(r);
  tr->rescue = NULL;
}

bool wf_train_rescue_ready(void) { return g_ready; }

bool wf_train_rescue_armed(void) { return g_armed; }

wf_status wf__rescue_enter(wf__trainer *tr, bool *skip)
{
  wf__rescue *r = tr->rescue;
  *skip = false;
  if (!r)
    return WF_OK;
  pthread_mutex_lock(&r->lock);
  r->in_window = true;
  r->entered_asked = g_asked != 0;
  int32_t x[2] = {r->entered_asked, wf_rt_rank() <= 0 && propose(r)};
  pthread_mutex_unlock(&r->lock);
  wf_status st = WF_OK;
  if (tr->world)
    st = wf_comm_allreduce(tr->world, x, x, 2, WF_COMM_I32, WF_COMM_MAX);
  pthread_mutex_lock(&r->lock);
  *skip = st == WF_OK && r->armed && x[0] > 0;
  r->armed_next = st == WF_OK ? x[1] > 0 : r->armed;
  pthread_mutex_unlock(&r->lock);
  return st;
}

void wf__rescue_leave(wf__trainer *tr, int step, bool updated)
{
  wf__rescue *r = tr->rescue;
  if (!r)
    return;
  char err[512] = "";
  if (updated && r->npos && r->carries_pos &&
      wf_data_state_get(tr->data, step, r->pos, err, sizeof err) != WF_OK)
    WF_ERROR("step %d: the data position for a stop's checkpoint: %s", step, err);
  double now = wf_now();
  pthread_mutex_lock(&r->lock);
  if (updated)
    r->state_step = step;
  r->armed = r->armed_next;
  g_armed = r->armed;
  r->in_window = r->entered_asked = false;
  if (r->last_leave > 0)
    r->step_s = now - r->last_leave;
  r->last_leave = now;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
}

void wf__rescue_checkpoint(wf__trainer *tr, bool begin)
{
  wf__rescue *r = tr->rescue;
  if (!r)
    return;
  double now = wf_now();
  pthread_mutex_lock(&r->lock);
  if (begin)
    r->ckpt_from = now;
  else
    r->ckpt_s = now - r->ckpt_from, r->last_leave += r->ckpt_s; /* not the step's time */
  pthread_mutex_unlock(&r->lock);
}

bool wf__rescue_at_stop(wf__trainer *tr)
{
  wf__rescue *r = tr->rescue;
  const wf_train_hooks *h = tr->hooks;
  if (!r || !h->stop_by_launcher || !h->stop_by_launcher(h->user))
    return false;
  pthread_mutex_lock(&r->lock);
  bool armed = r->armed;
  if (armed && !r->started)
    start_writer(r, r->state_step);
  pthread_mutex_unlock(&r->lock);
  return armed;
}
