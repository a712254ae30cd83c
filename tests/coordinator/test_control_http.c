/*
 * test_control_http.c - control-plane tests (control_fixture.h): the HTTP listener: /metrics
 * and the live view's API.
 */
#include "control_fixture.h"

void test_metrics(void **state)
{
  fixture *fx = calloc(1, sizeof *fx);
  g_fx = fx;
  snprintf(fx->dir, sizeof fx->dir, "/tmp/weft-test-XXXXXX");
  assert_non_null(mkdtemp(fx->dir));
  int port = free_port();
  wf_service_opts so = {.job_id = "metrics",
                        .world_size = 1,
                        .mesh = {1, 1, 1},
                        .bind_addr = "127.0.0.1",
                        .job_dir = fx->dir,
                        .metrics_port = port};
  assert_int_equal(wf_service_start(&fx->svc, &so), WF_OK);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
  assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
  char buf[8192];
  size_t got = 0;
  for (ssize_t n; (n = recv(fd, buf + got, sizeof buf - 1 - got, 0)) > 0;)
    got += (size_t)n;
  buf[got] = '\0';
  close(fd);
  assert_non_null(strstr(buf, "HTTP/1.0 200 OK"));
  /* Prometheus's conventions (issue 19): the job is job_id (Prometheus owns `job`),
   * steps are a counter, and every family has HELP and TYPE. */
  assert_null(strstr(buf, "{job="));
  assert_non_null(
      strstr(buf, "# TYPE weft_steps_total counter\nweft_steps_total{job_id=\"metrics\"} 0\n"));
  assert_non_null(strstr(buf, "weft_job_state{job_id=\"metrics\",state=\"registering\"} 1\n"));
  assert_non_null(strstr(buf, "weft_ranks_alive{job_id=\"metrics\"} 0\n"));
  assert_non_null(
      strstr(buf, "weft_rank_up{job_id=\"metrics\",rank=\"0\",pp=\"0\",dp=\"0\",tp=\"0\"} 0\n"));
  int helps = 0, types = 0;
  for (const char *p = buf; (p = strstr(p, "# HELP ")); p++)
    helps++;
  for (const char *p = buf; (p = strstr(p, "# TYPE ")); p++)
    types++;
  assert_int_equal(helps, types);
  assert_true(helps >= 30); /* 17 job-level families + 13 per-rank ones (metrics.c) */
  fx->n = 0;
  fx_stop(fx);
}

/* One HTTP request to the service's listener; the whole answer into buf. Returns the
 * status code (0 when there was no answer). */
static int http(int port, const char *req, size_t len, char *buf, size_t cap)
{
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0), code = 0;
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(send(fd, req, len, MSG_NOSIGNAL), (ssize_t)len);
  size_t got = 0;
  for (ssize_t n; got + 1 < cap && (n = recv(fd, buf + got, cap - 1 - got, 0)) > 0;)
    got += (size_t)n;
  buf[got] = '\0';
  close(fd);
  sscanf(buf, "HTTP/1.%*d %d", &code);
  return code;
}

static int get(int port, const char *path, const char *headers, char *buf, size_t cap)
{
  char req[10240];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n", path, headers);
  return http(port, req, (size_t)n, buf, cap);
}

static json_t *body_json(const char *buf)
{
  const char *b = strstr(buf, "\r\n\r\n");
  return b ? json_loads(b + 4, 0, NULL) : NULL;
}

/* Four ranks report three steps; rank 3 computes twice as long as its stage's others. */
static void report_steps(fixture *fx)
{
  static const double compute_s[4] = {0.100, 0.102, 0.098, 0.200};
  static const double loss[3] = {5.0, 4.5, 4.0};
  for (int s = 1; s <= 3; s++) {
    for (int i = 0; i < 4; i++) {
      wf_step_report r = {.step = s,
                          .steps = 100,
                          .loss = loss[s - 1],
                          .tokens_per_s = 1000.0 * s,
                          .step_ms = 250,
                          .val_loss = s == 2 ? 4.7 : NAN,
                          .lr = NAN,
                          .grad_norm = NAN,
                          .loss_scale = NAN,
                          .mfu = NAN,
                          .bubble = NAN,
                          .compute_s = compute_s[i],
                          .world_size = 4};
      wf_control_report(fx->ctl[i], &r);
    }
  }
  usleep(400 * 1000);
}

/* The live view's API (view.c, http.c): the token is required and checked, the state
 * carries the history and the straggler, paths reach nothing but the assets, oversized
 * heads are refused at once, and POST /api/stop reaches every rank as `stop` does. */
