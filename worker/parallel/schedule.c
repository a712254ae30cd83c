/*
 * schedule.c - pipeline schedules as data: generate, validate, simulate, draw.
 *
 * Generation has two parts.
 *
 * 1. The compute order of each rank, which is what names a schedule:
 *    - GPipe: F0 .. F(m-1), then B0 .. B(m-1).
 *    - 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): a warm-up of
 *      W = min(p - r - 1, m) forwards, then m - W pairs F(W + i), B(i), then the
 *      cool-down B(m - W) .. B(m - 1).
 *    - Interleaved 1F1B (Megatron's interleaved schedule): the m * v forward units
 *      are taken in groups of p micro-batches per chunk (unit k is micro-batch
 *      (k / pv) p + k % p on chunk (k % pv) / p; backward units use the chunks in
 *      reverse); warm-up W = 2 (p - r - 1) + (v - 1) p units (all of them when that
 *      is not less than m v), then one forward, one backward, then the cool-down.
 *
 * 2. Where the messages go. All ranks run their compute orders on a clock with unit
 *    costs. When a compute finishes at tick t and its output belongs to a stage on
 *    another rank, the SEND is appended to the producer's list and the matching RECV
 *    to the consumer's list at the same moment; within a tick, finishes are handled
 *    before starts and in rank order (not "sends first": two ranks that send to each
 *    other in one tick must agree on which message goes first, or blocking p2p
 *    criss-crosses into a deadlock). So a RECV sits where the data came into being,
 *    ahead of its consumer (where an engine posts the receive), and a SEND right
 *    after its producer.
 *
 *    Invariant: every rank's messages appear in one global order (the order they
 *    were appended), so the lists cannot deadlock even under blocking rendezvous
 *    p2p: the earliest message not yet exchanged has both ends reachable, because
 *    everything before it on either rank is compute or an earlier message. The same
 *    order also makes messages between two ranks match in list order, as NCCL
 *    matches them. The validator checks this independently rather than trusting it.
 *
 * Validation first checks each list alone, then replays all lists under rendezvous
 * p2p (the strictest model: nothing is buffered, so a list that passes also runs with
 * eager sends, non-blocking posts or NCCL groups). The replay pairs each SEND with its
 * RECV; the clock (simulate, draw) reuses that pairing and runs the lists the way an
 * engine with non-blocking p2p would: sends and receive posts never wait, a compute
 * waits for the SEND of its input. With that clock the placement of a RECV, which was
 * computed at unit cost, does not delay anything at other costs.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wf_parallel.h"

/* A schedule longer than this is a config mistake, not a workload. */
#define MAX_UNITS (1 << 22) /* m * v */

static wf_status fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static wf_status fail(char *err, size_t len, const char *fmt, ...)
{
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return WF_EINVAL;
}

static bool is_compute(wf_sched_op op) { return op == WF_ACT_FORWARD || op == WF_ACT_BACKWARD; }
static bool is_send(wf_sched_op op) { return op == WF_ACT_SEND_F || op == WF_ACT_SEND_B; }
static int stage_of(const wf_sched_params *prm, int rank, int chunk)
{
  return chunk * prm->pp + rank;
}

const char *wf_schedule_kind_str(wf_schedule_kind kind)
{
  switch (kind) {
  case WF_SCHED_1F1B: return "1f1b";
  case WF_SCHED_GPIPE: return "gpipe";
  case WF_SCHED_INTERLEAVED: return "interleaved";
  }
  return "unknown";
}

static wf_status check_params(const wf_sched_params *prm, char *err, size_t len)
{
  int p = prm->pp, m = prm->microbatches, v = prm->virtual_stages;
  const char *name = wf_schedule_kind_str(prm->kind);
  if (p < 1 || m < 1 || v < 1)
    return fail(err, len, "schedule %s: pp=%d, microbatches=%d and virtual_stages=%d must be >= 1",
                name, p, m, v);
  if ((int64_t)m * v > MAX_UNITS || p > MAX_UNITS)
    return fail(err, len, "schedule %s: microbatches=%d x virtual_stages=%d is too large", name, m,
                v);
  switch (prm->kind) {
  case WF_SCHED_GPIPE:
  case WF_SCHED_1F1B:
    if (v != 1)
      return fail(err, len,
                  "schedule %s runs one model chunk per rank; virtual_stages=%d must be 1", name,
                  v);
    return WF_OK;
  case WF_SCHED_INTERLEAVED:
    if (v < 2)
      return fail(err, len, "schedule interleaved needs virtual_stages >= 2 (it is %d)", v);
    if (m % p != 0)
      return fail(err, len, "schedule interleaved needs microbatches=%d to be a multiple of pp=%d",
                  m, p);
    return WF_OK;
  }
  return fail(err, len, "unknown schedule kind %d", (int)prm->kind);
}

