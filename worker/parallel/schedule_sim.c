/*
 * schedule_sim.c - the clock (wf_schedule_simulate: a makespan and the bubble as an
 * engine with non-blocking point-to-point would see them), and drawing a schedule for
 * `worker --print-schedule` and the console.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_int.h"

/* ---- the clock ---------------------------------------------------------------------- */

static int cost_of(wf_sched_cost cost, wf_sched_op op)
{
  return op == WF_ACT_FORWARD ? cost.forward : op == WF_ACT_BACKWARD ? cost.backward : 0;
}

/* dep[off[r] + i]: for a compute whose input comes from another rank, the flat index
 * of the SEND that delivers it; -1 otherwise. Lists must be valid. */
static wf_status link_inputs(const wf__sched_sim *m, int *dep)
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
      if (!wf__sched_is_compute(a->op) && !wf__sched_is_send(a->op))
        *slot = i;
      else if (wf__sched_is_compute(a->op) && *slot >= 0)
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
static wf_status run_clock(const wf__sched_sim *m, wf_sched_cost cost, const int *dep, int *start,
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
static wf_status clock_all(wf__sched_sim *m, const wf_schedule *ranks, wf_sched_cost cost,
                           int **start, int *makespan)
{
  *start = NULL;
  if (cost.forward < 1 || cost.backward < 1)
    return WF_EINVAL;
  wf_status st = wf__sched_sim_validate(m, ranks, NULL, 0);
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
  wf__sched_sim m;
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
  wf__sched_sim_free(&m);
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
      if (wf__sched_is_compute(ranks[r].actions[i].op)) {
        wf_schedule_action_str(&ranks[r], &ranks[r].actions[i], buf, sizeof buf);
        w = (int)strlen(buf) > w ? (int)strlen(buf) : w;
      }
  return w;
}

/* One rank's row: every tick shows the compute running then, or "..". */
static void draw_row(FILE *out, const wf__sched_sim *m, int r, const int *start, int span, int w,
                     wf_sched_cost cost, char (*cells)[64])
{
  const wf_schedule *s = &m->ranks[r];
  for (int t = 0; t < span; t++)
    snprintf(cells[t], sizeof cells[t], "..");
  for (int i = 0; i < s->n; i++) {
    const wf_sched_action *a = &s->actions[i];
    int t0 = start[m->off[r] + i];
    for (int t = t0; wf__sched_is_compute(a->op) && t < t0 + cost_of(cost, a->op) && t < span; t++)
      wf_schedule_action_str(s, a, cells[t], sizeof cells[t]);
  }
  fprintf(out, "rank %*d |", m->p > 100 ? 3 : m->p > 10 ? 2 : 1, r);
  for (int t = 0; t < span; t++)
    fprintf(out, " %-*s", w, cells[t]);
  fputc('\n', out);
}

wf_status wf_schedule_draw(FILE *out, const wf_schedule *ranks, wf_sched_cost cost)
{
  wf__sched_sim m;
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
  wf__sched_sim_free(&m);
  return st;
}

static void print_actions(FILE *out, const wf_schedule *ranks, int p)
{
  char buf[64];
  fprintf(out, "\nactions (SFk>r: send micro-batch k's activation to rank r, RFk<r: receive it "
               "from r; SB/RB: the same for its gradient; message buffers: activations "
               "received + gradients received + gradients sent):\n");
  for (int r = 0; r < p; r++) {
    const wf_schedule *s = &ranks[r];
    wf_sched_bufs b = wf_schedule_buffers(s);
    fprintf(out, "rank %d (%d actions, peak in flight %d, message buffers %d+%d+%d):", r, s->n,
            wf_schedule_peak_inflight(s), b.recv_f, b.recv_b, b.send_b);
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
    return wf__sched_fail(err, err_len, "schedule: pp must be >= 1");
  wf_schedule *ranks = calloc((size_t)prm->pp, sizeof *ranks);
  if (!ranks)
    return wf__sched_fail(err, err_len, "out of memory generating a schedule of %d ranks", prm->pp);
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
