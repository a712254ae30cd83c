/*
 * tensor.c - tensor parallelism against data parallelism on the same ranks, measured by
 * the real trainer.
 *
 *   mpirun -np 2 build/bench/tensor [steps (default 6)]
 *
 * For each model, the same global batch is trained on two ranks four ways: dp 2 (each
 * rank the whole model on half the batch), dp 2 with ZeRO-1 (AdamW state and update
 * sharded), tp 2 (each rank half of every layer on the whole batch, Megatron's
 * column/row split with a vocabulary-parallel head), and tp 2 with sequence
 * parallelism. Medians over the steps after the first:
 *  - step_ms, tokens/s, the job's GFLOP/s (wf_model_flops_per_step: the same model FLOPs
 *    whatever the mesh) and that against 2 ranks' sgemm rate (a 1024^3 GEMM through the
 *    kernels on both ranks at once, measured before the table);
 *  - tp_ms: rank 0's time inside the tensor-parallel collectives (all-reduce, or
 *    all-gather and reduce-scatter with sequence parallelism), waiting for the peer
 *    included, and its share of the step;
 *  - dp_ms: the data-parallel gradient reduction not hidden behind backward;
 *  - params and activation MiB per rank.
 * Never a test: it prints a table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_run.h"

typedef struct model {
  const char *name;
  int layers, d_model, heads, seq, vocab, batch;
} model;

static const model MODELS[] = {
    {"L4 C256 NH4 V256 T128", 4, 256, 4, 128, 256, 8},
    {"L4 C768 NH12 V8192 T128", 4, 768, 12, 128, 8192, 4},
};

static const char *const MESHES[][2] = {
    {"dp 2", "mesh.tp=1"},
    {"dp 2 ZeRO-1", "mesh.tp=1 optim.zero=1"},
    {"tp 2", "mesh.tp=2"},
    {"tp 2 + seq", "mesh.tp=2 parallel.sequence=true"},
};

static double get_step_ms(const wf_train_step_info *i) { return i->step_ms; }
static double get_tok_s(const wf_train_step_info *i) { return i->tokens_per_s; }
static double get_tflops(const wf_train_step_info *i) { return i->tflops; }
static double get_tp_ms(const wf_train_step_info *i) { return i->tp_ms; }
static double get_dp_ms(const wf_train_step_info *i) { return i->comm_ms; }

/* Key=value arguments of one run; mesh may hold two separated by a space. */
static void build_args(bench_kv *kv, const model *md, const char *mesh, int steps)
{
  const char *sp = strchr(mesh, ' ');
  bench_kv_add(kv, "%.*s", sp ? (int)(sp - mesh) : 63, mesh);
  if (sp)
    bench_kv_add(kv, "%s", sp + 1);
  bench_kv_add(kv, "model.layers=%d", md->layers);
  bench_kv_add(kv, "model.d_model=%d", md->d_model);
  bench_kv_add(kv, "model.heads=%d", md->heads);
  bench_kv_add(kv, "model.seq_len=%d", md->seq);
  bench_kv_add(kv, "model.vocab=%d", md->vocab);
  bench_kv_add(kv, "train.batch_size=%d", md->batch);
  bench_kv_add(kv, "train.steps=%d", steps);
  bench_kv_add(kv, "train.warmup=1");
}

static void print_row(const model *md, const char *mesh, const bench_steps *s, double gemm)
{
  double step = bench_median(s, 1, get_step_ms), tp = bench_median(s, 1, get_tp_ms);
  double tflops = bench_median(s, 1, get_tflops);
  const wf_train_step_info *last = &s->step[s->n - 1];
  printf("%-24s %-11s %9.1f %8.0f %8.1f %6.1f%% %7.1f %5.1f%% %6.1f %8.2fM %8.2f\n", md->name, mesh,
         step, bench_median(s, 1, get_tok_s), tflops * 1e3, 100 * tflops * 1e3 / (2 * gemm), tp,
         100 * tp / step, bench_median(s, 1, get_dp_ms), (double)last->params * 1e-6,
         (double)last->stage_act_bytes[0] / (1 << 20));
  fflush(stdout);
}

static int run(const bench_env *e, const model *md, size_t mesh, int steps, double gemm)
{
  bench_kv kv = {0};
  build_args(&kv, md, MESHES[mesh][1], steps);
  bench_steps s;
  if (bench_train(e, &kv, &s) != WF_OK || s.n < 2)
    return 1;
  if (e->rank == 0)
    print_row(md, MESHES[mesh][0], &s, gemm);
  return 0;
}

int main(int argc, char **argv)
{
  bench_env e;
  int steps, rc = bench_start(&e, &argc, &argv, "tensor", 2, &steps);
  if (rc)
    return rc;
  double gemm = bench_gemm_gflops(&e, 1024);
  if (e.rank == 0)
    printf("2 ranks, %d thread(s) each; the same global batch on every mesh; medians of steps\n"
           "2..%d. sgemm 1024^3 per rank, best of 20: %.1f GFLOP/s. tp_ms: rank 0 inside\n"
           "tp collectives (waits included); dp_ms: gradient reduction not hidden by backward.\n\n"
           "%-24s %-11s %9s %8s %8s %7s %7s %6s %6s %9s %8s\n",
           e.threads, steps, gemm, "model", "mesh", "step_ms", "tok/s", "GFLOP/s", "%sgemm",
           "tp_ms", "tp%", "dp_ms", "params/rk", "act MiB");
  for (size_t md = 0; md < sizeof MODELS / sizeof MODELS[0] && rc == 0; md++)
    for (size_t mesh = 0; mesh < sizeof MESHES / sizeof MESHES[0] && rc == 0; mesh++)
      rc = run(&e, &MODELS[md], mesh, steps, gemm);
  bench_env_fini(&e);
  return rc;
}
