/*
 * query.c - console queries answered from the registry, as JSON (jansson).
 *
 * The service answers in JSON only; the console renders text from the same
 * document, so `--json` and the text view can never disagree. Numbers that are not
 * known yet (no step finished, no loss on this rank) are JSON null.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"

static const char *state_name(rank_state s)
{
  switch (s) {
  case WF__RANK_WAITING: return "waiting";
  case WF__RANK_ALIVE: return "alive";
  case WF__RANK_DEAD: return "dead";
  case WF__RANK_EXITED: return "exited";
  }
  return "?";
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static const char *job_state(wf_service *svc, char *reason, size_t len)
{
  if (wf_service_aborted(svc, reason, len))
    return "aborted";
  return svc->registered < svc->world ? "starting" : "running";
}

/* cp and ep are 0 or 1 when the axis is not used. */
static int axis_size(int n) { return n > 1 ? n : 1; }

json_t *wf__json_status(wf_service *svc, double now)
{
  char reason[2048] = "";
  const char *state = job_state(svc, reason, sizeof reason);
  double eta = NAN;
  if (svc->total_steps > 0 && svc->step >= 0 && isfinite(svc->step_ms))
    eta = (double)(svc->total_steps - 1 - svc->step) * svc->step_ms / 1000.0;
  int alive = 0;
  for (int i = 0; i < svc->world; i++)
    alive += svc->ranks[i].state == WF__RANK_ALIVE;
  json_t *j = json_pack(
      "{s:s, s:s, s:s, s:i, s:{s:i, s:i, s:i, s:i, s:i}, s:I, s:I, s:o, s:o, s:o, s:o, "
      "s:i, s:i, s:f, s:s}",
      "job", svc->job_id, "model", svc->model, "state", state, "world_size", svc->world, "mesh",
      "dp", svc->mesh.dp, "tp", svc->mesh.tp, "pp", svc->mesh.pp, "cp", axis_size(svc->mesh.cp),
      "ep", axis_size(svc->mesh.ep), "step", (json_int_t)svc->step, "total_steps",
      (json_int_t)svc->total_steps, "loss", num_or_null(svc->loss), "tokens_per_s",
      num_or_null(svc->tokens_per_s), "step_ms", num_or_null(svc->step_ms), "eta_s",
      num_or_null(eta), "registered", svc->registered, "alive", alive, "uptime_s",
      (now - svc->t_start) / 1000.0, "endpoint", svc->endpoint);
  if (j && reason[0])
    json_object_set_new(j, "abort_reason", json_string(reason));
  return j;
}

static json_t *rank_json(const wf__rank *r, double now)
{
  const wf_rank_facts *f = &r->facts;
  json_t *age =
      r->state == WF__RANK_WAITING ? json_null() : json_real((now - r->t_heartbeat) / 1000.0);
  return json_pack(
      "{s:i, s:s, s:i, s:i, s:s, s:s, s:{s:i, s:i, s:i, s:i}, s:s, s:s, s:o, s:I, s:s, "
      "s:I, s:o, s:o, s:{s:I, s:s, s:b}, s:s}",
      "rank", f->rank, "host", f->host, "pid", f->pid, "local_rank", f->local_rank, "device",
      f->device, "binding", f->binding, "coords", "pp", f->coords.pp, "dp", f->coords.dp, "tp",
      f->coords.tp, "cp", f->coords.cp, "stage", r->stage, "state", state_name(r->state),
      "heartbeat_age_s", age, "step", (json_int_t)r->step, "phase", r->phase, "mem_bytes",
      (json_int_t)r->mem_bytes, "loss", num_or_null(r->loss), "step_ms", num_or_null(r->step_ms),
      "collective", "seq", (json_int_t)r->coll_seq, "op", r->coll_op, "active", r->coll_active,
      "error", r->error);
}

/* A rank's memory by kind from its last step report (the step line's figures); null
 * before its first report. */
static json_t *report_bytes(const wf__rank *r, uint64_t b)
{
  return r->reports > 0 ? json_integer((json_int_t)b) : json_null();
}

/* What `ranks` adds for operators: throughput per rank (the job's tokens/s over its
 * ranks, as Megatron reports per GPU), the process's resident set and CPU use, and its
 * memory by kind. */
static json_t *rank_usage(json_t *j, const wf__rank *r, int world)
{
  if (!j)
    return NULL;
  json_object_set_new(j, "param_bytes", report_bytes(r, r->rep.param_bytes));
  json_object_set_new(j, "grad_bytes", report_bytes(r, r->rep.grad_bytes));
  json_object_set_new(j, "optim_bytes", report_bytes(r, r->rep.optim_bytes));
  json_object_set_new(j, "act_bytes", report_bytes(r, r->rep.act_bytes));
  double per_gpu = isfinite(r->tokens_per_s) && world > 0 ? r->tokens_per_s / world : NAN;
  json_object_set_new(j, "tokens_per_s_per_rank", num_or_null(per_gpu));
  json_object_set_new(j, "rss_bytes", json_integer((json_int_t)r->rss_bytes));
  /* the rank's GPU through NVML; null without a GPU or NVML */
  json_object_set_new(j, "gpu_util_percent", r->gpu ? json_integer(r->gpu_util_pct) : json_null());
  json_object_set_new(j, "gpu_mem_used_bytes",
                      r->gpu ? json_integer((json_int_t)r->gpu_mem_used) : json_null());
  json_object_set_new(j, "gpu_mem_total_bytes",
                      r->gpu ? json_integer((json_int_t)r->gpu_mem_total) : json_null());
  json_object_set_new(j, "cpu_percent", r->t_cpu > 0 ? json_real(r->cpu_pct) : json_null());
  /* the control plane's round trip to the rank: its network path to rank 0's host */
  json_object_set_new(j, "rtt_ms", num_or_null(r->rtt_ms));
  return j;
}

