/*
 * wire.c - the messages between a rank and its checkpoint writer (saver.c, writer.c): a
 * 4-byte little-endian length, then that many bytes of JSON, on a stream socket. Both
 * ends are this binary, so a message that does not parse is a broken peer, not input.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt_int.h"

static bool send_all(int fd, const char *p, size_t n)
{
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return false;
    p += w, n -= (size_t)w;
  }
  return true;
}

/* 1: all n bytes; 0: the peer closed first; -1: an error. */
static int recv_all(int fd, char *p, size_t n)
{
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, p + got, n - got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return r == 0 ? 0 : -1;
    got += (size_t)r;
  }
  return 1;
}

int wf__recv_exact(int fd, void *buf, size_t n) { return recv_all(fd, buf, n); }

wf_status wf__msg_send(int fd, json_t *msg)
{
  char *text = json_dumps(msg, JSON_COMPACT);
  size_t n = text ? strlen(text) : 0;
  uint8_t len[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  bool ok = text && n <= WF__MSG_MAX && send_all(fd, (const char *)len, 4) && send_all(fd, text, n);
  free(text);
  return ok ? WF_OK : WF_EIO;
}

int wf__msg_recv(int fd, json_t **msg)
{
  uint8_t len[4];
  *msg = NULL;
  int r = recv_all(fd, (char *)len, 4);
  if (r <= 0)
    return r;
  size_t n = (size_t)len[0] | (size_t)len[1] << 8 | (size_t)len[2] << 16 | (size_t)len[3] << 24;
  char *text = n <= WF__MSG_MAX ? malloc(n + 1) : NULL;
  if (!text)
    return -1;
  r = recv_all(fd, text, n);
  text[n] = '\0';
  if (r > 0)
    *msg = json_loads(text, 0, NULL);
  free(text);
  return r > 0 && *msg ? 1 : r == 0 ? 0 : -1;
}

void wf__record_path(char *buf, size_t len, const char *stage, int rank)
{
  wf__pathf(buf, len, "%s/.rec-%05d.json", stage, rank);
}

void wf__life_path(char *buf, size_t len, const char *root, const char *nonce, int rank)
{
  wf__pathf(buf, len, "%s/.writer-%s-%05d.lock", root, nonce, rank);
}
