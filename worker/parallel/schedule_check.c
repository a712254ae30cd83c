/*
 * schedule_check.c - validation of a mesh's schedules (wf_schedule_validate): each
 * rank's list alone, then all ranks together under rendezvous point-to-point, where a
 * SEND and its RECV complete only when both are at the head of their lists (see
 * wf_parallel.h). The first bad step is described in the caller's buffer: the
 * validator's answer is that description, which tests read as data.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

/* ---- validation, 1: each list alone ------------------------------------------------- */

/* Where each (micro-batch, chunk) event happened in one rank's list, indexed
 * mb * v + chunk: the step, or -1 for not yet. */
typedef struct seen {
  int *at[6]; /* by wf_sched_op */
} seen;

static const char *const op_name[] = {"forward", "backward", "SEND_F",
                                      "RECV_F",  "SEND_B",   "RECV_B"};

static wf_status bad(const wf_schedule *s, int i, char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static wf_status bad(const wf_schedule *s, int i, char *err, size_t len, const char *fmt, ...)
{
  char what[64] = "end of list";
  if (!err || !len)
    return WF_EINVAL;
  if (i < s->n)
    wf_schedule_action_str(s, &s->actions[i], what, sizeof what);
  int k = snprintf(err, len, "rank %d step %d (%s): ", s->rank, i, what);
  if (k >= 0 && (size_t)k < len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, len - (size_t)k, fmt, ap);
    va_end(ap);
  }
  return WF_EINVAL;
}

static wf_status check_peer(const wf_schedule *s, int i, char *err, size_t len)
{
  const wf_sched_action *a = &s->actions[i];
  int p = s->prm.pp, S = p * s->prm.virtual_stages,
      st = wf__sched_stage(&s->prm, s->rank, a->chunk);
  bool next = a->op == WF_ACT_SEND_F || a->op == WF_ACT_RECV_B;
  int other = next ? st + 1 : st - 1;
  if (other < 0 || other >= S)
    return bad(s, i, err, len, "stage %d is the %s stage: it has no %s stage to exchange with", st,
               next ? "last" : "first", next ? "next" : "previous");
  if (other % p == s->rank)
    return bad(s, i, err, len,
               "stages %d and %d are both on this rank; they hand over locally, with no message",
               st, other);
  if (a->peer != other % p)
    return bad(s, i, err, len, "peer %d is wrong: stage %d is on rank %d", a->peer, other,
               other % p);
  return WF_OK;
}

/* What `a` needs that has not happened yet on this rank, or NULL. */
static const char *missing_input(const wf_schedule *s, const wf_sched_action *a, const seen *sn)
{
  int p = s->prm.pp, v = s->prm.virtual_stages, S = p * v;
  int st = wf__sched_stage(&s->prm, s->rank, a->chunk), k = a->mb * v + a->chunk;
  bool local_prev = st > 0 && (st - 1) % p == s->rank; /* p = 1: chunk - 1, index k - 1 */
  bool local_next = st + 1 < S && (st + 1) % p == s->rank;
  switch (a->op) {
  case WF_ACT_FORWARD:
    if (st > 0 && local_prev && sn->at[WF_ACT_FORWARD][k - 1] < 0)
      return "forward before its input: the previous chunk's forward has not run";
    if (st > 0 && !local_prev && sn->at[WF_ACT_RECV_F][k] < 0)
      return "forward before its input arrived: no RECV_F of this micro-batch before it";
    return NULL;
  case WF_ACT_BACKWARD:
    if (sn->at[WF_ACT_FORWARD][k] < 0)
      return "backward before its forward";
    if (st < S - 1 && local_next && sn->at[WF_ACT_BACKWARD][k + 1] < 0)
      return "backward before its gradient: the next chunk's backward has not run";
    if (st < S - 1 && !local_next && sn->at[WF_ACT_RECV_B][k] < 0)
      return "backward before its gradient arrived: no RECV_B of this micro-batch before it";
    return NULL;
  case WF_ACT_SEND_F:
    return sn->at[WF_ACT_FORWARD][k] < 0 ? "sends an activation its forward has not produced"
                                         : NULL;
  case WF_ACT_SEND_B:
    return sn->at[WF_ACT_BACKWARD][k] < 0 ? "sends a gradient its backward has not produced" : NULL;
  default: return NULL;
  }
}

