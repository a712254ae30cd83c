/*
 * pipeline.c - the pipeline bubble and the activation memory of each schedule, measured
 * by the real trainer, beside the theory.
 *
 *   mpirun -np 2 build/bench/pipeline [steps (default 6)]
 *
 * On pp = 2 (the world is the pipeline: dp = tp = 1), for GPipe, 1F1B and interleaved
 * 1F1B (v = 2), and m = p .. 8p micro-batches of a fixed size (2 sequences of 128
 * tokens, so a step's work grows with m), it trains a model of 8 layers, d_model 256,
 * 8 heads, vocab 256 on the synthetic source and reports, as medians over the steps
 * after the first (which pays page faults and thread start-up):
 *  - bubble: the measured idle share of the schedule's span, 1 - the pp ranks' mean
 *    forward/backward compute time / the longest rank's schedule wall time;
 *  - theory: (p - 1) / (m + p - 1), and (p - 1) / (v m + p - 1) interleaved;
 *  - slots: the most micro-batches (x chunks) each stage held at once, against the
 *    bound (1F1B: min(p - r, m); GPipe: m);
 *  - act MiB: each stage's peak activation memory (slots x one slot's bytes);
 *  - step time, tokens/s and the job's GFLOP/s (wf_model_flops_per_step), and that as a
 *    share of p ranks' sgemm rate measured before the table (a 1024^3 GEMM through the
 *    kernels on every rank at once).
 * Never a test: it prints a table.
 */
#include <stdio.h>
#include <stdlib.h>

#include "mesh_run.h"

enum { P = 2, MB_ROWS = 2, SEQ = 128 };

static double get_bubble(const wf_train_step_info *i) { return i->bubble; }
static double get_step_ms(const wf_train_step_info *i) { return i->step_ms; }
static double get_tok_s(const wf_train_step_info *i) { return i->tokens_per_s; }
static double get_tflops(const wf_train_step_info *i) { return i->tflops; }

static const char *sched_name(int s) { return s == 0 ? "gpipe" : s == 1 ? "1f1b" : "interleaved"; }

/* The slots bound of stage r (interleaved: whatever the list holds; printed as "-"). */
static int slot_bound(int sched, int r, int m)
{
  return sched == 0 ? m : sched == 1 ? (P - r < m ? P - r : m) : -1;
}

static void print_row(int sched, int m, const bench_steps *s, double gemm)
{
  const wf_train_step_info *last = &s->step[s->n - 1];
  double bubble = bench_median(s, 1, get_bubble), theory = last->bubble_theory;
  double tflops = bench_median(s, 1, get_tflops);
  char slots[32], bound[32], act[48];
  snprintf(slots, sizeof slots, "%d/%d", last->stage_peak_slots[0], last->stage_peak_slots[1]);
  if (sched < 2)
    snprintf(bound, sizeof bound, "%d/%d", slot_bound(sched, 0, m), slot_bound(sched, 1, m));
  else
    snprintf(bound, sizeof bound, "-");
  snprintf(act, sizeof act, "%.2f/%.2f", (double)last->stage_act_bytes[0] / (1 << 20),
           (double)last->stage_act_bytes[1] / (1 << 20));
  printf("%-11s %3d %8.1f%% %8.1f%% %+7.1f %7s %7s %13s %9.1f %8.0f %8.1f %6.1f%%\n",
         sched_name(sched), m, 100 * bubble, 100 * theory, 100 * (bubble - theory), slots, bound,
         act, bench_median(s, 1, get_step_ms), bench_median(s, 1, get_tok_s), tflops * 1e3,
         100 * tflops * 1e3 / (gemm * P));
  fflush(stdout);
}

static int run(const bench_env *e, int sched, int m, int steps, double gemm)
{
  bench_kv kv = {0};
  bench_kv_add(&kv, "mesh.pp=%d", P);
  bench_kv_add(&kv, "train.schedule=%s", sched_name(sched));
  bench_kv_add(&kv, "parallel.virtual_stages=%d", sched == 2 ? 2 : 1);
  bench_kv_add(&kv, "train.microbatches=%d", m);
  bench_kv_add(&kv, "train.batch_size=%d", m * MB_ROWS);
  bench_kv_add(&kv, "train.steps=%d", steps);
  bench_kv_add(&kv, "model.seq_len=%d", SEQ);
  bench_kv_add(&kv, "model.layers=8");
  bench_kv_add(&kv, "model.d_model=256");
  bench_kv_add(&kv, "model.heads=8");
  bench_kv_add(&kv, "train.warmup=1");
  bench_steps s;
  if (bench_train(e, &kv, &s) != WF_OK || s.n < 2)
    return 1;
  if (e->rank == 0)
    print_row(sched, m, &s, gemm);
  return 0;
}

int main(int argc, char **argv)
{
  bench_env e;
  int steps, rc = bench_start(&e, &argc, &argv, "pipeline", P, &steps);
  if (rc)
    return rc;
  double gemm = bench_gemm_gflops(&e, 1024);
  if (e.rank == 0)
    printf("pp %d, %d thread(s) per rank; model L8 C256 NH8 V256, micro-batch %d x %d tokens;\n"
           "medians of steps 2..%d. sgemm 1024^3 per rank, best of 20: %.1f GFLOP/s.\n"
           "bubble = 1 - mean compute time of the pp ranks / the longest schedule; slots = "
           "micro-batches\n"
           "held at the peak by stage 0/1, bound = 1F1B min(p - r, m), GPipe m.\n\n"
           "%-11s %3s %9s %9s %7s %7s %7s %13s %9s %8s %8s %7s\n",
           P, e.threads, MB_ROWS, SEQ, steps, gemm, "schedule", "m", "bubble", "theory", "diff",
           "slots", "bound", "act MiB s0/s1", "step_ms", "tok/s", "GFLOP/s", "%sgemm");
  for (int sched = 0; sched < 3 && rc == 0; sched++)
    for (int m = P; m <= 8 * P && rc == 0; m *= 2)
      rc = run(&e, sched, m, steps, gemm);
  bench_env_fini(&e);
  return rc;
}
