/*
 * kernels.c - every entry of the device's kernel table (kernels/wf_kreg.h), timed at
 * given shapes, against the device's peaks.
 *
 *   kernels [--device auto|cpu|cuda] [--precision fp32|bf16] [-B 16] [-T 1024] [-C 768]
 *           [--heads 12] [-V 50257] [--layers 12] [--threads N] [--tf32]
 *           [--attention auto|cudnn|flash|reference] [--reps N] [--only SUBSTRING]
 *           [--json FILE]
 *
 * Defaults are GPT-2 124M (gpt2-small) at B 16, T 1024. The device is the GPU when one
 * is usable (auto), else the CPU; --device cuda without a GPU exits 77 (no GPU) or 1
 * (a GPU weft cannot use), as the GPU tests do.
 *
 * Columns: ms per call (events around `reps` back-to-back calls on one stream, after
 * two warm-up calls; reps chosen so a row takes ~50 ms, unless --reps), FLOPs and bytes
 * per call, achieved TFLOP/s and GB/s, and each as a percent of the device's peak:
 *  - FLOPs are the op's arithmetic: 2·m·n·k per GEMM; causal attention 2·B·T²·C forward
 *    and 2.5 times that backward (FlashAttention's convention); elementwise and
 *    reduction ops count the operations of their formula with exp, tanh, log and sqrt
 *    as one each (nominal: their figure of merit is GB/s).
 *  - Bytes are the least the op must move as the table defines it: each input read
 *    once, each output written once, an output it adds into ("backward adds into
 *    gradients") read and written; an activation (the table's `void *` arguments) in
 *    the table's format, 2 bytes at bf16 and 4 at fp32, everything else 4, and 2 bytes an
 *    element for the bf16 entries' bf16 tensors.
 *  - The table: at --precision bf16, the device's bf16 table (storage.h), the kernels a
 *    precision=bf16 run calls; at fp32 the fp32 table.
 *  - Peak FLOP/s: GEMMs at --precision bf16 against the 16-bit tensor cores, at fp32
 *    against fp32 without TF32 (weft's default, runtime.allow_tf32 false); the bf16
 *    attention entries against the 16-bit tensor cores; everything else against fp32.
 *  - Attention runs the path runtime.attention would take (--attention; default as the
 *    worker: auto, i.e. cuDNN else the flash kernels, at bf16, the fp32 reference at
 *    fp32); the module logs the path each shape takes. GPU: runtime/peak.c's datasheet table (what
 * MFU divides by) and the datasheet's HBM bandwidth. CPU: the nominal fp32 peak of the threads'
 * cores (their bf16 dot-product peak for the bf16 GEMMs and attention when oneDNN runs the bf16
 * GEMMs), and a bandwidth measured here (a STREAM triad over 3 x 128 MiB on those threads).
 *
 * The rows it times, and their buffers, are in kernels_rows.c.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "threads.h"
#include "wf_build_id.h"
#include "wf_config.h"
#include "wf_device.h"
#include "wf_gpu.h"
#include "wf_kernels.h"
#include "wf_peak.h"

#include "kernels_int.h"

/* ---- timing ------------------------------------------------------------------------ */

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of `reps` back-to-back calls, between two events on the stream. */
static double time_calls(bench *b, const row *r, int reps)
{
  wf_event *e0 = NULL, *e1 = NULL;
  double sec = -1;
  if (wf_dev_event_create(b->dev, &e0) != WF_OK || wf_dev_event_create(b->dev, &e1) != WF_OK)
    goto out;
  wf_dev_event_record(b->dev, e0, b->s);
  for (int i = 0; i < reps; i++)
    r->run(b);
  wf_dev_event_record(b->dev, e1, b->s);
  if (wf_dev_event_sync(b->dev, e1) == WF_OK && wf_dev_event_elapsed(b->dev, e0, e1, &sec) == WF_OK)
    sec /= reps;
out:
  wf_dev_event_destroy(b->dev, e0);
  wf_dev_event_destroy(b->dev, e1);
  return sec;
}

/* Two warm-up calls (they also make the row's buffers), one timed call to size the
 * run, then `reps` calls (or enough for ~50 ms, 3 to 1000). Negative on failure. */
static double time_row(bench *b, const row *r, int reps)
{
  r->run(b);
  r->run(b);
  if (b->failed || wf_dev_stream_sync(b->dev, b->s) != WF_OK || wf_dev_check(b->dev) != WF_OK)
    return -1;
  if (reps <= 0) {
    double once = time_calls(b, r, 1);
    if (once < 0)
      return -1;
    reps = once > 0 ? (int)WF_MIN(1000.0, WF_MAX(3.0, 0.05 / once)) : 1000;
  }
  double sec = time_calls(b, r, reps);
  return wf_dev_check(b->dev) == WF_OK ? sec : -1;
}

