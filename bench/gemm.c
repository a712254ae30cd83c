/*
 * gemm.c - the machine's sgemm rate, and what the CPU kernels make of it.
 *
 * Prints three tables (medians of repeated runs; never a test):
 *  1. sgemm GFLOP/s at large square sizes and at gpt2-small's own shapes for B*T = 256
 *     tokens (forward, and the two backward GEMMs of each linear layer), for OpenBLAS
 *     called directly with 1 and 2 of its own threads, and for weft's wf_matmul_* with
 *     a budget of 1 and 2 threads (the kernels' pool, single-threaded OpenBLAS per share).
 *  2. the time of every kernel at gpt2-small shapes (B 4, T 64, C 768, NH 12,
 *     V 50257 padded to 50304) with the largest thread budget, and a step estimate
 *     made of 12 layers of them plus the head and AdamW, with its GFLOP/s.
 *  3. attention at T = 1024.
 *
 * Usage: gemm [max_threads (2)] [--quick] [--best] [--ops]
 *   --quick skips the 4096 square; --best reports the fastest repeat, not the median;
 *   --ops prints only tables 2 and 3.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "wf_kernels.h"

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef void (*bench_fn)(void *ctx);

/* 1: report the fastest repeat instead of the median (--best), which estimates the
 * uncontended speed when other jobs share the cores. */
static int report_best;

static double cpu_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Median (or best) seconds of one call, over enough repeats to fill ~0.4 s (3 to 25);
 * *cpu (if not NULL) gets the median process CPU seconds of a call, which other jobs
 * on the machine inflate much less than the wall time. */
static double median_time_cpu(bench_fn fn, void *ctx, double *cpu)
{
  double t[25], c[25];
  double t0 = now_s();
  fn(ctx); /* warm-up: page faults, packing buffers, thread start */
  double first = now_s() - t0;
  int reps = first > 0.13 ? 3 : (int)(0.4 / (first + 1e-6));
  reps = reps < 3 ? 3 : (reps > 25 ? 25 : reps);
  for (int r = 0; r < reps; r++) {
    double c0 = cpu_s();
    t0 = now_s();
    fn(ctx);
    t[r] = now_s() - t0;
    c[r] = cpu_s() - c0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  qsort(c, (size_t)reps, sizeof c[0], cmp_double);
  if (cpu)
    *cpu = c[reps / 2];
  return report_best ? t[0] : t[reps / 2];
}

static double median_time(bench_fn fn, void *ctx) { return median_time_cpu(fn, ctx, NULL); }

static float *randn(size_t n, unsigned seed)
{
  float *x = malloc(n * sizeof *x);
  if (!x) {
    fprintf(stderr, "gemm: out of memory allocating %zu floats\n", n);
    exit(1);
  }
  srand(seed);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
  return x;
}

/* ---- table 1: GEMMs -------------------------------------------------------------- */

enum gemm_kind { FWD, DINP, DWEIGHT };

/* One linear layer's GEMM: FWD out (N,OC) = x W^T, DINP dx (N,C) = dy W,
 * DWEIGHT dW (OC,C) = dy^T x. */
struct gemm_case {
  enum gemm_kind kind;
  int N, C, OC;
  float *x, *w, *y; /* x (N,C), w (OC,C), y (N,OC) */
  int weft;         /* 1: through wf_matmul_*, 0: cblas directly */
};

static void run_gemm(void *p)
{
  struct gemm_case *g = p;
  int N = g->N, C = g->C, OC = g->OC;
  if (g->weft) {
    if (g->kind == FWD)
      wf_matmul_forward(g->y, g->x, g->w, NULL, N, C, OC);
    else if (g->kind == DINP)
      wf_matmul_backward(g->x, NULL, NULL, g->y, g->x, g->w, N, C, OC);
    else
      wf_matmul_backward(NULL, g->w, NULL, g->y, g->x, g->w, N, C, OC);
    return;
  }
  if (g->kind == FWD)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, g->x, C, g->w, C, 0.0f,
                g->y, OC);
  else if (g->kind == DINP)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, g->y, OC, g->w, C, 1.0f,
                g->x, C);
  else
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, g->y, OC, g->x, C, 1.0f,
                g->w, C);
}

