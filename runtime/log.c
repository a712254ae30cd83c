/*
 * log.c - leveled logging with a "host:pid:rank" prefix, and the runtime context.
 *
 * The runtime context (host name, pid, rank, level) is the project's one global.
 * Each log line is formatted into one buffer and written with a single write(2) so
 * lines from concurrent ranks and threads do not interleave mid-line.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "wf_runtime.h"

static struct {
  char host[256];
  int pid;
  atomic_int rank;
  atomic_int level;
  atomic_int initialised;
} rt = {.rank = -1, .level = WF_LOG_INFO};

static void rt_init_once(void)
{
  if (atomic_load(&rt.initialised))
    return;
  if (gethostname(rt.host, sizeof rt.host) != 0)
    wf_strlcpy(rt.host, "unknown", sizeof rt.host);
  rt.host[sizeof rt.host - 1] = '\0';
  rt.pid = (int)getpid();
  const char *lvl = getenv("WEFT_LOG_LEVEL");
  if (lvl && wf_log_level_parse(lvl) >= 0)
    atomic_store(&rt.level, wf_log_level_parse(lvl));
  atomic_store(&rt.initialised, 1);
}

void wf_rt_set_rank(int rank)
{
  rt_init_once();
  atomic_store(&rt.rank, rank);
}

int wf_rt_rank(void) { return atomic_load(&rt.rank); }

const char *wf_rt_host(void)
{
  rt_init_once();
  return rt.host;
}

void wf_log_set_level(int level) { atomic_store(&rt.level, level); }

int wf_log_level(void)
{
  rt_init_once();
  return atomic_load(&rt.level);
}

int wf_log_level_parse(const char *s)
{
  static const char *names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (strcasecmp(s, names[i]) == 0)
      return i;
  if (s[0] >= '0' && s[0] <= '3' && s[1] == '\0')
    return s[0] - '0';
  return -1;
}

void wf_vlog(int level, const char *file, int line, const char *fmt, va_list ap)
{
  static const char tag[] = "EWID";
  rt_init_once();
  if (level > atomic_load(&rt.level))
    return;
  char buf[4096];
  int rank = atomic_load(&rt.rank);
  bool debug = atomic_load(&rt.level) >= WF_LOG_DEBUG;
  int n;
  /* An error is a sentence for the user, in one form wherever it arises: "weft: error:
   * ...", naming the rank and host when it is not rank 0's (every rank checks the same
   * config, and rank 0 says what they all found). */
  if (level == WF_LOG_ERROR && !debug && rank > 0)
    n = snprintf(buf, sizeof buf, "weft: error: rank %d (%s): ", rank, rt.host);
  else if (level == WF_LOG_ERROR && !debug)
    n = snprintf(buf, sizeof buf, "weft: error: ");
  else if (rank >= 0)
    n = snprintf(buf, sizeof buf, "[weft %c %s:%d:r%d] ", tag[level & 3], rt.host, rt.pid, rank);
  else
    n = snprintf(buf, sizeof buf, "[weft %c %s:%d] ", tag[level & 3], rt.host, rt.pid);
  if (n < 0 || (size_t)n >= sizeof buf)
    n = 0;
  int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
  if (m < 0)
    m = 0;
  size_t len = (size_t)n + (size_t)m;
  if (len > sizeof buf - 64)
    len = sizeof buf - 64;
  /* The source of a line only at debug level: users read what went wrong and what to do;
   * developers asking for debug output get where. */
  if (debug && (level == WF_LOG_ERROR || level == WF_LOG_DEBUG))
    len += (size_t)snprintf(buf + len, sizeof buf - len, " (%s:%d)", file, line);
  buf[len++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, len);
  (void)w;
}

void wf_log(int level, const char *file, int line, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  wf_vlog(level, file, line, fmt, ap);
  va_end(ap);
}

char *wf_strlcpy(char *dst, const char *src, size_t dst_len)
{
  if (dst_len == 0)
    return dst;
  size_t n = strlen(src);
  if (n >= dst_len)
    n = dst_len - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return dst;
}
