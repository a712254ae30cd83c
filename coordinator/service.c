/*
 * service.c - the coordinator service: a libuv loop thread inside world rank 0.
 *
 * It listens on TCP (MASTER_ADDR:MASTER_PORT) and on a Unix socket in the job
 * directory, authenticates every connection (the token in Hello on TCP, the peer's
 * uid on the Unix socket), keeps the registry of ranks from Hello, heartbeats and
 * step reports, answers console queries and forwards console commands.
 *
 * Invariants:
 *  - Only the loop thread touches connections and the registry (see control_int.h).
 *  - Each listener holds at most max_conns descriptors (its cap); at the cap the oldest
 *    connection that has not authenticated is evicted, else the newcomer is refused,
 *    so no flood can exhaust rank 0's descriptors (its checkpoints need some).
 *  - A line a flood could repeat (a refusal, a bad token, a bad frame) is logged at
 *    most once every WF__LOG_EVERY_MS, with the count of the ones left out.
 *  - A connection that is not authenticated gets nothing but an Error and a close.
 *  - Whatever a peer sends, the worst outcome is that its own connection is closed;
 *    only a worker's death or its Error ends the job.
 */
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control_int.h"
#include "wf_check.h"

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
static void conn_reject(wf__conn *c, const char *msg)
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
static void send_welcome(wf__conn *c)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Welcome w = WEFT__WELCOME__INIT;
  w.job_id = c->svc->job_id;
  w.world_size = c->svc->world;
  w.heartbeat_ms = (uint32_t)c->svc->heartbeat_ms;
  w.silence_ms = (uint32_t)(c->svc->dead_after_ms + c->svc->heartbeat_ms);
  w.host = (char *)wf_rt_host();
  w.pid = (int32_t)getpid();
  env.msg_case = WEFT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  wf__conn_send(c, &env);
}

static void facts_from_hello(wf__rank *r, const Weft__Hello *h)
{
  wf_rank_facts *f = &r->facts;
  f->rank = h->rank;
  f->local_rank = h->local_rank;
  f->pid = h->pid;
  f->threads = h->threads;
  f->coords.pp = h->pp;
  f->coords.dp = h->dp;
  f->coords.tp = h->tp;
  f->coords.cp = h->cp;
  wf__sanitize(f->host, sizeof f->host, h->host);
  wf__sanitize(f->device, sizeof f->device, h->device);
  wf__sanitize(f->binding, sizeof f->binding, h->binding);
  wf__sanitize(r->stage, sizeof r->stage, h->stage);
}

static void register_worker(wf__conn *c, const Weft__Hello *h)
{
  wf_service *svc = c->svc;
  char msg[256];
  if (h->rank < 0 || h->rank >= svc->world) {
    snprintf(msg, sizeof msg, "rank %d is outside this job of %d ranks", h->rank, svc->world);
    conn_reject(c, msg);
    return;
  }
  wf__rank *r = &svc->ranks[h->rank];
  if (r->state != WF__RANK_WAITING) {
    snprintf(msg, sizeof msg, "rank %d has already registered with this job", h->rank);
    conn_reject(c, msg);
    return;
  }
  facts_from_hello(r, h);
  r->state = WF__RANK_ALIVE;
  r->conn = c;
  r->t_hello = r->t_heartbeat = r->t_change = wf__now_ms();
  c->role = WF__CONN_WORKER;
  c->rank = h->rank;
  send_welcome(c);
  if (++svc->registered == svc->world) {
    svc->t_progress = wf__now_ms();
    WF_INFO("control: all %d ranks registered with job %s", svc->world, svc->job_id);
  }
}

