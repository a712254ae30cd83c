/*
 * control.c - the worker's control client: a libuv thread in every rank.
 *
 * It registers the rank (Hello -> Welcome), sends a heartbeat every interval from
 * its own timer, so liveness never depends on training progress, forwards step
 * reports and errors posted by the training loop, and receives Abort and console
 * commands. When the coordinator aborts the job, or the connection to it drops
 * without an orderly SHUTDOWN, it logs why and calls the caller's on_abort.
 *
 * Threads: the training loop only takes `lock` to post state and wakes the loop
 * with `async`; everything with a libuv handle happens on the control thread.
 *
 * This file connects, registers, heartbeats and reads the coordinator's messages;
 * control_abort.c ends the job as this rank sees it (an Abort, a lost or silent
 * coordinator), control_post.c carries what the training loop posts (step reports,
 * errors, the phase and collective) and the Bye. wf_control is in control_int.h.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control_int.h"

void wf__control_start_done(wf_control *c, int result, const char *err)
{
  pthread_mutex_lock(&c->lock);
  if (c->start == 0) {
    c->start = result;
    if (err)
      wf_strlcpy(c->start_err, err, sizeof c->start_err);
    pthread_cond_broadcast(&c->cond);
  }
  pthread_mutex_unlock(&c->lock);
}

void wf__control_close_all(wf_control *c)
{
  if (c->closed)
    return;
  c->closed = true;
  if (c->sock_open && !uv_is_closing(&c->sock.h))
    uv_close(&c->sock.h, NULL);
  uv_close((uv_handle_t *)&c->timer, NULL);
  uv_close((uv_handle_t *)&c->close_timer, NULL);
  uv_close((uv_handle_t *)&c->deadline_timer, NULL);
  uv_close((uv_handle_t *)&c->silence_timer, NULL);
  uv_close((uv_handle_t *)&c->async, NULL);
}

#define TRACE_BUF   (32 << 10)
#define TRACE_LINES 512

/* Answer the coordinator's TRACE with this rank's flight recorder, as lines. */
static void send_trace(wf_control *c, uint64_t id)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__TraceReport tr = WEFT__TRACE_REPORT__INIT;
  char *buf = calloc(1, TRACE_BUF), **lines = calloc(TRACE_LINES, sizeof *lines);
  pthread_mutex_lock(&c->lock);
  wf_control_trace_fn fn = c->trace_fn;
  void *user = c->trace_user;
  pthread_mutex_unlock(&c->lock);
  if (!buf || !lines)
    goto out;
  if (fn)
    fn(user, buf, TRACE_BUF);
  else
    wf_strlcpy(buf, "(this rank has no flight recorder)", TRACE_BUF);
  buf[TRACE_BUF - 1] = '\0';
  size_t n = 0;
  for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l && n < TRACE_LINES;
       l = strtok_r(NULL, "\n", &save)) {
    wf__sanitize(l, strlen(l) + 1, l);
    lines[n++] = l;
  }
  tr.request_id = id;
  tr.n_lines = n;
  tr.lines = lines;
  env.msg_case = WEFT__ENVELOPE__MSG_TRACE_REPORT;
  env.trace_report = &tr;
  wf__send(&c->sock.s, &env);
out:
  free(lines);
  free(buf);
}

static void on_command(wf_control *c, const Weft__Command *cmd)
{
  switch (cmd->kind) {
  case WEFT__COMMAND__KIND__STOP:
    /* Said once by the coordinator ("console requested stop") and once by rank 0 when
     * it stops ("stopping after step N"); every rank repeating it says nothing new. */
    WF_DEBUG("control: the console asked to stop at the next step boundary");
    atomic_store(&c->stop_req, true);
    break;
  case WEFT__COMMAND__KIND__CHECKPOINT: atomic_store(&c->ckpt_req, true); break;
  case WEFT__COMMAND__KIND__SHUTDOWN: c->shutdown_seen = true; break;
  case WEFT__COMMAND__KIND__TRACE: send_trace(c, cmd->request_id); break;
  default: break;
  }
}

/* This process's resident set and CPU time, for the console's `ranks` and /metrics.
 * Zero when /proc is not there. */
static void process_usage(uint64_t *rss_bytes, double *cpu_s)
{
  struct rusage ru;
  unsigned long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%lu %lu", &pages, &resident) != 2)
      resident = 0;
    fclose(f);
  }
  *rss_bytes = (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
  *cpu_s = 0;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    *cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
             ru.ru_stime.tv_usec * 1e-6;
}

