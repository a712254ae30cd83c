/*
 * control_int.h - private to the control-plane files of coordinator/.
 *
 * The service's state lives on its loop thread only: every field below except the
 * ones marked "locked" is touched by that thread alone, so handlers need no locks.
 * Other threads reach the service through `lock` (abort reason) and `stop_async`.
 */
#ifndef WF_CONTROL_INT_H
#define WF_CONTROL_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <uv.h>

#include "wf_control.h"
#include <math.h>

#include "wf_nvml.h"
#include "wf_proto.h"

/* Deadlines are absolute per phase: bytes that trickle in do not extend them, so a
 * peer cannot hold a descriptor by sending one byte every few seconds. */
#define WF__HANDSHAKE_MS    2000       /* a new connection must say Hello within this */
#define WF__PARTIAL_MS      5000       /* a started frame must complete within this */
#define WF__CONSOLE_IDLE_MS 30000      /* a console with no complete message is closed */
#define WF__HTTP_MS         5000       /* an HTTP request must arrive within this */
#define WF__HTTP_MAX_HEAD   (8u << 10) /* an HTTP request's head: a browser's fits in 2 KiB */
/* Connection caps per listener. The control port must hold every worker plus a few
 * consoles; the metrics port needs one or two scrapers. At the cap the oldest
 * unauthenticated connection is evicted, or, when there is none, the newcomer. */
#define WF__CONTROL_SPARE        64 /* control (TCP + Unix) connections beyond the world size */
#define WF__HTTP_MAX_CONNS       16
#define WF__LOG_EVERY_MS         10000       /* at most one line per kind of rejection this often */
#define WF__MAX_QUEUED           (16u << 20) /* unsent bytes before a slow reader is dropped */
#define WF__CONSOLE_MAX_IN       (64u << 10) /* largest frame accepted from any peer */
#define WF__WATCHDOG_MS          100
#define WF__RANK0_ABORT_DELAY_MS 100  /* see wf__abort_job() */
#define WF__STALL_AFTERMATH_MS   1000 /* see wf__stalled_ms() */

/* ---- shared helpers (util.c) ------------------------------------------------------ */

/* A log line that a flood could repeat: printed at most once per WF__LOG_EVERY_MS,
 * with the count of the ones left out since. */
typedef struct wf__ratelimit {
  double t_last; /* ms; 0 = never printed */
  long suppressed;
} wf__ratelimit;

/* Constant-time comparison of two NUL-terminated strings (time depends on lengths). */
bool wf__ct_streq(const char *a, const char *b);
/* 32 bytes from /dev/urandom as 64 hex characters. */
wf_status wf__random_token(char out[WF_TOKEN_HEX + 1]);
/* Copy `src` keeping printable ASCII only (anything else becomes '?'), so strings
 * from the wire are safe for logs, terminals and JSON. */
void wf__sanitize(char *dst, size_t dst_len, const char *src);
/* Split "host:port" (or "[v6]:port"). */
wf_status wf__split_endpoint(const char *ep, char *host, size_t host_len, int *port);
/* Encode and queue one envelope on a stream; the buffer is freed when written. */
int wf__send(uv_stream_t *s, Weft__Envelope *env);
/* Called first on each loop thread: a write into a connection whose peer has gone fails
 * with EPIPE there instead of ending the process with SIGPIPE (util.c says how). */
void wf__block_sigpipe(void);
double wf__now_ms(void);
/* True when a rate-limited line may be printed now; *suppressed gets (and clears) the
 * count of lines left out since the last one. */
bool wf__ratelimit_ok(wf__ratelimit *rl, double now, long *suppressed);

/* ---- the control client (control.c, control_abort.c, control_post.c) ---------------- */

#define WF__REPORTS_QUEUED 64 /* step reports the control thread may fall behind by */

/* A coordinator that stopped talking leaves the connection open: only its silence tells,
 * judged this often (wf__control_check_coordinator). */
