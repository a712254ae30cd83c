/*
 * util.c - small helpers shared by the service, the control client and the console:
 * token generation and comparison, endpoint parsing, sanitising wire strings, and
 * queueing an encoded envelope on a libuv stream.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control_int.h"

bool wf__ct_streq(const char *a, const char *b)
{
  size_t la = strlen(a), lb = strlen(b);
  /* Compare every byte of `b` whatever `a` holds, so the time leaks only lengths. */
  unsigned char diff = (unsigned char)(la != lb);
  for (size_t i = 0; i < lb; i++)
    diff |= (unsigned char)(b[i] ^ (i < la ? a[i] : 0));
  return diff == 0;
}

wf_status wf__random_token(char out[WF_TOKEN_HEX + 1])
{
  unsigned char raw[WF_TOKEN_HEX / 2];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    WF_ERROR("cannot open /dev/urandom for the job token: %s", strerror(errno));
    return WF_ESYS;
  }
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = read(fd, raw + got, sizeof raw - got);
    if (n <= 0) {
      if (n < 0 && errno == EINTR)
        continue;
      close(fd);
      WF_ERROR("reading /dev/urandom for the job token failed");
      return WF_ESYS;
    }
    got += (size_t)n;
  }
  close(fd);
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof raw; i++) {
    out[2 * i] = hex[raw[i] >> 4];
    out[2 * i + 1] = hex[raw[i] & 15];
  }
  out[WF_TOKEN_HEX] = '\0';
  return WF_OK;
}

void wf__sanitize(char *dst, size_t dst_len, const char *src)
{
  size_t i = 0;
  if (dst_len == 0)
    return;
  for (; src && src[i] && i + 1 < dst_len; i++) {
    unsigned char ch = (unsigned char)src[i];
    dst[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
  }
  dst[i] = '\0';
}

wf_status wf__split_endpoint(const char *ep, char *host, size_t host_len, int *port)
{
  const char *colon = strrchr(ep, ':');
  if (!colon || colon == ep || !colon[1])
    return WF_EINVAL;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (*end || p <= 0 || p > 65535)
    return WF_EINVAL;
  const char *h = ep;
  size_t n = (size_t)(colon - ep);
  if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (n + 1 > host_len)
    return WF_EINVAL;
  memcpy(host, h, n);
  host[n] = '\0';
  *port = (int)p;
  return WF_OK;
}

double wf__now_ms(void) { return (double)uv_hrtime() / 1e6; }

/* libuv writes to sockets with write(2), not send(2) with MSG_NOSIGNAL, so a write into a
 * connection whose peer has gone (a console that hung up, a rank or a coordinator that
 * died) raises SIGPIPE, whose default ends the whole process: the library cannot rely
 * on its host process ignoring it. The signal goes to the writing thread, so blocking
 * it on the loop threads is enough: it stays pending there (and goes with the thread),
 * the write fails with EPIPE, and the closed peer is seen as the read side's EOF or
 * reset, which every connection already handles and reports. */
void wf__block_sigpipe(void)
{
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
}

bool wf__ratelimit_ok(wf__ratelimit *rl, double now, long *suppressed)
{
  if (rl->t_last > 0 && now - rl->t_last < WF__LOG_EVERY_MS) {
    rl->suppressed++;
    return false;
  }
  *suppressed = rl->suppressed;
  rl->suppressed = 0;
  rl->t_last = now;
  return true;
}

typedef struct send_req {
  uv_write_t req;
  uint8_t *frame;
} send_req;

static void on_sent(uv_write_t *req, int status)
{
  send_req *r = (send_req *)req;
  free(r->frame);
  free(r);
}

int wf__send(uv_stream_t *s, Weft__Envelope *env)
{
  send_req *r = calloc(1, sizeof *r);
  size_t len;
  if (!r)
    return UV_ENOMEM;
  if (wf_proto_encode(env, &r->frame, &len) != WF_OK) {
    free(r);
    return UV_EINVAL;
  }
  uv_buf_t buf = uv_buf_init((char *)r->frame, (unsigned)len);
  int rc = uv_write(&r->req, s, &buf, 1, on_sent);
  if (rc < 0) {
    free(r->frame);
    free(r);
  }
  return rc;
}