/* ---- 1. compute orders ------------------------------------------------------------ */

static wf_sched_action unit(wf_sched_op op, int mb, int chunk)
{
  return (wf_sched_action){.op = op, .mb = mb, .chunk = chunk, .peer = -1};
}

static void order_gpipe(wf_sched_action *o, int m)
{
  for (int i = 0; i < m; i++) {
    o[i] = unit(WF_ACT_FORWARD, i, 0);
    o[m + i] = unit(WF_ACT_BACKWARD, i, 0);
  }
}

static void order_1f1b(wf_sched_action *o, int p, int r, int m)
{
  int warm = p - r - 1 < m ? p - r - 1 : m, n = 0;
  for (int i = 0; i < warm; i++)
    o[n++] = unit(WF_ACT_FORWARD, i, 0);
  for (int i = 0; i < m - warm; i++) {
    o[n++] = unit(WF_ACT_FORWARD, warm + i, 0);
    o[n++] = unit(WF_ACT_BACKWARD, i, 0);
  }
  for (int i = m - warm; i < m; i++)
    o[n++] = unit(WF_ACT_BACKWARD, i, 0);
}

/* Megatron's virtual micro-batch k -> (micro-batch, chunk). */
static wf_sched_action interleaved_unit(int k, int p, int v, bool forward)
{
  int in_group = k % (p * v), chunk = in_group / p;
  int mb = k / (p * v) * p + k % p;
  if (!forward)
    chunk = v - 1 - chunk;
  return unit(forward ? WF_ACT_FORWARD : WF_ACT_BACKWARD, mb, chunk);
}

static void order_interleaved(wf_sched_action *o, int p, int r, int m, int v)
{
  int total = m * v, n = 0;
  int warm = (p - r - 1) * 2 + (v - 1) * p;
  if (warm > total)
    warm = total;
  for (int k = 0; k < warm; k++)
    o[n++] = interleaved_unit(k, p, v, true);
  for (int k = 0; k < total - warm; k++) {
    o[n++] = interleaved_unit(warm + k, p, v, true);
    o[n++] = interleaved_unit(k, p, v, false);
  }
  for (int k = total - warm; k < total; k++)
    o[n++] = interleaved_unit(k, p, v, false);
}

static void compute_order(const wf_sched_params *prm, int r, wf_sched_action *o)
{
  switch (prm->kind) {
  case WF_SCHED_GPIPE: order_gpipe(o, prm->microbatches); break;
  case WF_SCHED_1F1B: order_1f1b(o, prm->pp, r, prm->microbatches); break;
  case WF_SCHED_INTERLEAVED:
    order_interleaved(o, prm->pp, r, prm->microbatches, prm->virtual_stages);
    break;
  }
}

/* ---- 2. placing the messages -------------------------------------------------------- */

typedef struct gen {
  const wf_sched_params *prm;
  int p, S, units;         /* ranks, stages, compute units per rank (2 m v) */
  wf_schedule *out;        /* [p] */
  wf_sched_action *order;  /* [p][units]: compute orders */
  int *fdone, *bdone;      /* [mb * S + stage]: tick it finished, -1 = not yet */
  int *pos, *run, *finish; /* per rank: next unit, running unit (-1 idle), its end */
} gen;

static void emit(gen *g, int r, wf_sched_op op, int mb, int chunk, int peer)
{
  wf_schedule *s = &g->out[r];
  s->actions[s->n++] = (wf_sched_action){.op = op, .mb = mb, .chunk = chunk, .peer = peer};
}

static bool done_by(int when, int t) { return when >= 0 && when <= t; }