#define WF__SILENCE_TICK_MS 100

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
   * view draws one point per step) unless the control thread falls WF__REPORTS_QUEUED steps
   * behind, when the oldest give way. */
  wf_step_report reports[WF__REPORTS_QUEUED];
  int report_head, n_reports;
  int err_code;
  char err_msg[512];

  atomic_bool stop_req, ckpt_req, aborted;
  bool spoke;             /* this rank said why the job was aborted (do_abort) */
  double abort_silent_ms; /* > 0: aborted because peers went silent (unreachable); set
                           * before on_abort runs, on the control thread */
  wf_nvml *nvml;          /* the rank's GPU, when NVML is there; sampled on the control thread */
};

/* control.c: registration ends, 1 (welcomed) or a wf_status, with the error when it
 * failed; wakes wf_control_start. */
void wf__control_start_done(wf_control *c, int result, const char *err);
/* control.c: close every handle of the loop, once. */
void wf__control_close_all(wf_control *c);
/* control.c: the rank's heartbeat: step, phase, collective, memory, CPU, GPU. */
void wf__control_send_heartbeat(wf_control *c);
/* control_abort.c: the coordinator's Abort. */
void wf__control_on_abort_msg(wf_control *c, const Weft__Abort *a);
/* control_abort.c: the silence timer: a coordinator silent past silence_ms is lost. */
void wf__control_check_coordinator(uv_timer_t *t);
/* control_abort.c: the connection dropped (or sent garbage): before Welcome, registration
 * fails; after, unless the job is closing, the coordinator is lost. */
void wf__control_connection_lost(wf_control *c, const char *why);
/* control_post.c: the control thread's wake-up: send what the training loop posted. */
void wf__control_on_async(uv_async_t *a);

/* ---- service ------------------------------------------------------------------------ */

typedef enum conn_role {
  WF__CONN_NEW = 0,
  WF__CONN_WORKER,
  WF__CONN_CONSOLE,
  WF__CONN_HTTP
} conn_role;

typedef enum conn_listener { WF__LSN_CONTROL = 0, WF__LSN_HTTP, WF__LSN_COUNT } conn_listener;

typedef struct wf__conn {
  union {
    uv_handle_t h;
    uv_stream_t s;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  } u;
  struct wf_service *svc;
  bool is_unix, closing;
  conn_role role;
  int rank; /* WF__CONN_WORKER */
  wf_proto_reader rd;
  conn_listener listener;
  double t_open, t_last; /* ms, monotonic: opened, last bytes (read, or our close) */
  double t_msg;          /* ms: last complete message (a console's idle deadline) */
  double t_frame;        /* ms: when the frame now partial began */
  struct wf__http *http; /* WF__CONN_HTTP: the request's parser (http.c) */
  struct wf__conn *next, *prev;
} wf__conn;

typedef enum rank_state {
  WF__RANK_WAITING = 0, /* no Hello yet */
  WF__RANK_ALIVE,
  WF__RANK_DEAD,
  WF__RANK_EXITED, /* said Bye */
} rank_state;

typedef struct wf__rank {
  wf_rank_facts facts;
  char stage[64];
  rank_state state;
  wf__conn *conn;
  double t_hello, t_heartbeat, t_change; /* ms */
  int64_t step;
  char phase[32];
  uint64_t coll_seq;
  char coll_op[64];
  bool coll_active;
  uint64_t mem_bytes;
  double loss, tokens_per_s, step_ms;
  int64_t reports;
  wf_step_report rep; /* its last step report, whole */
  uint64_t rss_bytes; /* from heartbeats */
  bool gpu;           /* heartbeats carry NVML figures of the rank's GPU: */
  int gpu_util_pct;
  uint64_t gpu_mem_used, gpu_mem_total;
  double cpu_s, cpu_pct; /* CPU seconds so far; % of one core over the last interval */
  double t_cpu;          /* ms: when cpu_s was taken */
  double rtt_ms;         /* control-plane round trip from the heartbeats; NAN = none yet */
  char error[256];       /* last Error message from this rank */
  char *trace;           /* lines of the TraceReport for the pending `trace`, malloc()ed */
  bool traced;           /* answered the pending `trace` */
} wf__rank;

