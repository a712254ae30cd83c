/*
 * nodelist.c - expansion of Slurm host lists such as "gpu[01-04,07],cpu3".
 *
 * Grammar (Slurm's hostlist): items separated by top-level commas; an item is text
 * with zero or more bracket groups, each a comma-separated list of numbers or
 * ranges "lo-hi". Ranges keep the zero padding of their lower bound ("01-04" gives
 * 01 02 03 04). Several bracket groups in one item expand as a cartesian product,
 * left to right ("r[1-2]n[1-2]" gives r1n1 r1n2 r2n1 r2n2), as Slurm does.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wf_launch.h"

typedef struct expand_ctx {
  char *names;
  int n, n_max;
  size_t name_len;
  char *err;
  size_t err_len;
} expand_ctx;

static int fail(expand_ctx *x, const char *what, const char *at)
{
  snprintf(x->err, x->err_len, "malformed Slurm node list: %s at \"%.40s\"", what, at);
  return -1;
}

static int emit(expand_ctx *x, const char *name)
{
  if (strlen(name) >= x->name_len)
    return fail(x, "host name too long", name);
  if (x->names) {
    if (x->n >= x->n_max) {
      snprintf(x->err, x->err_len, "Slurm node list has more than %d hosts", x->n_max);
      return -1;
    }
    wf_strlcpy(x->names + (size_t)x->n * x->name_len, name, x->name_len);
  }
  x->n++;
  return 0;
}

static int expand_item(expand_ctx *x, const char *prefix, const char *rest);

/* Expand one "lo" or "lo-hi" range of the bracket group at `rest`, whose text
 * after the closing bracket is `tail`. */
static int expand_range(expand_ctx *x, const char *prefix, const char *range, size_t len,
                        const char *tail)
{
  char buf[64], lo_s[32];
  if (len == 0 || len >= sizeof buf)
    return fail(x, "empty or overlong range", range);
  memcpy(buf, range, len);
  buf[len] = '\0';
  char *dash = strchr(buf, '-');
  if (dash)
    *dash = '\0';
  wf_strlcpy(lo_s, buf, sizeof lo_s);
  for (const char *p = buf; *p; p++)
    if (!isdigit((unsigned char)*p))
      return fail(x, "range bound is not a number", range);
  if (dash)
    for (const char *p = dash + 1; *p; p++)
      if (!isdigit((unsigned char)*p))
        return fail(x, "range bound is not a number", range);
  if (lo_s[0] == '\0' || (dash && dash[1] == '\0'))
    return fail(x, "empty range bound", range);
  long lo = strtol(lo_s, NULL, 10), hi = dash ? strtol(dash + 1, NULL, 10) : lo;
  if (hi < lo)
    return fail(x, "range runs backwards", range);
  if (hi - lo > 100000)
    return fail(x, "range too large", range);
  int width = (int)strlen(lo_s);
  for (long v = lo; v <= hi; v++) {
    char next[512];
    if (snprintf(next, sizeof next, "%s%0*ld", prefix, width, v) >= (int)sizeof next)
      return fail(x, "host name too long", range);
    if (expand_item(x, next, tail) < 0)
      return -1;
  }
  return 0;
}

static int expand_item(expand_ctx *x, const char *prefix, const char *rest)
{
  const char *open = strchr(rest, '[');
  if (!open) {
    if (strchr(rest, ']'))
      return fail(x, "unbalanced ']'", rest);
    char name[512];
    if (snprintf(name, sizeof name, "%s%s", prefix, rest) >= (int)sizeof name)
      return fail(x, "host name too long", rest);
    return emit(x, name);
  }
  const char *close = strchr(open, ']');
  if (!close)
    return fail(x, "missing ']'", open);
  if (close == open + 1)
    return fail(x, "empty brackets", open);
  char head[512];
  if (snprintf(head, sizeof head, "%s%.*s", prefix, (int)(open - rest), rest) >= (int)sizeof head)
    return fail(x, "host name too long", rest);
  for (const char *r = open + 1; r < close;) {
    const char *comma = memchr(r, ',', (size_t)(close - r));
    const char *end = comma ? comma : close;
    if (expand_range(x, head, r, (size_t)(end - r), close + 1) < 0)
      return -1;
    r = comma ? comma + 1 : close;
  }
  return 0;
}

int wf_nodelist_expand(const char *list, char *names, int n_max, size_t name_len, char *err,
                       size_t err_len)
{
  expand_ctx x = {names, 0, n_max, name_len, err, err_len};
  if (!list || !*list) {
    snprintf(err, err_len, "empty Slurm node list");
    return -1;
  }
  size_t len = strlen(list);
  char *copy = malloc(len + 1);
  if (!copy) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  memcpy(copy, list, len + 1);
  int rc = 0, depth = 0;
  char *item = copy;
  for (char *p = copy;; p++) {
    if (*p == '[')
      depth++;
    else if (*p == ']')
      depth--;
    if ((*p == ',' && depth == 0) || *p == '\0') {
      char c = *p;
      *p = '\0';
      if (*item == '\0')
        rc = fail(&x, "empty host name", item);
      else if (expand_item(&x, "", item) < 0)
        rc = -1;
      if (rc < 0 || c == '\0')
        break;
      item = p + 1;
    }
  }
  free(copy);
  return rc < 0 ? -1 : x.n;
}
