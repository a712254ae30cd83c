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
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <xxhash.h>

#include "control_int.h"

#define REPORTS_QUEUED 64 /* step reports the control thread may fall behind by */

struct wf_control {
  char endpoint[600], token[WF_TOKEN_HEX + 1], job_id[128], stage[64];
  char coord_host[64]; /* rank 0's host and pid, from Welcome */
  int coord_pid;
  wf_rank_facts facts;
  wf_control_abort_fn on_abort;
  void *user;
  bool is_unix;
  struct sockaddr_storage addr;
  char addr_str[80]; /* addr as numbers, "10.0.0.1 port 29500", for errors */
  double deadline;   /* ms: give up connecting */
  int connect_timeout_ms;
  int last_err; /* the last failed connect's libuv error; 0 = none yet */

  uv_loop_t loop;
  uv_thread_t thread;
  union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } sock;
  bool sock_open;
  uv_connect_t connect_req;
  uv_timer_t timer, close_timer, deadline_timer, silence_timer;
  uv_async_t async;
  wf_proto_reader rd;
  int heartbeat_ms, silence_ms;
  double t_rx, t_timer;   /* ms: last message from the coordinator, last timer run */
  double echo_ms, t_echo; /* the coordinator's last heartbeat stamp, and when it came */
  bool welcomed, shutdown_seen, closed;

  pthread_mutex_t lock; /* locked: */
  pthread_cond_t cond;
  int start; /* 0 pending, 1 registered, < 0 failed */
  char start_err[1024];
  int64_t step;
  char phase[32], coll_op[64];
  uint64_t coll_seq, mem_bytes;
  bool coll_active;
  wf_control_collective_fn coll_fn;
  void *coll_user;
  wf_control_trace_fn trace_fn;
  void *trace_user;
  bool error_pending, error_sent, closing;
  /* Step reports not yet sent, oldest first: every step reaches the coordinator (the live
   * view draws one point per step) unless the control thread falls REPORTS_QUEUED steps
   * behind, when the oldest give way. */
  wf_step_report reports[REPORTS_QUEUED];
  int report_head, n_reports;
  int err_code;
  char err_msg[512];

  atomic_bool stop_req, ckpt_req, aborted;
  bool spoke;             /* this rank said why the job was aborted (do_abort) */
  double abort_silent_ms; /* > 0: aborted because peers went silent (unreachable); set
                           * before on_abort runs, on the control thread */
  wf_nvml *nvml;          /* the rank's GPU, when NVML is there; sampled on the control thread */
};

static void start_done(wf_control *c, int result, const char *err)
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

static void close_all(wf_control *c)
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

/* The job ends; `said`: the coordinator said why, once for the job. This rank says it
 * when nobody else does, and is then the one that speaks for the job (spoke); it then
 * waits hold_ms before the job's end goes on (lost_abort says why). */
static void do_abort(wf_control *c, const char *reason, bool said, int hold_ms)
{
  if (atomic_exchange(&c->aborted, true))
    return;
  c->spoke = !said || c->facts.rank == 0;
  if (!said)
    WF_ERROR("job aborted: %s", reason);
  if (hold_ms > 0)
    uv_sleep((unsigned)hold_ms);
  else if (c->facts.rank != 0)
    WF_DEBUG("job aborted: %s", reason);
  if (c->on_abort)
    c->on_abort(c->user, reason);
}

/* Whether this rank says that the coordinator is lost (every rank sees it alike): the
 * first rank of each host to find it so (another host may have lost rank 0's host as a
 * whole). The others say it at debug level. The first rather than a fixed one: the
 * first to leave makes the launcher kill the rest, and a fixed speaker, judging a tick
 * later, would be killed before it spoke. The claim is a name in the host's abstract
 * socket namespace (its network namespace), which only one process can bind and the
 * kernel frees when the process ends: nothing is left behind. Its descriptor is kept
 * open on purpose, until the process ends, which this rank is about to do. */
static bool speaks_for_lost(const wf_control *c)
{
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  XXH64_hash_t h = XXH64(c->endpoint, strlen(c->endpoint), XXH64(c->job_id, strlen(c->job_id), 0));
  int n =
      snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, "weft-lost-%016llx", (unsigned long long)h);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) /* cannot claim: speaking twice beats nobody speaking */
    return true;
  if (bind(fd, (struct sockaddr *)&sa,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) == 0)
    return true;
  int err = errno;
  close(fd);
  return err != EADDRINUSE;
}

/* How long the rank that claimed the loss holds the claim before its end goes on, when
 * other ranks share its host. The claim ends with the process, and the host's other
 * ranks judge the loss on their own SILENCE_TICK_MS timers, a tick or a few later under
 * load: one that judged after the claimant had left would find the name free and say it
 * again. Not a delay of the job's end: the others leave at once, and the launcher then
 * ends this rank too. A rank alone on its host has nobody to hold the claim against. */