void wf__control_send_heartbeat(wf_control *c)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Heartbeat hb = WEFT__HEARTBEAT__INIT;
  char phase[32], op[64];
  pthread_mutex_lock(&c->lock);
  hb.step = c->step;
  hb.coll_seq = c->coll_seq;
  hb.coll_active = c->coll_active;
  hb.mem_bytes = c->mem_bytes;
  process_usage(&hb.rss_bytes, &hb.cpu_s);
  wf_nvml_figures g;
  if ((hb.gpu = wf_nvml_sample(c->nvml, &g))) {
    hb.gpu_util_pct = (uint32_t)g.util_pct;
    hb.gpu_mem_used = g.mem_used;
    hb.gpu_mem_total = g.mem_total;
  }
  wf_strlcpy(phase, c->phase, sizeof phase);
  wf_strlcpy(op, c->coll_op, sizeof op);
  wf_control_collective_fn fn = c->coll_fn;
  void *user = c->coll_user;
  pthread_mutex_unlock(&c->lock);
  if (fn) {
    bool active = hb.coll_active;
    fn(user, &hb.coll_seq, op, sizeof op, &active);
    hb.coll_active = active;
  }
  hb.phase = phase;
  hb.coll_op = op;
  if (c->echo_ms > 0) { /* the coordinator's last stamp, for its round-trip time */
    hb.echo_ms = c->echo_ms;
    hb.echo_held_ms = wf__now_ms() - c->t_echo;
  }
  env.msg_case = WEFT__ENVELOPE__MSG_HEARTBEAT;
  env.heartbeat = &hb;
  wf__send(&c->sock.s, &env);
}

static void on_heartbeat_timer(uv_timer_t *t) { wf__control_send_heartbeat(t->data); }

static void on_message(wf_control *c, const Weft__Envelope *env)
{
  char msg[600];
  switch (env->msg_case) {
  case WEFT__ENVELOPE__MSG_WELCOME:
    c->welcomed = true;
    if (env->welcome->heartbeat_ms >= 10 && env->welcome->heartbeat_ms <= 60000)
      c->heartbeat_ms = (int)env->welcome->heartbeat_ms;
    /* 0 from an older coordinator that does not heartbeat: never judge silence */
    c->silence_ms = env->welcome->silence_ms > 0 ? (int)env->welcome->silence_ms : 1 << 30;
    wf__sanitize(c->coord_host, sizeof c->coord_host, env->welcome->host);
    c->coord_pid = env->welcome->pid;
    wf__control_send_heartbeat(c);
    uv_timer_start(&c->timer, on_heartbeat_timer, (uint64_t)c->heartbeat_ms,
                   (uint64_t)c->heartbeat_ms);
    uv_timer_start(&c->silence_timer, wf__control_check_coordinator, WF__SILENCE_TICK_MS,
                   WF__SILENCE_TICK_MS);
    wf__control_start_done(c, 1, NULL);
    break;
  case WEFT__ENVELOPE__MSG_ERROR:
    wf__sanitize(msg, sizeof msg, env->error->message);
    if (!c->welcomed)
      wf__control_start_done(c, WF_EPROTO, msg);
    else
      WF_WARN("control: the coordinator says: %s", msg);
    break;
  case WEFT__ENVELOPE__MSG_ABORT: wf__control_on_abort_msg(c, env->abort); break;
  case WEFT__ENVELOPE__MSG_COMMAND: on_command(c, env->command); break;
  case WEFT__ENVELOPE__MSG_HEARTBEAT:
    c->echo_ms = env->heartbeat->sent_ms;
    c->t_echo = c->t_rx;
    break;
  default: break;
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  static _Thread_local char slab[64 << 10];
  buf->base = slab;
  buf->len = sizeof slab;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  wf_control *c = s->data;
  char err[256];
  if (n < 0) {
    uv_read_stop(s);
    wf__control_connection_lost(c, n == UV_EOF ? "connection closed" : uv_strerror((int)n));
    return;
  }
  if (wf_proto_reader_feed(&c->rd, buf->base, (size_t)n, err, sizeof err) != WF_OK) {
    uv_read_stop(s);
    wf__control_connection_lost(c, err);
    return;
  }
  for (;;) {
    Weft__Envelope *env = NULL;
    if (wf_proto_reader_next(&c->rd, &env, err, sizeof err) != WF_OK) {
      uv_read_stop(s);
      wf__control_connection_lost(c, err);
      return;
    }
    if (!env)
      return;
    c->t_rx = wf__now_ms();
    on_message(c, env);
    wf_proto_free(env);
  }
}

static void send_hello(wf_control *c)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Hello h = WEFT__HELLO__INIT;
  h.role = WEFT__HELLO__ROLE__WORKER;
  h.token = c->token;
  h.job_id = c->job_id;
  h.rank = c->facts.rank;
  h.local_rank = c->facts.local_rank;
  h.pid = c->facts.pid;
  h.host = c->facts.host;
  h.device = c->facts.device;
  h.binding = c->facts.binding;
  h.pp = c->facts.coords.pp;
  h.dp = c->facts.coords.dp;
  h.tp = c->facts.coords.tp;
  h.cp = c->facts.coords.cp;
  h.threads = c->facts.threads;
  h.stage = c->stage;
  env.msg_case = WEFT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  wf__send(&c->sock.s, &env);
}

