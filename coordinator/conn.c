/*
 * conn.c - the service's connections (service.c): accepting them within each listener's
 * cap (evicting the oldest that has not authenticated, else refusing the newcomer),
 * reading frames, sending, rejecting and closing. Complete messages go to wf__dispatch
 * (registry.c). Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control_int.h"

/* ---- connections ------------------------------------------------------------------ */

static void on_conn_closed(uv_handle_t *h)
{
  wf__conn *c = (wf__conn *)h;
  wf_service *svc = c->svc;
  if (c->prev)
    c->prev->next = c->next;
  else
    svc->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  wf_proto_reader_fini(&c->rd);
  wf__http_free(c->http);
  free(c);
}

/* Logical close: no more messages are processed, and a worker that had not said
 * Bye is lost. The handle itself is closed by the callers below. */
static void conn_retire(wf__conn *c)
{
  if (c->closing)
    return;
  c->closing = true;
  c->t_last = wf__now_ms();
  if (c->svc->trace.conn == c)
    c->svc->trace.conn = NULL;
  if (c->role == WF__CONN_WORKER && c->rank >= 0 && c->svc->ranks[c->rank].conn == c) {
    wf__rank *r = &c->svc->ranks[c->rank];
    r->conn = NULL;
    double stalled = wf__stalled_ms(c->svc, wf__now_ms());
    if (r->state == WF__RANK_ALIVE && !c->svc->shutting_down && stalled > 0)
      wf__rank_left_stalled(c->svc, c->rank, stalled); /* it left because we were frozen */
    else if (r->state == WF__RANK_ALIVE && !c->svc->shutting_down)
      wf__rank_lost(c->svc, c->rank,
                    "its connection to the coordinator closed (the process exited or was "
                    "killed)");
  }
}

/* uv_close() releases the descriptor at once: that is when a connection stops
 * counting against its listener's cap. */
void wf__conn_close(wf__conn *c)
{
  conn_retire(c);
  if (!uv_is_closing(&c->u.h)) {
    c->svc->n_conns[c->listener]--;
    uv_close(&c->u.h, on_conn_closed);
  }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
  wf__conn *c = req->data;
  free(req);
  wf__conn_close(c);
}

/* Close after what was queued has been written (uv_close would discard it). The
 * watchdog force-closes a connection whose peer does not take the bytes. */
void wf__conn_close_flushed(wf__conn *c)
{
  if (uv_is_closing(&c->u.h))
    return;
  bool was_closing = c->closing;
  conn_retire(c);
  if (was_closing)
    return; /* a shutdown is already under way */
  uv_read_stop(&c->u.s);
  uv_shutdown_t *req = malloc(sizeof *req);
  if (!req) {
    wf__conn_close(c);
    return;
  }
  req->data = c;
  if (uv_shutdown(req, &c->u.s, on_shutdown) < 0) {
    free(req);
    wf__conn_close(c);
  }
}

/* Queue an envelope; drop a peer that does not read what it is sent. */
void wf__conn_send(wf__conn *c, Weft__Envelope *env)
{
  if (uv_is_closing(&c->u.h))
    return;
  if (wf__send(&c->u.s, env) < 0 || uv_stream_get_write_queue_size(&c->u.s) > WF__MAX_QUEUED) {
    WF_WARN("control: dropping a %s connection that does not read what it is sent",
            c->role == WF__CONN_WORKER ? "worker" : "console");
    wf__conn_close(c);
  }
}

/* Tell the peer what was wrong, then close. */
void wf__conn_reject(wf__conn *c, const char *msg)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Error e = WEFT__ERROR__INIT;
  e.code = WF_EPROTO;
  e.message = (char *)msg;
  env.msg_case = WEFT__ENVELOPE__MSG_ERROR;
  env.error = &e;
  wf__conn_send(c, &env);
  wf__conn_close_flushed(c);
}