static void on_hello(wf__conn *c, const Weft__Hello *h)
{
  wf_service *svc = c->svc;
  /* On TCP the token is the only credential; on the Unix socket the kernel already
   * vouched for the peer's uid, and a token, when sent, must still be right. */
  bool token_ok = wf__ct_streq(h->token, svc->token);
  long more = 0;
  if (!token_ok && (!c->is_unix || h->token[0])) {
    if (wf__ratelimit_ok(&svc->rl_auth, wf__now_ms(), &more))
      WF_WARN("control: rejected a connection with a %s token (%ld more rejected since the "
              "last such line; logged at most every %d s)",
              h->token[0] ? "wrong" : "missing", more, WF__LOG_EVERY_MS / 1000);
    conn_reject(c, "access denied: missing or wrong job token (see the job file)");
    return;
  }
  if (h->job_id[0] && strcmp(h->job_id, svc->job_id) != 0) {
    conn_reject(c, "this coordinator serves another job");
    return;
  }
  if (h->role == WEFT__HELLO__ROLE__WORKER) {
    register_worker(c, h);
  } else if (h->role == WEFT__HELLO__ROLE__CONSOLE) {
    c->role = WF__CONN_CONSOLE;
    send_welcome(c);
  } else {
    conn_reject(c, "unknown peer role");
  }
}

static void on_heartbeat(wf__conn *c, const Weft__Heartbeat *hb)
{
  wf__rank *r = &c->svc->ranks[c->rank];
  double now = wf__now_ms();
  r->t_heartbeat = now;
  /* Progress is any change of step, phase or collective, not the heartbeat itself. */
  if (hb->step != r->step || hb->coll_seq != r->coll_seq || strcmp(hb->phase, r->phase) != 0 ||
      hb->coll_active != r->coll_active) {
    r->t_change = now;
    c->svc->t_progress = now;
  }
  r->step = hb->step;
  r->coll_seq = hb->coll_seq;
  r->coll_active = hb->coll_active;
  r->mem_bytes = hb->mem_bytes;
  r->rss_bytes = hb->rss_bytes;
  r->gpu = hb->gpu;
  r->gpu_util_pct = (int)hb->gpu_util_pct;
  r->gpu_mem_used = hb->gpu_mem_used;
  r->gpu_mem_total = hb->gpu_mem_total;
  /* CPU% over the interval since the last heartbeat that carried it (100 = one core) */
  if (r->t_cpu > 0 && now > r->t_cpu && hb->cpu_s >= r->cpu_s)
    r->cpu_pct = 100.0 * (hb->cpu_s - r->cpu_s) / ((now - r->t_cpu) / 1000.0);
  r->cpu_s = hb->cpu_s;
  r->t_cpu = now;
  /* The round trip of our stamp, less the time the worker held it (one clock), smoothed
   * as TCP smooths its RTT (RFC 6298), with a gain of 1/4 rather than 1/8 as there is one
   * sample a second: one quiet moment on a busy link does not hide it. */
  double rtt = now - hb->echo_ms - hb->echo_held_ms;
  if (hb->echo_ms > 0 && rtt >= 0)
    r->rtt_ms = isnan(r->rtt_ms) ? rtt : 0.75 * r->rtt_ms + 0.25 * rtt;
  wf__sanitize(r->phase, sizeof r->phase, hb->phase);
  wf__sanitize(r->coll_op, sizeof r->coll_op, hb->coll_op);
}