static void try_connect(wf_control *c);

static void on_retry_timer(uv_timer_t *t) { try_connect(t->data); }

static void on_sock_closed_retry(uv_handle_t *h)
{
  wf_control *c = h->data;
  c->sock_open = false;
  uv_timer_start(&c->timer, on_retry_timer, 200, 0);
}

/* Registration failed for good: say which address and port were tried, for how long,
 * and the last error (a refused port, no route to the host, no answer at all). */
static void give_up_connecting(wf_control *c, wf_status st, const char *what)
{
  char msg[1024], within[80] = "";
  if (st == WF_ETIMEOUT)
    snprintf(within, sizeof within, " within runtime.connect_timeout=%g s",
             c->connect_timeout_ms / 1000.0);
  snprintf(msg, sizeof msg,
           "cannot reach the coordinator at %s (%s)%s: %s (is rank 0 running, and is "
           "MASTER_ADDR:MASTER_PORT reachable from this host?)",
           c->endpoint, c->addr_str, within, what);
  wf__control_start_done(c, st, msg);
}

/* The deadline also covers a connect the network never answers (SYNs dropped: the
 * kernel would retry for about two minutes), and a Hello that gets no Welcome. */
static void on_deadline(uv_timer_t *t)
{
  wf_control *c = t->data;
  if (c->welcomed || c->closed)
    return;
  give_up_connecting(c, WF_ETIMEOUT,
                     c->last_err    ? uv_strerror(c->last_err)
                     : c->sock_open ? "no answer (the connection attempt timed out)"
                                    : "no answer");
}

static void on_connect(uv_connect_t *req, int status)
{
  wf_control *c = req->data;
  if (status == 0) {
    uv_read_start(&c->sock.s, on_alloc, on_read);
    send_hello(c);
    return;
  }
  if (c->closed || status == UV_ECANCELED)
    return;
  c->last_err = status;
  if (wf__now_ms() > c->deadline) {
    give_up_connecting(c, WF_ETIMEOUT, uv_strerror(status));
    return;
  }
  uv_close(&c->sock.h, on_sock_closed_retry);
}

static void try_connect(wf_control *c)
{
  int rc;
  c->sock.h.data = c;
  c->connect_req.data = c;
  c->sock_open = true;
  if (c->is_unix) {
    uv_pipe_init(&c->loop, &c->sock.pipe, 0);
    c->sock.h.data = c;
    uv_pipe_connect(&c->connect_req, &c->sock.pipe, c->endpoint + 5, on_connect);
    return;
  }
  uv_tcp_init(&c->loop, &c->sock.tcp);
  c->sock.h.data = c;
  uv_tcp_nodelay(&c->sock.tcp, 1);
  rc = uv_tcp_connect(&c->connect_req, &c->sock.tcp, (const struct sockaddr *)&c->addr, on_connect);
  if (rc < 0) /* no route to it at all: retrying would not help */
    give_up_connecting(c, WF_EUV, uv_strerror(rc));
}

static void control_thread(void *arg)
{
  wf_control *c = arg;
  wf__block_sigpipe();
  uv_timer_start(&c->deadline_timer, on_deadline, (uint64_t)c->connect_timeout_ms, 0);
  try_connect(c);
  uv_run(&c->loop, UV_RUN_DEFAULT);
}

/* ---- public API ----------------------------------------------------------------------- */

