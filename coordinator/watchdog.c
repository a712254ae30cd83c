/*
 * watchdog.c - the service's timer: dead workers, hangs, stalled connections.
 *
 * Liveness and progress are judged apart. A worker is alive while its control
 * thread's heartbeats arrive (they do not depend on training), so a rank that has
 * been silent for dead_after_ms is frozen or gone. Progress is any change of a
 * rank's step, phase or collective; none for runtime.hang_timeout means the job is
 * stuck, and the diagnosis compares every rank's last collective to point at the
 * rank or ranks that fell behind. Either way the whole job is aborted: every worker
 * gets Abort and exits, so nothing waits for a 30-minute NCCL timeout.
 *
 * The first cause wins: once aborted, later losses (the other ranks exiting) are
 * only recorded. A loss names the lost rank's host and every rank it runs; ranks that
 * fall silent together (a host down or cut off) are named together, and the Abort says
 * they went silent (unreachable) rather than closing their connections (dead).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"

/* Append "0-2,5" style runs of the ranks with sel[i] set. */
static void append_ranks(char *buf, size_t len, const bool *sel, int n)
{
  size_t at = strlen(buf);
  bool first = true;
  for (int i = 0; i < n && at < len; i++) {
    if (!sel[i])
      continue;
    int j = i;
    while (j + 1 < n && sel[j + 1])
      j++;
    int w = j > i ? snprintf(buf + at, len - at, "%s%d-%d", first ? "" : ",", i, j)
                  : snprintf(buf + at, len - at, "%s%d", first ? "" : ",", i);
    at += w > 0 ? (size_t)w : 0;
    first = false;
    i = j;
  }
}

/* The communicator a rank's last operation ran on, as a key that two ranks share only
 * when it is the same communicator: its name from "allreduce(dp)" / "recv(pp from rank
 * 1)", plus the rank's coordinates off that axis (the dp group of tp 0 is not the one
 * of tp 1, and sequence numbers count per communicator). */
static void comm_key(const wf__rank *r, char *key, size_t len)
{
  const char *open = strchr(r->coll_op, '(');
  char name[16] = "";
  if (open)
    sscanf(open + 1, "%15[^) ]", name);
  const wf_coords *c = &r->facts.coords;
  if (strcmp(name, "dp") == 0)
    snprintf(key, len, "dp pp %d tp %d", c->pp, c->tp);
  else if (strcmp(name, "tp") == 0)
    snprintf(key, len, "tp pp %d dp %d", c->pp, c->dp);
  else if (strcmp(name, "pp") == 0 || strcmp(name, "emb") == 0)
    snprintf(key, len, "%s dp %d tp %d", name, c->dp, c->tp);
  else
    snprintf(key, len, "%s", name); /* world, or none yet */
}

/* "; behind the others: ranks 1 (dp pp 0 tp 1: #39, others at #40)" for every
 * communicator on which some ranks' last operation is older than others'. */
static void append_behind(wf_service *svc, char *buf, size_t len, bool *sel, bool *done)
{
  int n = svc->world;
  char key[64], other[64];
  memset(done, 0, (size_t)n);
  for (int i = 0; i < n; i++) {
    if (done[i] || !svc->ranks[i].coll_op[0])
      continue;
    comm_key(&svc->ranks[i], key, sizeof key);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int j = i; j < n; j++) {
      comm_key(&svc->ranks[j], other, sizeof other);
      if (!done[j] && strcmp(key, other) == 0) {
        done[j] = true;
        lo = WF_MIN(lo, svc->ranks[j].coll_seq);
        hi = WF_MAX(hi, svc->ranks[j].coll_seq);
      }
    }
    if (lo == hi)
      continue;
    for (int j = 0; j < n; j++) {
      comm_key(&svc->ranks[j], other, sizeof other);
      sel[j] = strcmp(key, other) == 0 && svc->ranks[j].coll_seq == lo;
    }
    size_t at = strlen(buf);
    snprintf(buf + at, len - at, "; behind the others: ranks ");
    append_ranks(buf, len, sel, n);
    at = strlen(buf);
    snprintf(buf + at, len - at, " (%s: #%" PRIu64 ", others at #%" PRIu64 ")", key, lo, hi);
  }
}

