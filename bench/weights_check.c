/*
 * bench/weights_check.c - how long wf_weights_check (what a job does with model.init
 * before it starts) takes over a sharded Llama safetensors folder.
 *
 * usage: build/bench/weights_check [DIR] [-L layers] [-C d_model] [-F ffn] [-V vocab]
 *        [--shard-mb MB] [--reps N]
 * Writes a Llama of random weights (by default 4 layers, d_model 1024, ffn 2816, a
 * 32000 vocabulary: 110.6M floats) as a Hugging Face folder under DIR (default /tmp):
 * shards of at most MB (default 100) and model.safetensors.index.json. Then checks it N
 * times and prints the model's size, the shard size and the best and median seconds of
 * a check (the page cache holds the files after the first: this times the reader, not
 * the disk). The folder is removed at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_ckpt.h"

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* -X value pairs into the dims and the run's knobs; false on a bad argument. */
static bool parse(int argc, char **argv, const char **dir, wf_model_dims *d, double *mb, int *reps)
{
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-') {
      *dir = a;
      continue;
    }
    if (i + 1 == argc)
      return false;
    double v = atof(argv[++i]);
    if (!strcmp(a, "-L"))
      d->L = (int)v;
    else if (!strcmp(a, "-C"))
      d->C = (int)v;
    else if (!strcmp(a, "-F"))
      d->F = (int)v;
    else if (!strcmp(a, "-V"))
      d->V = (int)v;
    else if (!strcmp(a, "--shard-mb"))
      *mb = v;
    else if (!strcmp(a, "--reps"))
      *reps = (int)v;
    else
      return false;
  }
  return *reps > 0 && *mb > 0;
}

int main(int argc, char **argv)
{
  enum { MAX_REPS = 64 };
  const char *root = "/tmp";
  /* 8 heads of 128 over 2 kv heads; by default 4 layers of d_model 1024 (110.6M floats) */
  wf_model_dims want = {.fam = wf_model_family_find("llama"), .NH = 8, .KV = 2, .maxT = 64};
  want.L = 4, want.C = 1024, want.F = 2816, want.V = 32000;
  double mb = 100, t[MAX_REPS];
  int reps = 5;
  if (!parse(argc, argv, &root, &want, &mb, &reps) || reps > MAX_REPS) {
    fprintf(stderr,
            "usage: %s [DIR] [-L layers] [-C d_model] [-F ffn] [-V vocab] [--shard-mb MB] "
            "[--reps N (at most %d)]\n",
            argv[0], MAX_REPS);
    return 2;
  }
  want.Vp = (want.V + 127) / 128 * 128;
  wf_model_dims d = wf_model_dims_resolve(&want);
  size_t n = wf_model_num_params(&d);
  float *p = malloc(n * sizeof *p);
  char dir[256], index[300];
  snprintf(dir, sizeof dir, "%s/wf_weights_check_XXXXXX", root);
  if (!p || !mkdtemp(dir)) {
    fprintf(stderr, "cannot set up under %s\n", root);
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    p[i] = wf_rng_normal(7, 0, i) * 0.02f;
  strcat(dir, "/");
  if (wf_weights_write(dir, WF_WEIGHTS_SAFETENSORS, &d, p, (size_t)(mb * 1e6)) != WF_OK)
    return 1;
  snprintf(index, sizeof index, "%smodel.safetensors.index.json", dir);
  for (int r = 0; r < reps; r++) {
    wf_model_dims got;
    double t0 = wf_now();
    if (wf_weights_check(index, "model.init", &got) != WF_OK)
      return 1;
    t[r] = wf_now() - t0;
  }
  qsort(t, (size_t)reps, sizeof *t, cmp_double);
  printf("%-8s %-8s %-10s %-10s %-10s\n", "params", "MB", "shard MB", "best s", "median s");
  char params[32];
  snprintf(params, sizeof params, "%.2fM", n / 1e6);
  printf("%-8s %-8.1f %-10.1f %-10.4f %-10.4f\n", params, n * 4 / 1e6, mb, t[0], t[reps / 2]);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  free(p);
  return system(cmd) == 0 ? 0 : 1;
}