static bool unit_ready(const gen *g, int r, const wf_sched_action *a, int t)
{
  int s = stage_of(g->prm, r, a->chunk), i = a->mb * g->S + s;
  if (a->op == WF_ACT_FORWARD)
    return s == 0 || done_by(g->fdone[i - 1], t);
  return done_by(g->fdone[i], t) && (s == g->S - 1 || done_by(g->bdone[i + 1], t));
}

/* Unit `a` of rank r finished at tick t: record it and send its output on. */
static void unit_finish(gen *g, int r, const wf_sched_action *a, int t)
{
  int p = g->p, s = stage_of(g->prm, r, a->chunk), i = a->mb * g->S + s;
  if (a->op == WF_ACT_FORWARD) {
    g->fdone[i] = t;
    if (s + 1 < g->S && (s + 1) % p != r) {
      emit(g, r, WF_ACT_SEND_F, a->mb, a->chunk, (s + 1) % p);
      emit(g, (s + 1) % p, WF_ACT_RECV_F, a->mb, (s + 1) / p, r);
    }
    return;
  }
  g->bdone[i] = t;
  if (s > 0 && (s - 1) % p != r) {
    emit(g, r, WF_ACT_SEND_B, a->mb, a->chunk, (s - 1) % p);
    emit(g, (s - 1) % p, WF_ACT_RECV_B, a->mb, (s - 1) / p, r);
  }
}

/* One tick: finishes (in rank order), then starts. Returns how many units finished;
 * *busy says whether any rank is still computing. */
static int tick(gen *g, int t, bool *busy)
{
  int finished = 0;
  for (int r = 0; r < g->p; r++)
    if (g->run[r] >= 0 && g->finish[r] == t) {
      unit_finish(g, r, &g->order[(size_t)r * g->units + g->run[r]], t);
      g->run[r] = -1;
      finished++;
    }
  *busy = false;
  for (int r = 0; r < g->p; r++) {
    const wf_sched_action *a = &g->order[(size_t)r * g->units + g->pos[r]];
    if (g->run[r] < 0 && g->pos[r] < g->units && unit_ready(g, r, a, t)) {
      emit(g, r, a->op, a->mb, a->chunk, -1);
      g->run[r] = g->pos[r]++;
      g->finish[r] = t + 1; /* unit cost */
    }
    *busy = *busy || g->run[r] >= 0;
  }
  return finished;
}

static wf_status place_messages(gen *g, char *err, size_t len)
{
  long left = (long)g->p * g->units;
  for (int t = 0;; t++) {
    bool busy;
    left -= tick(g, t, &busy);
    if (left == 0)
      return WF_OK;
    if (!busy)
      return fail(err, len, "schedule %s: the compute order stalls at tick %d (a generator bug)",
                  wf_schedule_kind_str(g->prm->kind), t);
  }
}

static wf_status gen_alloc(gen *g, const wf_sched_params *prm, wf_schedule *ranks)
{
  memset(g, 0, sizeof *g);
  g->prm = prm;
  g->p = prm->pp;
  g->S = prm->pp * prm->virtual_stages;
  g->units = 2 * prm->microbatches * prm->virtual_stages;
  g->out = ranks;
  size_t cells = (size_t)prm->microbatches * g->S;
  g->order = calloc((size_t)g->p * g->units, sizeof *g->order);
  g->fdone = malloc(cells * sizeof *g->fdone);
  g->bdone = malloc(cells * sizeof *g->bdone);
  g->pos = calloc((size_t)g->p * 3, sizeof *g->pos);
  if (!g->order || !g->fdone || !g->bdone || !g->pos)
    return WF_ENOMEM;
  g->run = g->pos + g->p;
  g->finish = g->run + g->p;
  for (size_t i = 0; i < cells; i++)
    g->fdone[i] = g->bdone[i] = -1;
  for (int r = 0; r < g->p; r++) {
    g->run[r] = -1;
    compute_order(prm, r, &g->order[(size_t)r * g->units]);
    /* each unit brings at most one receive and one send */
    ranks[r].actions = malloc((size_t)3 * g->units * sizeof *ranks[r].actions);
    if (!ranks[r].actions)
      return WF_ENOMEM;
  }
  return WF_OK;
}

static void gen_free(gen *g)
{
  free(g->order);
  free(g->fdone);
  free(g->bdone);
  free(g->pos);
}

