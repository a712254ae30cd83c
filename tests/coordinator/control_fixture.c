/*
 * control_fixture.c - the control-plane tests' fixture (control_fixture.h): a service on a
 * free port of 127.0.0.1 with control clients as threads, and raw peers.
 */
#include "control_fixture.h"

fixture *g_fx;
const char *g_gpu_bus0;
int g_http_port;

void on_abort(void *user, const char *reason)
{
  int i = *(int *)user;
  g_fx->abort_at[i] = wf_now();
  wf_strlcpy(g_fx->abort_reason[i], reason, sizeof g_fx->abort_reason[i]);
  atomic_fetch_add(&g_fx->aborts, 1);
}

wf_rank_facts facts_for(int rank, const wf_mesh *m)
{
  wf_rank_facts f;
  memset(&f, 0, sizeof f);
  f.rank = rank;
  f.local_rank = rank;
  f.pid = 1000 + rank;
  snprintf(f.host, sizeof f.host, "host%d", rank / 2);
  snprintf(f.device, sizeof f.device, "cpu");
  snprintf(f.binding, sizeof f.binding, "core %d", rank);
  f.threads = 1;
  /* rank = tp + TP * (dp + DP * pp) (docs/architecture.md) */
  f.coords =
      (wf_coords){.pp = rank / (m->tp * m->dp), .dp = (rank / m->tp) % m->dp, .tp = rank % m->tp};
  return f;
}

fixture *fx_start(int world, int nctl, double hang_s)
{
  fixture *fx = calloc(1, sizeof *fx);
  g_fx = fx;
  snprintf(fx->dir, sizeof fx->dir, "/tmp/weft-test-XXXXXX");
  assert_non_null(mkdtemp(fx->dir));
  wf_mesh mesh = {.dp = world / 2, .tp = 2, .pp = 1};
  if (world == 8)
    mesh = (wf_mesh){.dp = 2, .tp = 2, .pp = 2};
  else if (world % 2)
    mesh = (wf_mesh){.dp = world, .tp = 1, .pp = 1};
  wf_rank_facts facts[MAXR];
  for (int i = 0; i < world; i++)
    facts[i] = facts_for(i, &mesh);
  char id[64];
  snprintf(id, sizeof id, "test-%d", (int)getpid());
  wf_service_opts so = {.job_id = id,
                        .world_size = world,
                        .mesh = mesh,
                        .facts = facts,
                        .master_addr = "127.0.0.1",
                        .bind_addr = "127.0.0.1",
                        .job_dir = fx->dir,
                        .checkpoint_dir = fx->dir, /* any: the service only checks it is set */
                        .model_desc = "gpt2-tiny (test)",
                        .total_steps = 100,
                        .hang_timeout_s = hang_s,
                        .metrics_port = g_http_port};
  assert_int_equal(wf_service_start(&fx->svc, &so), WF_OK);
  char err[256];
  assert_int_equal(wf_console_job_load(wf_service_job_file(fx->svc), &fx->job, err, sizeof err),
                   WF_OK);
  for (int i = 0; i < nctl; i++) {
    fx->idx[i] = i;
    wf_control_opts co = {.endpoint = wf_service_endpoint(fx->svc),
                          .token = wf_service_token(fx->svc),
                          .job_id = id,
                          .facts = facts[i],
                          .stage_desc = "layers 0-3",
                          .on_abort = on_abort,
                          .user = &fx->idx[i],
                          .connect_timeout_ms = 3000,
                          .gpu_bus = i == 0 ? g_gpu_bus0 : NULL};
    assert_int_equal(wf_control_start(&fx->ctl[i], &co), WF_OK);
  }
  fx->n = nctl;
  return fx;
}

void fx_stop(fixture *fx)
{
  for (int i = 0; i < fx->n; i++)
    wf_control_destroy(fx->ctl[i]);
  char file[700];
  wf_strlcpy(file, wf_service_job_file(fx->svc), sizeof file);
  wf_service_destroy(fx->svc);
  assert_int_equal(access(file, F_OK), -1); /* the job file is removed at exit */
  rmdir(fx->dir);
  free(fx);
  g_fx = NULL;
}

json_t *query(fixture *fx, wf_console_cmd cmd)
{
  char *js = NULL, err[512];
  wf_status st = wf_console_request(&fx->job, cmd, 3000, &js, err, sizeof err);
  if (st != WF_OK)
    fprintf(stderr, "query %s: %s\n", wf_console_cmd_name(cmd), err);
  assert_int_equal(st, WF_OK);
  json_error_t je;
  json_t *j = json_loads(js, 0, &je);
  assert_non_null(j);
  free(js);
  return j;
}

void wait_for(atomic_int *v, int want, double seconds)
{
  double end = wf_now() + seconds;
  while (atomic_load(v) < want && wf_now() < end)
    usleep(5000);
}

int free_port(void)
{
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof sa;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  bind(fd, (struct sockaddr *)&sa, sizeof sa);
  getsockname(fd, (struct sockaddr *)&sa, &len);
  close(fd);
  return ntohs(sa.sin_port);
}

/* ---- raw peers ------------------------------------------------------------------- */

int raw_connect(fixture *fx)
{
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)wf_service_port(fx->svc))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

void raw_send(int fd, Weft__Envelope *env)
{
  uint8_t *frame;
  size_t len;
  assert_int_equal(wf_proto_encode(env, &frame, &len), WF_OK);
  assert_int_equal(send(fd, frame, len, MSG_NOSIGNAL), (ssize_t)len);
  free(frame);
}

void raw_hello(int fd, const char *token, int rank)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Hello h = WEFT__HELLO__INIT;
  h.role = WEFT__HELLO__ROLE__WORKER;
  h.token = (char *)token;
  h.rank = rank;
  h.host = "rawhost";
  h.pid = 4321;
  h.device = "cpu";
  env.msg_case = WEFT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  raw_send(fd, &env);
}

Weft__Envelope *raw_recv(int fd, int ms)
{
  wf_proto_reader r;
  char err[256], buf[4096];
  Weft__Envelope *env = NULL;
  wf_proto_reader_init(&r, 0);
  struct pollfd p = {.fd = fd, .events = POLLIN};
  while (!env && poll(&p, 1, ms) > 0) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0 || wf_proto_reader_feed(&r, buf, (size_t)n, err, sizeof err) != WF_OK ||
        wf_proto_reader_next(&r, &env, err, sizeof err) != WF_OK)
      break;
  }
  wf_proto_reader_fini(&r);
  return env;
}

bool raw_closed_within(int fd, int ms)
{
  char buf[4096];
  double end = wf_now() + ms / 1000.0;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  while (wf_now() < end) {
    if (poll(&p, 1, 50) > 0) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0)
        return true;
    }
  }
  return false;
}