/* A figure's name as /metrics may print it: letters, digits, '_' and '/', else '_'. */
static void figure_name(char *dst, size_t len, const char *src)
{
  size_t i = 0;
  for (; src && src[i] && i + 1 < len; i++) {
    char ch = src[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '/';
    dst[i] = ok ? ch : '_';
  }
  dst[i] = '\0';
}

static void report_from_proto(wf_step_report *r, const Weft__StepReport *sr)
{
  *r = (wf_step_report){.step = sr->step,
                        .steps = sr->steps,
                        .loss = sr->loss,
                        .tokens_per_s = sr->tokens_per_s,
                        .step_ms = sr->step_ms,
                        .mem_bytes = sr->mem_bytes,
                        .tokens = sr->tokens,
                        .world_size = sr->world_size,
                        .lr = sr->lr,
                        .grad_norm = sr->grad_norm,
                        .val_loss = sr->val_loss,
                        .loss_scale = sr->loss_scale,
                        .mfu = sr->mfu,
                        .compute_s = sr->compute_s,
                        .p2p_wait_s = sr->p2p_wait_s,
                        .tp_s = sr->tp_s,
                        .dp_s = sr->dp_s,
                        .bubble = sr->bubble,
                        .act_bytes = sr->act_bytes,
                        .optim_bytes = sr->optim_bytes,
                        .param_bytes = sr->param_bytes,
                        .grad_bytes = sr->grad_bytes,
                        .skipped_steps = sr->skipped_steps,
                        .ckpt_wall = sr->ckpt_wall,
                        .checkpoints = sr->checkpoints};
  for (size_t i = 0; i < sr->n_figures && r->n_figures < WF_STEP_FIGURES; i++) {
    const Weft__Figure *f = sr->figures[i];
    if (!f || !f->name || !f->name[0])
      continue;
    wf_step_figure *d = &r->figures[r->n_figures++];
    figure_name(d->name, sizeof d->name, f->name);
    d->value = f->value;
  }
}

#define TAKE(f)                                                                                    \
  do {                                                                                             \
    if (isfinite(r->f))                                                                            \
      j->f = r->f;                                                                                 \
  } while (0)

/* The job's figures: ranks without the loss (pipeline stages before the last) send
 * NaN, so each figure is the newest finite one any rank sent for the newest step. */
static void job_from_report(wf_service *svc, const wf_step_report *r)
{
  wf_step_report *j = &svc->job;
  j->step = r->step;
  j->steps = WF_MAX(j->steps, r->steps);
  j->world_size = r->world_size > 0 ? r->world_size : svc->world;
  TAKE(loss);
  TAKE(tokens_per_s);
  TAKE(step_ms);
  TAKE(tokens);
  TAKE(lr);
  TAKE(grad_norm);
  TAKE(val_loss);
  TAKE(loss_scale);
  TAKE(mfu);
  j->skipped_steps = WF_MAX(j->skipped_steps, r->skipped_steps);
  j->ckpt_wall = WF_MAX(j->ckpt_wall, r->ckpt_wall);
  j->checkpoints = WF_MAX(j->checkpoints, r->checkpoints);
  if (r->n_figures > 0) { /* a model's figures, the same on every rank that has them */
    j->n_figures = r->n_figures;
    memcpy(j->figures, r->figures, sizeof j->figures);
  }
}
#undef TAKE

static void on_step_report(wf__conn *c, const Weft__StepReport *sr)
{
  wf_service *svc = c->svc;
  wf__rank *r = &svc->ranks[c->rank];
  double now = wf__now_ms();
  r->t_heartbeat = r->t_change = svc->t_progress = now;
  r->step = sr->step;
  r->loss = sr->loss;
  r->tokens_per_s = sr->tokens_per_s;
  r->step_ms = sr->step_ms;
  r->mem_bytes = sr->mem_bytes;
  report_from_proto(&r->rep, sr);
  r->reports++;
  if (sr->step >= svc->step) {
    svc->step = sr->step;
    if (sr->loss == sr->loss) /* NaN on ranks without the loss */
      svc->loss = sr->loss;
    if (sr->tokens_per_s > 0)
      svc->tokens_per_s = sr->tokens_per_s;
    if (sr->step_ms > 0)
      svc->step_ms = sr->step_ms;
    job_from_report(svc, &r->rep);
  }
  wf__history_add(svc, &r->rep);
}

static void on_worker_error(wf__conn *c, const Weft__Error *e)
{
  wf__rank *r = &c->svc->ranks[c->rank];
  char reason[512];
  wf__sanitize(r->error, sizeof r->error, e->message);
  snprintf(reason, sizeof reason, "it reported an error: %s", r->error);
  wf__rank_lost(c->svc, c->rank, reason);
}

static void on_worker_msg(wf__conn *c, const Weft__Envelope *env)
{
  switch (env->msg_case) {
  case WEFT__ENVELOPE__MSG_HEARTBEAT: on_heartbeat(c, env->heartbeat); break;
  case WEFT__ENVELOPE__MSG_STEP_REPORT: on_step_report(c, env->step_report); break;
  case WEFT__ENVELOPE__MSG_ERROR: on_worker_error(c, env->error); break;
  case WEFT__ENVELOPE__MSG_TRACE_REPORT: wf__trace_report(c, env->trace_report); break;
  case WEFT__ENVELOPE__MSG_BYE:
    c->svc->ranks[c->rank].state = WF__RANK_EXITED;
    c->svc->t_progress = wf__now_ms();
    break;
  default: conn_reject(c, "unexpected message from a worker"); break;
  }
}

void wf__reply(wf__conn *c, bool ok, const char *json, const char *msg)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Reply r = WEFT__REPLY__INIT;
  r.ok = ok;
  r.json = (char *)(json ? json : "");
  r.message = (char *)(msg ? msg : "");
  env.msg_case = WEFT__ENVELOPE__MSG_REPLY;
  env.reply = &r;
  wf__conn_send(c, &env);
}

