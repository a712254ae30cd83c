/*
 * client.c - the console side: one blocking request per connection.
 *
 * A request connects (the Unix socket when the job has one, else TCP), sends Hello
 * with the token and one Query or Command, and reads frames until the Reply, all
 * under one deadline. A connection per request keeps the console stateless, so
 * `attach` survives a coordinator that dropped an idle connection.
 */
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "control_int.h"

static const char *cmd_names[WF_CONSOLE_NUM_CMDS] = {"status", "ranks",      "mesh", "schedule",
                                                     "trace",  "checkpoint", "stop"};

const char *wf_console_cmd_name(wf_console_cmd cmd)
{
  return (unsigned)cmd < WF_CONSOLE_NUM_CMDS ? cmd_names[cmd] : "?";
}

int wf_console_cmd_parse(const char *name)
{
  for (int i = 0; i < WF_CONSOLE_NUM_CMDS; i++)
    if (strcmp(name, cmd_names[i]) == 0)
      return i;
  return -1;
}

static int connect_unix(const char *path)
{
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path)
    return -1;
  wf_strlcpy(sa.sun_path, path, sizeof sa.sun_path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static int connect_tcp(const char *endpoint, char *err, size_t err_len)
{
  char host[300], ports[16];
  int port, fd = -1;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
  if (wf__split_endpoint(endpoint, host, sizeof host, &port) != WF_OK) {
    snprintf(err, err_len, "bad endpoint '%s'", endpoint);
    return -1;
  }
  snprintf(ports, sizeof ports, "%d", port);
  if (getaddrinfo(host, ports, &hints, &res) != 0) {
    snprintf(err, err_len, "cannot resolve '%s'", host);
    return -1;
  }
  for (ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    snprintf(err, err_len, "cannot connect to %s: %s (is the job still running?)", endpoint,
             strerror(errno));
  return fd;
}

static int wait_fd(int fd, short events, double deadline)
{
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int left = (int)(deadline - wf__now_ms());
    if (left <= 0)
      return -1;
    int rc = poll(&p, 1, left);
    if (rc > 0)
      return 0;
    if (rc < 0 && errno != EINTR)
      return -1;
  }
}

static wf_status send_env(int fd, Weft__Envelope *env, double deadline)
{
  uint8_t *frame;
  size_t len, off = 0;
  if (wf_proto_encode(env, &frame, &len) != WF_OK)
    return WF_EPROTO;
  while (off < len) {
    if (wait_fd(fd, POLLOUT, deadline) < 0)
      break;
    ssize_t n = send(fd, frame + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno != EINTR && errno != EAGAIN)
      break;
    off += n > 0 ? (size_t)n : 0;
  }
  free(frame);
  return off == len ? WF_OK : WF_EIO;
}

static wf_status send_request(int fd, const wf_console_job *job, wf_console_cmd cmd,
                              double deadline)
{
  Weft__Envelope env = WEFT__ENVELOPE__INIT;
  Weft__Hello h = WEFT__HELLO__INIT;
  Weft__Query q = WEFT__QUERY__INIT;
  Weft__Command c = WEFT__COMMAND__INIT;
  h.role = WEFT__HELLO__ROLE__CONSOLE;
  h.token = (char *)job->token;
  h.job_id = (char *)job->id;
  env.msg_case = WEFT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  wf_status st = send_env(fd, &env, deadline);
  if (st != WF_OK)
    return st;
  if (cmd == WF_CONSOLE_STOP || cmd == WF_CONSOLE_CHECKPOINT) {
    c.kind = cmd == WF_CONSOLE_STOP ? WEFT__COMMAND__KIND__STOP : WEFT__COMMAND__KIND__CHECKPOINT;
    env.msg_case = WEFT__ENVELOPE__MSG_COMMAND;
    env.command = &c;
  } else {
    q.kind = (Weft__Query__Kind)cmd; /* the first five commands mirror Query.Kind */
    env.msg_case = WEFT__ENVELOPE__MSG_QUERY;
    env.query = &q;
  }
  return send_env(fd, &env, deadline);
}

/* Read until a Reply or an Error arrives. */
static wf_status read_reply(int fd, double deadline, char **json, char *err, size_t err_len)
{
  wf_proto_reader rd;
  char buf[65536];
  wf_status st = WF_ETIMEOUT;
  snprintf(err, err_len, "no reply from the coordinator in time");
  wf_proto_reader_init(&rd, 0);
  while (st == WF_ETIMEOUT && wait_fd(fd, POLLIN, deadline) == 0) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      snprintf(err, err_len, "the coordinator closed the connection");
      st = WF_EIO;
      break;
    }
    if (wf_proto_reader_feed(&rd, buf, (size_t)n, err, err_len) != WF_OK) {
      st = WF_EPROTO;
      break;
    }
    Weft__Envelope *env;
    while (st == WF_ETIMEOUT && wf_proto_reader_next(&rd, &env, err, err_len) == WF_OK && env) {
      if (env->msg_case == WEFT__ENVELOPE__MSG_REPLY) {
        st = env->reply->ok ? WF_OK : WF_EUNSUPPORTED;
        wf__sanitize(err, err_len, env->reply->message);
        if (st == WF_OK && !(*json = strdup(env->reply->json)))
          st = WF_ENOMEM;
      } else if (env->msg_case == WEFT__ENVELOPE__MSG_ERROR) {
        wf__sanitize(err, err_len, env->error->message);
        st = WF_EPROTO;
      }
      wf_proto_free(env);
    }
  }
  wf_proto_reader_fini(&rd);
  return st;
}

wf_status wf_console_request(const wf_console_job *job, wf_console_cmd cmd, int timeout_ms,
                             char **json, char *err, size_t err_len)
{
  double deadline = wf__now_ms() + (timeout_ms > 0 ? timeout_ms : 5000);
  *json = NULL;
  if ((unsigned)cmd >= WF_CONSOLE_NUM_CMDS)
    return WF_EINVAL;
  int fd = job->unix_path[0] ? connect_unix(job->unix_path) : -1;
  if (fd < 0)
    fd = connect_tcp(job->endpoint, err, err_len);
  if (fd < 0)
    return WF_EIO;
  wf_status st = send_request(fd, job, cmd, deadline);
  if (st == WF_OK)
    st = read_reply(fd, deadline, json, err, err_len);
  else
    snprintf(err, err_len, "cannot send the request to %s", job->endpoint);
  close(fd);
  return st;
}