wf_status wf_schedule_init_all(wf_schedule *ranks, const wf_sched_params *prm, char *err,
                               size_t err_len)
{
  if (!ranks || !prm)
    return WF_EINVAL;
  wf_status st = check_params(prm, err, err_len);
  if (st != WF_OK)
    return st;
  for (int r = 0; r < prm->pp; r++)
    ranks[r] = (wf_schedule){.prm = *prm, .rank = r};
  gen g;
  st = gen_alloc(&g, prm, ranks);
  if (st == WF_ENOMEM)
    fail(err, err_len, "out of memory generating a schedule of %d ranks", prm->pp);
  if (st == WF_OK)
    st = place_messages(&g, err, err_len);
  gen_free(&g);
  if (st != WF_OK)
    wf_schedule_fini_all(ranks, prm->pp);
  return st;
}

wf_status wf_schedule_init(wf_schedule *s, const wf_sched_params *prm, int rank, char *err,
                           size_t err_len)
{
  if (!s || !prm)
    return WF_EINVAL;
  memset(s, 0, sizeof *s);
  if (rank < 0 || rank >= prm->pp)
    return fail(err, err_len, "pp rank %d is not in 0 .. %d", rank, prm->pp - 1);
  wf_schedule *all = calloc((size_t)prm->pp, sizeof *all);
  if (!all)
    return fail(err, err_len, "out of memory generating a schedule of %d ranks", prm->pp);
  wf_status st = wf_schedule_init_all(all, prm, err, err_len);
  if (st == WF_OK) {
    *s = all[rank];
    all[rank].actions = NULL;
    wf_schedule_fini_all(all, prm->pp);
  }
  free(all);
  return st;
}

void wf_schedule_fini(wf_schedule *s)
{
  if (!s)
    return;
  free(s->actions);
  s->actions = NULL;
  s->n = 0;
}

void wf_schedule_fini_all(wf_schedule *ranks, int pp)
{
  for (int r = 0; ranks && r < pp; r++)
    wf_schedule_fini(&ranks[r]);
}

/* ---- names ------------------------------------------------------------------------ */

