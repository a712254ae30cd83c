/*
 * control_abort.c - the control client (control.c) when the job ends under it: the
 * coordinator's Abort, or the coordinator lost (its connection dropped) or silent (rank 0
 * frozen, or its host cut off). The job then ends, said once: by the coordinator, or by
 * the first rank of each host to find it lost. The caller's on_abort runs on the control
 * thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include "control_int.h"

/* The job ends; `said`: the coordinator said why, once for the job. This rank says it
 * when nobody else does, and is then the one that speaks for the job (spoke); it then
 * waits hold_ms before the job's end goes on (lost_abort says why). */
static void do_abort(wf_control *c, const char *reason, bool said, int hold_ms)
{
  if (atomic_exchange(&c->aborted, true))
    return;
  c->spoke = !said || c->facts.rank == 0;
  if (!said)
    WF_ERROR("job aborted: %s", reason);
  if (hold_ms > 0)
    uv_sleep((unsigned)hold_ms);
  else if (c->facts.rank != 0)
    WF_DEBUG("job aborted: %s", reason);
  if (c->on_abort)
    c->on_abort(c->user, reason);
}

/* Whether this rank says that the coordinator is lost (every rank sees it alike): the
 * first rank of each host to find it so (another host may have lost rank 0's host as a
 * whole). The others say it at debug level. The first rather than a fixed one: the
 * first to leave makes the launcher kill the rest, and a fixed speaker, judging a tick
 * later, would be killed before it spoke. The claim is a name in the host's abstract
 * socket namespace (its network namespace), which only one process can bind and the
 * kernel frees when the process ends: nothing is left behind. Its descriptor is kept
 * open on purpose, until the process ends, which this rank is about to do. */
static bool speaks_for_lost(const wf_control *c)
{
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  XXH64_hash_t h = XXH64(c->endpoint, strlen(c->endpoint), XXH64(c->job_id, strlen(c->job_id), 0));
  int n =
      snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "weft-lost-%016llx", (unsigned long long)h);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) /* cannot claim: speaking twice beats nobody speaking */
    return true;
  if (bind(fd, (struct sockaddr *)&sa,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) == 0)
    return true;
  int err = errno;
  close(fd);
  return err != EADDRINUSE;
}

/* How long the rank that claimed the loss holds the claim before its end goes on, when
 * other ranks share its host. The claim ends with the process, and the host's other
 * ranks judge the loss on their own WF__SILENCE_TICK_MS timers, a tick or a few later under
 * load: one that judged after the claimant had left would find the name free and say it
 * again. Not a delay of the job's end: the others leave at once, and the launcher then
 * ends this rank too. A rank alone on its host has nobody to hold the claim against. */
#define LOST_HOLD_MS 500

/* The coordinator is lost: the job ends, said once per host. */
static void lost_abort(wf_control *c, const char *reason)
{
  bool speak = speaks_for_lost(c);
  int hold = speak && c->facts.local_size > 1 ? LOST_HOLD_MS : 0;
  do_abort(c, reason, !speak, hold);
}

void wf__control_on_abort_msg(wf_control *c, const Weft__Abort *a)
{
  char reason[2300], clean[2048];
  if (!atomic_load(&c->aborted) && a->unreachable)
    c->abort_silent_ms = a->silent_ms > 0 ? a->silent_ms : 1;
  wf__sanitize(clean, sizeof clean, a->reason);
  snprintf(reason, sizeof reason, "the coordinator aborted the job: %s", clean);
  do_abort(c, reason, true, 0);
}

/* A coordinator that stopped talking (rank 0 frozen, its host gone without a reset)
 * leaves the connection open: only its silence tells. Judged every WF__SILENCE_TICK_MS, so
 * that a rank cut off from rank 0 leaves silence_ms after it last heard from it, not
 * up to a heartbeat later. */
void wf__control_check_coordinator(uv_timer_t *t)
{
  wf_control *c = t->data;
  double now = wf__now_ms();
  bool stalled = c->t_timer > 0 && now - c->t_timer > 5.0 * WF__SILENCE_TICK_MS;
  c->t_timer = now;
  if (stalled) { /* our own thread was held up: judge after reading what arrived */
    c->t_rx = WF_MAX(c->t_rx, now - c->heartbeat_ms);
    return;
  }
  if (c->shutdown_seen || atomic_load(&c->aborted) || now - c->t_rx <= c->silence_ms)
    return;
  char reason[1024], where[200] = "";
  bool here = strcmp(c->coord_host, c->facts.host) == 0;
  if (!here) /* on another host it may also be out of reach */
    snprintf(where, sizeof where,
             ", or its host is down or cut off from this one (%s): a partition", c->facts.host);
  snprintf(reason, sizeof reason,
           "the coordinator at %s has been silent for %.1f s: rank 0 (host %s, pid %d) is "
           "frozen (SIGSTOP?)%s; so this rank stops",
           c->endpoint, (now - c->t_rx) / 1000.0, c->coord_host[0] ? c->coord_host : "?",
           c->coord_pid, where);
  /* only a silence across hosts may be a partition for the launcher to see too */
  c->abort_silent_ms = here ? 0 : now - c->t_rx;
  lost_abort(c, reason);
}

void wf__control_connection_lost(wf_control *c, const char *why)
{
  char reason[1024];
  if (!c->welcomed) {
    wf__control_start_done(c, WF_EPROTO, why);
    return;
  }
  pthread_mutex_lock(&c->lock);
  bool closing = c->closing;
  pthread_mutex_unlock(&c->lock);
  if (closing || c->shutdown_seen || atomic_load(&c->aborted))
    return;
  pthread_mutex_lock(&c->lock);
  int64_t step = c->step;
  pthread_mutex_unlock(&c->lock);
  snprintf(reason, sizeof reason,
           "lost the connection to the coordinator at %s (%s): rank 0 (host %s, pid %d), which "
           "runs it, died or was killed after step %" PRId64
           " (this rank's last), so this rank stops too",
           c->endpoint, why, c->coord_host[0] ? c->coord_host : "?", c->coord_pid, step);
  lost_abort(c, reason);
}

bool wf_control_aborted(wf_control *c) { return c && atomic_load(&c->aborted); }

double wf_control_abort_silent_ms(const wf_control *c) { return c ? c->abort_silent_ms : 0; }

bool wf_control_abort_spoke(const wf_control *c) { return c && c->spoke; }