/* ---- the CPU's memory bandwidth: a STREAM triad on the kernels' threads ------------- */

typedef struct triad {
  float *a, *b, *c;
  size_t lo, hi;
} triad;

static void *triad_run(void *arg)
{
  triad *t = arg;
  for (size_t i = t->lo; i < t->hi; i++)
    t->a[i] = t->b[i] + 3.0f * t->c[i];
  return NULL;
}

/* GB/s of a[i] = b[i] + 3 c[i] over 3 x 128 MiB, best of 5, counting 12 bytes per
 * element (STREAM's convention). 0 when it cannot run. */
static double cpu_bandwidth_gbs(int threads)
{
  size_t n = (size_t)32 << 20;
  float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
  double best = 0;
  pthread_t tid[256];
  triad parts[256];
  threads = WF_MAX(1, WF_MIN(threads, 256));
  for (size_t i = 0; a && b && c && i < n; i++)
    a[i] = 0, b[i] = 1, c[i] = 2; /* touch every page before timing */
  for (int rep = 0; a && b && c && rep < 5; rep++) {
    double t0 = now_s();
    for (int t = 0; t < threads; t++) {
      parts[t] = (triad){a, b, c, n * t / threads, n * (t + 1) / threads};
      pthread_create(&tid[t], NULL, triad_run, &parts[t]);
    }
    for (int t = 0; t < threads; t++)
      pthread_join(tid[t], NULL);
    best = WF_MAX(best, 12.0 * n / (now_s() - t0) / 1e9);
  }
  free(a), free(b), free(c);
  return best;
}

/* ---- the device, the peaks, the table ----------------------------------------------- */

typedef struct opts {
  const char *device, *only, *json;
  int reps, threads, tf32;
  int attention; /* a wf_attention_impl, or -1: the worker's rule for the precision */
  shape sh;
} opts;

typedef struct peaks {
  double gemm, bf16, fp32, mem_gbs; /* TFLOP/s, TFLOP/s, TFLOP/s, GB/s; 0 = unknown */
  char what[512];
} peaks;

static int usage(const char *msg)
{
  fprintf(stderr,
          "kernels: %s\nusage: kernels [--device auto|cpu|cuda] [--precision fp32|bf16] [-B 16] "
          "[-T 1024] [-C 768] [--heads 12] [-V 50257] [--layers 12] [--threads N] [--tf32] "
          "[--attention auto|cudnn|flash|reference] [--reps N] [--only SUBSTRING] [--json FILE]\n",
          msg);
  return 2;
}

/* --attention's value as a wf_attention_impl, or -1 */
static int attention_arg(const char *v)
{
  static const char *names[] = {"auto", "cudnn", "flash", "reference"};
  for (int i = 0; i < (int)WF_ARRAY_LEN(names); i++)
    if (!strcmp(v, names[i]))
      return i;
  return -1;
}

static int parse(int argc, char **argv, opts *o)
{
  *o = (opts){.device = "auto", .attention = -1, .sh = {16, 1024, 768, 12, 50257, 12, WF_PREC_NO}};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int *num = !strcmp(a, "-B")          ? &o->sh.B
               : !strcmp(a, "-T")        ? &o->sh.T
               : !strcmp(a, "-C")        ? &o->sh.C
               : !strcmp(a, "--heads")   ? &o->sh.NH
               : !strcmp(a, "-V")        ? &o->sh.V
               : !strcmp(a, "--layers")  ? &o->sh.L
               : !strcmp(a, "--threads") ? &o->threads
               : !strcmp(a, "--reps")    ? &o->reps
                                         : NULL;
    if (!strcmp(a, "--tf32")) {
      o->tf32 = 1;
      continue;
    }
    if (!v)
      return usage(a);
    i++;
    if (num)
      *num = atoi(v);
    else if (!strcmp(a, "--device"))
      o->device = v;
    else if (!strcmp(a, "--attention") && (o->attention = attention_arg(v)) < 0)
      return usage(a);
    else if (!strcmp(a, "--attention"))
      continue;
    else if (!strcmp(a, "--only"))
      o->only = v;
    else if (!strcmp(a, "--json"))
      o->json = v;
    else if (!strcmp(a, "--precision") && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
      o->sh.lowp = !strcmp(v, "bf16") ? WF_PREC_BF16 : WF_PREC_NO;
    else
      return usage(a);
  }
  const shape *s = &o->sh;
  if (s->B < 1 || s->T < 1 || s->C < 1 || s->NH < 1 || s->C % s->NH || s->V < 1 || s->L < 1)
    return usage("shapes must be positive and C a multiple of the heads");
  return 0;
}