void wf_schedule_action_str(const wf_schedule *s, const wf_sched_action *a, char *buf, size_t len)
{
  static const char *const pre[] = {"F", "B", "SF", "RF", "SB", "RB"};
  char chunk[16] = "";
  if (s->prm.virtual_stages > 1 && a->chunk >= 0 && a->chunk < 26)
    snprintf(chunk, sizeof chunk, "%c", 'a' + a->chunk);
  else if (s->prm.virtual_stages > 1)
    snprintf(chunk, sizeof chunk, "c%d", a->chunk);
  if ((unsigned)a->op > WF_ACT_RECV_B)
    snprintf(buf, len, "?%d", (int)a->op);
  else if (is_compute(a->op))
    snprintf(buf, len, "%s%d%s", pre[a->op], a->mb, chunk);
  else
    snprintf(buf, len, "%s%d%s%c%d", pre[a->op], a->mb, chunk, is_send(a->op) ? '>' : '<', a->peer);
}

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
  int p = s->prm.pp, S = p * s->prm.virtual_stages, st = stage_of(&s->prm, s->rank, a->chunk);
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
  int st = stage_of(&s->prm, s->rank, a->chunk), k = a->mb * v + a->chunk;
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
  if (!is_compute(a->op) && check_peer(s, i, err, len) != WF_OK)
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
  int st = stage_of(&s->prm, s->rank, c);
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
                   stage_of(&s->prm, s->rank, c), c, gap);
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
    return fail(err, len, "rank %d: the action list is malformed (n = %d)", s->rank, s->n);
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
    return fail(err, len, "out of memory validating a schedule");
  for (int o = 0; o < 6; o++)
    sn.at[o] = mem + o * cells;
  wf_status st = WF_OK;
  for (int r = 0; r < prm->pp && st == WF_OK; r++) {
    if (ranks[r].rank != r || memcmp(&ranks[r].prm, prm, sizeof *prm))
      st = fail(err, len, "rank %d: the list is for rank %d or for other parameters than rank 0's",
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
  int s1 = stage_of(prm, from, snd->chunk), s2 = stage_of(prm, to, rcv->chunk);
  return s2 == (fwd ? s1 + 1 : s1 - 1);
}

typedef struct sim {
  const wf_schedule *ranks;
  int p;
  int *pos;   /* [p]: next step of each rank */
  int *off;   /* [p + 1]: rank r's steps are off[r] .. off[r+1]-1 in the flat arrays */
  int *match; /* [off[p]]: the partner's step of each message, -1 for compute */
} sim;

static wf_status mismatch(const sim *m, int r, int q, char *err, size_t len)
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
static int advance(sim *m, int r, char *err, size_t len)
{
  const wf_schedule *s = &m->ranks[r];
  int moved = 0;
  while (m->pos[r] < s->n) {
    const wf_sched_action *a = &s->actions[m->pos[r]];
    if (!is_compute(a->op)) {
      int q = a->peer;
      const wf_schedule *o = &m->ranks[q];
      if (m->pos[q] >= o->n)
        break;
      const wf_sched_action *b = &o->actions[m->pos[q]];
      if (is_compute(b->op) || b->peer != r || is_send(a->op) == is_send(b->op))
        break;
      bool same =
          is_send(a->op) ? same_message(&s->prm, a, r, b, q) : same_message(&s->prm, b, q, a, r);
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

static wf_status deadlock(const sim *m, char *err, size_t len)
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

static wf_status rendezvous(sim *m, char *err, size_t len)
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

static void sim_free(sim *m)
{
  free(m->pos);
  free(m->match);
}

/* Validate, and on success leave the pairing of every message in m->match. */
static wf_status sim_validate(sim *m, const wf_schedule *ranks, char *err, size_t len)
{
  memset(m, 0, sizeof *m);
  if (!ranks)
    return fail(err, len, "no schedule to validate");
  if (check_params(&ranks[0].prm, err, len) != WF_OK)
    return WF_EINVAL;
  wf_status st = check_lists(ranks, err, len);
  if (st != WF_OK)
    return st;
  m->ranks = ranks;
  m->p = ranks[0].prm.pp;
  m->pos = calloc((size_t)2 * m->p + 1, sizeof *m->pos);
  if (!m->pos)
    return fail(err, len, "out of memory validating a schedule");
  m->off = m->pos + m->p;
  for (int r = 0; r < m->p; r++)
    m->off[r + 1] = m->off[r] + ranks[r].n;
  m->match = malloc(((size_t)m->off[m->p] + 1) * sizeof *m->match);
  if (!m->match)
    return fail(err, len, "out of memory validating a schedule");
  for (int i = 0; i < m->off[m->p]; i++)
    m->match[i] = -1;
  return rendezvous(m, err, len);
}

wf_status wf_schedule_validate(const wf_schedule *ranks, char *err, size_t err_len)
{
  sim m;
  wf_status st = sim_validate(&m, ranks, err, err_len);
  sim_free(&m);
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

/* ---- the clock ---------------------------------------------------------------------- */

static int cost_of(wf_sched_cost cost, wf_sched_op op)
{
  return op == WF_ACT_FORWARD ? cost.forward : op == WF_ACT_BACKWARD ? cost.backward : 0;
}

/* dep[off[r] + i]: for a compute whose input comes from another rank, the flat index
 * of the SEND that delivers it; -1 otherwise. Lists must be valid. */
static wf_status link_inputs(const sim *m, int *dep)
{
  const wf_sched_params *prm = &m->ranks[0].prm;
  size_t cells = (size_t)prm->microbatches * prm->virtual_stages;
  int *recv = malloc(2 * cells * sizeof *recv); /* RECV_F step, then RECV_B step */
  if (!recv)
    return WF_ENOMEM;
  for (int r = 0; r < m->p; r++) {
    const wf_schedule *s = &m->ranks[r];
    for (size_t k = 0; k < 2 * cells; k++)
      recv[k] = -1;
    for (int i = 0; i < s->n; i++) {
      const wf_sched_action *a = &s->actions[i];
      size_t k = (size_t)a->mb * prm->virtual_stages + a->chunk;
      int *slot = a->op == WF_ACT_RECV_F || a->op == WF_ACT_FORWARD ? &recv[k] : &recv[cells + k];
      dep[m->off[r] + i] = -1;
      if (!is_compute(a->op) && !is_send(a->op))
        *slot = i;
      else if (is_compute(a->op) && *slot >= 0)
        dep[m->off[r] + i] = m->off[s->actions[*slot].peer] + m->match[m->off[r] + *slot];
    }
  }
  free(recv);
  return WF_OK;
}

/* Run validated lists on a clock, as an engine with non-blocking p2p runs them: a
 * SEND is issued and never waits, a RECV is posted and never waits, and a compute
 * starts when its rank is free and the SEND of its input has been issued (messages
 * take no time). start[off[r] + i] is when step i of rank r begins, -1 until then. */
static wf_status run_clock(const sim *m, wf_sched_cost cost, const int *dep, int *start,
                           int *makespan)
{
  int *t = calloc((size_t)2 * m->p, sizeof *t), *pos = t + m->p, done = 0;
  if (!t)
    return WF_ENOMEM;
  for (int i = 0; i < m->off[m->p]; i++)
    start[i] = -1;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < m->p; r++)
      for (const wf_schedule *s = &m->ranks[r]; pos[r] < s->n; pos[r]++, done++) {
        int idx = m->off[r] + pos[r], d = dep[idx];
        if (d >= 0 && start[d] < 0)
          break; /* its input is not sent yet */
        if (d >= 0 && start[d] > t[r])
          t[r] = start[d];
        start[idx] = t[r];
        t[r] += cost_of(cost, s->actions[pos[r]].op);
        progress = true;
      }
  }
  *makespan = 0;
  for (int r = 0; r < m->p; r++)
    *makespan = t[r] > *makespan ? t[r] : *makespan;
  free(t);
  return done == m->off[m->p] ? WF_OK : WF_EINVAL;
}

/* Validate and run the clock; the caller frees *start and the sim. */
static wf_status clock_all(sim *m, const wf_schedule *ranks, wf_sched_cost cost, int **start,
                           int *makespan)
{
  *start = NULL;
  if (cost.forward < 1 || cost.backward < 1)
    return WF_EINVAL;
  wf_status st = sim_validate(m, ranks, NULL, 0);
  if (st != WF_OK)
    return st;
  size_t total = (size_t)m->off[m->p] + 1;
  *start = malloc(2 * total * sizeof **start); /* start, then dep */
  if (!*start)
    return WF_ENOMEM;
  st = link_inputs(m, *start + total);
  return st == WF_OK ? run_clock(m, cost, *start + total, *start, makespan) : st;
}

wf_status wf_schedule_simulate(const wf_schedule *ranks, wf_sched_cost cost, int *makespan,
                               double *bubble)
{
  sim m;
  int *start, span = 0;
  wf_status st = clock_all(&m, ranks, cost, &start, &span);
  if (st == WF_OK) {
    double busy = 0;
    for (int r = 0; r < m.p; r++)
      for (int i = 0; i < ranks[r].n; i++)
        busy += cost_of(cost, ranks[r].actions[i].op);
    if (makespan)
      *makespan = span;
    if (bubble)
      *bubble = span > 0 ? 1.0 - busy / ((double)m.p * span) : 0.0;
  }
  free(start);
  sim_free(&m);
  return st;
}

double wf_schedule_bubble_theory(const wf_sched_params *prm)
{
  double p = prm->pp, m = prm->microbatches, v = prm->virtual_stages;
  if (prm->kind != WF_SCHED_INTERLEAVED)
    v = 1;
  return (p - 1) / (v * m + p - 1);
}

/* ---- drawing ------------------------------------------------------------------------ */

static int label_width(const wf_schedule *ranks, int p)
{
  int w = 2; /* ".." */
  char buf[64];
  for (int r = 0; r < p; r++)
    for (int i = 0; i < ranks[r].n; i++)
      if (is_compute(ranks[r].actions[i].op)) {
        wf_schedule_action_str(&ranks[r], &ranks[r].actions[i], buf, sizeof buf);
        w = (int)strlen(buf) > w ? (int)strlen(buf) : w;
      }
  return w;
}

/* One rank's row: every tick shows the compute running then, or "..". */
static void draw_row(FILE *out, const sim *m, int r, const int *start, int span, int w,
                     wf_sched_cost cost, char (*cells)[64])
{
  const wf_schedule *s = &m->ranks[r];
  for (int t = 0; t < span; t++)
    snprintf(cells[t], sizeof cells[t], "..");
  for (int i = 0; i < s->n; i++) {
    const wf_sched_action *a = &s->actions[i];
    int t0 = start[m->off[r] + i];
    for (int t = t0; is_compute(a->op) && t < t0 + cost_of(cost, a->op) && t < span; t++)
      wf_schedule_action_str(s, a, cells[t], sizeof cells[t]);
  }
  fprintf(out, "rank %*d |", m->p > 100 ? 3 : m->p > 10 ? 2 : 1, r);
  for (int t = 0; t < span; t++)
    fprintf(out, " %-*s", w, cells[t]);
  fputc('\n', out);
}

wf_status wf_schedule_draw(FILE *out, const wf_schedule *ranks, wf_sched_cost cost)
{
  sim m;
  int *start, span = 0;
  char(*cells)[64] = NULL;
  wf_status st = clock_all(&m, ranks, cost, &start, &span);
  if (st == WF_OK && !(cells = calloc((size_t)span + 1, sizeof *cells)))
    st = WF_ENOMEM;
  if (st == WF_OK) {
    int w = label_width(ranks, m.p);
    for (int r = 0; r < m.p; r++)
      draw_row(out, &m, r, start, span, w, cost, cells);
  }
  free(cells);
  free(start);
  sim_free(&m);
  return st;
}

static void print_actions(FILE *out, const wf_schedule *ranks, int p)
{
  char buf[64];
  fprintf(out, "\nactions (SFk>r: send micro-batch k's activation to rank r, RFk<r: receive it "
               "from r; SB/RB: the same for its gradient):\n");
  for (int r = 0; r < p; r++) {
    const wf_schedule *s = &ranks[r];
    fprintf(out, "rank %d (%d actions, peak in flight %d):", r, s->n, wf_schedule_peak_inflight(s));
    for (int i = 0; i < s->n; i++) {
      wf_schedule_action_str(s, &s->actions[i], buf, sizeof buf);
      fprintf(out, " %s", buf);
    }
    fputc('\n', out);
  }
}

static void print_bubble(FILE *out, const wf_sched_params *prm, int span, double bubble)
{
  int p = prm->pp, m = prm->microbatches, v = prm->virtual_stages;
  bool il = prm->kind == WF_SCHED_INTERLEAVED;
  int den = (il ? v * m : m) + p - 1;
  fprintf(out,
          "\nbubble: theoretical (p-1)/(%s+p-1) = %d/%d = %.4f; simulated %.4f (makespan %d ticks, "
          "%d busy per rank)\n",
          il ? "v*m" : "m", p - 1, den, wf_schedule_bubble_theory(prm), bubble, span,
          2 * m * (il ? v : 1));
}

wf_status wf_schedule_print(FILE *out, const wf_sched_params *prm, char *err, size_t err_len)
{
  wf_sched_cost unit_cost = {1, 1};
  int span = 0;
  double bubble = 0;
  if (!out || !prm || prm->pp < 1)
    return fail(err, err_len, "schedule: pp must be >= 1");
  wf_schedule *ranks = calloc((size_t)prm->pp, sizeof *ranks);
  if (!ranks)
    return fail(err, err_len, "out of memory generating a schedule of %d ranks", prm->pp);
  wf_status st = wf_schedule_init_all(ranks, prm, err, err_len);
  if (st == WF_OK)
    st = wf_schedule_validate(ranks, err, err_len);
  if (st == WF_OK)
    st = wf_schedule_simulate(ranks, unit_cost, &span, &bubble);
  if (st == WF_OK) {
    fprintf(out, "schedule %s: pp=%d microbatches=%d virtual_stages=%d\n",
            wf_schedule_kind_str(prm->kind), prm->pp, prm->microbatches, prm->virtual_stages);
    fprintf(out,
            "validated: each rank's list alone, then all %d ranks together under "
            "rendezvous p2p: no deadlock, every send meets its receive, every micro-batch "
            "runs forward and backward once per stage\n",
            prm->pp);
    fprintf(out,
            "\ngrid (one column per tick; forward and backward take 1 tick, messages none; "
            ".. = idle%s):\n",
            prm->virtual_stages > 1 ? "; a, b, ... = model chunk 0, 1, ... of the rank" : "");
    wf_schedule_draw(out, ranks, unit_cost);
    print_actions(out, ranks, prm->pp);
    print_bubble(out, prm, span, bubble);
  }
  wf_schedule_fini_all(ranks, prm->pp);
  free(ranks);
  return st;
}