static wf_status check_action(const wf_schedule *s, int i, seen *sn, char *err, size_t len)
{
  const wf_sched_action *a = &s->actions[i];
  int m = s->prm.microbatches, v = s->prm.virtual_stages;
  if ((unsigned)a->op > WF_ACT_RECV_B)
    return bad(s, i, err, len, "unknown action %d", (int)a->op);
  if (a->mb < 0 || a->mb >= m)
    return bad(s, i, err, len, "micro-batch %d is out of range 0 .. %d", a->mb, m - 1);
  if (a->chunk < 0 || a->chunk >= v)
    return bad(s, i, err, len, "chunk %d is out of range 0 .. %d", a->chunk, v - 1);
  if (!wf__sched_is_compute(a->op) && check_peer(s, i, err, len) != WF_OK)
    return WF_EINVAL;
  int k = a->mb * v + a->chunk, *at = sn->at[a->op];
  if (at[k] >= 0)
    return bad(s, i, err, len, "repeats micro-batch %d: its %s already ran at step %d", a->mb,
               op_name[a->op], at[k]);
  const char *why = missing_input(s, a, sn);
  if (why)
    return bad(s, i, err, len, "%s", why);
  at[k] = i;
  return WF_OK;
}

/* After the last step: every unit ran forward and backward, and sent what a stage on
 * another rank waits for. */
/* What unit (mb, chunk c) never did on this rank, or NULL. */
static const char *unit_gap(const wf_schedule *s, const seen *sn, int mb, int c)
{
  int p = s->prm.pp, v = s->prm.virtual_stages, k = mb * v + c;
  int st = wf__sched_stage(&s->prm, s->rank, c);
  if (sn->at[WF_ACT_FORWARD][k] < 0)
    return "never runs forward";
  if (sn->at[WF_ACT_BACKWARD][k] < 0)
    return "never runs backward";
  if (st + 1 < p * v && (st + 1) % p != s->rank && sn->at[WF_ACT_SEND_F][k] < 0)
    return "never sends its activation";
  if (st > 0 && (st - 1) % p != s->rank && sn->at[WF_ACT_SEND_B][k] < 0)
    return "never sends its gradient";
  return NULL;
}

static wf_status check_complete(const wf_schedule *s, const seen *sn, char *err, size_t len)
{
  for (int mb = 0; mb < s->prm.microbatches; mb++)
    for (int c = 0; c < s->prm.virtual_stages; c++) {
      const char *gap = unit_gap(s, sn, mb, c);
      if (gap)
        return bad(s, s->n, err, len, "micro-batch %d on stage %d (chunk %d) %s", mb,
                   wf__sched_stage(&s->prm, s->rank, c), c, gap);
    }
  return WF_OK;
}

static wf_status check_list(const wf_schedule *s, seen *sn, char *err, size_t len)
{
  size_t cells = (size_t)s->prm.microbatches * s->prm.virtual_stages;
  for (int o = 0; o < 6; o++)
    for (size_t k = 0; k < cells; k++)
      sn->at[o][k] = -1;
  if (s->n < 0 || (s->n > 0 && !s->actions))
    return wf__sched_fail(err, len, "rank %d: the action list is malformed (n = %d)", s->rank,
                          s->n);
  for (int i = 0; i < s->n; i++)
    if (check_action(s, i, sn, err, len) != WF_OK)
      return WF_EINVAL;
  return check_complete(s, sn, err, len);
}

