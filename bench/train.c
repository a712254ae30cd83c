/*
 * train.c - whole training steps (forward, backward, grad norm, AdamW) on one rank.
 *
 * Prints, for GPT-2 and Llama pairs of the same shape (the tiny presets at batch 8 x seq
 * 64; 4 layers of d_model 256, 4 heads, vocab 256 at batch 8 x seq 128) and for
 * gpt2-small at batch 4 x seq 64: step time, tokens/s and achieved GFLOP/s
 * (wf_model_flops_per_step: 6 x params x tokens plus attention), next to the machine's
 * sgemm rate: a 2048^3 GEMM through wf_matmul_forward, i.e. cblas_sgemm split over the
 * kernels' thread pool the way the model calls it, measured just before each model so
 * both see the same load. Each as best and median of the runs, with the step broken
 * into forward, backward and optimizer (grad norm + AdamW). Never a test.
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
#include "wf_optim.h"
#include "wf_parallel.h"
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

static double best(const double *t, int n)
{
  double b = t[0];
  for (int i = 1; i < n; i++)
    b = t[i] < b ? t[i] : b;
  return b;
}

/* Seconds of an n^3 GEMM over `reps` runs after one warm-up: median and best. */
static void sgemm_time(int n, int reps, double *med, double *min)
{
  size_t nn = (size_t)n * n;
  float *a = wf_mem_alloc(3 * nn * sizeof *a);
  *med = *min = INFINITY;
  if (!a)
    return;
  wf_rng_fill_normal(a, 2 * nn, 1.0f, 1, 0, 0);
  double t[MAX_REPS];
  wf_matmul_forward(a + 2 * nn, a, a + nn, NULL, n, n, n);
  for (int r = 0; r < reps; r++) {
    t[r] = wf_now();
    wf_matmul_forward(a + 2 * nn, a, a + nn, NULL, n, n, n);
    t[r] = wf_now() - t[r];
  }
  wf_mem_free(a);
  *min = best(t, reps);
  *med = median(t, reps);
}

typedef struct shape {
  const char *name;
  wf_model_dims d;
  int B, T;
} shape;

/* Phase times of one step, in seconds. */
typedef struct phases {
  double fwd, bwd, norm, adamw, step;
} phases;

/* What the trainer runs on one rank: the model, the gradient path, the optimizer. */
typedef struct rank {
  wf_config cfg;
  wf_model *m;
  wf_grads *g;
  wf_optim *o;
} rank;

static void one_step(rank *r, const int *in, const int *tg, int B, int T, int t, phases *p)
{
  float loss, norm;
  wf_optim_step_info oi;
  double t0 = wf_now();
  wf_grads_zero(r->g);
  wf_model_forward(r->m, in, tg, B, T, &loss);
  double t1 = wf_now();
  wf_model_backward(r->m, 1.0f);
  double t2 = wf_now();
  wf_grads_finish(r->g);
  wf_grads_norm(r->g, 1.0, &norm);
  double t3 = wf_now();
  wf_optim_step(r->o, t, loss, norm, wf_grads_for_update(r->g), &oi);
  wf_grads_sync_params(r->g, wf_optim_writes_low(r->o));
  double t4 = wf_now();
  *p = (phases){t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0};
}

/* lr 1e-4, betas 0.9 / 0.95, weight decay 0.1, clip 1: the step the trainer takes. */
static wf_status rank_create(rank *r, const shape *s)
{
  wf_config_init(&r->cfg);
  r->cfg.train.lr = r->cfg.train.min_lr = 1e-4, r->cfg.train.warmup = 0;
  r->cfg.optim.beta1 = 0.9, r->cfg.optim.beta2 = 0.95, r->cfg.optim.weight_decay = 0.1;
  r->cfg.optim.clip = 1.0, r->cfg.precision = WF_PREC_NO;
  wf_status st = wf_model_create(&r->m, &s->d, s->B, s->T);
  if (st == WF_OK)
    st = wf_model_init(r->m, 1);
  wf_grads_opts go = {.model = r->m};
  if (st == WF_OK)
    st = wf_grads_create(&r->g, &go);
  wf_optim_opts oo = {
      .cfg = &r->cfg, .model = r->m, .hi = r->m ? wf_model_local_params(r->m) : 0, .dp_size = 1};
  if (st == WF_OK)
    st = wf_optim_create(&r->o, &oo);
  return st;
}

static void rank_destroy(rank *r)
{
  wf_optim_destroy(r->o);
  wf_grads_destroy(r->g);
  wf_model_destroy(r->m);
}

