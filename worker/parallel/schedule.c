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

#include "parallel_int.h"

/* A schedule longer than this is a config mistake, not a workload. */
#define MAX_UNITS (1 << 22) /* m * v */

wf_status wf__sched_fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
wf_status wf__sched_fail(char *err, size_t len, const char *fmt, ...)
{
  if (err && len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
  }
  return WF_EINVAL;
}

bool wf__sched_is_compute(wf_sched_op op) { return op == WF_ACT_FORWARD || op == WF_ACT_BACKWARD; }
bool wf__sched_is_send(wf_sched_op op) { return op == WF_ACT_SEND_F || op == WF_ACT_SEND_B; }
int wf__sched_stage(const wf_sched_params *prm, int rank, int chunk)
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

wf_status wf__sched_check_params(const wf_sched_params *prm, char *err, size_t len)
{
  int p = prm->pp, m = prm->microbatches, v = prm->virtual_stages;
  const char *name = wf_schedule_kind_str(prm->kind);
  if (p < 1 || m < 1 || v < 1)
    return wf__sched_fail(err, len,
                          "schedule %s: pp=%d, microbatches=%d and virtual_stages=%d must be >= 1",
                          name, p, m, v);
  if ((int64_t)m * v > MAX_UNITS || p > MAX_UNITS)
    return wf__sched_fail(err, len, "schedule %s: microbatches=%d x virtual_stages=%d is too large",
                          name, m, v);
  switch (prm->kind) {
  case WF_SCHED_GPIPE:
  case WF_SCHED_1F1B:
    if (v != 1)
      return wf__sched_fail(
          err, len, "schedule %s runs one model chunk per rank; virtual_stages=%d must be 1", name,
          v);
    return WF_OK;
  case WF_SCHED_INTERLEAVED:
    if (v < 2)
      return wf__sched_fail(err, len, "schedule interleaved needs virtual_stages >= 2 (it is %d)",
                            v);
    if (m % p != 0)
      return wf__sched_fail(
          err, len, "schedule interleaved needs microbatches=%d to be a multiple of pp=%d", m, p);
    return WF_OK;
  }
  return wf__sched_fail(err, len, "unknown schedule kind %d", (int)prm->kind);
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
  int s = wf__sched_stage(g->prm, r, a->chunk), i = a->mb * g->S + s;
  if (a->op == WF_ACT_FORWARD)
    return s == 0 || done_by(g->fdone[i - 1], t);
  return done_by(g->fdone[i], t) && (s == g->S - 1 || done_by(g->bdone[i + 1], t));
}

/* Unit `a` of rank r finished at tick t: record it and send its output on. */
static void unit_finish(gen *g, int r, const wf_sched_action *a, int t)
{
  int p = g->p, s = wf__sched_stage(g->prm, r, a->chunk), i = a->mb * g->S + s;
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
      return wf__sched_fail(err, len,
                            "schedule %s: the compute order stalls at tick %d (a generator bug)",
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
  wf_status st = wf__sched_check_params(prm, err, err_len);
  if (st != WF_OK)
    return st;
  for (int r = 0; r < prm->pp; r++)
    ranks[r] = (wf_schedule){.prm = *prm, .rank = r};
  gen g;
  st = gen_alloc(&g, prm, ranks);
  if (st == WF_ENOMEM)
    wf__sched_fail(err, err_len, "out of memory generating a schedule of %d ranks", prm->pp);
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
    return wf__sched_fail(err, err_len, "pp rank %d is not in 0 .. %d", rank, prm->pp - 1);
  wf_schedule *all = calloc((size_t)prm->pp, sizeof *all);
  if (!all)
    return wf__sched_fail(err, err_len, "out of memory generating a schedule of %d ranks", prm->pp);
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
  else if (wf__sched_is_compute(a->op))
    snprintf(buf, len, "%s%d%s", pre[a->op], a->mb, chunk);
  else
    snprintf(buf, len, "%s%d%s%c%d", pre[a->op], a->mb, chunk, wf__sched_is_send(a->op) ? '>' : '<',
             a->peer);
}
