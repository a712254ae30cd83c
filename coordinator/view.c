/*
 * view.c - the live view of the job: a page served by the coordinator on its HTTP
 * listener (http.c checks the token first), and the JSON it polls.
 *
 *   GET  /                the page (view/index.html, view.js, view.css) and uPlot
 *   GET  /api/state?since=STEP   the job, its mesh, every rank as the watchdog sees it,
 *                         stragglers, and the steps after STEP for the curves
 *   GET  /api/schedule    the pipeline schedule as --print-schedule draws it
 *   GET  /api/trace       every rank's recent collectives (the console's `trace`), as a
 *                         download
 *   POST /api/stop, /api/checkpoint   what `coordinator stop` and `checkpoint` do
 *
 * The assets are compiled in (view_assets.c, generated from coordinator/view/ and npm's
 * uplot at build time): nothing is read from disk or fetched at run time, so the page
 * works offline and a path names nothing but an asset.
 *
 * What the page shows is what the watchdog uses: a rank is late once it missed a
 * heartbeat and a half (wf__rank_late), dead once the watchdog declared it so. A
 * straggler is a rank whose compute in its last step exceeds its pipeline stage's
 * median by STRAGGLER_RATIO and STRAGGLER_MIN_S: the ranks of one stage do the same work
 * (dp replicas, tp shards), so their compute times should agree, and synchronous steps
 * hide a slow rank's delay in the others' waits, never in their step time.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"
#include "view_assets.h"

#define STRAGGLER_RATIO 1.25  /* a quarter slower than its stage's median */
#define STRAGGLER_MIN_S 0.002 /* and by more than a timer's noise on a small step */

/* ---- the history --------------------------------------------------------------------- */

/* Drop every other step (keeping evaluated ones) until there is room. */
static void thin(wf_service *svc)
{
  while (svc->n_hist >= WF__HISTORY_MAX) {
    size_t kept = 0;
    svc->hist_every *= 2;
    for (size_t i = 0; i < svc->n_hist; i++)
      if (svc->hist[i].step % svc->hist_every == 0 || isfinite(svc->hist[i].val_loss))
        svc->hist[kept++] = svc->hist[i];
    svc->n_hist = kept;
  }
}

/* A step's point comes from the first report that has its loss (the last pipeline stage
 * sends it; the others send NaN); a validation loss joins the point of its step. */