static wf_status check_lists(const wf_schedule *ranks, char *err, size_t len)
{
  const wf_sched_params *prm = &ranks[0].prm;
  size_t cells = (size_t)prm->microbatches * prm->virtual_stages;
  seen sn;
  int *mem = malloc(6 * cells * sizeof *mem);
  if (!mem)
    return wf__sched_fail(err, len, "out of memory validating a schedule");
  for (int o = 0; o < 6; o++)
    sn.at[o] = mem + o * cells;
  wf_status st = WF_OK;
  for (int r = 0; r < prm->pp && st == WF_OK; r++) {
    if (ranks[r].rank != r || memcmp(&ranks[r].prm, prm, sizeof *prm))
      st = wf__sched_fail(err, len,
                          "rank %d: the list is for rank %d or for other parameters than rank 0's",
                          r, ranks[r].rank);
    else
      st = check_list(&ranks[r], &sn, err, len);
  }
  free(mem);
  return st;
}

/* ---- validation, 2: all ranks together, rendezvous p2p ------------------------------ */

/* `snd` on rank `from` and `rcv` on rank `to` are the same message. */
static bool same_message(const wf_sched_params *prm, const wf_sched_action *snd, int from,
                         const wf_sched_action *rcv, int to)
{
  bool fwd = snd->op == WF_ACT_SEND_F;
  if (rcv->op != (fwd ? WF_ACT_RECV_F : WF_ACT_RECV_B) || rcv->mb != snd->mb)
    return false;
  int s1 = wf__sched_stage(prm, from, snd->chunk), s2 = wf__sched_stage(prm, to, rcv->chunk);
  return s2 == (fwd ? s1 + 1 : s1 - 1);
}

static wf_status mismatch(const wf__sched_sim *m, int r, int q, char *err, size_t len)
{
  char other[64];
  const wf_schedule *o = &m->ranks[q];
  wf_schedule_action_str(o, &o->actions[m->pos[q]], other, sizeof other);
  return bad(&m->ranks[r], m->pos[r], err, len,
             "meets rank %d step %d (%s): not the same message; messages between two ranks "
             "must come in the same order in both lists",
             q, m->pos[q], other);
}

/* Run rank r as far as it can go; returns the steps taken, or -1 on a mismatch. */
static int advance(wf__sched_sim *m, int r, char *err, size_t len)
{
  const wf_schedule *s = &m->ranks[r];
  int moved = 0;
  while (m->pos[r] < s->n) {
    const wf_sched_action *a = &s->actions[m->pos[r]];
    if (!wf__sched_is_compute(a->op)) {
      int q = a->peer;
      const wf_schedule *o = &m->ranks[q];
      if (m->pos[q] >= o->n)
        break;
      const wf_sched_action *b = &o->actions[m->pos[q]];
      if (wf__sched_is_compute(b->op) || b->peer != r ||
          wf__sched_is_send(a->op) == wf__sched_is_send(b->op))
        break;
      bool same = wf__sched_is_send(a->op) ? same_message(&s->prm, a, r, b, q)
                                           : same_message(&s->prm, b, q, a, r);
      if (!same) {
        mismatch(m, r, q, err, len);
        return -1;
      }
      m->match[m->off[r] + m->pos[r]] = m->pos[q];
      m->match[m->off[q] + m->pos[q]] = m->pos[r];
      m->pos[q]++;
    }
    m->pos[r]++;
    moved++;
  }
  return moved;
}

static wf_status deadlock(const wf__sched_sim *m, char *err, size_t len)
{
  for (int r = 0; r < m->p; r++) {
    const wf_schedule *s = &m->ranks[r];
    if (m->pos[r] >= s->n)
      continue;
    int q = s->actions[m->pos[r]].peer;
    const wf_schedule *o = &m->ranks[q];
    char other[64] = "";
    if (m->pos[q] >= o->n)
      return bad(s, m->pos[r], err, len,
                 "deadlock: waits for rank %d, which has finished its list without the partner "
                 "of this message",
                 q);
    wf_schedule_action_str(o, &o->actions[m->pos[q]], other, sizeof other);
    return bad(s, m->pos[r], err, len,
               "deadlock: waits for rank %d, which is blocked at step %d (%s); with blocking "
               "p2p no rank can move",
               q, m->pos[q], other);
  }
  return WF_OK;
}

