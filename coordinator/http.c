/*
 * http.c - the coordinator's HTTP listener (runtime.metrics_port): Prometheus's /metrics
 * and the live view of the job (view.c), on the service's loop.
 *
 * One request per connection, answered and closed (HTTP/1.0 with Connection: close):
 * a scraper or the page polls with a new connection each time, and no connection
 * outlives its answer. Requests are parsed by nodejs/http-parser, fed as bytes arrive.
 * Limits, so that no peer can hold rank 0's loop or descriptors:
 *  - the request head must fit WF__HTTP_MAX_HEAD bytes (431 otherwise, at once);
 *  - the whole request must arrive within WF__HTTP_MS of the connection, however it
 *    trickles in (the watchdog closes it; slowloris);
 *  - a body is never wanted: one is refused (413);
 *  - paths name embedded assets and API routes only: nothing is read from disk, so
 *    ".." and percent-encodings reach nothing (404).
 *
 * Access: /metrics is open, as Prometheus scrapes it (it shows job-level numbers, never
 * the token). Everything else needs the job's token, compared in constant time, from
 * an `Authorization: Bearer TOKEN` header (scripts), or from the cookie that GET
 * /?token=TOKEN sets (HttpOnly, SameSite=Strict: a page of another site can neither
 * read it nor send it with a request of its own, so it cannot press the stop button)
 * before redirecting to / without the token in the address.
 */
#include <http_parser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control_int.h"

typedef enum hdr { HDR_NONE = 0, HDR_COOKIE, HDR_AUTH } hdr;

struct wf__http {
  http_parser parser;
  size_t head;       /* bytes of the request seen so far */
  char url[1024];    /* path and query, as sent */
  char cookie[1024]; /* the Cookie header (the last one sent) */
  char auth[256];    /* the Authorization header */
  hdr field;         /* which header the next value belongs to */
  bool url_long, complete, body;
};

static void append(char *dst, size_t cap, const char *at, size_t n, bool *truncated)
{
  size_t have = strlen(dst);
  if (have + n >= cap) {
    if (truncated)
      *truncated = true;
    n = have < cap - 1 ? cap - 1 - have : 0;
  }
  memcpy(dst + have, at, n);
  dst[have + n] = '\0';
}

static wf__http *of(http_parser *p) { return (wf__http *)p; }

static int on_url(http_parser *p, const char *at, size_t n)
{
  append(of(p)->url, sizeof of(p)->url, at, n, &of(p)->url_long);
  return 0;
}

static int on_field(http_parser *p, const char *at, size_t n)
{
  /* a field's name may come in pieces: only a whole short name is matched */
  wf__http *h = of(p);
  if (n == 6 && strncasecmp(at, "cookie", 6) == 0) {
    h->field = HDR_COOKIE;
    h->cookie[0] = '\0';
  } else if (n == 13 && strncasecmp(at, "authorization", 13) == 0) {
    h->field = HDR_AUTH;
    h->auth[0] = '\0';
  } else {
    h->field = HDR_NONE;
  }
  return 0;
}

static int on_value(http_parser *p, const char *at, size_t n)
{
  wf__http *h = of(p);
  if (h->field == HDR_COOKIE)
    append(h->cookie, sizeof h->cookie, at, n, NULL);
  else if (h->field == HDR_AUTH)
    append(h->auth, sizeof h->auth, at, n, NULL);
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
  of(p)->body = true;
  return 0;
}

static int on_complete(http_parser *p)
{
  of(p)->complete = true;
  http_parser_pause(p, 1); /* one request per connection: ignore what follows */
  return 0;
}

static const http_parser_settings settings = {.on_url = on_url,
                                              .on_header_field = on_field,
                                              .on_header_value = on_value,
                                              .on_body = on_body,
                                              .on_message_complete = on_complete};

wf__http *wf__http_new(void)
{
  wf__http *h = calloc(1, sizeof *h);
  if (h)
    http_parser_init(&h->parser, HTTP_REQUEST);
  return h;
}

void wf__http_free(wf__http *h) { free(h); }

/* ---- answers ------------------------------------------------------------------------ */

typedef struct http_write {
  uv_write_t req;
  char *data;
} http_write;

static void on_written(uv_write_t *req, int status)
{
  http_write *w = (http_write *)req;
  wf__conn_close((wf__conn *)req->handle);
  free(w->data);
  free(w);
}

/* Every answer: no caching (each poll must reach the job), nothing sniffed or framed,
 * no address (with a token in it) passed on; `headers` ends in \r\n or is "". */
void wf__http_respond(wf__conn *c, const char *status, const char *type, const char *headers,
                      const void *body, size_t len)
{
  http_write *w = calloc(1, sizeof *w);
  size_t cap = len + 1024 + strlen(headers);
  if (!w || !(w->data = malloc(cap))) {
    free(w);
    wf__conn_close(c);
    return;
  }
  int n = snprintf(w->data, cap,
                   "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                   "Referrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n%s"
                   "Connection: close\r\n\r\n",
                   status, type, len, headers);
  memcpy(w->data + n, body, len);
  uv_buf_t buf = uv_buf_init(w->data, (unsigned)((size_t)n + len));
  uv_read_stop(&c->u.s);
  if (uv_write(&w->req, &c->u.s, &buf, 1, on_written) < 0) {
    free(w->data);
    free(w);
    wf__conn_close(c);
  }
}