bool wf__request(wf_service *svc, int kind, char *msg, size_t len)
{
  bool stop = kind == WEFT__COMMAND__KIND__STOP;
  if (!stop && kind != WEFT__COMMAND__KIND__CHECKPOINT) {
    snprintf(msg, len, "unknown command");
    return false;
  }
  if (!stop && !svc->can_checkpoint) {
    snprintf(msg, len,
             "checkpoint refused: this job has no checkpoint directory; start it with "
             "train.checkpoint_dir=DIR to write checkpoints");
    return false;
  }
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Command fwd = WEFT__COMMAND__INIT;
  fwd.kind = (Weft__Command__Kind)kind;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &fwd;
  wf__broadcast(svc, &env);
  svc->stop_requested |= stop;
  WF_INFO("control: console requested %s", stop ? "stop" : "a checkpoint");
  snprintf(msg, len, "%s",
           stop ? "stop requested: the job stops at the next step boundary"
                : "checkpoint requested: it is written at the next step boundary");
  return true;
}

static void on_command(wf__conn *c, const Weft__Command *cmd)
{
  char msg[256];
  bool stop = cmd->kind == WEFT__COMMAND__KIND__STOP;
  bool ok = wf__request(c->svc, cmd->kind, msg, sizeof msg);
  wf__reply(c, ok,
            !ok    ? NULL
            : stop ? "{\"requested\":\"stop\"}"
                   : "{\"requested\":\"checkpoint\"}",
            msg);
}

static void on_console_msg(wf__conn *c, const Weft__Envelope *env)
{
  char msg[256] = "";
  if (env->msg_case == WEFT__ENVELOPE__MSG_COMMAND) {
    on_command(c, env->command);
  } else if (env->msg_case == WEFT__ENVELOPE__MSG_QUERY &&
             env->query->kind == WEFT__QUERY__KIND__TRACE) {
    wf__trace_start(c->svc, c);
  } else if (env->msg_case == WEFT__ENVELOPE__MSG_QUERY) {
    char *json = wf__query_json(c->svc, env->query->kind, msg, sizeof msg);
    wf__reply(c, json != NULL, json, msg);
    free(json);
  } else {
    conn_reject(c, "unexpected message from a console");
  }
}