/* The device: the GPU (auto or cuda) or the CPU. Returns 0, or the exit status. */
static int open_device(const opts *o, bench *b, wf_gpu **gpu, char *name, size_t len)
{
  char why[1024] = "";
  wf_status st = WF_ENODEV;
  if (strcmp(o->device, "cpu") != 0)
    st = wf_gpu_open(gpu, why, sizeof why);
  if (st == WF_OK && wf_gpu_set_device(*gpu, 0) == WF_OK &&
      wf_dev_open_cuda(&b->dev, *gpu, why, sizeof why) == WF_OK) {
    wf_gpu_device_name(*gpu, 0, name, len);
    return 0;
  }
  if (!strcmp(o->device, "cuda")) {
    printf("kernels: no GPU: %s\n", why);
    return st == WF_ENODEV ? 77 : 1;
  }
  if (strcmp(o->device, "cpu") != 0)
    printf("kernels: no GPU (%s); timing the CPU\n", why);
  b->dev = wf_dev_cpu();
  if (o->threads > 0)
    wf_kernels_set_threads(o->threads);
  snprintf(name, len, "CPU, %d thread(s)", wf_kernels_threads());
  return 0;
}

static void device_peaks(const opts *o, wf_gpu *gpu, const char *name, peaks *p)
{
  wf_peak pk;
  int bf16 = o->sh.lowp != WF_PREC_NO;
  *p = (peaks){0};
  if (gpu && wf_peak_gpu(name, &pk)) {
    p->gemm = bf16 ? pk.bf16 : o->tf32 ? pk.tf32 : pk.fp32;
    p->bf16 = pk.bf16;
    p->fp32 = pk.fp32;
    p->mem_gbs = pk.mem_gbs;
    snprintf(p->what, sizeof p->what, "%s", pk.source);
  } else if (gpu) {
    snprintf(p->what, sizeof p->what, "%s is not in runtime/peak.c's table: no percentages", name);
  } else {
    int threads = wf_kernels_threads();
    double gbs = cpu_bandwidth_gbs(threads);
    /* bf16 GEMMs on oneDNN run on the bf16 dot-product units; widened, on the FMAs */
    bool dots = bf16 && wf_kernels_bf16_gemm_fast();
    if (wf_peak_cpu(threads, &pk)) {
      p->fp32 = pk.fp32;
      p->bf16 = dots ? pk.bf16 : pk.fp32;
      p->gemm = p->bf16;
    }
    p->mem_gbs = gbs;
    snprintf(p->what, sizeof p->what, "%s; memory %.1f GB/s measured (STREAM triad, %d threads)",
             p->fp32 <= 0 ? "CPU peak unknown"
             : dots       ? pk.source_bf16
                          : pk.source,
             gbs, threads);
  }
}

static json_t *row_json(const row *r, double sec, double fl, double by, int gemm, const peaks *p)
{
  double pk = gemm == 2 ? p->bf16 : gemm ? p->gemm : p->fp32;
  json_t *o = json_pack("{s:s, s:f, s:f, s:f}", "kernel", r->label, "ms", sec * 1e3, "flops", fl,
                        "bytes", by);
  json_object_set_new(o, "tflops", json_real(sec > 0 ? fl / sec / 1e12 : 0));
  json_object_set_new(o, "gbs", json_real(sec > 0 ? by / sec / 1e9 : 0));
  json_object_set_new(o, "pct_peak_flops",
                      pk > 0 && sec > 0 ? json_real(100 * fl / sec / 1e12 / pk) : json_null());
  json_object_set_new(o, "pct_peak_bw",
                      p->mem_gbs > 0 && sec > 0 ? json_real(100 * by / sec / 1e9 / p->mem_gbs)
                                                : json_null());
  return o;
}

static void print_row(const json_t *o)
{
  json_t *pf = json_object_get(o, "pct_peak_flops"), *pb = json_object_get(o, "pct_peak_bw");
  char f[16] = "-", m[16] = "-";
  if (json_is_real(pf))
    snprintf(f, sizeof f, "%.1f", json_real_value(pf));
  if (json_is_real(pb))
    snprintf(m, sizeof m, "%.1f", json_real_value(pb));
  printf("| %-38s | %9.4f | %9.3f | %9.1f | %8.2f | %8.1f | %6s | %6s |\n",
         json_string_value(json_object_get(o, "kernel")), json_real_value(json_object_get(o, "ms")),
         json_real_value(json_object_get(o, "flops")) / 1e9,
         json_real_value(json_object_get(o, "bytes")) / 1e6,
         json_real_value(json_object_get(o, "tflops")), json_real_value(json_object_get(o, "gbs")),
         f, m);
}