#define LOST_HOLD_MS 500

/* The coordinator is lost: the job ends, said once per host. */
static void lost_abort(wf_control *c, const char *reason)
{
  bool speak = speaks_for_lost(c);
  int hold = speak && c->facts.local_size > 1 ? LOST_HOLD_MS : 0;
  do_abort(c, reason, !speak, hold);
}

static void on_abort_msg(wf_control *c, const Weft__Abort *a)
{
  char reason[2300], clean[2048];
  if (!atomic_load(&c->aborted) && a->unreachable)
    c->abort_silent_ms = a->silent_ms > 0 ? a->silent_ms : 1;
  wf__sanitize(clean, sizeof clean, a->reason);
  snprintf(reason, sizeof reason, "the coordinator aborted the job: %s", clean);
  do_abort(c, reason, true, 0);
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

static void send_heartbeat(wf_control *c)
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

/* A coordinator that stopped talking (rank 0 frozen, its host gone without a reset)
 * leaves the connection open: only its silence tells. Judged every SILENCE_TICK_MS, so
 * that a rank cut off from rank 0 leaves silence_ms after it last heard from it, not
 * up to a heartbeat later. */
#define SILENCE_TICK_MS 100
static void check_coordinator(uv_timer_t *t)
{
  wf_control *c = t->data;
  double now = wf__now_ms();
  bool stalled = c->t_timer > 0 && now - c->t_timer > 5.0 * SILENCE_TICK_MS;
  c->t_timer = now;
  if (stalled) { /* our own thread was held up: judge after reading what arrived */
    c->t_rx = WF_MAX(c->t_rx, now - c->heartbeat_ms);
    return;
  }
  if (c->shutdown_seen || atomic_load(&c->aborted) || now - c->t_rx <= c->silence_ms)
    return;
  char reason[1024], where[200] = "";
  bool here = strcmp(c->coord_host, c->facts.host) == 0;
  if (!here) /* on another host it may also be out of reach */
    snprintf(where, sizeof where,
             ", or its host is down or cut off from this one (%s): a partition", c->facts.host);
  snprintf(reason, sizeof reason,
           "the coordinator at %s has been silent for %.1f s: rank 0 (host %s, pid %d) is "
           "frozen (SIGSTOP?)%s; so this rank stops",
           c->endpoint, (now - c->t_rx) / 1000.0, c->coord_host[0] ? c->coord_host : "?",
           c->coord_pid, where);
  /* only a silence across hosts may be a partition for the launcher to see too */
  c->abort_silent_ms = here ? 0 : now - c->t_rx;
  lost_abort(c, reason);
}

static void on_heartbeat_timer(uv_timer_t *t) { send_heartbeat(t->data); }

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
    send_heartbeat(c);
    uv_timer_start(&c->timer, on_heartbeat_timer, (uint64_t)c->heartbeat_ms,
                   (uint64_t)c->heartbeat_ms);
    uv_timer_start(&c->silence_timer, check_coordinator, SILENCE_TICK_MS, SILENCE_TICK_MS);
    start_done(c, 1, NULL);
    break;
  case WEFT__ENVELOPE__MSG_ERROR:
    wf__sanitize(msg, sizeof msg, env->error->message);
    if (!c->welcomed)
      start_done(c, WF_EPROTO, msg);
    else
      WF_WARN("control: the coordinator says: %s", msg);
    break;
  case WEFT__ENVELOPE__MSG_ABORT: on_abort_msg(c, env->abort); break;
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

static void connection_lost(wf_control *c, const char *why)
{
  char reason[1024];
  if (!c->welcomed) {
    start_done(c, WF_EPROTO, why);
    return;
  }
  pthread_mutex_lock(&c->lock);
  bool closing = c->closing;
  pthread_mutex_unlock(&c->lock);
  if (closing || c->shutdown_seen || atomic_load(&c->aborted))
    return;
  pthread_mutex_lock(&c->lock);
  int64_t step = c->step;
  pthread_mutex_unlock(&c->lock);
  snprintf(reason, sizeof reason,
           "lost the connection to the coordinator at %s (%s): rank 0 (host %s, pid %d), which "
           "runs it, died or was killed after step %" PRId64
           " (this rank's last), so this rank stops too",
           c->endpoint, why, c->coord_host[0] ? c->coord_host : "?", c->coord_pid, step);
  lost_abort(c, reason);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  wf_control *c = s->data;
  char err[256];
  if (n < 0) {
    uv_read_stop(s);
    connection_lost(c, n == UV_EOF ? "connection closed" : uv_strerror((int)n));
    return;
  }
  if (wf_proto_reader_feed(&c->rd, buf->base, (size_t)n, err, sizeof err) != WF_OK) {
    uv_read_stop(s);
    connection_lost(c, err);
    return;
  }
  for (;;) {
    Weft__Envelope *env = NULL;
    if (wf_proto_reader_next(&c->rd, &env, err, sizeof err) != WF_OK) {
      uv_read_stop(s);
      connection_lost(c, err);
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
  start_done(c, st, msg);
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

/* ---- posted work (async) ------------------------------------------------------------ */

typedef struct sent_req {
  uv_write_t req;
  uint8_t *frame;
  wf_control *c;
  bool is_error, is_bye;
} sent_req;

static void on_posted_sent(uv_write_t *req, int status)
{
  sent_req *r = (sent_req *)req;
  wf_control *c = r->c;
  if (r->is_error) {
    pthread_mutex_lock(&c->lock);
    c->error_sent = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
  }
  if (r->is_bye)
    close_all(c);
  free(r->frame);
  free(r);
}

/* Send with a completion callback; false when it could not be queued. */
static bool send_tracked(wf_control *c, Weft__Envelope *env, bool is_error, bool is_bye)
{
  size_t len;
  sent_req *r = calloc(1, sizeof *r);
  if (!r || !c->welcomed || uv_is_closing(&c->sock.h) ||
      wf_proto_encode(env, &r->frame, &len) != WF_OK)
    goto fail;
  r->c = c;
  r->is_error = is_error;
  r->is_bye = is_bye;
  uv_buf_t buf = uv_buf_init((char *)r->frame, (unsigned)len);
  if (uv_write(&r->req, &c->sock.s, &buf, 1, on_posted_sent) == 0)
    return true;
fail:
  if (r)
    free(r->frame);
  free(r);
  return false;
}

static void on_close_timer(uv_timer_t *t) { close_all(t->data); }

/* The message of a report; its figures point into f and fp (WF_STEP_FIGURES each). */
static void report_to_proto(const wf_step_report *r, Weft__StepReport *sr, Weft__Figure *f,
                            Weft__Figure **fp)
{
  *sr = (Weft__StepReport)WEFT__STEP_REPORT__INIT;
  sr->step = r->step;
  sr->loss = r->loss;
  sr->tokens_per_s = r->tokens_per_s;
  sr->step_ms = r->step_ms;
  sr->mem_bytes = r->mem_bytes;
  sr->steps = r->steps;
  sr->tokens = r->tokens;
  sr->world_size = r->world_size;
  sr->lr = r->lr;
  sr->grad_norm = r->grad_norm;
  sr->val_loss = r->val_loss;
  sr->loss_scale = r->loss_scale;
  sr->mfu = r->mfu;
  sr->compute_s = r->compute_s;
  sr->p2p_wait_s = r->p2p_wait_s;
  sr->tp_s = r->tp_s;
  sr->dp_s = r->dp_s;
  sr->bubble = r->bubble;
  sr->act_bytes = r->act_bytes;
  sr->optim_bytes = r->optim_bytes;
  sr->param_bytes = r->param_bytes;
  sr->grad_bytes = r->grad_bytes;
  sr->skipped_steps = r->skipped_steps;
  sr->ckpt_wall = r->ckpt_wall;
  sr->checkpoints = r->checkpoints;
  int n = WF_MIN(r->n_figures, WF_STEP_FIGURES);
  for (int i = 0; i < n; i++) {
    f[i] = (Weft__Figure)WEFT__FIGURE__INIT;
    f[i].name = (char *)r->figures[i].name, f[i].value = r->figures[i].value;
    fp[i] = &f[i];
  }
  sr->n_figures = (size_t)n, sr->figures = n ? fp : NULL;
}

/* Send the queued step reports, oldest first. */
static void send_reports(wf_control *c, const wf_step_report *q, int n)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Figure f[WF_STEP_FIGURES], *fp[WF_STEP_FIGURES];
  bool sent = true;
  for (int i = 0; i < n && sent; i++) {
    Weft__StepReport sr;
    report_to_proto(&q[i], &sr, f, fp);
    env.msg_case = WEFT__ENVELOPE__MSG_STEP_REPORT;
    env.step_report = &sr;
    sent = send_tracked(c, &env, false, false);
  }
  if (n > 0 && sent)
    send_heartbeat(c); /* so the registry's phase and collective are as fresh as the step */
}

static void on_async(uv_async_t *a)
{
  wf_control *c = a->data;
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  static _Thread_local wf_step_report q[REPORTS_QUEUED]; /* 72 KiB: not on the loop's stack */
  Weft__Error err = WEFT__ERROR__INIT;
  char msg[512];
  pthread_mutex_lock(&c->lock);
  bool error = c->error_pending, closing = c->closing;
  int n = c->n_reports;
  for (int i = 0; i < n; i++)
    q[i] = c->reports[(c->report_head + i) % REPORTS_QUEUED];
  c->n_reports = 0;
  err.code = c->err_code;
  wf_strlcpy(msg, c->err_msg, sizeof msg);
  c->error_pending = false;
  pthread_mutex_unlock(&c->lock);
  if (c->closed)
    return;
  send_reports(c, q, n);
  if (error) {
    err.message = msg;
    env.msg_case = WEFT__ENVELOPE__MSG_ERROR;
    env.error = &err;
    if (!send_tracked(c, &env, true, false)) {
      pthread_mutex_lock(&c->lock);
      c->error_sent = true; /* nothing will be sent: do not make the caller wait */
      pthread_cond_broadcast(&c->cond);
      pthread_mutex_unlock(&c->lock);
    }
  }
  if (closing) {
    Weft__Bye bye = WEFT__BYE__INIT;
    env.msg_case = WEFT__ENVELOPE__MSG_BYE;
    env.bye = &bye;
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->silence_timer);
    if (!send_tracked(c, &env, false, true))
      close_all(c);
    else
      uv_timer_start(&c->close_timer, on_close_timer, 1000, 0);
  }
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
  uv_async_init(&c->loop, &c->async, on_async);
  c->timer.data = c->close_timer.data = c->deadline_timer.data = c->silence_timer.data =
      c->async.data = c;
  if (uv_thread_create(&c->thread, control_thread, c) < 0) {
    close_all(c);
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

void wf_control_report_step(wf_control *c, int64_t step, double loss, double tokens_per_s,
                            double step_ms, uint64_t mem_bytes)
{
  wf_step_report r = wf__step_report_none();
  r.step = step, r.loss = loss, r.tokens_per_s = tokens_per_s, r.step_ms = step_ms;
  r.mem_bytes = mem_bytes;
  wf_control_report(c, &r);
}

void wf_control_report(wf_control *c, const wf_step_report *r)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  if (c->n_reports == REPORTS_QUEUED) { /* the control thread is far behind: drop the oldest */
    c->report_head = (c->report_head + 1) % REPORTS_QUEUED;
    c->n_reports--;
  }
  c->reports[(c->report_head + c->n_reports++) % REPORTS_QUEUED] = *r;
  c->step = r->step;
  c->mem_bytes = r->mem_bytes;
  pthread_mutex_unlock(&c->lock);
  uv_async_send(&c->async);
}

void wf_control_set_phase(wf_control *c, const char *phase)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  wf_strlcpy(c->phase, phase ? phase : "", sizeof c->phase);
  pthread_mutex_unlock(&c->lock);
}

void wf_control_set_collective(wf_control *c, uint64_t seq, const char *op, bool active)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  c->coll_seq = seq;
  wf_strlcpy(c->coll_op, op ? op : "", sizeof c->coll_op);
  c->coll_active = active;
  pthread_mutex_unlock(&c->lock);
}

void wf_control_set_collective_fn(wf_control *c, wf_control_collective_fn fn, void *user)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  c->coll_fn = fn;
  c->coll_user = user;
  pthread_mutex_unlock(&c->lock);
}

