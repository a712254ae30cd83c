/*
 * train.c - whole training steps (forward, backward, grad norm, AdamW) on one rank.
 *
 * Prints, for gpt2-small at batch 4 x seq 64 and a 4-layer d_model 256 model (4 heads,
 * vocab 256) at batch 8 x seq 128: the median step time, tokens/s and achieved GFLOP/s
 * (wf_gpt_flops_per_step: 6 x params x tokens plus attention), next to the machine's
 * sgemm rate (2048^3, median) through wf_matmul_forward, i.e. cblas_sgemm split over the
 * kernels' thread pool the way the model calls it; and the step broken down into its
 * phases. Never a test.
 *
 * Usage: train [threads (default: all CPUs)] [steps (default 5)]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_kernels.h"
#include "wf_model.h"
#include "wf_runtime.h"

enum { MAX_REPS = 32 };

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, int n)
{
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return t[n / 2];
}

/* GFLOP/s of an n^3 GEMM, median of `reps` after one warm-up. */
static double sgemm_gflops(int n, int reps)
{
  size_t nn = (size_t)n * n;
  float *a = wf_mem_alloc(3 * nn * sizeof *a);
  if (!a)
    return 0;
  wf_rng_fill_normal(a, 2 * nn, 1.0f, 1, 0, 0);
  double t[MAX_REPS];
  wf_matmul_forward(a + 2 * nn, a, a + nn, NULL, n, n, n);
  for (int r = 0; r < reps; r++) {
    t[r] = wf_now();
    wf_matmul_forward(a + 2 * nn, a, a + nn, NULL, n, n, n);
    t[r] = wf_now() - t[r];
  }
  wf_mem_free(a);
  return 2.0 * n * n * (double)n / median(t, reps) * 1e-9;
}

typedef struct shape {
  const char *name;
  wf_gpt_dims d;
  int B, T;
} shape;

/* Phase times of one step, in seconds. */
typedef struct phases {
  double fwd, bwd, norm, adamw, step;
} phases;

static void one_step(wf_gpt *m, const int *in, const int *tg, int B, int T, int t, phases *p)
{
  double t0 = wf_now();
  wf_gpt_zero_grad(m);
  wf_gpt_forward(m, in, tg, B, T);
  double t1 = wf_now();
  wf_gpt_backward(m, 1.0f);
  double t2 = wf_now();
  float norm = wf_gpt_grad_norm(m);
  double t3 = wf_now();
  wf_gpt_update(m, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, norm > 1 ? 1 / norm : 1, t);
  double t4 = wf_now();
  *p = (phases){t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0};
}

static int bench_shape(const shape *s, int steps, double sgemm)
{
  wf_gpt *m = NULL;
  if (wf_gpt_create(&m, &s->d, s->B, s->T) != WF_OK) {
    fprintf(stderr, "train: cannot allocate %s\n", s->name);
    return 1;
  }
  wf_gpt_init(m, 1);
  size_t n = (size_t)s->B * s->T;
  int *tok = malloc((n + 1) * sizeof *tok);
  for (size_t i = 0; i <= n; i++)
    tok[i] = (int)(wf_rng_u64(2, 0, i) % (uint64_t)s->d.V);
  phases p, all[MAX_REPS];
  one_step(m, tok, tok + 1, s->B, s->T, 1, &p); /* warm-up: page faults, thread start */
  double ts[MAX_REPS], fwd[MAX_REPS], bwd[MAX_REPS], rest[MAX_REPS];
  for (int i = 0; i < steps; i++) {
    one_step(m, tok, tok + 1, s->B, s->T, i + 2, &all[i]);
    ts[i] = all[i].step, fwd[i] = all[i].fwd, bwd[i] = all[i].bwd;
    rest[i] = all[i].norm + all[i].adamw;
  }
  double step = median(ts, steps);
  double flops = wf_gpt_flops_per_step(&s->d, s->B, s->T);
  double gflops = flops / step * 1e-9;
  printf("%-22s %4dx%-4d %8.2fM %9.1f %8.1f %8.1f %8.1f %9.0f %8.2f %7.1f%%\n", s->name, s->B, s->T,
         (double)wf_gpt_num_params(&s->d) * 1e-6, step * 1e3, median(fwd, steps) * 1e3,
         median(bwd, steps) * 1e3, median(rest, steps) * 1e3, (double)n / step, gflops,
         100 * gflops / sgemm);
  free(tok);
  wf_gpt_destroy(m);
  return 0;
}

int main(int argc, char **argv)
{
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = argc > 1 ? atoi(argv[1]) : (int)(ncpu > 0 ? ncpu : 1);
  int steps = argc > 2 ? atoi(argv[2]) : 5;
  steps = steps < 1 ? 1 : (steps > MAX_REPS ? MAX_REPS : steps);
  wf_kernels_set_threads(threads);
  double sgemm = sgemm_gflops(2048, 5);
  printf("threads %d; sgemm 2048^3 (cblas_sgemm split over the pool by wf_matmul_forward, "
         "median of 5): %.1f GFLOP/s\n",
         wf_kernels_threads(), sgemm);
  printf("median of %d steps; fwd, bwd and norm+adamw are medians of each phase\n\n", steps);
  printf("%-22s %9s %9s %9s %8s %8s %8s %9s %8s %8s\n", "model", "BxT", "params", "step_ms",
         "fwd_ms", "bwd_ms", "opt_ms", "tok/s", "GFLOP/s", "%sgemm");
  const shape shapes[] = {
      {"gpt2-small", {12, 12, 768, 1024, 50257, 50304}, 4, 64},
      {"L4 C256 NH4 V256", {4, 4, 256, 128, 256, 256}, 8, 128},
  };
  int rc = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    rc |= bench_shape(&shapes[i], steps, sgemm);
  return rc;
}