/* Time every row (or those whose label contains --only); failures are rows too. */
static int run_rows(bench *b, const opts *o, const peaks *p, json_t *out)
{
  int failures = 0;
  double total = 0;
  printf("| %-38s | %9s | %9s | %9s | %8s | %8s | %6s | %6s |\n", "kernel", "ms", "GFLOP", "MB",
         "TFLOP/s", "GB/s", "%FLOP", "%BW");
  printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", "----------------------------------------", "----------:",
         "----------:", "----------:", "---------:", "---------:", "-------:", "-------:");
  for (size_t i = 0; i < kbench_n_rows; i++) {
    const row *r = &kbench_rows[i];
    if (o->only && !strstr(r->label, o->only))
      continue;
    double fl = 0, by = 0, sec = time_row(b, r, o->reps);
    r->cost(b, &fl, &by);
    if (sec < 0) {
      printf("| %-38s | FAILED (see the log above) | | | | | | |\n", r->label);
      json_array_append_new(out, json_pack("{s:s, s:s}", "kernel", r->label, "error",
                                           "the launch or its buffers failed"));
      failures++;
      b->failed = 0;
      continue;
    }
    json_t *j = row_json(r, sec, fl, by, r->gemm, p);
    print_row(j);
    json_array_append_new(out, j);
    total += sec;
  }
  printf("total of the rows: %.3f ms\n", total * 1e3);
  return failures;
}

static void write_json(const char *path, const opts *o, const char *name, const peaks *p,
                       json_t *rows_json)
{
  const shape *s = &o->sh;
  json_t *j = json_pack("{s:s, s:s, s:s, s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:{s:f, s:f, s:f, s:s}, "
                        "s:O}",
                        "weft_build", wf_build_id(), "device", name, "precision",
                        s->lowp == WF_PREC_NO ? "fp32" : "bf16", "shape", "B", s->B, "T", s->T, "C",
                        s->C, "NH", s->NH, "V", s->V, "layers", s->L, "peaks", "gemm_tflops",
                        p->gemm, "fp32_tflops", p->fp32, "mem_gbs", p->mem_gbs, "source", p->what,
                        "rows", rows_json);
  if (!j || json_dump_file(j, path, JSON_INDENT(1)) != 0)
    fprintf(stderr, "kernels: cannot write %s\n", path);
  json_decref(j);
}

int main(int argc, char **argv)
{
  opts o;
  bench b = {0};
  wf_gpu *gpu = NULL;
  char name[160] = "";
  peaks p;
  int rc = parse(argc, argv, &o);
  if (rc)
    return rc;
  if (kbench_unbenched())
    return 1;
  if ((rc = open_device(&o, &b, &gpu, name, sizeof name)) != 0)
    return rc;
  /* at 16 bits, the table of that format: the kernels a run at that precision calls */
  b.k = wf_dev_kernels(b.dev, o.sh.lowp);
  b.sh = o.sh;
  WF_K(b.k, matmul)->set_tf32(o.tf32);
  /* as the worker sets runtime.attention: auto takes the tensor-core paths only in bf16 */
  WF_K(b.k, attention)
      ->set_impl(o.attention >= 0 && !(o.attention == WF_ATTN_AUTO && o.sh.lowp == WF_PREC_NO)
                     ? o.attention
                 : o.sh.lowp == WF_PREC_NO ? WF_ATTN_REFERENCE
                                           : WF_ATTN_AUTO);
  if (wf_dev_stream_create(b.dev, &b.s) != WF_OK)
    return 1;
  device_peaks(&o, gpu, name, &p);
  const shape *s = &o.sh;
  printf("bench/kernels on %s: %s GEMMs%s, activations stored in %s; B %d, T %d, C %d, heads "
         "%d, V %d, %d layers "
         "(%.1fM parameters)\npeaks: GEMMs %.1f TFLOP/s, the rest %.1f TFLOP/s, memory %.0f GB/s "
         "(%s)\n",
         name, s->lowp == WF_PREC_NO ? "fp32" : "bf16",
         s->lowp == WF_PREC_NO && o.tf32 ? " (TF32)" : "", wf_dtype_name(b.k->dt), s->B, s->T, s->C,
         s->NH, s->V, s->L, kbench_params(s) / 1e6, p.gemm, p.fp32, p.mem_gbs, p.what);
  json_t *out = json_array();
  int failures = run_rows(&b, &o, &p, out);
  if (o.json)
    write_json(o.json, &o, name, &p, out);
  json_decref(out);
  for (int r = 0; r < N_ROLES; r++)
    wf_dev_free(b.dev, b.buf[r]);
  wf_dev_stream_destroy(b.dev, b.s);
  wf_dev_close(b.dev);
  wf_gpu_close(gpu);
  return failures ? 1 : 0;
}