void wf_control_set_trace_fn(wf_control *c, wf_control_trace_fn fn, void *user)
{
  if (!c)
    return;
  pthread_mutex_lock(&c->lock);
  c->trace_fn = fn;
  c->trace_user = user;
  pthread_mutex_unlock(&c->lock);
}

void wf_control_report_error(wf_control *c, wf_status code, const char *message, int wait_ms)
{
  if (!c)
    return;
  struct timespec ts;
  pthread_mutex_lock(&c->lock);
  c->err_code = (int)code;
  wf_strlcpy(c->err_msg, message ? message : wf_status_str(code), sizeof c->err_msg);
  c->error_pending = true;
  c->error_sent = false;
  pthread_mutex_unlock(&c->lock);
  uv_async_send(&c->async);
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += wait_ms / 1000;
  ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&c->lock);
  while (!c->error_sent && wait_ms > 0)
    if (pthread_cond_timedwait(&c->cond, &c->lock, &ts) != 0)
      break;
  pthread_mutex_unlock(&c->lock);
}

bool wf_control_stop_requested(wf_control *c) { return c && atomic_load(&c->stop_req); }
bool wf_control_checkpoint_requested(wf_control *c)
{
  return c && atomic_exchange(&c->ckpt_req, false);
}
bool wf_control_aborted(wf_control *c) { return c && atomic_load(&c->aborted); }

double wf_control_abort_silent_ms(const wf_control *c) { return c ? c->abort_silent_ms : 0; }

bool wf_control_abort_spoke(const wf_control *c) { return c && c->spoke; }