void wf__broadcast(wf_service *svc, Weft__Envelope *env)
{
  for (wf__conn *c = svc->conns, *next; c; c = next) {
    next = c->next;
    if (c->role == WF__CONN_WORKER && !c->closing)
      wf__conn_send(c, env);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  static _Thread_local char slab[64 << 10];
  buf->base = slab;
  buf->len = sizeof slab;
}

static void bad_frame(wf__conn *c, const char *err)
{
  long more = 0;
  if (wf__ratelimit_ok(&c->svc->rl_frame, wf__now_ms(), &more))
    WF_WARN("control: dropping a peer that sent a bad frame: %s (%ld more since the last such "
            "line)",
            err, more);
  wf__conn_reject(c, err);
}

/* Decode and dispatch every complete frame; returns how many there were, or -1 when
 * the connection was closed. */
static int drain_frames(wf__conn *c)
{
  char err[256];
  for (int done = 0;; done++) {
    Weft__Envelope *env = NULL;
    if (wf_proto_reader_next(&c->rd, &env, err, sizeof err) != WF_OK) {
      bad_frame(c, err);
      return -1;
    }
    if (!env)
      return done;
    c->t_msg = wf__now_ms();
    wf__dispatch(c, env);
    wf_proto_free(env);
    if (c->closing)
      return -1;
  }
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  wf__conn *c = (wf__conn *)s;
  char err[256];
  if (n < 0) {
    wf__conn_close(c);
    return;
  }
  if (n == 0 || c->closing)
    return;
  c->t_last = wf__now_ms();
  if (c->role == WF__CONN_HTTP) {
    wf__http_read(c, buf->base, (size_t)n);
    return;
  }
  bool was_partial = wf_proto_reader_partial(&c->rd);
  if (wf_proto_reader_feed(&c->rd, buf->base, (size_t)n, err, sizeof err) != WF_OK) {
    bad_frame(c, err);
    return;
  }
  int done = drain_frames(c);
  /* A frame's deadline runs from its first byte, whatever trickles in after it. */
  if (done >= 0 && wf_proto_reader_partial(&c->rd) && (!was_partial || done > 0))
    c->t_frame = c->t_last;
}

static wf__conn *conn_new(wf_service *svc, bool is_unix, conn_listener l)
{
  wf__conn *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->svc = svc;
  c->is_unix = is_unix;
  c->rank = -1;
  c->listener = l;
  svc->n_conns[l]++;
  c->t_open = c->t_last = c->t_msg = c->t_frame = wf__now_ms();
  /* Workers and consoles send small frames; only replies are large. */
  wf_proto_reader_init(&c->rd, WF__CONSOLE_MAX_IN);
  if (is_unix)
    uv_pipe_init(&svc->loop, &c->u.pipe, 0);
  else
    uv_tcp_init(&svc->loop, &c->u.tcp);
  c->next = svc->conns;
  if (svc->conns)
    svc->conns->prev = c;
  svc->conns = c;
  return c;
}

/* The Unix socket lives in a 0700 directory, and the peer must also be us. */
static bool peer_is_same_user(wf__conn *c)
{
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (uv_fileno(&c->u.h, &fd) < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    return false;
  return cred.uid == getuid();
}

static const char *const listener_names[WF__LSN_COUNT] = {"control", "metrics"};

/* The oldest connection on this listener that has not authenticated (metrics
 * connections never do), or NULL. */
static wf__conn *eviction_victim(wf_service *svc, conn_listener l)
{
  wf__conn *victim = NULL;
  for (wf__conn *c = svc->conns; c; c = c->next)
    if (c->listener == l && !uv_is_closing(&c->u.h) &&
        (c->role == WF__CONN_NEW || c->role == WF__CONN_HTTP) &&
        (!victim || c->t_open < victim->t_open))
      victim = c;
  return victim;
}

/* At the cap: evict the oldest unauthenticated connection to make room, or refuse the
 * newcomer (false). Said once, then at most every WF__LOG_EVERY_MS. */
static bool make_room(wf_service *svc, conn_listener l)
{
  long more = 0;
  if (svc->n_conns[l] < svc->max_conns[l])
    return true;
  wf__conn *victim = eviction_victim(svc, l);
  svc->evicted[l]++;
  if (wf__ratelimit_ok(&svc->rl_cap[l], wf__now_ms(), &more))
    WF_WARN("control: the %s port has reached its cap of %d connections; %s (%ld evicted or "
            "refused in all; this line is repeated at most every %d s)",
            listener_names[l], svc->max_conns[l],
            victim ? "evicting the oldest connection that has not authenticated"
                   : "refusing new connections until one closes",
            svc->evicted[l], WF__LOG_EVERY_MS / 1000);
  if (!victim)
    return false;
  wf__conn_close(victim);
  return true;
}

/* Take the pending connection off the backlog and close it, so a full listener does
 * not leave it queued in the kernel. */
static void refuse_pending(wf_service *svc, uv_stream_t *server, bool is_unix)
{
  wf__conn *c = conn_new(svc, is_unix, server == (uv_stream_t *)&svc->http);
  if (!c)
    return;
  uv_accept(server, &c->u.s);
  wf__conn_close(c);
}

void wf__service_on_connection(uv_stream_t *server, int status)
{
  wf_service *svc = server->data;
  bool is_unix = server == (uv_stream_t *)&svc->pipe;
  conn_listener l = server == (uv_stream_t *)&svc->http ? WF__LSN_HTTP : WF__LSN_CONTROL;
  if (status < 0)
    return;
  if (!make_room(svc, l)) {
    refuse_pending(svc, server, is_unix);
    return;
  }
  wf__conn *c = conn_new(svc, is_unix, l);
  if (!c)
    return;
  if (l == WF__LSN_HTTP && !(c->http = wf__http_new())) { /* out of memory */
    wf__conn_close(c);
    refuse_pending(svc, server, is_unix);
    return;
  }
  if (l == WF__LSN_HTTP)
    c->role = WF__CONN_HTTP;
  if (uv_accept(server, &c->u.s) < 0) {
    wf__conn_close(c);
    return;
  }
  if (is_unix && !peer_is_same_user(c)) {
    WF_WARN("control: rejected a Unix-socket peer of another user");
    wf__conn_close(c);
    return;
  }
  if (!is_unix)
    uv_tcp_nodelay(&c->u.tcp, 1);
  if (svc->shutting_down || uv_read_start(&c->u.s, on_alloc, on_read) < 0)
    wf__conn_close(c);
}