/* "#12 allreduce(dp) (in progress): ranks 0-2; #11 ...": ranks grouped by their last
 * collective, then which ranks are behind the others on the same communicator. */
static void collective_summary(wf_service *svc, char *buf, size_t len)
{
  int n = svc->world;
  bool *done = calloc((size_t)n, 1), *sel = calloc((size_t)n, 1);
  size_t at;
  buf[0] = '\0';
  if (!done || !sel)
    goto out;
  for (int i = 0; i < n; i++) {
    if (done[i])
      continue;
    const wf__rank *r = &svc->ranks[i];
    memset(sel, 0, (size_t)n);
    for (int j = i; j < n; j++) {
      const wf__rank *q = &svc->ranks[j];
      if (!done[j] && q->coll_seq == r->coll_seq && q->coll_active == r->coll_active &&
          strcmp(q->coll_op, r->coll_op) == 0)
        sel[j] = done[j] = true;
    }
    at = strlen(buf);
    snprintf(buf + at, len - at, "%s#%" PRIu64 " %s (%s): ranks ", at ? "; " : "", r->coll_seq,
             r->coll_op[0] ? r->coll_op : "none", r->coll_active ? "inside" : "done");
    append_ranks(buf, len, sel, n);
  }
  append_behind(svc, buf, len, sel, done);
out:
  free(done);
  free(sel);
}

/* Send the recorded Abort to every worker connection, or to rank 0's only. */
static void send_abort(wf_service *svc, bool rank0)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Abort a = WEFT__ABORT__INIT;
  int rank = svc->abort_rank;
  a.reason = svc->abort_reason; /* written once, before this thread's first send */
  a.dead_rank = rank;
  a.step = svc->step;
  a.unreachable = svc->abort_silent_ms > 0;
  a.silent_ms = svc->abort_silent_ms;
  if (rank >= 0) {
    const wf__rank *r = &svc->ranks[rank];
    a.host = (char *)r->facts.host;
    a.pid = r->facts.pid;
    a.device = (char *)r->facts.device;
    a.step = r->step;
  }
  env.msg_case = WEFT__ENVELOPE__MSG_ABORT;
  env.abort = &a;
  for (wf__conn *c = svc->conns, *next; c; c = next) {
    next = c->next;
    if (c->role == WF__CONN_WORKER && !c->closing && (c->rank == 0) == rank0)
      wf__conn_send(c, &env);
  }
}

static void on_abort_rank0(uv_timer_t *t) { send_abort(t->data, true); }

/* Rank 0's worker shares this process, and its abort handler ends the process: tell
 * it last, once the others have had time to read their Abort, or they would only
 * see the connection drop and not learn why. They wait longer than that before they end
 * (worker/plane.c, QUIET_LAG_MS), so that rank 0, which speaks for the job, is not
 * killed by the launcher before it has. `silent_ms` > 0: the lost ranks went
 * silent rather than closing their connections (unreachable), for that long. */
/* said_elsewhere: the ranks that left already said why (the coordinator was frozen, and
 * the first rank after it on its host said so): logged as information, not again as an
 * error. */
static void abort_job(wf_service *svc, int rank, const char *reason, double silent_ms,
                      bool said_elsewhere)
{
  pthread_mutex_lock(&svc->lock);
  bool first = !svc->aborted;
  if (first) {
    svc->aborted = true;
    wf_strlcpy(svc->abort_reason, reason, sizeof svc->abort_reason);
  }
  pthread_mutex_unlock(&svc->lock);
  if (!first)
    return;
  if (said_elsewhere)
    WF_INFO("control: aborting job %s: %s", svc->job_id, reason);
  else
    WF_ERROR("control: aborting job %s: %s", svc->job_id, reason);
  svc->abort_rank = rank;
  svc->abort_silent_ms = silent_ms;
  send_abort(svc, false);
  uv_timer_start(&svc->abort_timer, on_abort_rank0, WF__RANK0_ABORT_DELAY_MS, 0);
}