/* GFLOP/s of one case under the four thread configurations. */
static void gemm_row(const char *name, enum gemm_kind kind, int N, int C, int OC, int max_threads)
{
  struct gemm_case g = {
      kind, N, C, OC, randn((size_t)N * C, 1), randn((size_t)OC * C, 2), randn((size_t)N * OC, 3),
      0};
  int M = kind == DWEIGHT ? OC : N, Nn = kind == FWD ? OC : C,
      K = kind == FWD ? C : (kind == DINP ? OC : N);
  double flops = 2.0 * M * Nn * K;
  printf("%-16s %6d x %6d x %5d", name, M, Nn, K);
  for (int weft = 0; weft <= 1; weft++)
    for (int nt = 1; nt <= max_threads; nt *= 2) {
      g.weft = weft;
      if (weft)
        wf_kernels_set_threads(nt);
      else
        openblas_set_num_threads(nt);
      printf(" %9.1f", flops / median_time(run_gemm, &g) / 1e9);
      if (!weft)
        openblas_set_num_threads(1); /* weft's invariant: OpenBLAS single-threaded */
    }
  printf("\n");
  fflush(stdout);
  free(g.x), free(g.w), free(g.y);
}

static void gemm_table(int max_threads, int quick)
{
  printf("sgemm GFLOP/s (M x N x K; %s). openblas-Nt: cblas_sgemm with N OpenBLAS "
         "threads;\nweft-Nt: wf_matmul_* with a budget of N (pool shares, 1-thread "
         "OpenBLAS each)\n",
         report_best ? "best repeat" : "median");
  printf("%-16s %24s", "shape", "M x N x K");
  for (int weft = 0; weft <= 1; weft++)
    for (int nt = 1; nt <= max_threads; nt *= 2)
      printf(" %6s-%dt", weft ? "weft" : "oblas", nt);
  printf("\n");
  int sq[] = {1024, 2048, 4096};
  for (int i = 0; i < (quick ? 2 : 3); i++) {
    char name[32];
    snprintf(name, sizeof name, "square %d", sq[i]);
    gemm_row(name, FWD, sq[i], sq[i], sq[i], max_threads);
  }
  /* gpt2-small, B*T = 256 tokens: (name, C in, OC out) of each linear layer */
  struct {
    const char *name;
    int C, OC;
  } lin[] = {{"qkv", 768, 2304},
             {"attproj", 768, 768},
             {"fc", 768, 3072},
             {"fcproj", 3072, 768},
             {"lm head", 768, 50304}};
  const char *kinds[] = {"fwd", "dinp", "dweight"};
  for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++)
    for (int k = FWD; k <= DWEIGHT; k++) {
      char name[32];
      snprintf(name, sizeof name, "%s %s", lin[i].name, kinds[k]);
      gemm_row(name, (enum gemm_kind)k, 256, lin[i].C, lin[i].OC, max_threads);
    }
}

/* ---- table 2: every kernel at gpt2-small shapes ----------------------------------- */

enum { GB = 4, GT = 64, GC = 768, GNH = 12, GV = 50257, GVP = 50304, GL = 12, GN = GB * GT };

struct bufs {
  float *x, *y, *dx, *dy, *ln_w, *ln_b, *mean, *rstd;
  float *qkv, *dqkv, *att, *scratch, *h4, *dh4, *w_qkv, *w_fc, *w_fcp, *w_ap, *dw, *bias, *dbias;
  float *wte, *wpe, *dwte, *logits, *mx, *se, *tl, *loss;
  float *p, *m, *v, *g;
  int *tok;
  size_t nparams;
};

static struct bufs alloc_bufs(size_t nparams)
{
  struct bufs b = {0};
  size_t nc = (size_t)GN * GC, n4 = nc * 4, na = (size_t)GB * GNH * GT * GT;
  b.x = randn(nc, 4), b.y = randn(nc, 5), b.dx = randn(nc, 6), b.dy = randn(nc, 7);
  b.ln_w = randn(GC, 8), b.ln_b = randn(GC, 9), b.mean = randn(GN, 10), b.rstd = randn(GN, 11);
  b.qkv = randn(nc * 3, 12), b.dqkv = randn(nc * 3, 13), b.att = randn(na, 14);
  b.scratch = randn(na, 15), b.h4 = randn(n4, 16), b.dh4 = randn(n4, 17);
  b.w_qkv = randn((size_t)3 * GC * GC, 18), b.w_fc = randn((size_t)4 * GC * GC, 19);
  b.w_fcp = randn((size_t)4 * GC * GC, 20), b.w_ap = randn((size_t)GC * GC, 21);
  b.dw = randn((size_t)4 * GC * GC, 22), b.bias = randn(4 * GC, 23), b.dbias = randn(4 * GC, 24);
  b.wte = randn((size_t)GVP * GC, 25), b.wpe = randn((size_t)1024 * GC, 26);
  b.dwte = randn((size_t)GVP * GC, 27), b.logits = randn((size_t)GN * GVP, 28);
  b.mx = randn(GN, 29), b.se = randn(GN, 30), b.tl = randn(GN, 31), b.loss = randn(GN, 32);
  b.tok = malloc(GN * sizeof *b.tok);
  for (int i = 0; i < GN; i++)
    b.tok[i] = (i * 7919) % GV;
  b.nparams = nparams;
  b.p = randn(nparams, 33), b.m = calloc(nparams, 4), b.v = calloc(nparams, 4);
  b.g = randn(nparams, 34);
  if (!b.m || !b.v) {
    fprintf(stderr, "gemm: out of memory for AdamW state\n");
    exit(1);
  }
  wf_scale(b.g, 1e-3f, nparams);
  return b;
}