void test_view(void **state)
{
  (void)state;
  g_http_port = free_port();
  fixture *fx = fx_start(4, 4, 0);
  int port = g_http_port;
  static char buf[1 << 20];
  char auth[128], cookie[128];
  snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", fx->job.token);
  report_steps(fx);
  /* no token, a wrong one, a wrong cookie: refused */
  assert_int_equal(get(port, "/api/state", "", buf, sizeof buf), 401);
  assert_int_equal(get(port, "/", "Authorization: Bearer 00\r\n", buf, sizeof buf), 401);
  assert_int_equal(get(port, "/view.js", "Cookie: weft_token=abc\r\n", buf, sizeof buf), 401);
  assert_int_equal(get(port, "/?token=abc", "", buf, sizeof buf), 401);
  assert_non_null(strstr(buf, "coordinator view"));
  /* /metrics stays open to scrapers */
  assert_int_equal(get(port, "/metrics", "", buf, sizeof buf), 200);
  /* the token in the address becomes a cookie, and the cookie opens the page */
  char path[128];
  snprintf(path, sizeof path, "/?token=%s", fx->job.token);
  assert_int_equal(get(port, path, "", buf, sizeof buf), 303);
  assert_non_null(strstr(buf, "SameSite=Strict"));
  assert_non_null(strstr(buf, "HttpOnly"));
  assert_non_null(strstr(buf, "\r\nLocation: /\r\n"));
  snprintf(cookie, sizeof cookie, "Cookie: a=1; weft_token=%s\r\n", fx->job.token);
  assert_int_equal(get(port, "/", cookie, buf, sizeof buf), 200);
  assert_non_null(strstr(buf, "<script src=\"/view.js\""));
  assert_non_null(strstr(buf, "Content-Security-Policy: default-src 'self'"));
  assert_int_equal(get(port, "/uplot.js", cookie, buf, sizeof buf), 200);
  assert_non_null(strstr(buf, "uPlot")); /* npm's uplot, compiled in */
  /* the state: history, and rank 3 the straggler of its stage (median of 98, 100, 102,
   * 200 ms: the lower middle, 100 ms; 200 > 1.25 x 100) */
  assert_int_equal(get(port, "/api/state?since=-1", auth, buf, sizeof buf), 200);
  json_t *st = body_json(buf), *ranks = json_object_get(st, "ranks");
  assert_int_equal(json_array_size(ranks), 4);
  for (int i = 0; i < 4; i++) {
    json_t *r = json_array_get(ranks, (size_t)i);
    assert_int_equal(json_is_true(json_object_get(r, "straggler")), i == 3);
    assert_true(fabs(json_real_value(json_object_get(r, "stage_median_compute_ms")) - 100.0) <
                1e-9);
    assert_string_equal(json_string_value(json_object_get(r, "view_state")), "alive");
  }
  json_t *pts = json_object_get(json_object_get(st, "history"), "points");
  assert_int_equal(json_array_size(pts), 3);
  for (int s = 0; s < 3; s++) {
    json_t *p = json_array_get(pts, (size_t)s);
    assert_int_equal(json_integer_value(json_array_get(p, 0)), s + 1);
    assert_true(json_real_value(json_array_get(p, 2)) == 5.0 - 0.5 * s);
    assert_true(json_real_value(json_array_get(p, 4)) == 1000.0 * (s + 1));
    assert_true(s == 1 ? json_real_value(json_array_get(p, 3)) == 4.7
                       : json_is_null(json_array_get(p, 3)));
  }
  json_decref(st);
  assert_int_equal(get(port, "/api/state?since=2", auth, buf, sizeof buf), 200);
  st = body_json(buf);
  assert_int_equal(json_array_size(json_object_get(json_object_get(st, "history"), "points")), 1);
  json_decref(st);
  /* paths name assets and routes only */
  assert_int_equal(get(port, "/../../etc/passwd", auth, buf, sizeof buf), 404);
  assert_int_equal(get(port, "/%2e%2e/%2e%2e/etc/passwd", auth, buf, sizeof buf), 404);
  assert_int_equal(get(port, "/view.js/../../../etc/passwd", auth, buf, sizeof buf), 404);
  assert_null(strstr(buf, "root:"));
  /* a head over 8 KiB is refused at once; a body is never taken */
  static char big[9 * 1024 + 64];
  memset(big, 'a', sizeof big);
  memcpy(big, "X-Big: ", 7);
  memcpy(big + sizeof big - 3, "\r\n", 3);
  assert_int_equal(get(port, "/metrics", big, buf, sizeof buf), 431);
  const char post_body[] = "POST /api/stop HTTP/1.1\r\nContent-Length: 4\r\n\r\nstop";
  assert_int_equal(http(port, post_body, sizeof post_body - 1, buf, sizeof buf), 413);
  assert_false(wf_control_stop_requested(fx->ctl[0]));
  /* POST /api/stop without the token: refused; with it: every rank is asked to stop */
  const char post[] = "POST /api/stop HTTP/1.1\r\nHost: x\r\n\r\n";
  assert_int_equal(http(port, post, sizeof post - 1, buf, sizeof buf), 401);
  char req[512];
  int n = snprintf(req, sizeof req, "POST /api/stop HTTP/1.1\r\nHost: x\r\n%s\r\n", auth);
  assert_int_equal(http(port, req, (size_t)n, buf, sizeof buf), 200);
  usleep(300 * 1000);
  for (int i = 0; i < 4; i++)
    assert_true(wf_control_stop_requested(fx->ctl[i]));
  assert_int_equal(get(port, "/api/state", auth, buf, sizeof buf), 200);
  st = body_json(buf);
  assert_true(json_is_true(json_object_get(st, "stop_requested")));
  json_decref(st);
  g_http_port = 0;
  fx_stop(fx);
}