void wf__abort_job(wf_service *svc, int rank, const char *reason)
{
  abort_job(svc, rank, reason, 0, false);
}

/* "host node1 runs ranks 2-3" for the host of rank `rank`, so that a lost node is
 * named with everything it took down. */
static void append_host_ranks(wf_service *svc, int rank, char *buf, size_t len)
{
  bool *sel = calloc((size_t)svc->world, 1);
  const char *host = svc->ranks[rank].facts.host;
  if (!sel || !host[0]) {
    free(sel);
    return;
  }
  for (int i = 0; i < svc->world; i++)
    sel[i] = strcmp(svc->ranks[i].facts.host, host) == 0;
  size_t at = strlen(buf);
  snprintf(buf + at, len - at, " Host %s runs ranks ", host);
  append_ranks(buf, len, sel, svc->world);
  at = strlen(buf);
  snprintf(buf + at, len - at, ".");
  free(sel);
}

static void rank_lost(wf_service *svc, int rank, const char *why, double silent_ms)
{
  wf__rank *r = &svc->ranks[rank];
  char reason[2048], colls[1200];
  r->state = WF__RANK_DEAD;
  collective_summary(svc, colls, sizeof colls);
  snprintf(reason, sizeof reason,
           "rank %d (host %s, pid %d, device %s, pp %d dp %d tp %d) died at step %" PRId64 ": %s.",
           rank, r->facts.host[0] ? r->facts.host : "?", r->facts.pid,
           r->facts.device[0] ? r->facts.device : "?", r->facts.coords.pp, r->facts.coords.dp,
           r->facts.coords.tp, r->step, why);
  append_host_ranks(svc, rank, reason, sizeof reason);
  size_t at = strlen(reason);
  snprintf(reason + at, sizeof reason - at, " Last collectives: %s", colls);
  abort_job(svc, rank, reason, silent_ms, false);
}

void wf__rank_lost(wf_service *svc, int rank, const char *why) { rank_lost(svc, rank, why, 0); }

double wf__stalled_ms(const wf_service *svc, double now)
{
  if (svc->t_tick > 0 && now - svc->t_tick > 5 * WF__WATCHDOG_MS)
    return now - svc->t_tick; /* held up until now: the watchdog has not run since */
  if (svc->t_stall_end > 0 && now - svc->t_stall_end < WF__STALL_AFTERMATH_MS)
    return svc->stall_ms;
  return 0;
}

void wf__rank_left_stalled(wf_service *svc, int rank, double stalled_ms)
{
  char reason[1024];
  const wf_rank_facts *f = &svc->ranks[0].facts;
  svc->ranks[rank].state = WF__RANK_DEAD;
  snprintf(reason, sizeof reason,
           "the coordinator at %s has been silent for %.1f s: rank 0 (host %s, pid %d), which "
           "runs it, was frozen (SIGSTOP?) or starved until now, and the other ranks took it for "
           "lost and left (rank %d's connection closed first)",
           svc->endpoint, stalled_ms / 1000.0, f->host[0] ? f->host : "?", f->pid, rank);
  abort_job(svc, -1, reason, 0, true);
}

/* Every deadline runs from a fixed point (the connection, the frame's first byte, the
 * last whole message), never from the last byte, which a peer could trickle. */
