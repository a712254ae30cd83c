/*
 * bench/loader.c - how fast a data.source stream makes training rows.
 *
 * usage: build/bench/loader [--tokenizer DIR] [--lanes L] [--seq T] [--steps N]
 *                           [--dp D] [--mix W,W,...] SOURCE...
 *
 * Opens the sources as dp rank 0 of D (L / D lanes, T tokens a row) and asks for N steps
 * one after another with nothing in between, as fast as the loader's thread makes them:
 * reading, decompressing, parsing JSON, tokenizing and packing, on one thread (run it
 * under `taskset -c 0` to hold the whole process to one core). Prints one row per round
 * (a fresh stream each: the files are read from their start) with its wall time and the
 * process's CPU time (getrusage: every thread's user and system time, the tokenizer's
 * load left out), and the best and median tokens/s, the tokens a trainer would consume
 * per second from this rank. Per CPU second is what a core gives when it is the
 * loader's alone: on a busy machine wall time counts other processes' turns too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "wf_io.h"

#define ROUNDS 3

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct args {
  const char *tokenizer;
  int lanes, T, steps, dp;
  double mix[WF_DATA_MAX_SOURCES];
  int n_mix;
  const char *src[WF_DATA_MAX_SOURCES];
  int n_src;
} args;

static int parse(int argc, char **argv, args *a)
{
  *a = (args){.tokenizer = "", .lanes = 8, .T = 1024, .steps = 200, .dp = 1};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(k, "--tokenizer") && v)
      a->tokenizer = v, i++;
    else if (!strcmp(k, "--lanes") && v)
      a->lanes = atoi(v), i++;
    else if (!strcmp(k, "--seq") && v)
      a->T = atoi(v), i++;
    else if (!strcmp(k, "--steps") && v)
      a->steps = atoi(v), i++;
    else if (!strcmp(k, "--dp") && v)
      a->dp = atoi(v), i++;
    else if (!strcmp(k, "--mix") && v) {
      char *s = strdup(v), *save = NULL;
      for (char *w = strtok_r(s, ",", &save); w && a->n_mix < WF_DATA_MAX_SOURCES;
           w = strtok_r(NULL, ",", &save))
        a->mix[a->n_mix++] = atof(w);
      free(s), i++;
    } else if (k[0] != '-' && a->n_src < WF_DATA_MAX_SOURCES)
      a->src[a->n_src++] = k;
    else
      return 1;
  }
  return a->n_src == 0 || a->lanes < 1 || a->T < 1 || a->steps < 1 || a->dp < 1 ||
         a->lanes % a->dp || (a->n_mix && a->n_mix != a->n_src);
}

static double cpu_s(void)
{
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

/* One round: wall and CPU seconds for `steps` steps of a fresh stream. */
static int round_s(const args *a, double *s, double *cpu, char *desc, size_t desc_len)
{
  char err[2048] = "";
  wf_data_opts o = {.vocab = a->tokenizer[0] ? 1 << 20 : 256,
                    .seq_len = a->T,
                    .batch_size = a->lanes,
                    .tokenizer = a->tokenizer,
                    .n_source = a->n_src,
                    .n_mix = a->n_mix,
                    .dp_rank = 0,
                    .dp_size = a->dp};
  for (int i = 0; i < a->n_src; i++)
    o.source[i] = a->src[i], o.mix[i] = a->mix[i], o.field[i] = "text";
  wf_data *d = NULL;
  if (wf_data_open(&d, &o, err, sizeof err) != WF_OK) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  snprintf(desc, desc_len, "%s", wf_data_describe(d));
  double t0 = wf_now(), c0 = cpu_s();
  for (int i = 0; i < a->steps; i++)
    if (wf_data_ready(d, WF_DATA_TRAIN, i, err, sizeof err) != WF_OK) {
      fprintf(stderr, "step %d: %s\n", i + 1, err);
      wf_data_destroy(d);
      return 1;
    }
  *s = wf_now() - t0;
  wf_data_destroy(d); /* the thread stops: its time is all in */
  *cpu = cpu_s() - c0;
  return 0;
}

int main(int argc, char **argv)
{
  args a;
  if (parse(argc, argv, &a)) {
    fprintf(stderr,
            "usage: %s [--tokenizer DIR] [--lanes L] [--seq T] [--steps N] [--dp D] "
            "[--mix W,W,...] SOURCE...\n",
            argv[0]);
    return 2;
  }
  double tps[ROUNDS], per_cpu[ROUNDS], tokens = (double)a.steps * (a.lanes / a.dp) * a.T;
  char desc[4096];
  for (int r = 0; r < ROUNDS; r++) {
    double s, cpu;
    if (round_s(&a, &s, &cpu, desc, sizeof desc))
      return 1;
    tps[r] = tokens / s, per_cpu[r] = tokens / cpu;
    if (r == 0)
      printf("%s\n%d steps x %d lanes x %d tokens = %.0f tokens per round\n", desc, a.steps,
             a.lanes / a.dp, a.T, tokens);
    printf("round %d: %.2f s (%.2f s of CPU), %.0f tokens/s, %.0f per CPU second\n", r + 1, s, cpu,
           tps[r], per_cpu[r]);
  }
  qsort(tps, ROUNDS, sizeof *tps, cmp_double);
  qsort(per_cpu, ROUNDS, sizeof *per_cpu, cmp_double);
  printf("loader tokens/s: best %.0f, median %.0f; per CPU second: median %.0f\n", tps[ROUNDS - 1],
         tps[ROUNDS / 2], per_cpu[ROUNDS / 2]);
  return 0;
}