static wf_status rendezvous(wf__sched_sim *m, char *err, size_t len)
{
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < m->p; r++) {
      int moved = advance(m, r, err, len);
      if (moved < 0)
        return WF_EINVAL;
      progress = progress || moved > 0;
    }
  }
  return deadlock(m, err, len);
}

void wf__sched_sim_free(wf__sched_sim *m)
{
  free(m->pos);
  free(m->match);
}

/* Validate, and on success leave the pairing of every message in m->match. */
wf_status wf__sched_sim_validate(wf__sched_sim *m, const wf_schedule *ranks, char *err, size_t len)
{
  memset(m, 0, sizeof *m);
  if (!ranks)
    return wf__sched_fail(err, len, "no schedule to validate");
  if (wf__sched_check_params(&ranks[0].prm, err, len) != WF_OK)
    return WF_EINVAL;
  wf_status st = check_lists(ranks, err, len);
  if (st != WF_OK)
    return st;
  m->ranks = ranks;
  m->p = ranks[0].prm.pp;
  m->pos = calloc((size_t)2 * m->p + 1, sizeof *m->pos);
  if (!m->pos)
    return wf__sched_fail(err, len, "out of memory validating a schedule");
  m->off = m->pos + m->p;
  for (int r = 0; r < m->p; r++)
    m->off[r + 1] = m->off[r] + ranks[r].n;
  m->match = malloc(((size_t)m->off[m->p] + 1) * sizeof *m->match);
  if (!m->match)
    return wf__sched_fail(err, len, "out of memory validating a schedule");
  for (int i = 0; i < m->off[m->p]; i++)
    m->match[i] = -1;
  return rendezvous(m, err, len);
}

wf_status wf_schedule_validate(const wf_schedule *ranks, char *err, size_t err_len)
{
  wf__sched_sim m;
  wf_status st = wf__sched_sim_validate(&m, ranks, err, err_len);
  wf__sched_sim_free(&m);
  return st;
}

int wf_schedule_peak_inflight(const wf_schedule *s)
{
  int now = 0, peak = 0;
  for (int i = 0; s && i < s->n; i++) {
    if (s->actions[i].op == WF_ACT_FORWARD && ++now > peak)
      peak = now;
    else if (s->actions[i].op == WF_ACT_BACKWARD)
      now--;
  }
  return peak;
}

/* Receives posted and not yet consumed, at their peak. A work item's key is mb * v +
 * chunk; `posted` marks the keys whose message is waiting for its consumer. */
static int peak_pending(const wf_schedule *s, wf_sched_op recv, wf_sched_op consumer)
{
  int v = s->prm.virtual_stages, now = 0, peak = 0;
  bool *posted = calloc((size_t)s->prm.microbatches * (size_t)v, sizeof *posted);
  if (!posted)
    return s->prm.microbatches * v; /* the most there can be */
  for (int i = 0; i < s->n; i++) {
    const wf_sched_action *a = &s->actions[i];
    int k = a->mb * v + a->chunk;
    if (a->op == recv && !posted[k]) {
      posted[k] = true;
      peak = ++now > peak ? now : peak;
    } else if (a->op == consumer && posted[k]) {
      posted[k] = false;
      now--;
    }
  }
  free(posted);
  return peak;
}

wf_sched_bufs wf_schedule_buffers(const wf_schedule *s)
{
  wf_sched_bufs b = {0};
  if (!s || s->n == 0)
    return b;
  b.recv_f = peak_pending(s, WF_ACT_RECV_F, WF_ACT_FORWARD);
  b.recv_b = peak_pending(s, WF_ACT_RECV_B, WF_ACT_BACKWARD);
  for (int i = 0; i < s->n && b.send_b < 2; i++)
    b.send_b += s->actions[i].op == WF_ACT_SEND_B;
  return b;
}