void wf__history_add(wf_service *svc, const wf_step_report *r)
{
  wf__point *last = svc->n_hist ? &svc->hist[svc->n_hist - 1] : NULL;
  if (!isfinite(r->loss) || r->step < 0)
    return;
  if (last && r->step <= last->step) {
    if (r->step == last->step && isfinite(r->val_loss))
      last->val_loss = r->val_loss;
    return;
  }
  if (r->step % svc->hist_every != 0 && !isfinite(r->val_loss))
    return;
  if (svc->n_hist == svc->cap_hist) {
    size_t cap = svc->cap_hist ? 2 * svc->cap_hist : 1024;
    wf__point *grown = realloc(svc->hist, cap * sizeof *grown);
    if (!grown)
      return; /* the curve misses a point; the job does not notice */
    svc->hist = grown, svc->cap_hist = cap;
  }
  svc->hist[svc->n_hist++] = (wf__point){.step = r->step,
                                         .wall = wf_wall_time(),
                                         .loss = r->loss,
                                         .val_loss = r->val_loss,
                                         .tokens_per_s = r->tokens_per_s,
                                         .step_ms = r->step_ms};
  thin(svc);
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* [[step, wall, loss, val_loss, tokens_per_s, step_ms], ...] after step `since`. */
static json_t *history_json(const wf_service *svc, int64_t since)
{
  json_t *pts = json_array();
  size_t lo = 0, hi = svc->n_hist;
  while (lo < hi) { /* the first point past `since` */
    size_t mid = (lo + hi) / 2;
    if (svc->hist[mid].step <= since)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t i = lo; pts && i < svc->n_hist; i++) {
    const wf__point *p = &svc->hist[i];
    json_array_append_new(pts, json_pack("[I, f, o, o, o, o]", (json_int_t)p->step, p->wall,
                                         num(p->loss), num(p->val_loss), num(p->tokens_per_s),
                                         num(p->step_ms)));
  }
  return json_pack("{s:I, s:o}", "every", (json_int_t)svc->hist_every, "points", pts);
}

/* ---- the ranks as the watchdog sees them ---------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median compute time of pipeline stage `pp` over its ranks that reported a step
 * (the lower middle one of an even count); NAN with fewer than two. */
static double stage_median(const wf_service *svc, int pp, double *scratch)
{
  int n = 0;
  for (int i = 0; i < svc->world; i++) {
    const wf__rank *r = &svc->ranks[i];
    if (r->facts.coords.pp == pp && r->reports > 0 && isfinite(r->rep.compute_s))
      scratch[n++] = r->rep.compute_s;
  }
  if (n < 2)
    return NAN;
  qsort(scratch, (size_t)n, sizeof *scratch, cmp_double);
  return scratch[(n - 1) / 2];
}

static const char *view_state(const wf_service *svc, const wf__rank *r, double now)
{
  if (wf__rank_late(svc, r, now))
    return "late";
  switch (r->state) {
  case WF__RANK_WAITING: return "waiting";
  case WF__RANK_ALIVE: return "alive";
  case WF__RANK_DEAD: return "dead";
  case WF__RANK_EXITED: return "exited";
  }
  return "?";
}

/* The `ranks` document with what the page adds: the watchdog's view, the compute time of
 * the last step, and whether the rank straggles. */
static json_t *ranks_json(wf_service *svc, double now)
{
  json_t *doc = wf__json_ranks(svc, now), *arr = json_object_get(doc, "ranks");
  double *med = calloc((size_t)svc->mesh.pp, sizeof *med);
  double *scratch = calloc((size_t)svc->world, sizeof *scratch);
  if (!doc || !arr || !med || !scratch) {
    json_decref(doc);
    doc = arr = NULL;
    goto out;
  }
  for (int s = 0; s < svc->mesh.pp; s++)
    med[s] = stage_median(svc, s, scratch);
  for (int i = 0; i < svc->world && i < (int)json_array_size(arr); i++) {
    const wf__rank *r = &svc->ranks[i];
    json_t *j = json_array_get(arr, (size_t)i);
    int pp = r->facts.coords.pp;
    double x = r->reports > 0 ? r->rep.compute_s : NAN;
    double m = pp >= 0 && pp < svc->mesh.pp ? med[pp] : NAN;
    bool slow = isfinite(x) && isfinite(m) && x > STRAGGLER_RATIO * m && x - m > STRAGGLER_MIN_S;
    json_object_set_new(j, "view_state", json_string(view_state(svc, r, now)));
    json_object_set_new(j, "compute_ms", num(x * 1e3));
    json_object_set_new(j, "stage_median_compute_ms", num(m * 1e3));
    json_object_set_new(j, "straggler", json_boolean(slow));
  }
out:
  free(med);
  free(scratch);
  arr = json_incref(arr);
  json_decref(doc);
  return arr;
}

static json_t *state_json(wf_service *svc, int64_t since)
{
  double now = wf__now_ms();
  const wf_step_report *j = &svc->job;
  return json_pack(
      "{s:o, s:o, s:o, s:o, s:{s:o, s:o, s:o, s:o, s:o, s:o}, s:{s:i, s:f, s:f, s:f, s:f}, "
      "s:b, s:b, s:b, s:f}",
      "status", wf__json_status(svc, now), "mesh", wf__json_mesh(svc), "ranks",
      ranks_json(svc, now), "history", history_json(svc, since), "job", "val_loss",
      num(j->val_loss), "lr", num(j->lr), "grad_norm", num(j->grad_norm), "mfu", num(j->mfu),
      "bubble", num(j->bubble), "tokens", num(j->tokens), "watchdog", "heartbeat_ms",
      svc->heartbeat_ms, "late_after_s", WF__LATE_BEATS * svc->heartbeat_ms / 1000.0,
      "dead_after_s", svc->dead_after_ms / 1000.0, "hang_timeout_s", svc->hang_timeout_ms / 1000.0,
      "straggler_ratio", STRAGGLER_RATIO, "stop_requested", svc->stop_requested, "can_checkpoint",
      svc->can_checkpoint, "shutting_down", svc->shutting_down, "now", wf_wall_time());
}

/* ---- answers -------------------------------------------------------------------------- */

static void send_json(wf__conn *c, const char *status, json_t *j)
{
  char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (!s) {
    wf__http_text(c, "500 Internal Server Error", "out of memory building the answer\n");
    return;
  }
  wf__http_respond(c, status, "application/json", "", s, strlen(s));
  free(s);
}

static const char page_policy[] =
    "Content-Security-Policy: default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'none'\r\n";

/* An embedded asset; false when `path` names none. */
static bool serve_asset(wf__conn *c, const char *path)
{
  if (strcmp(path, "/") == 0)
    path = "/index.html";
  for (size_t i = 0; i < wf__view_n_assets; i++) {
    const wf__asset *a = &wf__view_assets[i];
    if (strcmp(a->path, path) == 0) {
      wf__http_respond(c, "200 OK", a->type, page_policy, a->data, a->len);
      return true;
    }
  }
  return false;
}

static void command(wf__conn *c, int kind)
{
  char msg[256];
  bool ok = wf__request(c->svc, kind, msg, sizeof msg);
  send_json(c, ok ? "200 OK" : "409 Conflict", json_pack("{s:b, s:s}", "ok", ok, "message", msg));
}

void wf__view_serve(wf__conn *c, bool post, const char *path, const char *query)
{
  wf_service *svc = c->svc;
  if (post && strcmp(path, "/api/stop") == 0) {
    command(c, WEFT__COMMAND__KIND__STOP);
  } else if (post && strcmp(path, "/api/checkpoint") == 0) {
    command(c, WEFT__COMMAND__KIND__CHECKPOINT);
  } else if (post) {
    wf__http_text(c, "404 Not Found", "POST /api/stop or /api/checkpoint\n");
  } else if (strcmp(path, "/api/state") == 0) {
    const char *since = strstr(query, "since=");
    send_json(c, "200 OK", state_json(svc, since ? strtoll(since + 6, NULL, 10) : -1));
  } else if (strcmp(path, "/api/schedule") == 0) {
    json_t *j = wf__json_schedule(svc);
    send_json(c, "200 OK", j ? j : json_pack("{s:n}", "schedule"));
  } else if (strcmp(path, "/api/trace") == 0) {
    wf__trace_start(svc, c);
  } else if (!serve_asset(c, path)) {
    wf__http_text(c, "404 Not Found", "no such page\n");
  }
}
