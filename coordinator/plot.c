/*
 * plot.c - `coordinator plot METRICS.jsonl OUT.svg|OUT.png`: a run's loss and
 * throughput as a figure, for reports and machines without a browser.
 *
 * The metrics file (train.metrics, one JSON object per step) is read with jansson; the
 * figure is drawn by gnuplot (Debian's gnuplot-nox): the loss (and val_loss at the
 * evaluated steps) above, tokens per second below, against the step. The data goes to
 * gnuplot's stdin as inline data blocks, so nothing is written but OUT. A line that is
 * not JSON is skipped only when it is the last one (a running job's line being written);
 * anywhere else it is an error naming the line.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "plot_int.h"

typedef struct series {
  double *step, *loss, *val, *tok;
  size_t n, cap;
} series;

static double field(json_t *o, const char *key)
{
  json_t *v = json_object_get(o, key);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static int push(series *s, json_t *o)
{
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    double **arrs[] = {&s->step, &s->loss, &s->val, &s->tok};
    for (size_t i = 0; i < 4; i++) {
      double *g = realloc(*arrs[i], cap * sizeof *g);
      if (!g)
        return -1;
      *arrs[i] = g;
    }
    s->cap = cap;
  }
  s->step[s->n] = field(o, "step");
  s->loss[s->n] = field(o, "loss");
  s->val[s->n] = field(o, "val_loss");
  s->tok[s->n] = field(o, "tokens_per_s");
  s->n++;
  return 0;
}

/* The steps of `path`; 0, or 2 with the reason said (a user's file). */
static int read_metrics(const char *path, series *s)
{
  FILE *f = fopen(path, "r");
  char *line = NULL;
  size_t cap = 0;
  int rc = 0, bad_line = 0;
  if (!f) {
    fprintf(stderr, "coordinator: plot: cannot read %s: %s\n", path, strerror(errno));
    return 2;
  }
  for (int no = 1; getline(&line, &cap, f) > 0 && rc == 0; no++) {
    if (bad_line) { /* a bad line before this one: not the last */
      fprintf(stderr,
              "coordinator: plot: %s:%d is not a JSON object (a train.metrics file has "
              "one per line)\n",
              path, bad_line);
      rc = 2;
      break;
    }
    json_t *o = json_loads(line, 0, NULL);
    if (!json_is_object(o))
      bad_line = no;
    else if (json_is_number(json_object_get(o, "step")) && push(s, o) != 0)
      rc = 1;
    json_decref(o);
  }
  free(line);
  fclose(f);
  if (rc == 0 && s->n == 0) {
    fprintf(stderr, "coordinator: plot: %s has no steps (it should be a train.metrics file)\n",
            path);
    rc = 2;
  }
  return rc;
}

/* One inline data block of the finite (step, y) pairs. */
static void block(FILE *g, const char *name, const series *s, const double *y)
{
  fprintf(g, "$%s << EOD\n", name);
  for (size_t i = 0; i < s->n; i++)
    if (isfinite(s->step[i]) && isfinite(y[i]))
      fprintf(g, "%.17g %.17g\n", s->step[i], y[i]);
  fprintf(g, "EOD\n");
}

static bool any(const series *s, const double *y)
{
  for (size_t i = 0; i < s->n; i++)
    if (isfinite(y[i]))
      return true;
  return false;
}

static void script(FILE *g, const series *s, const char *out, bool svg, const char *title)
{
  if (svg)
    fprintf(g, "set terminal svg size 900,700 dynamic font 'sans,11'\n");
  else
    fprintf(g, "set terminal pngcairo size 900,700 font 'sans,10'\n");
  fprintf(g, "set output '%s'\n", out);
  block(g, "loss", s, s->loss);
  block(g, "val", s, s->val);
  block(g, "tok", s, s->tok);
  fprintf(g,
          "set multiplot layout 2,1 title '%s'\nset grid\nset key top right\n"
          "set xlabel 'step'\nset ylabel 'loss (nats per token)'\n",
          title);
  fprintf(g, "plot $loss using 1:2 with lines lw 1.5 lc rgb '#4c6ef5' title 'loss'%s\n",
          any(s, s->val) ? ", $val using 1:2 with linespoints pt 7 ps 0.6 lw 1.5 lc rgb '#e8590c' "
                           "title 'val\\_loss'"
                         : "");
  fprintf(g, "set ylabel 'tokens / s'\n");
  if (any(s, s->tok))
    fprintf(g, "plot $tok using 1:2 with lines lw 1.5 lc rgb '#12b886' title 'tokens/s'\n");
  fprintf(g, "unset multiplot\n");
}

/* Quotes would end gnuplot's strings: keep the title and the path plain. */
static bool plain(const char *s) { return !strpbrk(s, "'\"\\\n`"); }

int wf__plot(const char *in, const char *out)
{
  series s = {0};
  const char *ext = strrchr(out, '.');
  bool svg = ext && strcmp(ext, ".svg") == 0, png = ext && strcmp(ext, ".png") == 0;
  if (!svg && !png) {
    fprintf(stderr, "coordinator: plot: %s: name an .svg or a .png file to write\n", out);
    return 2;
  }
  if (!plain(out) || !plain(in)) {
    fprintf(stderr, "coordinator: plot: paths with quotes or backslashes are not supported\n");
    return 2;
  }
  int rc = read_metrics(in, &s);
  if (rc != 0)
    goto out;
  FILE *g = popen("gnuplot", "w");
  if (!g) {
    fprintf(stderr, "coordinator: plot: cannot run gnuplot: %s\n", strerror(errno));
    rc = 1;
    goto out;
  }
  const char *base = strrchr(in, '/');
  script(g, &s, out, svg, base ? base + 1 : in);
  int st = pclose(g);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "coordinator: plot: gnuplot failed (exit %d)%s\n",
            st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st),
            WIFEXITED(st) && WEXITSTATUS(st) == 127 ? ": install gnuplot-nox" : "");
    rc = 1;
    goto out;
  }
  printf("%s: %zu steps of %s\n", out, s.n, in);
out:
  free(s.step);
  free(s.loss);
  free(s.val);
  free(s.tok);
  return rc;
}