void wf__http_text(wf__conn *c, const char *status, const char *text)
{
  wf__http_respond(c, status, "text/plain; charset=utf-8", "", text, strlen(text));
}

/* ---- access ------------------------------------------------------------------------- */

/* The value of `name` in a "a=1; name=2" list (cookies) or "a=1&name=2" (a query),
 * copied into out; false when absent. */
static bool param(const char *list, const char *name, char sep, char *out, size_t len)
{
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    while (*p == ' ' || *p == sep)
      p++;
    const char *end = strchr(p, sep);
    size_t span = end ? (size_t)(end - p) : strlen(p);
    if (span > n && strncmp(p, name, n) == 0 && p[n] == '=') {
      size_t v = span - n - 1;
      if (v >= len)
        return false;
      memcpy(out, p + n + 1, v);
      out[v] = '\0';
      return true;
    }
    p = end;
  }
  return false;
}

static bool token_ok(const wf_service *svc, const char *given)
{
  return given[0] && wf__ct_streq(given, svc->token);
}

/* The Bearer header or the cookie carries the job's token. */
static bool authorised(const wf__conn *c)
{
  const wf__http *h = c->http;
  char tok[WF_TOKEN_HEX + 2];
  if (strncasecmp(h->auth, "Bearer ", 7) == 0 && token_ok(c->svc, h->auth + 7))
    return true;
  return param(h->cookie, "weft_token", ';', tok, sizeof tok) && token_ok(c->svc, tok);
}

static const char denied[] =
    "<!doctype html><meta charset=utf-8><title>weft: access denied</title>"
    "<body style='font:15px sans-serif;margin:3em'><h1>Access denied</h1>"
    "<p>The live view of a weft job needs the job's token. Open the address that "
    "<code>coordinator view</code> prints on the machine that runs rank 0 (it reads the "
    "token from the job file), or send <code>Authorization: Bearer TOKEN</code>.</p>\n";

static void refuse(wf__conn *c)
{
  long more = 0;
  if (wf__ratelimit_ok(&c->svc->rl_auth, wf__now_ms(), &more))
    WF_WARN("control: refused a web view request without the job's token (%ld more since the "
            "last such line)",
            more);
  wf__http_respond(c, "401 Unauthorized", "text/html; charset=utf-8", "", denied,
                   sizeof denied - 1);
}

/* GET /?token=T: set the cookie and send the browser to / (the token leaves the address
 * bar and the history). */
static bool login(wf__conn *c, const char *query)
{
  char tok[WF_TOKEN_HEX + 2], headers[256];
  if (!query || !param(query, "token", '&', tok, sizeof tok))
    return false;
  if (!token_ok(c->svc, tok)) {
    refuse(c);
    return true;
  }
  snprintf(headers, sizeof headers,
           "Set-Cookie: weft_token=%s; Path=/; HttpOnly; SameSite=Strict\r\nLocation: /\r\n",
           c->svc->token);
  wf__http_respond(c, "303 See Other", "text/plain; charset=utf-8", headers, "see /\n", 6);
  return true;
}

/* ---- routing ------------------------------------------------------------------------ */

static void route(wf__conn *c)
{
  wf__http *h = c->http;
  int method = h->parser.method;
  char *query = strchr(h->url, '?');
  if (query)
    *query++ = '\0';
  if (method != HTTP_GET && method != HTTP_POST) {
    wf__http_text(c, "405 Method Not Allowed", "GET or POST\n");
    return;
  }
  if (strcmp(h->url, "/metrics") == 0 && method == HTTP_GET) {
    wf__metrics_serve(c);
    return;
  }
  if (strcmp(h->url, "/") == 0 && method == HTTP_GET && login(c, query))
    return;
  if (!authorised(c)) {
    refuse(c);
    return;
  }
  wf__view_serve(c, method == HTTP_POST, h->url, query ? query : "");
}

/* Bytes of a request, as they arrive. Anything that cannot be a request we answer is
 * refused at once rather than waited on. */
void wf__http_read(wf__conn *c, const char *data, size_t len)
{
  wf__http *h = c->http;
  if (!h || h->complete)
    return;
  size_t done = http_parser_execute(&h->parser, &settings, data, len);
  h->head += done;
  enum http_errno err = HTTP_PARSER_ERRNO(&h->parser);
  if (h->head > WF__HTTP_MAX_HEAD) { /* bodies are refused, so all of it is head */
    wf__http_text(c, "431 Request Header Fields Too Large", "the request head is too large\n");
  } else if (h->body) {
    wf__http_text(c, "413 Payload Too Large", "requests here carry no body\n");
  } else if (h->url_long) {
    wf__http_text(c, "414 URI Too Long", "the address is too long\n");
  } else if (h->complete) {
    route(c);
  } else if (err != HPE_OK && err != HPE_PAUSED) {
    char msg[160];
    snprintf(msg, sizeof msg, "bad request (%s): try GET /metrics or GET /?token=TOKEN\n",
             http_errno_name(err));
    wf__http_text(c, "400 Bad Request", msg);
  }
}