static void dispatch(wf__conn *c, const Weft__Envelope *env)
{
  if (c->role == WF__CONN_NEW) {
    if (env->msg_case == WEFT__ENVELOPE__MSG_HELLO)
      on_hello(c, env->hello);
    else
      conn_reject(c, "the first message must be Hello");
  } else if (c->role == WF__CONN_WORKER) {
    on_worker_msg(c, env);
  } else {
    on_console_msg(c, env);
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
  conn_reject(c, err);
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
    dispatch(c, env);
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

/* ---- start and stop ----------------------------------------------------------------- */

int wf__listen_tcp(wf_service *svc, uv_tcp_t *h, int port, int backlog)
{
  struct sockaddr_storage addr;
  int rc = strchr(svc->bind_addr, ':')
               ? uv_ip6_addr(svc->bind_addr, port, (struct sockaddr_in6 *)&addr)
               : uv_ip4_addr(svc->bind_addr, port, (struct sockaddr_in *)&addr);
  if (rc < 0)
    return rc;
  uv_tcp_init(&svc->loop, h);
  h->data = svc;
  rc = uv_tcp_bind(h, (const struct sockaddr *)&addr, 0);
  return rc == 0 ? uv_listen((uv_stream_t *)h, backlog, wf__service_on_connection) : rc;
}

/* A port the user chose (the default one yields: plane.c) is held by another process. */
static wf_status port_in_use(int port)
{
  WF_ERROR("control: port %d (MASTER_PORT) is already in use on this host, perhaps by another "
           "job; choose another with MASTER_PORT=%d or dist.master_port=%d",
           port, port + 1, port + 1);
  return WF_ECONFIG;
}

static wf_status check_ip(const char *bind_addr)
{
  unsigned char probe[16];
  if (uv_inet_pton(strchr(bind_addr, ':') ? AF_INET6 : AF_INET, bind_addr, probe) >= 0)
    return WF_OK;
  WF_ERROR("control: cannot listen on '%s' (runtime.listen_addr): not an IP address", bind_addr);
  return WF_ECONFIG;
}

static wf_status listen_tcp(wf_service *svc)
{
  struct sockaddr_storage addr;
  if (check_ip(svc->bind_addr) != WF_OK)
    return WF_ECONFIG;
  int rc = wf__listen_tcp(svc, &svc->tcp, svc->port, 128);
  if (rc == UV_EADDRINUSE)
    return port_in_use(svc->port);
  if (rc == UV_EACCES || rc == UV_EADDRNOTAVAIL) { /* a port or an address not to be had here */
    WF_ERROR("control: cannot listen on %s:%d: %s; choose another MASTER_PORT (1024 and up), "
             "or a MASTER_ADDR (runtime.listen_addr) of this host",
             svc->bind_addr, svc->port, uv_strerror(rc));
    return WF_ECONFIG;
  }
  if (rc < 0) {
    WF_ERROR("control: cannot listen on %s:%d: %s", svc->bind_addr, svc->port, uv_strerror(rc));
    return WF_EUV;
  }
  int len = sizeof addr;
  uv_tcp_getsockname(&svc->tcp, (struct sockaddr *)&addr, &len);
  svc->port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
  return WF_OK;
}

static wf_status listen_unix(wf_service *svc)
{
  uv_pipe_init(&svc->loop, &svc->pipe, 0);
  svc->pipe.data = svc;
  unlink(svc->unix_path);
  int rc = uv_pipe_bind(&svc->pipe, svc->unix_path);
  if (rc == 0) {
    chmod(svc->unix_path, 0600);
    rc = uv_listen((uv_stream_t *)&svc->pipe, 128, wf__service_on_connection);
  }
  if (rc < 0) {
    WF_WARN("control: no Unix socket at %s (%s); consoles use TCP", svc->unix_path,
            uv_strerror(rc));
    svc->unix_path[0] = '\0';
  }
  return WF_OK;
}

static void close_handle(uv_handle_t *h, void *arg)
{
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* Close whatever is still open and let the loop finish. Loop thread, or after it. */
static void loop_teardown(wf_service *svc)
{
  uv_walk(&svc->loop, close_handle, svc);
  uv_run(&svc->loop, UV_RUN_DEFAULT);
  uv_loop_close(&svc->loop);
}

static void on_stop(uv_async_t *a)
{
  wf_service *svc = a->data;
  svc->shutting_down = true;
  svc->t_progress = wf__now_ms(); /* the watchdog uses it as the stop time */
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Command cmd = WEFT__COMMAND__INIT;
  cmd.kind = WEFT__COMMAND__KIND__SHUTDOWN;
  env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
  env.command = &cmd;
  wf__broadcast(svc, &env);
  uv_close((uv_handle_t *)&svc->tcp, NULL);
  if (svc->unix_path[0])
    uv_close((uv_handle_t *)&svc->pipe, NULL);
  if (svc->have_http)
    uv_close((uv_handle_t *)&svc->http, NULL);
  uv_close((uv_handle_t *)&svc->stop_async, NULL);
  uv_close((uv_handle_t *)&svc->abort_timer, NULL);
  for (wf__conn *c = svc->conns, *next; c; c = next) {
    next = c->next;
    wf__conn_close_flushed(c);
  }
}

static void service_thread(void *arg)
{
  wf_service *svc = arg;
  wf__block_sigpipe();
  uv_run(&svc->loop, UV_RUN_DEFAULT);
}

static bool is_loopback(const struct sockaddr *sa)
{
  if (sa->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  return sa->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* Whether some rank runs on another host than rank 0 (when the facts are known). */
static bool spans_hosts(const wf_service_opts *o)
{
  for (int i = 1; o->facts && i < o->world_size; i++)
    if (strcmp(o->facts[i].host, o->facts[0].host) != 0)
      return true;
  return false;
}

/* The address workers reach rank 0 by (MASTER_ADDR) is the one to listen on: the
 * first address getaddrinfo() gives, as the workers' client takes the first too.
 * Listening on every interface is a choice (runtime.listen_addr=0.0.0.0), or the way
 * out when that address is a loopback one and ranks run on other hosts. */
static wf_status bind_address(const char *host, bool multi_host, char *out, size_t out_len)
{
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
  int rc = getaddrinfo(host, NULL, &hints, &res);
  if (rc != 0 || !res) {
    WF_ERROR("control: cannot resolve MASTER_ADDR '%s' to an address to listen on: %s; set "
             "MASTER_ADDR to this host's address, or runtime.listen_addr",
             host, gai_strerror(rc));
    return rc == EAI_AGAIN ? WF_ESYS : WF_ECONFIG; /* DNS down: a retry may do */
  }
  rc = getnameinfo(res->ai_addr, res->ai_addrlen, out, (socklen_t)out_len, NULL, 0, NI_NUMERICHOST);
  bool loopback = is_loopback(res->ai_addr);
  freeaddrinfo(res);
  if (rc != 0) {
    WF_ERROR("control: cannot print the address of MASTER_ADDR '%s': %s", host, gai_strerror(rc));
    return WF_EINVAL;
  }
  if (loopback && multi_host) {
    WF_WARN("control: MASTER_ADDR '%s' resolves to %s on rank 0, a loopback address (Debian's "
            "/etc/hosts maps the host name so), which the other hosts cannot reach: listening "
            "on every interface instead. Set MASTER_ADDR to this host's network address, or "
            "runtime.listen_addr",
            host, out);
    wf_strlcpy(out, "0.0.0.0", out_len);
  }
  return WF_OK;
}

static wf_status service_paths(wf_service *svc, const wf_service_opts *o)
{
  char host[256];
  if (o->job_dir && o->job_dir[0])
    wf_strlcpy(svc->job_dir, o->job_dir, sizeof svc->job_dir);
  else
    wf_job_dir_default(svc->job_dir, sizeof svc->job_dir);
  wf_status st = wf__job_dir_prepare(svc->job_dir);
  if (st != WF_OK)
    return st;
  snprintf(svc->job_file, sizeof svc->job_file, "%s/%s.json", svc->job_dir, svc->job_id);
  snprintf(svc->unix_path, sizeof svc->unix_path, "%s/%s.sock", svc->job_dir, svc->job_id);
  if (strlen(svc->unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    WF_WARN("control: job directory path too long for a Unix socket; consoles use TCP");
    svc->unix_path[0] = '\0';
  }
  wf_strlcpy(host, o->master_addr && o->master_addr[0] ? o->master_addr : wf_rt_host(),
             sizeof host);
  if (o->bind_addr && o->bind_addr[0])
    wf_strlcpy(svc->bind_addr, o->bind_addr, sizeof svc->bind_addr);
  else if ((st = bind_address(host, spans_hosts(o), svc->bind_addr, sizeof svc->bind_addr)) !=
           WF_OK)
    return st;
  snprintf(svc->endpoint, sizeof svc->endpoint, strchr(host, ':') ? "[%s]" : "%s", host);
  return WF_OK;
}

static wf_status service_config(wf_service *svc, const wf_service_opts *o)
{
  if (!o->job_id || !o->job_id[0] || o->world_size <= 0 || strlen(o->job_id) >= 100 ||
      strpbrk(o->job_id, "/ \t\n")) {
    WF_ERROR("control: the service needs a job id (no '/' or spaces) and a world size");
    return WF_EINVAL;
  }
  wf_strlcpy(svc->job_id, o->job_id, sizeof svc->job_id);
  svc->world = o->world_size;
  svc->mesh = o->mesh;
  if (wf_mesh_size(&svc->mesh) != svc->world) /* cp included: a cp 2 mesh is no dp mesh */
    svc->mesh = (wf_mesh){.dp = svc->world, .tp = 1, .pp = 1, .cp = 1};
  wf_strlcpy(svc->model, o->model_desc ? o->model_desc : "", sizeof svc->model);
  svc->total_steps = o->total_steps;
  svc->hang_timeout_ms = o->hang_timeout_s * 1000.0;
  svc->heartbeat_ms = o->heartbeat_ms > 0 ? o->heartbeat_ms : 1000;
  svc->dead_after_ms = o->dead_after_ms > 0 ? o->dead_after_ms : 2000;
  svc->register_timeout_ms = o->register_timeout_ms > 0 ? o->register_timeout_ms : 120000;
  svc->port = o->port;
  svc->reaper_fd = -1;
  svc->metrics_port = o->metrics_port;
  svc->can_checkpoint = o->checkpoint_dir && o->checkpoint_dir[0];
  svc->max_conns[WF__LSN_CONTROL] = svc->world + WF__CONTROL_SPARE;
  svc->max_conns[WF__LSN_HTTP] = WF__HTTP_MAX_CONNS;
  svc->start_wall = wf_wall_time();
  svc->step = -1;
  svc->loss = svc->tokens_per_s = svc->step_ms = NAN;
  svc->job = wf__step_report_none();
  svc->hist_every = 1;
  svc->ranks = calloc((size_t)svc->world, sizeof *svc->ranks);
  if (!svc->ranks)
    return WF_ENOMEM;
  for (int i = 0; i < svc->world; i++) {
    wf__rank *r = &svc->ranks[i];
    if (o->facts)
      r->facts = o->facts[i];
    else /* rank = tp + TP * (cp + CP * (dp + DP * pp)) */
      r->facts.coords = wf_mesh_coords(&svc->mesh, i);
    r->facts.rank = i;
    r->step = -1;
    r->loss = r->tokens_per_s = r->step_ms = r->rtt_ms = NAN;
    r->rep = (wf_step_report){.step = -1, .bubble = NAN};
  }
  return WF_OK;
}

static wf_status service_handles(wf_service *svc)
{
  wf_status st = listen_tcp(svc);
  if (st != WF_OK)
    return st;
  if (svc->unix_path[0])
    listen_unix(svc);
  bool metrics = svc->metrics_port > 0 && wf__metrics_start(svc) == WF_OK;
  if (svc->metrics_port > 0 && !metrics)
    WF_WARN("control: Prometheus metrics are off (runtime.metrics_port=%d)", svc->metrics_port);
  uv_timer_init(&svc->loop, &svc->watchdog);
  svc->watchdog.data = svc;
  uv_timer_start(&svc->watchdog, wf__watchdog_tick, WF__WATCHDOG_MS, WF__WATCHDOG_MS);
  uv_timer_init(&svc->loop, &svc->abort_timer);
  svc->abort_timer.data = svc;
  uv_async_init(&svc->loop, &svc->stop_async, on_stop);
  svc->stop_async.data = svc;
  size_t n = strlen(svc->endpoint);
  if (metrics) { /* the endpoint is the advertised host here, before its port is added */
    snprintf(svc->view_url, sizeof svc->view_url, "http://%s:%d/", svc->endpoint,
             svc->metrics_port);
    WF_INFO("control: Prometheus metrics at %smetrics; the live view at %s (`coordinator view` "
            "prints its address with the job's token)",
            svc->view_url, svc->view_url);
  }
  snprintf(svc->endpoint + n, sizeof svc->endpoint - n, ":%d", svc->port);
  return WF_OK;
}

wf_status wf_service_start(wf_service **out, const wf_service_opts *o)
{
  wf_status st = WF_OK;
  bool loop_ok = false;
  *out = NULL;
  wf_service *svc = calloc(1, sizeof *svc);
  WF_CHECK_ALLOC(svc);
  pthread_mutex_init(&svc->lock, NULL);
  WF_TRY(service_config(svc, o));
  WF_TRY(wf__random_token(svc->token));
  WF_TRY(service_paths(svc, o));
  if ((st = wf__job_file_claim(svc)) != WF_OK) { /* the name is another job's: leave its files */
    svc->job_file[0] = svc->unix_path[0] = '\0';
    goto fail;
  }
  WF_CHECK_UV(uv_loop_init(&svc->loop));
  loop_ok = true;
  svc->t_start = svc->t_progress = wf__now_ms();
  WF_TRY(service_handles(svc));
  WF_TRY(wf__job_file_write(svc));
  wf__job_reaper_start(svc);
  WF_CHECK_UV(uv_thread_create(&svc->thread, service_thread, svc));
  WF_INFO("control: coordinator for job %s listening on %s%s%s", svc->job_id, svc->endpoint,
          svc->unix_path[0] ? " and " : "", svc->unix_path);
  *out = svc;
  return WF_OK;
fail:
  if (svc) {
    if (svc->job_file[0])
      unlink(svc->job_file);
    if (svc->unix_path[0])
      unlink(svc->unix_path);
    if (loop_ok)
      loop_teardown(svc);
    pthread_mutex_destroy(&svc->lock);
    free(svc->ranks);
    free(svc);
  }
  return st;
}

void wf_service_destroy(wf_service *svc)
{
  if (!svc)
    return;
  uv_async_send(&svc->stop_async);
  uv_thread_join(&svc->thread);
  loop_teardown(svc);
  unlink(svc->job_file);
  if (svc->unix_path[0])
    unlink(svc->unix_path);
  if (svc->reaper_fd >= 0)
    close(svc->reaper_fd); /* the reaper finds nothing left, and exits */
  free(svc->schedule);
  free(svc->hist);
  pthread_mutex_destroy(&svc->lock);
  for (int i = 0; i < svc->world; i++)
    free(svc->ranks[i].trace);
  free(svc->ranks);
  free(svc);
}

const char *wf_service_endpoint(const wf_service *svc) { return svc->endpoint; }
const char *wf_service_unix_path(const wf_service *svc) { return svc->unix_path; }
const char *wf_service_job_file(const wf_service *svc) { return svc->job_file; }

bool wf_service_port_taken(int port)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  bool taken = bind(fd, (struct sockaddr *)&a, sizeof a) != 0;
  close(fd);
  return taken;
}

wf_status wf_service_check_listen(const char *master_addr, const char *bind_addr, int port)
{
  char addr[256];
  wf_status st = bind_addr && bind_addr[0] ? check_ip(bind_addr)
                                           : bind_address(master_addr, false, addr, sizeof addr);
  if (st != WF_OK)
    return st;
  return port > 0 && wf_service_port_taken(port) ? port_in_use(port) : WF_OK;
}

void wf_service_remove_files(const wf_service *svc)
{
  if (!svc)
    return;
  unlink(svc->job_file);
  if (svc->unix_path[0])
    unlink(svc->unix_path);
}
const char *wf_service_token(const wf_service *svc) { return svc->token; }
int wf_service_port(const wf_service *svc) { return svc->port; }

wf_status wf_service_set_schedule(wf_service *svc, const char *text)
{
  char *copy = text ? strdup(text) : NULL;
  if (!svc || (text && !copy)) {
    free(copy);
    return svc ? WF_ENOMEM : WF_EINVAL;
  }
  pthread_mutex_lock(&svc->lock);
  free(svc->schedule);
  svc->schedule = copy;
  pthread_mutex_unlock(&svc->lock);
  return WF_OK;
}

bool wf_service_aborted(wf_service *svc, char *reason, size_t reason_len)
{
  if (!svc)
    return false;
  pthread_mutex_lock(&svc->lock);
  bool aborted = svc->aborted;
  if (aborted && reason && reason_len)
    wf_strlcpy(reason, svc->abort_reason, reason_len);
  pthread_mutex_unlock(&svc->lock);
  return aborted;
}