struct op {
  const char *name;
  int per_step; /* calls per training step */
  double flops; /* per call, 0 if not counted */
  void (*fn)(struct bufs *b);
};

/* clang-format off */
/* GPT-2's input: token rows, then the positions' rows added (worker/model/ops.c). */
static void enc_f(struct bufs *b)
{
  wf_embedding_forward(b->x, b->tok, b->wte, 0, INT_MAX, GB * GT, GC);
  wf_position_forward(b->x, b->wpe, NULL, GB, GT, GC);
}

static void enc_b(struct bufs *b)
{
  wf_embedding_backward(b->dwte, b->dx, b->tok, 0, INT_MAX, GB * GT, GC);
  wf_position_backward(b->wpe, b->dx, NULL, GB, GT, GC);
}
static void ln_f(struct bufs *b) { wf_layernorm_forward(b->y, b->mean, b->rstd, b->x, b->ln_w, b->ln_b, GN, GC); }
static void ln_b(struct bufs *b) { wf_layernorm_backward(b->dx, b->dbias, b->dbias + GC, b->dy, b->x, b->ln_w, b->mean, b->rstd, GN, GC); }
static void qkv_f(struct bufs *b) { wf_matmul_forward(b->qkv, b->x, b->w_qkv, b->bias, GN, GC, 3 * GC); }
static void qkv_b(struct bufs *b) { wf_matmul_backward(b->dx, b->dw, b->dbias, b->dqkv, b->x, b->w_qkv, GN, GC, 3 * GC); }
static void att_f(struct bufs *b) { wf_attention_forward(b->y, b->att, b->qkv, GB, GT, GC, GNH); }
static void att_b(struct bufs *b) { wf_attention_backward(b->dqkv, b->scratch, b->dy, b->qkv, b->att, GB, GT, GC, GNH); }
static void ap_f(struct bufs *b) { wf_matmul_forward(b->y, b->x, b->w_ap, b->bias, GN, GC, GC); }
static void ap_b(struct bufs *b) { wf_matmul_backward(b->dx, b->dw, b->dbias, b->dy, b->x, b->w_ap, GN, GC, GC); }
static void res_f(struct bufs *b) { wf_residual_forward(b->y, b->x, b->dx, (size_t)GN * GC); }
static void res_b(struct bufs *b) { wf_residual_backward(b->dx, b->dy, b->x, (size_t)GN * GC); }
static void fc_f(struct bufs *b) { wf_matmul_forward(b->h4, b->x, b->w_fc, b->bias, GN, GC, 4 * GC); }
static void fc_b(struct bufs *b) { wf_matmul_backward(b->dx, b->dw, b->dbias, b->dh4, b->x, b->w_fc, GN, GC, 4 * GC); }
static void gelu_f(struct bufs *b) { wf_gelu_forward(b->dh4, b->h4, (size_t)GN * 4 * GC); }
static void gelu_b(struct bufs *b) { wf_gelu_backward(b->dh4, b->h4, b->h4, (size_t)GN * 4 * GC); }
static void fcp_f(struct bufs *b) { wf_matmul_forward(b->y, b->h4, b->w_fcp, b->bias, GN, 4 * GC, GC); }
static void fcp_b(struct bufs *b) { wf_matmul_backward(b->dh4, b->dw, b->dbias, b->dy, b->h4, b->w_fcp, GN, 4 * GC, GC); }
static void lm_f(struct bufs *b) { wf_matmul_forward(b->logits, b->x, b->wte, NULL, GN, GC, GVP); }
static void lm_b(struct bufs *b) { wf_matmul_backward(b->dx, b->dwte, NULL, b->logits, b->x, b->wte, GN, GC, GVP); }
static void xe_f(struct bufs *b) { wf_xent_stats(b->mx, b->se, b->tl, b->logits, b->tok, GN, GV, GVP, 0); wf_xent_loss(b->loss, b->mx, b->se, b->tl, GN); }
static void xe_b(struct bufs *b) { wf_xent_backward(b->logits, b->logits, b->mx, b->se, b->tok, 1.0f / GN, GN, GV, GVP, 0); }
static void adamw(struct bufs *b) { wf_adamw_update(b->p, b->m, b->v, b->g, b->nparams, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f); }
static void sumsq(struct bufs *b) { volatile double s = wf_sumsq(b->g, b->nparams); (void)s; }
static void scale(struct bufs *b) { wf_scale(b->g, 1.0f, b->nparams); }
/* clang-format on */