#define WF__TRACE_WAIT_MS 1000 /* how long a `trace` waits for the ranks' answers */

/* One step of the job, for the live view's curves (view.c). NAN where not known. */
typedef struct wf__point {
  int64_t step;
  double wall; /* s since the epoch: when the coordinator heard of it */
  double loss, val_loss, tokens_per_s, step_ms;
} wf__point;
#define WF__HISTORY_MAX (1u << 18) /* points kept; past it every other one is dropped */

/* One `trace` at a time: sent to every live worker, answered when all replied or
 * the wait is over. `conn` is NULL once the asking console went away. */
typedef struct wf__trace {
  bool active;
  uint64_t id;
  struct wf__conn *conn;
  double deadline;
  int waiting;
} wf__trace;

struct wf_service {
  /* configuration (copied) */
  char job_id[128];
  int world;
  wf_mesh mesh;
  char model[256];
  int64_t total_steps;
  double hang_timeout_ms;
  int heartbeat_ms, dead_after_ms, register_timeout_ms;
  char job_dir[512], job_file[700], unix_path[700], endpoint[300], bind_addr[64];
  char token[WF_TOKEN_HEX + 1];
  int port, metrics_port;
  bool can_checkpoint; /* train.checkpoint_dir is set */
  double start_wall;
  int reaper_fd; /* the write end of the reaper's pipe (jobfile.c); -1 = none */

  /* loop thread */
  uv_loop_t loop;
  uv_tcp_t tcp;
  uv_pipe_t pipe;
  uv_tcp_t http;
  bool have_http;
  uv_timer_t watchdog;
  uv_async_t stop_async;
  uv_thread_t thread;
  wf__conn *conns;
  int n_conns[WF__LSN_COUNT], max_conns[WF__LSN_COUNT];
  long evicted[WF__LSN_COUNT]; /* connections refused or evicted at the cap */
  wf__ratelimit rl_cap[WF__LSN_COUNT], rl_auth, rl_hello, rl_frame;
  wf__ratelimit rl_http;
  wf__rank *ranks;
  double t_start, t_progress;   /* ms */
  double t_tick, t_ping;        /* ms: last watchdog tick, last heartbeat sent to workers */
  double t_stall_end, stall_ms; /* ms: when this thread was last found held up, and how long */
  int registered;
  bool shutting_down;
  /* latest job-level numbers, from step reports */
  int64_t step;
  double loss, tokens_per_s, step_ms;
  wf_step_report job; /* each field the newest any rank reported (NAN until then) */
  wf__trace trace;
  wf__point *hist; /* the job's steps, oldest first (view.c) */
  size_t n_hist, cap_hist;
  int64_t hist_every;  /* a point every this many steps (1, doubled at each thinning) */
  bool stop_requested; /* a console or the page asked the job to stop */
  char view_url[320];  /* http://HOST:PORT/ of the live view; "" = no HTTP listener */

  pthread_mutex_t lock; /* locked: */
  bool aborted;
  char *schedule;          /* wf_service_set_schedule() */
  char abort_reason[2048]; /* written once, by the loop thread */
  int abort_rank;          /* loop thread only */
  double abort_silent_ms;  /* loop thread: > 0 when the lost ranks went silent (unreachable) */
  uv_timer_t abort_timer;
};

/* service.c */
/* Bind and listen on bind_addr:port; a libuv error code. */
int wf__listen_tcp(wf_service *svc, uv_tcp_t *h, int port, int backlog);
/* conn.c */
void wf__service_on_connection(uv_stream_t *server, int status);
void wf__conn_close(wf__conn *c);
void wf__conn_close_flushed(wf__conn *c);
void wf__broadcast(wf_service *svc, Weft__Envelope *env);
void wf__conn_send(wf__conn *c, Weft__Envelope *env);
/* Tell the peer what was wrong (an Error), then close. */
void wf__conn_reject(wf__conn *c, const char *msg);
/* registry.c: one complete message from connection c, by its role. */
void wf__dispatch(wf__conn *c, const Weft__Envelope *env);
/* watchdog.c */
void wf__watchdog_tick(uv_timer_t *t);
void wf__rank_lost(wf_service *svc, int rank, const char *why);
/* How long this thread was just held up (rank 0 stopped or starved): > 0 while the
 * watchdog has not run for 5 ticks, and for WF__STALL_AFTERMATH_MS after it found that.
 * Ranks that leave then left because of it: wf__rank_left_stalled() says so. */