static void check_conns(wf_service *svc, double now)
{
  long more = 0;
  for (wf__conn *c = svc->conns, *next; c; c = next) {
    next = c->next;
    if (uv_is_closing(&c->u.h))
      continue;
    if (c->closing) {
      if (now - c->t_last > 1000) /* a peer that does not take our last bytes */
        wf__conn_close(c);
    } else if (c->role == WF__CONN_NEW && now - c->t_open > WF__HANDSHAKE_MS) {
      if (wf__ratelimit_ok(&svc->rl_hello, now, &more))
        WF_WARN("control: dropping a connection that did not say Hello within %d ms (%ld more "
                "since the last such line)",
                WF__HANDSHAKE_MS, more);
      wf__conn_close(c);
    } else if (c->role == WF__CONN_HTTP && now - c->t_open > WF__HTTP_MS) {
      if (wf__ratelimit_ok(&svc->rl_http, now, &more))
        WF_WARN("control: dropping a metrics connection that sent no whole request within %d ms "
                "(%ld more since the last such line)",
                WF__HTTP_MS, more);
      wf__conn_close(c);
    } else if (wf_proto_reader_partial(&c->rd) && now - c->t_frame > WF__PARTIAL_MS) {
      if (wf__ratelimit_ok(&svc->rl_frame, now, &more))
        WF_WARN("control: dropping a peer that stalled in the middle of a frame (%ld more since "
                "the last such line)",
                more);
      wf__conn_close(c);
    } else if (c->role == WF__CONN_CONSOLE && now - c->t_msg > WF__CONSOLE_IDLE_MS) {
      wf__conn_close(c);
    }
  }
}

/* Every rank silent for dead_after_ms is lost at once: a host that went down or was cut
 * off takes all its ranks, and the diagnosis names them together. Their connections
 * stay open (a frozen process may still be sent the Abort; an unreachable one never
 * closes), which is what tells this apart from a process that died. */
static void check_heartbeats(wf_service *svc, double now)
{
  int n = svc->world, first = -1;
  bool *sel = calloc((size_t)n, 1);
  double silent = 0;
  if (!sel)
    return;
  for (int i = 0; i < n; i++) {
    const wf__rank *r = &svc->ranks[i];
    if (r->state != WF__RANK_ALIVE || now - r->t_heartbeat <= svc->dead_after_ms)
      continue;
    sel[i] = true;
    first = first < 0 ? i : first;
    silent = WF_MAX(silent, now - r->t_heartbeat);
  }
  /* Ranks beat out of phase: a lost host's other ranks may still be inside the window,
   * but one that has also missed a beat and a half is lost with it. */
  for (int i = 0; first >= 0 && i < n; i++) {
    const wf__rank *r = &svc->ranks[i];
    for (int j = 0; j < n && !sel[i] && r->state == WF__RANK_ALIVE; j++)
      sel[i] = sel[j] && strcmp(svc->ranks[j].facts.host, r->facts.host) == 0 &&
               wf__rank_late(svc, r, now);
  }
  if (first >= 0) {
    const char *home = svc->ranks[0].facts.host;
    bool remote = false;
    for (int i = 0; i < n; i++)
      remote |= sel[i] && strcmp(svc->ranks[i].facts.host, home) != 0;
    char why[700];
    snprintf(why, sizeof why, "no heartbeat for %.1f s from ranks ", silent / 1000.0);
    append_ranks(why, sizeof why, sel, n);
    size_t at = strlen(why);
    if (remote)
      snprintf(why + at, sizeof why - at,
               ": their host is down or cut off from rank 0's host %s (a partition), or the "
               "processes are frozen (SIGSTOP?)",
               home[0] ? home : "?");
    else
      snprintf(why + at, sizeof why - at,
               ": the process is frozen (SIGSTOP?) or its control thread cannot run");
    for (int i = 0; i < n; i++)
      if (sel[i])
        svc->ranks[i].state = WF__RANK_DEAD;
    svc->ranks[first].state = WF__RANK_ALIVE; /* rank_lost marks it */
    /* Only another host can be unreachable: on this one they can only be frozen. */
    rank_lost(svc, first, why, remote ? silent : 0);
  }
  free(sel);
}