static wf_status resolve(wf_control *c)
{
  char host[300];
  int port;
  if (strncmp(c->endpoint, "unix:", 5) == 0) {
    c->is_unix = true;
    return WF_OK;
  }
  if (wf__split_endpoint(c->endpoint, host, sizeof host, &port) != WF_OK) {
    WF_ERROR("control: bad coordinator endpoint '%s': expected host:port or unix:/path",
             c->endpoint);
    return WF_EINVAL;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  char ports[16];
  snprintf(ports, sizeof ports, "%d", port);
  int rc = getaddrinfo(host, ports, &hints, &res);
  if (rc != 0 || !res) {
    WF_ERROR("control: cannot resolve the coordinator host '%s' (MASTER_ADDR): %s", host,
             gai_strerror(rc));
    return WF_EINVAL;
  }
  memcpy(&c->addr, res->ai_addr, res->ai_addrlen);
  char num[64] = "?";
  getnameinfo(res->ai_addr, res->ai_addrlen, num, sizeof num, NULL, 0, NI_NUMERICHOST);
  snprintf(c->addr_str, sizeof c->addr_str, "%s port %d", num, port);
  freeaddrinfo(res);
  return WF_OK;
}

static wf_control *control_new(const wf_control_opts *o)
{
  wf_control *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  wf_strlcpy(c->endpoint, o->endpoint, sizeof c->endpoint);
  wf_strlcpy(c->token, o->token ? o->token : "", sizeof c->token);
  wf_strlcpy(c->job_id, o->job_id ? o->job_id : "", sizeof c->job_id);
  wf_strlcpy(c->stage, o->stage_desc ? o->stage_desc : "", sizeof c->stage);
  c->facts = o->facts;
  c->on_abort = o->on_abort;
  c->user = o->user;
  c->heartbeat_ms = 1000;
  c->step = -1;
  wf_strlcpy(c->phase, "init", sizeof c->phase);
  char why[256];
  if (o->gpu_bus && o->gpu_bus[0] && wf_nvml_open(&c->nvml, o->gpu_bus, why, sizeof why) != WF_OK)
    WF_DEBUG("control: no GPU figures for the console: %s", why);
  c->connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 30000;
  c->deadline = wf__now_ms() + c->connect_timeout_ms;
  wf_strlcpy(c->addr_str, "a Unix socket", sizeof c->addr_str);
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  wf_proto_reader_init(&c->rd, 0);
  return c;
}

static void control_free(wf_control *c)
{
  wf_nvml_close(c->nvml);
  wf_proto_reader_fini(&c->rd);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c);
}

/* Wait for registration (or its failure) a little past the connect deadline. */
static int wait_started(wf_control *c)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double wait_ms = c->deadline - wf__now_ms() + 5000;
  ts.tv_sec += (time_t)(wait_ms / 1000);
  ts.tv_nsec += (long)((wait_ms - (double)(long)(wait_ms / 1000) * 1000) * 1e6);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&c->lock);
  while (c->start == 0)
    if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) != 0)
      break;
  if (c->start == 0) {
    c->start = WF_ETIMEOUT;
    snprintf(c->start_err, sizeof c->start_err, "the coordinator at %s did not answer Hello",
             c->endpoint);
  }
  int r = c->start;
  pthread_mutex_unlock(&c->lock);
  return r;
}

static void stop_thread(wf_control *c)
{
  pthread_mutex_lock(&c->lock);
  c->closing = true;
  pthread_mutex_unlock(&c->lock);
  uv_async_send(&c->async);
  uv_thread_join(&c->thread);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  uv_loop_close(&c->loop);
}

wf_status wf_control_start(wf_control **out, const wf_control_opts *o)
{
  *out = NULL;
  if (!o || !o->endpoint || !o->endpoint[0])
    return WF_EINVAL;
  wf_control *c = control_new(o);
  if (!c)
    return WF_ENOMEM;
  if (resolve(c) != WF_OK || uv_loop_init(&c->loop) < 0) {
    control_free(c);
    return WF_EINVAL;
  }
  uv_timer_init(&c->loop, &c->timer);
  uv_timer_init(&c->loop, &c->close_timer);
  uv_timer_init(&c->loop, &c->deadline_timer);
  uv_timer_init(&c->loop, &c->silence_timer);
  uv_async_init(&c->loop, &c->async, wf__control_on_async);
  c->timer.data = c->close_timer.data = c->deadline_timer.data = c->silence_timer.data =
      c->async.data = c;
  if (uv_thread_create(&c->thread, control_thread, c) < 0) {
    wf__control_close_all(c);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    uv_loop_close(&c->loop);
    control_free(c);
    return WF_EUV;
  }
  int r = wait_started(c);
  if (r != 1) {
    WF_ERROR("control: rank %d could not register with the coordinator: %s", c->facts.rank,
             c->start_err);
    stop_thread(c);
    control_free(c);
    return r < 0 ? (wf_status)r : WF_EPROTO;
  }
  *out = c;
  return WF_OK;
}

void wf_control_destroy(wf_control *c)
{
  if (!c)
    return;
  stop_thread(c);
  control_free(c);
}