static void print_row(const shape *s, const char *kind, double step, double fwd, double bwd,
                      double opt, double sgemm_s)
{
  char bxt[32];
  snprintf(bxt, sizeof bxt, "%dx%d", s->B, s->T);
  double gflops = wf_model_flops_per_step(&s->d, s->B, s->T) / step * 1e-9;
  double sgemm = 2.0 * 2048.0 * 2048.0 * 2048.0 / sgemm_s * 1e-9;
  printf("%-17s %-6s %-7s %7.2fM %9.1f %8.1f %8.1f %7.1f %8.0f %8.1f %7.1f %6.1f%%\n", s->name,
         kind, bxt, (double)wf_model_num_params(&s->d) * 1e-6, step * 1e3, fwd * 1e3, bwd * 1e3,
         opt * 1e3, (double)s->B * s->T / step, gflops, sgemm, 100 * gflops / sgemm);
}

static int bench_shape(const shape *s, int steps)
{
  /* Measured next to each model, so both numbers see the same machine load. */
  double sg_med, sg_min;
  sgemm_time(2048, 5, &sg_med, &sg_min);
  rank r = {0};
  if (rank_create(&r, s) != WF_OK) {
    fprintf(stderr, "train: cannot allocate %s\n", s->name);
    rank_destroy(&r);
    return 1;
  }
  size_t n = (size_t)s->B * s->T;
  int *tok = malloc((n + 1) * sizeof *tok);
  for (size_t i = 0; i <= n; i++)
    tok[i] = (int)(wf_rng_u64(2, 0, i) % (uint64_t)s->d.V);
  phases p;
  one_step(&r, tok, tok + 1, s->B, s->T, 1, &p); /* warm-up: page faults, thread start */
  double ts[MAX_REPS], fwd[MAX_REPS], bwd[MAX_REPS], opt[MAX_REPS];
  for (int i = 0; i < steps; i++) {
    one_step(&r, tok, tok + 1, s->B, s->T, i + 2, &p);
    ts[i] = p.step, fwd[i] = p.fwd, bwd[i] = p.bwd, opt[i] = p.norm + p.adamw;
  }
  print_row(s, "best", best(ts, steps), best(fwd, steps), best(bwd, steps), best(opt, steps),
            sg_min);
  print_row(s, "median", median(ts, steps), median(fwd, steps), median(bwd, steps),
            median(opt, steps), sg_med);
  free(tok);
  rank_destroy(&r);
  return 0;
}

int main(int argc, char **argv)
{
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = argc > 1 ? atoi(argv[1]) : (int)(ncpu > 0 ? ncpu : 1);
  int steps = argc > 2 ? atoi(argv[2]) : 5;
  steps = steps < 1 ? 1 : (steps > MAX_REPS ? MAX_REPS : steps);
  wf_kernels_set_threads(threads);
  printf("threads %d; %d steps after one warm-up: best and median of the step and of each\n"
         "phase (opt = grad norm + AdamW). sgemm: GFLOP/s of a 2048^3 GEMM through\n"
         "wf_matmul_forward (cblas_sgemm split over the kernels' pool), best and median of 5,\n"
         "measured just before each model. On a shared machine 'best' is the less disturbed.\n\n",
         wf_kernels_threads(), steps);
  printf("%-17s %-6s %-7s %8s %9s %8s %8s %7s %8s %8s %7s %7s\n", "model", "stat", "BxT", "params",
         "step_ms", "fwd_ms", "bwd_ms", "opt_ms", "tok/s", "GFLOP/s", "sgemm", "%sgemm");
  /* GPT-2 and Llama pairs of the same depth, width and heads (Llama: 2 kv heads, SwiGLU
   * 3 x C wide at the tiny size, ~8/3 x C at d_model 256, as Llama sizes it), then
   * gpt2-small. The family is looked up by name (the dims literal's NULL is GPT-2). */
  const wf_family *llama = wf_model_family_find("llama");
  shape shapes[] = {
      {"gpt2-tiny", {.L = 4, .NH = 4, .C = 64, .maxT = 64, .V = 256, .Vp = 256}, 8, 64},
      {"llama-tiny",
       {.fam = llama,
        .L = 4,
        .NH = 4,
        .C = 64,
        .maxT = 64,
        .V = 256,
        .Vp = 256,
        .KV = 2,
        .F = 192,
        .rope_theta = 10000},
       8,
       64},
      {"L4 C256 NH4 V256", {.L = 4, .NH = 4, .C = 256, .maxT = 128, .V = 256, .Vp = 256}, 8, 128},
      {"llama L4 C256 KV2",
       {.fam = llama,
        .L = 4,
        .NH = 4,
        .C = 256,
        .maxT = 128,
        .V = 256,
        .Vp = 256,
        .KV = 2,
        .F = 688,
        .rope_theta = 10000},
       8,
       128},
      {"gpt2-small", {.L = 12, .NH = 12, .C = 768, .maxT = 1024, .V = 50257, .Vp = 50304}, 4, 64},
  };
  int rc = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    rc |= bench_shape(&shapes[i], steps);
  return rc;
}
