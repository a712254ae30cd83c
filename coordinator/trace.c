/*
 * trace.c - the console's `trace`: every rank's recent collectives, gathered live.
 *
 * The coordinator asks every live worker (Command TRACE with a fresh request id),
 * each control thread answers from its rank's flight recorder (TraceReport), and the
 * console gets one JSON reply once all answered or WF__TRACE_WAIT_MS passed (the live
 * view's download gets the same document over HTTP). A rank
 * that did not answer in time shows as such: that is itself a diagnosis (frozen).
 * One gather runs at a time; the loop thread owns all of it.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"

static void trace_reset(wf_service *svc)
{
  for (int i = 0; i < svc->world; i++) {
    free(svc->ranks[i].trace);
    svc->ranks[i].trace = NULL;
    svc->ranks[i].traced = false;
  }
}

static json_t *trace_json(wf_service *svc)
{
  json_t *ranks = json_array();
  for (int i = 0; ranks && i < svc->world; i++) {
    const wf__rank *r = &svc->ranks[i];
    json_t *lines = json_array();
    for (char *p = r->trace; lines && p && *p;) {
      char *nl = strchr(p, '\n');
      size_t n = nl ? (size_t)(nl - p) : strlen(p);
      json_array_append_new(lines, json_stringn(p, n));
      p += n + (nl ? 1 : 0);
    }
    json_array_append_new(
        ranks, json_pack("{s:i, s:b, s:o}", "rank", i, "answered", r->traced, "lines", lines));
  }
  return json_pack("{s:s, s:i, s:o}", "job", svc->job_id, "world_size", svc->world, "ranks", ranks);
}

static void trace_finish(wf_service *svc)
{
  wf__trace *t = &svc->trace;
  if (t->conn) {
    json_t *j = trace_json(svc);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (t->conn->role == WF__CONN_HTTP && s) { /* the live view's download */
      char headers[256];
      snprintf(headers, sizeof headers,
               "Content-Disposition: attachment; filename=\"weft-trace-%s.json\"\r\n", svc->job_id);
      wf__http_respond(t->conn, "200 OK", "application/json", headers, s, strlen(s));
    } else if (t->conn->role == WF__CONN_HTTP) {
      wf__http_text(t->conn, "500 Internal Server Error", "out of memory building the trace\n");
    } else {
      wf__reply(t->conn, s != NULL, s, s ? "" : "out of memory building the trace");
    }
    free(s);
    json_decref(j);
  }
  trace_reset(svc);
  t->active = false;
  t->conn = NULL;
}

void wf__trace_start(wf_service *svc, wf__conn *console)
{
  wf__trace *t = &svc->trace;
  if (t->active && console->role == WF__CONN_HTTP) {
    wf__http_text(console, "503 Service Unavailable",
                  "another console's trace is being gathered; retry\n");
    return;
  }
  if (t->active) {
    wf__reply(console, false, NULL, "trace: another console's trace is being gathered; retry");
    return;
  }
  trace_reset(svc);
  t->active = true;
  t->id++;
  t->conn = console;
  t->deadline = wf__now_ms() + WF__TRACE_WAIT_MS;
  t->waiting = 0;
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Command cmd = WEFT__COMMAND__INIT;
  cmd.kind = WEFT__COMMAND__KIND__TRACE;
  cmd.request_id = t->id;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &cmd;
  for (int i = 0; i < svc->world; i++) {
    wf__rank *r = &svc->ranks[i];
    if (r->state == WF__RANK_ALIVE && r->conn && !r->conn->closing) {
      wf__conn_send(r->conn, &env);
      t->waiting++;
    }
  }
  if (t->waiting == 0)
    trace_finish(svc);
}

void wf__trace_report(wf__conn *c, const Weft__TraceReport *tr)
{
  wf_service *svc = c->svc;
  wf__trace *t = &svc->trace;
  wf__rank *r = &svc->ranks[c->rank];
  if (!t->active || tr->request_id != t->id || r->traced)
    return; /* late or repeated: ignore */
  size_t len = 1;
  for (size_t i = 0; i < tr->n_lines; i++)
    len += strlen(tr->lines[i]) + 1;
  r->trace = malloc(len);
  if (r->trace) {
    size_t at = 0;
    for (size_t i = 0; i < tr->n_lines; i++) {
      wf__sanitize(r->trace + at, len - at, tr->lines[i]);
      at += strlen(r->trace + at);
      r->trace[at++] = '\n';
    }
    r->trace[at] = '\0';
  }
  r->traced = true;
  if (--t->waiting <= 0)
    trace_finish(svc);
}

void wf__trace_tick(wf_service *svc, double now)
{
  if (svc->trace.active && now > svc->trace.deadline)
    trace_finish(svc);
}