static void run_op(void *p)
{
  void **pp = p;
  ((const struct op *)pp[0])->fn(pp[1]);
}

/* The performance bar: the step's rate against the large-square sgemm rate, both
 * measured the same way (wall, and CPU time per thread). */
static void print_bar(double flops, double total_ms, double total_cpu_ms, int threads)
{
  struct gemm_case sq = {
      FWD, 1024, 1024, 1024, randn(1024 * 1024, 50), randn(1024 * 1024, 51), randn(1024 * 1024, 52),
      1};
  double sq_cpu, sq_t = median_time_cpu(run_gemm, &sq, &sq_cpu);
  double sq_fl = 2.0 * 1024 * 1024 * 1024;
  printf("sgemm 1024^3 through wf_matmul_forward: %.1f GFLOP/s wall, %.1f on free cores;\n"
         "step / sgemm: %.0f%% wall, %.0f%% on free cores\n",
         sq_fl / sq_t / 1e9, sq_fl / (sq_cpu / threads) / 1e9,
         100.0 * (flops / (total_ms / 1e3)) / (sq_fl / sq_t),
         100.0 * (flops / (total_cpu_ms / 1e3)) / (sq_fl / (sq_cpu / threads)));
  free(sq.x), free(sq.w), free(sq.y);
}

static void ops_table(int threads)
{
  const double C = GC, N = GN, mm = 2.0 * N * C * C;
  /* 6 * params * tokens convention: fwd 2 N C OC, bwd 4 N C OC */
  const struct op ops[] = {
      {"encoder fwd", 1, 0, enc_f},
      {"encoder bwd", 1, 0, enc_b},
      {"layernorm fwd", 2 * GL + 1, 0, ln_f},
      {"layernorm bwd", 2 * GL + 1, 0, ln_b},
      {"qkv fwd", GL, 3 * mm, qkv_f},
      {"qkv bwd", GL, 6 * mm, qkv_b},
      {"attention fwd", GL, 2.0 * 2 * GB * GT * GT * C, att_f},
      {"attention bwd", GL, 4.0 * 2 * GB * GT * GT * C, att_b},
      {"attproj fwd", GL, mm, ap_f},
      {"attproj bwd", GL, 2 * mm, ap_b},
      {"residual fwd", 2 * GL, 0, res_f},
      {"residual bwd", 2 * GL, 0, res_b},
      {"fc fwd", GL, 4 * mm, fc_f},
      {"fc bwd", GL, 8 * mm, fc_b},
      {"gelu fwd", GL, 0, gelu_f},
      {"gelu bwd", GL, 0, gelu_b},
      {"fcproj fwd", GL, 4 * mm, fcp_f},
      {"fcproj bwd", GL, 8 * mm, fcp_b},
      {"lm head fwd", 1, 2.0 * N * C * GVP, lm_f},
      {"lm head bwd", 1, 4.0 * N * C * GVP, lm_b},
      {"xent stats+loss", 1, 0, xe_f},
      {"xent bwd", 1, 0, xe_b},
      {"adamw 124M", 1, 0, adamw},
      {"sumsq 124M", 1, 0, sumsq},
      {"scale 124M", 1, 0, scale},
  };
  /* gpt2-small with Vp = 50304: wte + wpe + 12 layers + final layernorm */
  size_t nparams = (size_t)GVP * GC + 1024 * GC + (size_t)GL * (12 * GC * GC + 13 * GC) + 2 * GC;
  struct bufs b = alloc_bufs(nparams);
  wf_kernels_set_threads(threads);
  printf("\nkernels at gpt2-small shapes (B %d, T %d, C %d, NH %d, Vp %d), %d thread(s)\n", GB, GT,
         GC, GNH, GVP, threads);
  printf("(cpu/nt: process CPU time divided by the thread budget, what the op costs on "
         "free cores;\n the wall time also counts waits for cores that other jobs hold)\n");
  printf("%-16s %9s %6s %10s %10s %9s\n", "op", "ms/call", "calls", "ms/step", "cpu/nt ms",
         "GFLOP/s");
  double total = 0, total_cpu = 0, flops = 0, gemm_ms = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    void *ctx[2] = {(void *)&ops[i], &b};
    double cpu;
    double t = median_time_cpu(run_op, ctx, &cpu);
    double step_ms = 1e3 * t * ops[i].per_step, cpu_ms = 1e3 * cpu * ops[i].per_step / threads;
    total += step_ms;
    total_cpu += cpu_ms;
    flops += ops[i].flops * ops[i].per_step;
    if (ops[i].flops > 0 && strstr(ops[i].name, "attention") == NULL)
      gemm_ms += step_ms;
    printf("%-16s %9.3f %6d %10.1f %10.1f", ops[i].name, 1e3 * t, ops[i].per_step, step_ms, cpu_ms);
    if (ops[i].flops > 0)
      printf(" %9.1f", ops[i].flops / t / 1e9);
    printf("\n");
    fflush(stdout);
  }
  printf("step estimate: %.0f ms wall (linear-layer GEMMs %.0f ms), %.1f GFLOP -> %.1f GFLOP/s;"
         "\n               %.0f ms of CPU per thread -> %.1f GFLOP/s on free cores\n",
         total, gemm_ms, flops / 1e9, flops / (total / 1e3) / 1e9, total_cpu,
         flops / (total_cpu / 1e3) / 1e9);
  print_bar(flops, total, total_cpu, threads);
  free(b.p), free(b.m), free(b.v), free(b.g);
}