bool wf__rank_late(const wf_service *svc, const wf__rank *r, double now)
{
  return r->state == WF__RANK_ALIVE && now - r->t_heartbeat > WF__LATE_BEATS * svc->heartbeat_ms;
}

static void check_registration(wf_service *svc, double now)
{
  if (svc->registered == svc->world || now - svc->t_start <= svc->register_timeout_ms)
    return;
  bool *sel = calloc((size_t)svc->world, 1);
  char reason[1024];
  if (!sel)
    return;
  for (int i = 0; i < svc->world; i++)
    sel[i] = svc->ranks[i].state == WF__RANK_WAITING;
  snprintf(reason, sizeof reason, "%d of %d ranks did not register within %.0f s: ranks ",
           svc->world - svc->registered, svc->world, svc->register_timeout_ms / 1000.0);
  append_ranks(reason, sizeof reason, sel, svc->world);
  free(sel);
  wf__abort_job(svc, -1, reason);
}

static void check_progress(wf_service *svc, double now)
{
  if (svc->hang_timeout_ms <= 0 || svc->registered < svc->world ||
      now - svc->t_progress <= svc->hang_timeout_ms)
    return;
  /* A rank writing a checkpoint may be silent on every other count for longer than
   * the hang timeout; its heartbeats still prove it alive. */
  for (int i = 0; i < svc->world; i++) {
    if (svc->ranks[i].state == WF__RANK_ALIVE &&
        strncmp(svc->ranks[i].phase, "checkpoint", 10) == 0) {
      svc->t_progress = now;
      return;
    }
  }
  char reason[2048], colls[1600];
  collective_summary(svc, colls, sizeof colls);
  snprintf(reason, sizeof reason,
           "no progress for %.0f s (runtime.hang_timeout) at step %" PRId64
           ": the job is stuck. Last collectives: %s",
           (now - svc->t_progress) / 1000.0, svc->step, colls);
  wf__abort_job(svc, -1, reason);
}

static void finish_stop(wf_service *svc, double now)
{
  if (now - svc->t_progress > 1000) /* peers that will not take SHUTDOWN */
    for (wf__conn *c = svc->conns; c; c = c->next)
      if (!uv_is_closing(&c->u.h))
        wf__conn_close(c);
  if (!svc->conns)
    uv_close((uv_handle_t *)&svc->watchdog, NULL);
}

void wf__watchdog_tick(uv_timer_t *t)
{
  wf_service *svc = t->data;
  double now = wf__now_ms();
  if (svc->shutting_down) {
    finish_stop(svc, now);
    return;
  }
  check_conns(svc, now);
  wf__trace_tick(svc, now);
  if (now - svc->t_ping >= svc->heartbeat_ms) {
    Weft__Envelope env = WEFT__ENVELOPE__INIT;
    Weft__Heartbeat hb = WEFT__HEARTBEAT__INIT;
    hb.sent_ms = now; /* echoed back: each rank's round-trip time */
    env.msg_case = WEFT__ENVELOPE__MSG_HEARTBEAT;
    env.heartbeat = &hb;
    wf__broadcast(svc, &env);
    svc->t_ping = now;
  }
  /* Timers run before I/O in a loop iteration: after this thread itself was held up
   * (rank 0 starved or stopped), heartbeats that did arrive are still unread. Judge
   * liveness on the next tick, once they have been. */
  bool stalled = svc->t_tick > 0 && now - svc->t_tick > 5 * WF__WATCHDOG_MS;
  if (stalled) {
    svc->t_stall_end = now;
    svc->stall_ms = now - svc->t_tick;
  }
  svc->t_tick = now;
  pthread_mutex_lock(&svc->lock);
  bool aborted = svc->aborted;
  pthread_mutex_unlock(&svc->lock);
  if (aborted || stalled)
    return;
  check_heartbeats(svc, now);
  check_registration(svc, now);
  check_progress(svc, now);
}