json_t *wf__json_ranks(wf_service *svc, double now)
{
  json_t *arr = json_array();
  for (int i = 0; arr && i < svc->world; i++)
    json_array_append_new(arr,
                          rank_usage(rank_json(&svc->ranks[i], now), &svc->ranks[i], svc->world));
  return json_pack("{s:s, s:i, s:o}", "job", svc->job_id, "world_size", svc->world, "ranks", arr);
}

/* The rank at mesh coordinates, from the registry (what the ranks reported), so the
 * drawing shows the real placement rather than the formula. -1 when none. */
static int rank_at(const wf_service *svc, int pp, int dp, int tp)
{
  for (int i = 0; i < svc->world; i++) {
    const wf_coords *c = &svc->ranks[i].facts.coords;
    if (c->pp == pp && c->dp == dp && c->tp == tp && c->cp == 0)
      return i;
  }
  return -1;
}

/* The groups along one axis in world ranks, each listed once (from its first
 * member): the same arithmetic (mesh.c) that built the job's communicators. */
static json_t *groups_json(const wf_service *svc, wf_axis axis)
{
  json_t *all = json_array();
  int *members = malloc((size_t)svc->world * sizeof *members);
  for (int r = 0; members && r < svc->world; r++) {
    int n = wf_mesh_group(&svc->mesh, axis, r, members, svc->world);
    if (n == 0 || members[0] != r)
      continue;
    json_t *g = json_array();
    for (int i = 0; i < n; i++)
      json_array_append_new(g, json_integer(members[i]));
    json_array_append_new(all, g);
  }
  free(members);
  return all;
}

json_t *wf__json_mesh(wf_service *svc)
{
  const wf_mesh *m = &svc->mesh;
  json_t *stages = json_array();
  for (int pp = 0; pp < m->pp; pp++) {
    json_t *grid = json_array();
    for (int dp = 0; dp < m->dp; dp++) {
      json_t *row = json_array();
      for (int tp = 0; tp < m->tp; tp++)
        json_array_append_new(row, json_integer(rank_at(svc, pp, dp, tp)));
      json_array_append_new(grid, row);
    }
    json_array_append_new(stages, json_pack("{s:i, s:o}", "pp", pp, "grid", grid));
  }
  /* the grid shows cp rank 0 of each (pp, dp, tp); the cp groups list the rest */
  return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:{s:o, s:o, s:o, s:o, s:o, s:o}}",
                   "job", svc->job_id, "world_size", svc->world, "dp", m->dp, "tp", m->tp, "pp",
                   m->pp, "cp", axis_size(m->cp), "ep", axis_size(m->ep), "stages", stages,
                   "groups", "tp", groups_json(svc, WF_AXIS_TP), "dp", groups_json(svc, WF_AXIS_DP),
                   "pp", groups_json(svc, WF_AXIS_PP), "emb", groups_json(svc, WF_AXIS_EMB), "cp",
                   groups_json(svc, WF_AXIS_CP), "ep", groups_json(svc, WF_AXIS_EP));
}

json_t *wf__json_schedule(wf_service *svc)
{
  json_t *j = NULL;
  pthread_mutex_lock(&svc->lock);
  if (svc->schedule)
    j = json_pack("{s:s, s:s}", "job", svc->job_id, "schedule", svc->schedule);
  pthread_mutex_unlock(&svc->lock);
  return j;
}

char *wf__query_json(wf_service *svc, int kind, char *msg, size_t msg_len)
{
  double now = wf__now_ms();
  json_t *j = NULL;
  switch (kind) {
  case WEFT__QUERY__KIND__STATUS: j = wf__json_status(svc, now); break;
  case WEFT__QUERY__KIND__RANKS: j = wf__json_ranks(svc, now); break;
  case WEFT__QUERY__KIND__MESH: j = wf__json_mesh(svc); break;
  case WEFT__QUERY__KIND__SCHEDULE:
    if (!(j = wf__json_schedule(svc))) {
      snprintf(msg, msg_len,
               "schedule: not available yet (this job has not published its "
               "pipeline schedule)");
      return NULL;
    }
    break;
  default: snprintf(msg, msg_len, "unknown query"); return NULL;
  }
  if (!j) {
    snprintf(msg, msg_len, "out of memory building the reply");
    return NULL;
  }
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  return s;
}
