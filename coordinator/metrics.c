/*
 * metrics.c - optional Prometheus endpoint (runtime.metrics_port): GET /metrics.
 *
 * A deliberately tiny HTTP/1.0 server on the service's loop: read one request (up
 * to 1 KiB, within WF__HTTP_MS of the connection, however it trickles in), answer in
 * Prometheus text format and close. At most WF__HTTP_MAX_CONNS at once. It exposes no
 * token-protected data: job-level numbers and per-rank heartbeat age and memory only.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"

wf_status wf__metrics_start(wf_service *svc)
{
  int rc = wf__listen_tcp(svc, &svc->http, svc->metrics_port, 16);
  svc->have_http = svc->http.data == svc; /* initialised, so it must be closed */
  if (rc < 0) {
    WF_WARN("control: cannot serve metrics on %s:%d: %s; choose another port with "
            "runtime.metrics_port=... or address with runtime.listen_addr=...",
            svc->bind_addr, svc->metrics_port, uv_strerror(rc));
    return WF_EUV;
  }
  return WF_OK;
}

static size_t metrics_text(wf_service *svc, char *buf, size_t len)
{
  double now = wf__now_ms();
  size_t at = 0;
#define OUT(...)                                                                                   \
  do {                                                                                             \
    if (at < len)                                                                                  \
      at += (size_t)snprintf(buf + at, len - at, __VA_ARGS__);                                     \
  } while (0)
  OUT("# TYPE weft_step gauge\nweft_step{job=\"%s\"} %" PRId64 "\n", svc->job_id, svc->step);
  OUT("# TYPE weft_loss gauge\nweft_loss{job=\"%s\"} %g\n", svc->job_id,
      isfinite(svc->loss) ? svc->loss : 0.0);
  OUT("# TYPE weft_tokens_per_second gauge\nweft_tokens_per_second{job=\"%s\"} %g\n", svc->job_id,
      isfinite(svc->tokens_per_s) ? svc->tokens_per_s : 0.0);
  OUT("# TYPE weft_heartbeat_age_seconds gauge\n");
  for (int i = 0; i < svc->world; i++)
    if (svc->ranks[i].state != WF__RANK_WAITING)
      OUT("weft_heartbeat_age_seconds{job=\"%s\",rank=\"%d\"} %.3f\n", svc->job_id, i,
          (now - svc->ranks[i].t_heartbeat) / 1000.0);
  OUT("# TYPE weft_memory_bytes gauge\n");
  for (int i = 0; i < svc->world; i++)
    OUT("weft_memory_bytes{job=\"%s\",rank=\"%d\"} %" PRIu64 "\n", svc->job_id, i,
        svc->ranks[i].mem_bytes);
#undef OUT
  return at < len ? at : len;
}

typedef struct http_write {
  uv_write_t req;
  char *data;
} http_write;

static void on_http_written(uv_write_t *req, int status)
{
  http_write *w = (http_write *)req;
  wf__conn_close((wf__conn *)req->handle);
  free(w->data);
  free(w);
}

static void http_respond(wf__conn *c, const char *status, const char *body, size_t body_len)
{
  http_write *w = calloc(1, sizeof *w);
  size_t cap = body_len + 256;
  if (!w || !(w->data = malloc(cap))) {
    free(w);
    wf__conn_close(c);
    return;
  }
  int n = snprintf(w->data, cap,
                   "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, body_len);
  memcpy(w->data + n, body, body_len);
  uv_buf_t buf = uv_buf_init(w->data, (unsigned)((size_t)n + body_len));
  uv_read_stop(&c->u.s);
  if (uv_write(&w->req, &c->u.s, &buf, 1, on_http_written) < 0) {
    free(w->data);
    free(w);
    wf__conn_close(c);
  }
}

/* A request is read whole before it is answered, within WF__HTTP_MS of the connection
 * (the watchdog enforces it). One that cannot be a scrape (too large for the buffer,
 * or with a NUL byte in it) is answered 400 at once rather than waited on. */
void wf__metrics_read(wf__conn *c, const char *data, size_t len)
{
  if (c->http_len + len >= sizeof c->http || memchr(data, '\0', len)) {
    static const char msg[] = "bad request: a scrape is GET /metrics, under 1 KiB, no NUL bytes\n";
    http_respond(c, "400 Bad Request", msg, sizeof msg - 1);
    return;
  }
  memcpy(c->http + c->http_len, data, len);
  c->http_len += len;
  c->http[c->http_len] = '\0';
  if (!strstr(c->http, "\r\n\r\n") && !strstr(c->http, "\n\n"))
    return;
  if (strncmp(c->http, "GET /metrics", 12) != 0) {
    http_respond(c, "404 Not Found", "try /metrics\n", 13);
    return;
  }
  size_t cap = 4096 + (size_t)c->svc->world * 256;
  char *body = malloc(cap);
  if (!body) {
    wf__conn_close(c);
    return;
  }
  size_t n = metrics_text(c->svc, body, cap);
  http_respond(c, "200 OK", body, n);
  free(body);
}