double wf__stalled_ms(const wf_service *svc, double now);
void wf__rank_left_stalled(wf_service *svc, int rank, double stalled_ms);
void wf__abort_job(wf_service *svc, int rank, const char *reason);
/* query.c: the JSON answer to a console query; NULL with `msg` when unavailable. */
char *wf__query_json(wf_service *svc, int kind, char *msg, size_t msg_len);
/* trace.c: the console's `trace`, gathered from every rank */
void wf__trace_start(wf_service *svc, wf__conn *console);
void wf__trace_report(wf__conn *c, const Weft__TraceReport *tr);
void wf__trace_tick(wf_service *svc, double now);
/* registry.c */
void wf__reply(wf__conn *c, bool ok, const char *json, const char *msg);
/* jobfile.c */
wf_status wf__job_dir_prepare(const char *dir);
wf_status wf__job_file_write(wf_service *svc);
/* Before the job file is written: a job file of the same name (runtime.job_name) whose
 * job still runs on this host is refused (WF_ECONFIG, logged); one whose process is gone
 * is removed, with its socket. */
wf_status wf__job_file_claim(wf_service *svc);
/* After: start the process that removes the job file and the socket once this one ends,
 * however it ends (svc->reaper_fd holds its pipe; -1 when it could not start). */
void wf__job_reaper_start(wf_service *svc);
/* metrics.c */
wf_status wf__metrics_start(wf_service *svc);
void wf__metrics_serve(wf__conn *c);
/* http.c: the HTTP listener's requests, parsed as they arrive, and its answers (each
 * closes the connection once written; `headers` is "" or lines ending in \r\n). */
typedef struct wf__http wf__http;
wf__http *wf__http_new(void);
void wf__http_free(wf__http *h);
void wf__http_read(wf__conn *c, const char *data, size_t len);
void wf__http_respond(wf__conn *c, const char *status, const char *type, const char *headers,
                      const void *body, size_t len);
void wf__http_text(wf__conn *c, const char *status, const char *text);
/* view.c: the live view's pages and API (path without the query), after the token was
 * checked; the step history its curves draw. */
void wf__view_serve(wf__conn *c, bool post, const char *path, const char *query);
void wf__history_add(wf_service *svc, const wf_step_report *r);
/* query.c: the JSON documents of `status`, `ranks` and `mesh` (NULL when out of memory). */
json_t *wf__json_status(wf_service *svc, double now);
json_t *wf__json_ranks(wf_service *svc, double now);
json_t *wf__json_mesh(wf_service *svc);
json_t *wf__json_schedule(wf_service *svc);
/* registry.c: a console's (or the page's) STOP or CHECKPOINT, sent to every worker; false
 * with the reason in msg when refused (checkpoint without a checkpoint directory). */
bool wf__request(wf_service *svc, int kind, char *msg, size_t len);
/* watchdog.c: the rank missed a heartbeat and a half (WF__LATE_BEATS), the mark by which
 * the watchdog takes a lost host's other ranks with it; it is declared dead after
 * runtime.heartbeat_timeout. */
#define WF__LATE_BEATS 1.5
bool wf__rank_late(const wf_service *svc, const wf__rank *r, double now);

/* A step report before any step: no step, every figure unknown (NaN), counts zero. */
static inline wf_step_report wf__step_report_none(void)
{
  return (wf_step_report){.step = -1,
                          .loss = NAN,
                          .tokens_per_s = NAN,
                          .step_ms = NAN,
                          .tokens = NAN,
                          .lr = NAN,
                          .grad_norm = NAN,
                          .val_loss = NAN,
                          .loss_scale = NAN,
                          .mfu = NAN,
                          .bubble = NAN};
}

#endif /* WF_CONTROL_INT_H */
