/*
 * service.c - the coordinator service: a libuv loop thread inside world rank 0.
 *
 * It listens on TCP (MASTER_ADDR:MASTER_PORT) and on a Unix socket in the job
 * directory, authenticates every connection (the token in Hello on TCP, the peer's
 * uid on the Unix socket), keeps the registry of ranks from Hello, heartbeats and
 * step reports, answers console queries and forwards console commands.
 *
 * Here: the listeners, the loop thread, and starting and stopping the service.
 * Connections (accept, caps, frames, close) are in conn.c, what the service does with
 * each message (the registry, step reports, console commands) in registry.c.
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