/* ---- table 3: attention at long T -------------------------------------------------- */

struct att_case {
  int B, T, C, NH;
  float *out, *att, *qkv, *dqkv, *scratch, *dout;
};

static void att_long_f(void *p)
{
  struct att_case *a = p;
  wf_attention_forward(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH);
}

static void att_long_b(void *p)
{
  struct att_case *a = p;
  wf_attention_backward(a->dqkv, a->scratch, a->dout, a->qkv, a->att, a->B, a->T, a->C, a->NH);
}

static void attention_table(int threads)
{
  int Ts[] = {64, 256, 1024};
  wf_kernels_set_threads(threads);
  printf("\nattention, B*T = 1024 tokens, C 768, NH 12, %d thread(s); GFLOP/s count the "
         "full T x T products\n%-6s %10s %10s %10s %10s\n",
         threads, "T", "fwd ms", "fwd GF/s", "bwd ms", "bwd GF/s");
  for (int i = 0; i < 3; i++) {
    int T = Ts[i], B = 1024 / T;
    size_t nq = (size_t)B * T * 3 * GC, na = (size_t)B * GNH * T * T, no = (size_t)B * T * GC;
    struct att_case a = {B,
                         T,
                         GC,
                         GNH,
                         randn(no, 40),
                         randn(na, 41),
                         randn(nq, 42),
                         randn(nq, 43),
                         randn(na, 44),
                         randn(no, 45)};
    double fl = 2.0 * 2 * B * (double)T * T * GC;
    double tf = median_time(att_long_f, &a), tb = median_time(att_long_b, &a);
    printf("%-6d %10.2f %10.1f %10.2f %10.1f\n", T, 1e3 * tf, fl / tf / 1e9, 1e3 * tb,
           2 * fl / tb / 1e9);
    free(a.out), free(a.att), free(a.qkv), free(a.dqkv), free(a.scratch), free(a.dout);
  }
}

int main(int argc, char **argv)
{
  int max_threads = 2, quick = 0, ops_only = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "--best") == 0)
      report_best = 1;
    else if (strcmp(argv[i], "--ops") == 0)
      ops_only = 1;
    else if (atoi(argv[i]) > 0)
      max_threads = atoi(argv[i]);
    else {
      fprintf(stderr, "usage: gemm [max_threads] [--quick] [--best] [--ops]\n");
      return 2;
    }
  }
  if (!ops_only)
    gemm_table(max_threads, quick);
  ops_table(max_threads);
  attention_table(max_threads);
  return 0;
}
