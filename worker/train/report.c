/*
 * report.c - what the trainer tells its users: the banner, one line per step (and one
 * more with model parallelism), the evaluation line, a progress bar on a terminal, the
 * train.metrics JSON-lines file, and the peak that MFU divides by.
 *
 * Only rank 0 prints or writes metrics. The step line has a stable key=value form:
 *   step 12/300 loss=3.1234 lr=1.20e-03 grad_norm=0.812 tok/s=5123 tok/s/gpu=1281
 *   tflops=0.041 tflops/gpu=0.010 mfu=23.1% step_ms=99.8 comm_ms=0.0 mem=45.2MiB
 *   params=0.84MiB grads=0.85MiB optim=1.68MiB act=6.20MiB eta=28s
 * (mem: all this rank holds; then by kind: parameters with their GEMM copy, gradients
 * with the dp reduction's buffers, AdamW's state, the step's peak activations).
 * tok/s and tflops are the job's; the /gpu figures divide them over its ranks (one GPU
 * each, as Megatron-LM and torchtitan report throughput), and MFU is tflops/gpu over the
 * per-rank peak. The metrics file carries the same figures in the same units (mfu_pct is
 * the line's percent), with the wall time and the writing rank.
 *
 * The loss-jump watch (train.loss_jump_factor): after LOSS_WARMUP steps, a step whose loss
 * exceeds factor x the running mean of the losses before it gets one WARN. The mean is
 * the plain average over the first LOSS_WINDOW steps, then an exponential moving average
 * with weight 1/LOSS_WINDOW (about the last LOSS_WINDOW steps); the jumped loss joins it,
 * so a loss that settles at a new level is reported once, not at every step.
 *
 * MFU's peak (per rank): train.peak_tflops when given, else the device's nominal peak
 * (worker/device.c: a GPU's dense peak at the run's precision, as Megatron-LM and llm.c
 * report MFU, or the CPU's cores x clock x FMA width), else
 * measured by every rank at once, on its own threads, at a GEMM shape no smaller than
 * the model's: a single-threaded 512^3 stand-in let a dp 2 run of gpt2-small report
 * mfu=111%. All ranks measure together, so ranks that share cores share them as they
 * do when training, and each keeps the best of several runs; the job's peak is the sum
 * over ranks, which the model's own GEMMs running side by side cannot exceed.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "train_int.h"
#include "wf_file.h"
#include "wf_kernels.h"

/* ---- the peak ---------------------------------------------------------------------------- */

#define PEAK_N    1024 /* the measured GEMM: PEAK_N^3 multiply-adds */
#define PEAK_REPS 3    /* best of, after one warm-up */

static double mib(int64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* Best of PEAK_REPS PEAK_N^3 GEMMs through the device's matmul op, in TFLOP/s. */
static wf_status measure_peak(wf_dev *dev, double *tflops)
{
  wf_status st = WF_OK;
  const size_t nn = (size_t)PEAK_N * PEAK_N;
  const wf_kset *k = wf_dev_kernels(dev, WF_DT_F32);
  float *a = NULL;
  wf_dev_view v;
  double best = INFINITY;
  WF_TRY(wf_dev_alloc_floats(dev, &a, 3 * nn));
  WF_TRY(wf_dev_map(dev, &v, a, 2 * nn * sizeof *a, WF_MAP_WRITE));
  for (size_t i = 0; i < 2 * nn; i++)
    ((float *)v.host)[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  WF_TRY(wf_dev_unmap(dev, &v));
  for (int rep = 0; rep <= PEAK_REPS; rep++) {
    WF_TRY(wf_dev_stream_sync(dev, NULL));
    double t = wf_now();
    WF_K(k, matmul)->forward(a + 2 * nn, a, a + nn, NULL, PEAK_N, PEAK_N, PEAK_N, WF_PREC_NO, NULL);
    WF_TRY(wf_dev_stream_sync(dev, NULL));
    t = wf_now() - t;
    if (rep > 0 && t < best) /* rep 0 warms up threads and caches */
      best = t;
  }
  *tflops = best > 0 && isfinite(best) ? 2.0 * nn * PEAK_N / best * 1e-12 : 0;
  st = wf_dev_check(dev);
fail:
  wf_dev_free(dev, a);
  return st;
}

wf_status wf__setup_peak(wf__trainer *tr)
{
  wf_status st = WF_OK;
  tr->peak_tflops = tr->cfg->train.peak_tflops;
  tr->peak_source = "nominal, from train.peak_tflops";
  /* Whether anything reports MFU: the same answer on every rank (a collective follows). */
  bool wanted = !(tr->hooks && tr->hooks->quiet) || tr->cfg->train.metrics[0];
  if (tr->peak_tflops <= 0 && tr->hooks && tr->hooks->peak_tflops > 0) {
    tr->peak_tflops = tr->hooks->peak_tflops;
    tr->peak_source = tr->hooks->peak_source;
  }
  if (tr->peak_tflops > 0 || !wanted)
    return WF_OK;
  float sum = 0;
  double mine = 0;
  if (tr->world)
    WF_TRY(wf_comm_barrier(tr->world)); /* every rank measures at the same time */
  WF_TRY(measure_peak(tr->dev, &mine));
  sum = (float)mine;
  if (tr->world)
    WF_TRY(wf_comm_allreduce(tr->world, &sum, &sum, 1, WF_COMM_F32, WF_COMM_SUM));
  tr->peak_tflops = sum / wf__comm_size(tr->world);
  tr->peak_source = "measured: every rank at once, best of 3 sgemm 1024^3 on its threads "
                    "(set train.peak_tflops for the hardware's nominal peak)";
fail:
  return st;
}

/* ---- the banner ---------------------------------------------------------------------------- */

/* What mixed precision stores in 16 bits, and how the CPU runs its GEMMs: bf16 on
 * bf16 dot products through oneDNN where it can, else (and for fp16) on widened
 * operands, said once. */
static void print_precision(const wf__trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  const char *p = tr->fp16 ? "fp16" : "bf16";
  const wf_optim_scaler *ls = wf_optim_get_scaler(tr->optim);
  fprintf(tr->out,
          "precision %s: activations, pipeline messages and the GEMMs' weight copy in %s; fp32 "
          "master weights, gradients, AdamW state, norm statistics, loss and reductions; GEMMs "
          "accumulate in fp32\n",
          p, p);
  if (tr->fp16 && cfg->optim.loss_scale > 0)
    fprintf(tr->out, "loss scale fixed at %g (steps whose gradients overflow are skipped)\n",
            cfg->optim.loss_scale);
  else if (tr->fp16)
    fprintf(tr->out,
            "dynamic loss scaling from %g: halved and the step skipped when a gradient "
            "overflows, doubled after %d finite steps\n",
            ls->scale, cfg->optim.loss_scale_window);
  if (tr->dev != wf_dev_cpu())
    return;
  if (!tr->fp16 && wf_kernels_bf16_gemm_fast())
    fprintf(tr->out, "bf16 GEMMs on the CPU: %s\n", wf_kernels_bf16_gemm());
  else
    fprintf(tr->out,
            "%s GEMMs on the CPU run on operands widened to fp32 (%s): %s numerics at fp32 "
            "speed\n",
            p, tr->fp16 ? "no fp16 GEMM kernel here" : wf_kernels_bf16_gemm(), p);
}

static const char *schedule_name(const wf__trainer *tr)
{
  switch (tr->cfg->train.schedule) {
  case WF_SCHED_GPIPE: return "GPipe";
  case WF_SCHED_INTERLEAVED: return "interleaved 1F1B";
  default: return "1F1B";
  }
}

/* Layers [*l0, *l1) of model chunk c of pipeline stage s: with the interleaved schedule
 * virtual stage c * pp + s of Lc = L / (pp * chunks) layers each (setup.c's split, the
 * shard's l0 + c * chunk_stride), else the partition's stage s. */
static void chunk_layers(const wf__trainer *tr, int s, int c, int *l0, int *l1)
{
  if (tr->chunks > 1) {
    int lc = tr->dims.L / (tr->pp * tr->chunks);
    *l0 = (c * tr->pp + s) * lc, *l1 = *l0 + lc;
  } else {
    *l0 = tr->bounds[s], *l1 = tr->bounds[s + 1];
  }
}

/* The mesh, the schedule and the layers of every stage's chunks, e.g.
 *   mesh dp 1 x tp 1 x pp 2, interleaved 1F1B schedule with 2 chunks per stage: layers
 *   pp 0 [0,2) [4,6), pp 1 [2,4) [6,8) of 8; rank 0 holds 220416 of 420480 parameters */
/* A pipeline whose stages wait for half of every step or more: (p - 1) / (v m + p - 1)
 * of the schedule is bubble (the interleaved schedule's v chunks divide it). */
static void warn_idle(const wf__trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  wf_sched_params prm = {cfg->train.schedule, tr->pp, tr->M, tr->chunks};
  double idle = tr->pp > 1 ? wf_schedule_bubble_theory(&prm) : 0;
  if (idle < 0.5)
    return;
  WF_WARN("mesh.pp=%d with train.microbatches=%d: every pipeline stage idles %.0f%% of each "
          "step ((p - 1) / (m + p - 1)); use train.microbatches=%d or more (4 x pp) to bring "
          "it under 20%%",
          tr->pp, tr->M, idle * 100, 4 * tr->pp);
}

static void print_mesh(const wf__trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  fprintf(tr->out, "mesh dp %d x tp %d x pp %d%s", tr->D, tr->tp, tr->pp,
          tr->tp > 1 && cfg->parallel.sequence ? " (sequence parallel)" : "");
  if (tr->cp > 1)
    fprintf(tr->out, " x cp %d (%s attention, %d tokens of each sequence per rank)", tr->cp,
            cfg->parallel.cp_mode == WF_CP_ALLGATHER ? "all-gather" : "ring", tr->Tl);
  if (tr->pp == 1) {
    fprintf(tr->out, ": layers [0,%d) on every rank", tr->dims.L);
  } else {
    fprintf(tr->out, ", %s schedule", schedule_name(tr));
    if (tr->chunks > 1)
      fprintf(tr->out, " with %d chunks per stage", tr->chunks);
    fputs(": layers", tr->out);
    for (int s = 0; s < tr->pp; s++) {
      fprintf(tr->out, "%s pp %d", s ? "," : "", s);
      for (int c = 0, l0, l1; c < tr->chunks; c++) {
        chunk_layers(tr, s, c, &l0, &l1);
        fprintf(tr->out, " [%d,%d)", l0, l1);
      }
    }
    fprintf(tr->out, " of %d", tr->dims.L);
  }
  fprintf(tr->out, "; rank %d holds %zu of %zu parameters\n", wf_rt_rank() < 0 ? 0 : wf_rt_rank(),
          wf_model_local_params(tr->model), wf_model_num_params(&tr->dims));
  warn_idle(tr);
}

/* What the dp ranks shard, over which ranks, and why (an fsdp axis chooses ZeRO-3). */
static void print_sharding(const wf__trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  static const char *const what[] = {
      "", "the optimizer state (ZeRO-1)", "the optimizer state and gradients (ZeRO-2)",
      "the parameters, gradients and optimizer state (ZeRO-3, FSDP)"};
  int z = cfg->optim.zero, f = cfg->mesh.fsdp, dp = tr->D;
  if (z <= 0 || z > 3)
    return;
  const char *why = cfg->source[wf_config_key_find("optim.zero")] == WF_SRC_DERIVED
                        ? " (optim.zero=3, chosen by the fsdp mesh axis)"
                        : "";
  if (f > 0 && f < dp)
    fprintf(tr->out,
            "sharding: HSDP: %s sharded within %d fsdp groups of %d dp ranks, replicated across "
            "the groups%s\n",
            what[z], dp / f, f, why);
  else if (tr->cp > 1)
    fprintf(tr->out, "sharding: %s sharded over the %d dp x %d cp ranks%s\n", what[z], dp, tr->cp,
            why);
  else
    fprintf(tr->out, "sharding: %s sharded over the %d dp ranks%s\n", what[z], dp, why);
}

void wf__print_banner(const wf__trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  const wf_model_dims *d = &tr->dims;
  size_t np = wf_model_num_params(d);
  fprintf(tr->out, "model %s: L=%d NH=%d C=%d V=%d (padded %d) maxT=%d, %.3fM parameters (%zu)\n",
          cfg->model.init[0] ? cfg->model.init : cfg->model.preset, d->L, d->NH, d->C, d->V, d->Vp,
          d->maxT, (double)np * 1e-6, np);
  fprintf(tr->out, "data %s\n", wf_data_describe(tr->data));
  double H = wf_data_entropy_floor(tr->data);
  if (!isnan(H))
    fprintf(tr->out, "entropy floor H = %.4f nats\n", H);
  fprintf(tr->out,
          "training %d steps of %d x %d tokens (dp %d x %d micro-batch%s of %d), lr %.2e "
          "warm-up %d cosine to %.2e, clip %g, weight decay %g, seed %llu\n",
          tr->steps, tr->B * tr->M * tr->D, tr->T, tr->D, tr->M, tr->M == 1 ? "" : "es", tr->B,
          cfg->train.lr, cfg->train.warmup, cfg->train.min_lr, cfg->optim.clip,
          cfg->optim.weight_decay, (unsigned long long)cfg->train.seed);
  print_sharding(tr);
  if (tr->tp > 1 || tr->pp > 1 || tr->cp > 1)
    print_mesh(tr);
  if (cfg->parallel.activation_checkpointing == WF_RECOMPUTE_FULL)
    fprintf(tr->out, "activation checkpointing: each layer's intermediates are recomputed in "
                     "backward\n");
  if (cfg->parallel.activation_checkpointing == WF_RECOMPUTE_SELECTIVE)
    fprintf(tr->out, "selective recompute: attention's core (softmax(QK^T)V) is recomputed in "
                     "backward from the kept q, k, v\n");
  if (cfg->precision != WF_PREC_NO)
    print_precision(tr);
  if (tr->peak_tflops > 0)
    fprintf(tr->out, "peak %.3f TFLOP/s per rank for MFU (%s)\n", tr->peak_tflops, tr->peak_source);
  fflush(tr->out);
}

/* ---- per-step lines -------------------------------------------------------------------------- */

void wf__clear_bar(const wf__trainer *tr)
{
  if (tr->bar)
    fputs("\r\033[K", stderr);
}

static void draw_bar(const wf__trainer *tr, const wf_train_step_info *in, double eta)
{
  enum { WIDTH = 30 };
  static const char full[] = "##############################";
  static const char empty[] = "..............................";
  int fill = (int)((long long)WIDTH * in->step / in->steps);
  fprintf(stderr, "\r[%.*s%.*s] %d/%d loss %.4f eta %.0fs", fill, full, WIDTH - fill, empty,
          in->step, in->steps, in->loss, eta);
  fflush(stderr);
}

/* A mixture of experts' figures: the load-balancing loss (z-loss beside it when there is
 * one), the fewest and most tokens an expert of any layer received, the worst layer's
 * imbalance (its most chosen expert's tokens over the mean), and the choices a capacity
 * dropped. */
static void print_experts(const wf__trainer *tr, const wf_train_step_info *in)
{
  if (in->n_expert_layers <= 0)
    return;
  float lo = in->expert_load[0], hi = in->expert_load[1], imb = in->expert_load[2];
  for (int l = 1; l < in->n_expert_layers; l++) {
    const float *x = in->expert_load + 3 * (size_t)l;
    lo = fminf(lo, x[0]), hi = fmaxf(hi, x[1]), imb = fmaxf(imb, x[2]);
  }
  fprintf(tr->out, " aux_loss=%.4f", in->aux_loss);
  if (in->z_loss > 0 && tr->dims.z_coef > 0)
    fprintf(tr->out, " z_loss=%.4f", in->z_loss);
  fprintf(tr->out, " expert_tokens=%.0f..%.0f imbalance=%.2f dropped=%lld", lo, hi, imb,
          (long long)in->dropped_tokens);
}

static void print_step(const wf__trainer *tr, const wf_train_step_info *in, double eta)
{
  wf__clear_bar(tr);
  fprintf(tr->out,
          "step %d/%d loss=%.4f lr=%.2e grad_norm=%.3f tok/s=%.0f tok/s/gpu=%.0f tflops=%.3f "
          "tflops/gpu=%.3f mfu=%.1f%% step_ms=%.1f comm_ms=%.1f mem=%.1fMiB params=%.2fMiB "
          "grads=%.2fMiB optim=%.2fMiB act=%.2fMiB eta=%.0fs",
          in->step, in->steps, in->loss, in->lr, in->grad_norm, in->tokens_per_s,
          in->tokens_per_s_gpu, in->tflops, in->tflops_gpu, in->mfu * 100, in->step_ms, in->comm_ms,
          mib(in->mem_bytes), mib(in->param_bytes), mib(in->grad_bytes), mib(in->optim_bytes),
          mib(in->act_bytes), eta);
  if (tr->fp16) /* the scale this step's backward used, and the skips so far */
    fprintf(tr->out, " loss_scale=%g skipped=%d%s", in->loss_scale, in->skipped_steps,
            in->skipped ? " (this step)" : "");
  print_experts(tr, in);
  fputc('\n', tr->out);
}

/* Model-parallel figures, on the step line's continuation when there are any. */
static void print_parallel(const wf__trainer *tr, const wf_train_step_info *in)
{
  if (tr->tp == 1 && tr->pp == 1 && tr->cp == 1 && !tr->epr)
    return;
  if (tr->tp > 1)
    fprintf(tr->out, "  tp_ms=%.1f", in->tp_ms);
  if (tr->cp > 1)
    fprintf(tr->out, "  cp_ms=%.1f", in->cp_ms);
  if (tr->epr)
    fprintf(tr->out, "  ep_ms=%.1f ep_mib=%.2f", in->ep_ms, mib((int64_t)in->ep_bytes));
  if (tr->pp > 1)
    fprintf(tr->out, "  bubble=%.1f%% theory=%.1f%%", in->bubble * 100, in->bubble_theory * 100);
  fprintf(tr->out, "  act_mib=[");
  for (int s = 0; s < in->n_stages && s < WF_MAX_STAGES; s++)
    fprintf(tr->out, "%s%.2f", s ? "," : "", (double)in->stage_act_bytes[s] / (1 << 20));
  fputs("]\n", tr->out);
}

static void print_eval(const wf__trainer *tr, const wf_train_step_info *in, double eval_ms)
{
  wf__clear_bar(tr);
  fprintf(tr->out, "eval %d/%d val_loss=%.4f", in->step, in->steps, in->val_loss);
  if (!isnan(in->entropy_floor))
    fprintf(tr->out, " floor=%.4f gap=%.4f", in->entropy_floor, in->val_loss - in->entropy_floor);
  fprintf(tr->out, " eval_ms=%.1f\n", eval_ms);
}

/* ---- the metrics file --------------------------------------------------------------------------
 */

/* jansson refuses NaN and infinities (they are not JSON): write null instead. */
static json_t *real_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Model-parallel figures: tp_ms, the pipeline bubble beside its theory, and per stage the
 * peak activations in MiB and in micro-batches held (act_mib, act_slots). */
static void add_parallel_metrics(json_t *o, const wf_train_step_info *in)
{
  json_t *act = json_array(), *slots = json_array();
  for (int s = 0; s < in->n_stages && s < WF_MAX_STAGES; s++) {
    json_array_append_new(act, json_real(mib(in->stage_act_bytes[s])));
    json_array_append_new(slots, json_integer(in->stage_peak_slots[s]));
  }
  json_object_set_new(o, "tp_ms", real_or_null(in->tp_ms));
  json_object_set_new(o, "cp_ms", real_or_null(in->cp_ms));
  json_object_set_new(o, "cp_mib", real_or_null(mib((int64_t)in->cp_bytes)));
  json_object_set_new(o, "ep_ms", real_or_null(in->ep_ms));
  json_object_set_new(o, "ep_mib", real_or_null(mib((int64_t)in->ep_bytes)));
  json_object_set_new(o, "bubble", real_or_null(in->bubble));
  json_object_set_new(o, "bubble_theory", real_or_null(in->bubble_theory));
  json_object_set_new(o, "act_mib", act);
  json_object_set_new(o, "act_slots", slots);
}

/* A mixture of experts: expert_load, one [min, max, imbalance] of tokens per expert for
 * each layer (the step's scalar router figures are its extras, router/...). */
static void add_expert_metrics(json_t *o, const wf_train_step_info *in)
{
  json_t *load = json_array();
  for (int l = 0; l < in->n_expert_layers; l++) {
    const float *x = in->expert_load + 3 * (size_t)l;
    json_array_append_new(load, json_pack("[f, f, f]", (double)x[0], (double)x[1], (double)x[2]));
  }
  json_object_set_new(o, "expert_load", load);
}

/* When the line is written: unix seconds (with fractions) and the same instant in ISO
 * 8601, UTC, to the millisecond. */
static void add_time(json_t *o)
{
  struct timespec ts;
  struct tm tm;
  char iso[40];
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t n = strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(iso + n, sizeof iso - n, ".%03ldZ", ts.tv_nsec / 1000000);
  json_object_set_new(o, "time", json_real((double)ts.tv_sec + ts.tv_nsec * 1e-9));
  json_object_set_new(o, "timestamp", json_string(iso));
}

static void write_metrics(wf__trainer *tr, const wf_train_step_info *in, double eval_ms)
{
  json_t *o = json_object();
  if (!o)
    return;
  json_object_set_new(o, "step", json_integer(in->step));
  add_time(o);
  json_object_set_new(o, "rank", json_integer(wf_rt_rank() < 0 ? 0 : wf_rt_rank()));
  json_object_set_new(o, "loss", real_or_null(in->loss));
  json_object_set_new(o, "lr", real_or_null(in->lr));
  json_object_set_new(o, "grad_norm", real_or_null(in->grad_norm));
  json_object_set_new(o, "tokens_per_s", real_or_null(in->tokens_per_s));
  json_object_set_new(o, "tokens_per_s_per_gpu", real_or_null(in->tokens_per_s_gpu));
  json_object_set_new(o, "step_ms", real_or_null(in->step_ms));
  json_object_set_new(o, "tflops", real_or_null(in->tflops));
  json_object_set_new(o, "tflops_per_gpu", real_or_null(in->tflops_gpu));
  json_object_set_new(o, "mfu_pct", real_or_null(in->mfu * 100)); /* the line's mfu=...% */
  json_object_set_new(o, "mem_mib", real_or_null(mib(in->mem_bytes)));
  json_object_set_new(o, "comm_ms", real_or_null(in->comm_ms));
  json_object_set_new(o, "optim_mib", real_or_null(mib(in->optim_bytes)));
  /* memory by kind, exact (bytes) */
  json_object_set_new(o, "param_bytes", json_integer(in->param_bytes));
  json_object_set_new(o, "grad_bytes", json_integer(in->grad_bytes));
  json_object_set_new(o, "optim_bytes", json_integer(in->optim_bytes));
  json_object_set_new(o, "act_bytes", json_integer(in->act_bytes));
  json_object_set_new(o, "host_syncs", json_integer(in->host_syncs));
  /* GPU kernel launches and library calls since the last line (the CPU counts none): a
   * step's, evaluation's included when it ran (docs/gpu-performance.md, launch overhead) */
  uint64_t launches = wf_dev_kernels(tr->dev, WF_DT_F32)->reg->launches();
  json_object_set_new(o, "launches", json_integer((json_int_t)(launches - tr->launches)));
  tr->launches = launches;
  if (!isnan(in->val_loss)) {
    json_object_set_new(o, "val_loss", real_or_null(in->val_loss));
    json_object_set_new(o, "eval_ms", real_or_null(eval_ms)); /* not in step_ms */
  }
  if (tr->tp > 1 || tr->pp > 1 || tr->cp > 1 || tr->epr)
    add_parallel_metrics(o, in);
  if (tr->fp16) {
    json_object_set_new(o, "loss_scale", real_or_null(in->loss_scale));
    json_object_set_new(o, "skipped_steps", json_integer(in->skipped_steps));
    json_object_set_new(o, "step_skipped", json_boolean(in->skipped));
  }
  for (int i = 0; i < in->n_extra && i < WF_TRAIN_MAX_EXTRA; i++)
    json_object_set_new(o, in->extra[i].name, real_or_null(in->extra[i].value));
  if (in->n_expert_layers > 0)
    add_expert_metrics(o, in);
  if (json_dumpf(o, tr->metrics, JSON_COMPACT) == 0)
    fputc('\n', tr->metrics);
  fflush(tr->metrics); /* one complete line per step, even if the run dies */
  json_decref(o);
}

/* ---- TensorBoard ------------------------------------------------------------------------ */

/* The scalars of train.tensorboard, in TensorBoard's sections (the tag before '/'). A
 * figure that does not apply to the run is NaN and left out: val_loss between
 * evaluations, the pipeline's figures with one stage, tp's with one tensor rank, the
 * loss scale outside fp16. Times and memory are the writing rank's (world rank 0's),
 * as on the step line. The step's named extras (wf_train_step_info.extra: a MoE
 * router's figures) follow under their own names. */
typedef struct tb_scalar {
  const char *tag, *about;
  double (*get)(const wf__trainer *tr, const wf_train_step_info *in);
} tb_scalar;

static double nan_unless(bool applies, double v) { return applies ? v : NAN; }
static double g_loss(const wf__trainer *tr, const wf_train_step_info *in) { return in->loss; }
static double g_val(const wf__trainer *tr, const wf_train_step_info *in) { return in->val_loss; }
static double g_lr(const wf__trainer *tr, const wf_train_step_info *in) { return in->lr; }
static double g_norm(const wf__trainer *tr, const wf_train_step_info *in) { return in->grad_norm; }
static double g_scale(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->fp16, in->loss_scale);
}
static double g_skipped(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->fp16, in->skipped_steps);
}
static double g_tok(const wf__trainer *tr, const wf_train_step_info *in)
{
  return in->tokens_per_s;
}
static double g_tok_gpu(const wf__trainer *tr, const wf_train_step_info *in)
{
  return in->tokens_per_s_gpu;
}
static double g_tflops(const wf__trainer *tr, const wf_train_step_info *in)
{
  return in->tflops_gpu;
}
static double g_mfu(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->peak_tflops > 0, in->mfu * 100);
}
static double g_step(const wf__trainer *tr, const wf_train_step_info *in) { return in->step_ms; }
static double g_compute(const wf__trainer *tr, const wf_train_step_info *in)
{
  return in->compute_ms;
}
static double g_dp(const wf__trainer *tr, const wf_train_step_info *in) { return in->comm_ms; }
static double g_tp(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->tp > 1, in->tp_ms);
}
static double g_ep(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->epr != NULL, in->ep_ms);
}
static double g_p2p(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->pp > 1, in->p2p_wait_ms);
}
static double g_bubble(const wf__trainer *tr, const wf_train_step_info *in)
{
  return nan_unless(tr->pp > 1, in->bubble * 100);
}
static double g_mem(const wf__trainer *tr, const wf_train_step_info *in)
{
  return mib(in->mem_bytes);
}
static double g_params(const wf__trainer *tr, const wf_train_step_info *in)
{
  return mib(in->param_bytes);
}
static double g_grads(const wf__trainer *tr, const wf_train_step_info *in)
{
  return mib(in->grad_bytes);
}
static double g_optim(const wf__trainer *tr, const wf_train_step_info *in)
{
  return mib(in->optim_bytes);
}
static double g_act(const wf__trainer *tr, const wf_train_step_info *in)
{
  return mib(in->act_bytes);
}

static const tb_scalar tb_scalars[] = {
    {"loss/train", "mean cross-entropy of the step's global batch, nats per token", g_loss},
    {"loss/val", "mean cross-entropy on the validation split, at evaluated steps", g_val},
    {"optim/lr", "learning rate of the step's update", g_lr},
    {"optim/grad_norm", "global gradient norm before clipping", g_norm},
    {"optim/loss_scale", "fp16 loss scale of the step's backward", g_scale},
    {"optim/skipped_steps", "fp16 steps skipped so far for overflowed gradients", g_skipped},
    {"throughput/tokens_per_s", "the job's tokens per second (global batch / step time)", g_tok},
    {"throughput/tokens_per_s_per_gpu", "tokens per second per rank (one GPU each)", g_tok_gpu},
    {"throughput/tflops_per_gpu", "achieved TFLOP/s per rank", g_tflops},
    {"throughput/mfu_pct", "model FLOP utilisation, % of the per-rank peak", g_mfu},
    {"time/step_ms", "wall time of the step", g_step},
    {"time/compute_ms", "forward + backward compute in the step (rank 0)", g_compute},
    {"time/dp_comm_ms", "data-parallel gradient communication not hidden behind backward (rank 0)",
     g_dp},
    {"time/tp_ms", "in tensor-parallel collectives (rank 0)", g_tp},
    {"time/ep_ms", "in expert parallelism's all-to-all (rank 0)", g_ep},
    {"time/p2p_wait_ms", "waiting in pipeline sends and receives (rank 0)", g_p2p},
    {"time/bubble_pct", "pipeline idle share of the step, % (1 - mean busy / longest stage)",
     g_bubble},
    {"memory/total_mib", "all rank 0 holds through weft's allocator (host + device)", g_mem},
    {"memory/params_mib", "parameters with their GEMM copy and ZeRO's gather buffers (rank 0)",
     g_params},
    {"memory/grads_mib", "gradients and the dp reduction's buffers (rank 0)", g_grads},
    {"memory/optim_mib", "AdamW state (rank 0)", g_optim},
    {"memory/act_mib", "peak activations of the step (rank 0)", g_act},
};

#define TB_MAX (WF_ARRAY_LEN(tb_scalars) + WF_TRAIN_MAX_EXTRA)

/* The step's scalars that apply, into v (TB_MAX entries); returns the count. */
static int tb_collect(const wf__trainer *tr, const wf_train_step_info *in, wf_tfevents_scalar *v)
{
  int n = 0;
  for (size_t i = 0; i < WF_ARRAY_LEN(tb_scalars); i++) {
    double x = tb_scalars[i].get(tr, in);
    if (isfinite(x))
      v[n++] = (wf_tfevents_scalar){tb_scalars[i].tag, x, tb_scalars[i].about};
  }
  for (int i = 0; i < in->n_extra && i < WF_TRAIN_MAX_EXTRA; i++)
    if (in->extra[i].name && isfinite(in->extra[i].value))
      v[n++] = (wf_tfevents_scalar){in->extra[i].name, in->extra[i].value, NULL};
  return n;
}

static void write_tensorboard(wf__trainer *tr, const wf_train_step_info *in)
{
  wf_tfevents_scalar v[TB_MAX];
  int n = tb_collect(tr, in, v);
  wf_tfevents_write(tr->tb, in->step, wf_wall_time(), v, n); /* a failure is said there, once */
}

wf_status wf__open_tensorboard(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  if (!cfg->train.tensorboard[0] || wf_rt_rank() > 0)
    return WF_OK;
  WF_TRY(wf_tfevents_open(&tr->tb, cfg->train.tensorboard,
                          (int64_t)(cfg->train.tensorboard_roll_mb * 1e6)));
  /* a resumed run redoes the steps after its checkpoint: TensorBoard drops them */
  if (tr->start > 0)
    wf_tfevents_restart(tr->tb, tr->start + 1);
fail:
  return st;
}

/* ---- the loss-jump watch ------------------------------------------------------------------ */

#define LOSS_WARMUP 5  /* steps before the watch starts: the first fall fastest from ln V */
#define LOSS_WINDOW 10 /* the running mean's horizon in steps */

/* World rank 0 only (one WARN per job); see the file comment. */
static void watch_loss(wf__trainer *tr, const wf_train_step_info *in)
{
  double f = tr->cfg->train.loss_jump_factor, x = in->loss;
  if (wf_rt_rank() > 0 || !isfinite(x))
    return;
  if (f > 0 && tr->loss_n >= LOSS_WARMUP && x > f * tr->loss_mean) {
    wf__clear_bar(tr);
    WF_WARN("step %d: loss %.4f jumped to %.1f times its running mean %.4f "
            "(train.loss_jump_factor=%g); grad_norm=%.3g lr=%.2e: check the learning rate and "
            "the data",
            in->step, x, x / tr->loss_mean, tr->loss_mean, f, in->grad_norm, in->lr);
  }
  tr->loss_n++;
  tr->loss_mean += (x - tr->loss_mean) / WF_MIN(tr->loss_n, LOSS_WINDOW);
}

/* train.log_every: a step line every N steps, and always for the first step of the run,
 * the last, and one evaluated. */
static bool log_due(const wf__trainer *tr, const wf_train_step_info *in)
{
  int every = tr->cfg->train.log_every;
  return every <= 1 || in->step == tr->start + 1 || in->step == tr->steps ||
         in->step % every == 0 || !isnan(in->val_loss);
}

void wf__report_step(wf__trainer *tr, const wf_train_step_info *in, double eta, double eval_ms)
{
  watch_loss(tr, in);
  tr->done = in->step;
  if (isnan(tr->first_loss))
    tr->first_loss = in->loss;
  tr->last_loss = in->loss;
  if (!isnan(in->val_loss))
    tr->last_val = in->val_loss;
  if (tr->talk && log_due(tr, in)) {
    print_step(tr, in, eta);
    print_parallel(tr, in);
    if (!isnan(in->val_loss))
      print_eval(tr, in, eval_ms);
    if (fflush(tr->out) == EOF && errno == EPIPE)
      tr->out_closed = true; /* SIGPIPE is ignored (main.c) */
  }
  if (tr->talk && tr->bar)
    draw_bar(tr, in, eta);
  if (tr->metrics)
    write_metrics(tr, in, eval_ms);
  if (tr->tb)
    write_tensorboard(tr, in);
}

static bool metrics_line_past(const char *line, int step)
{
  json_t *o = json_loads(line, 0, NULL);
  json_t *s = o ? json_object_get(o, "step") : NULL;
  bool past = json_is_integer(s) && json_integer_value(s) > step;
  json_decref(o);
  return past;
}

/* Drop the lines of the metrics file whose "step" is past `step` (steps a killed run did
 * after its last checkpoint, which the resumed run repeats), rewriting it atomically; a
 * missing file is fine. */
static wf_status trim_metrics(const char *path, int step)
{
  wf_status st = WF_OK;
  char *line = NULL, *text = NULL;
  size_t cap = 0, len = 0;
  bool dropped = false;
  FILE *in = fopen(path, "r"), *out = NULL;
  if (!in)
    return errno == ENOENT ? WF_OK : WF_EIO;
  WF_CHECK(out = open_memstream(&text, &len), WF_ENOMEM, "train.metrics: out of memory");
  for (ssize_t n; (n = getline(&line, &cap, in)) > 0;) {
    if (metrics_line_past(line, step))
      dropped = true;
    else
      fputs(line, out);
  }
  fclose(out);
  if (dropped)
    st = wf_file_write_atomic(path, text, len, 0644);
fail:
  fclose(in);
  free(line);
  free(text);
  return st;
}

wf_status wf__open_metrics(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const char *path = tr->cfg->train.metrics;
  if (!path[0] || wf_rt_rank() > 0)
    return WF_OK;
  /* A resumed run continues its file (without the steps it is about to redo); a fresh
   * run starts a new one. */
  if (tr->start > 0 && trim_metrics(path, tr->start) != WF_OK)
    WF_WARN("train.metrics: %s: cannot drop the steps after %d (see above)", path, tr->start);
  WF_TRY(wf_file_make_parent(path, "train.metrics"));
  tr->metrics = fopen(path, tr->start > 0 ? "a" : "w");
  WF_CHECK(tr->metrics, wf_file_errno_status(errno),
           "train.metrics: cannot open '%s' for writing: %s", path, strerror(errno));
fail:
  return st;
}

/* ---- the end of the run ------------------------------------------------------------------ */

static void human_time(double s, char *buf, size_t len)
{
  if (s < 120)
    snprintf(buf, len, "%.1f s", s);
  else if (s < 7200)
    snprintf(buf, len, "%dm%02ds", (int)s / 60, (int)s % 60);
  else
    snprintf(buf, len, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

void wf__print_summary(const wf__trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  int n = tr->done - tr->start;
  char took[32], val[48] = "";
  if (!tr->talk)
    return;
  double wall = wf_now() - tr->t0;
  double tokens = (double)n * tr->B * tr->M * tr->D * tr->T;
  human_time(wall, took, sizeof took);
  if (!isnan(tr->last_val))
    snprintf(val, sizeof val, ", val_loss %.4f", tr->last_val);
  if (n <= 0) {
    fprintf(tr->out, "done: nothing to train (step %d of %d)\n", tr->start, tr->steps);
  } else {
    char what[64];
    if (tr->stopped)
      snprintf(what, sizeof what, "stopped after step %d of %d:", tr->done, tr->steps);
    else
      snprintf(what, sizeof what, "done:");
    fprintf(tr->out, "%s %d steps in %s, %.0f tokens/s; loss %.4f (first %.4f)%s\n", what, n, took,
            wall > 0 ? tokens / wall : 0.0, tr->last_loss, tr->first_loss, val);
  }
  if (tr->rescued_step > 0)
    fprintf(tr->out,
            "  checkpoint: %s/step-%06d, written by the stop's writers after the job (their "
            "log: %s/" WF_CKPT_WRITERS_LOG ")\n",
            cfg->train.checkpoint_dir, tr->rescued_step, cfg->train.checkpoint_dir);
  else if (tr->saved_step > 0)
    fprintf(tr->out,
            "  checkpoint: %s/step-%06d (train.resume=auto, or the same command, "
            "continues from it)\n",
            cfg->train.checkpoint_dir, tr->saved_step);
  if (cfg->train.metrics[0])
    fprintf(tr->out, "  metrics: %s (one JSON object per step)\n", cfg->train.metrics);
  if (tr->tb)
    fprintf(tr->out, "  tensorboard: %s (tensorboard --logdir %s)\n", wf_tfevents_path(tr->tb),
            cfg->train.tensorboard);
  if (tr->trace)
    fprintf(tr->out, "  trace: %s, steps %d..%d of every rank (open it in ui.perfetto.dev)\n",
            cfg->train.trace, cfg->train.trace_steps[0], cfg->train.trace_steps[1]);
  if (tr->hooks && tr->hooks->save_llmc) /* --save's confirmation */
    fprintf(tr->out, "  saved: %s (%s)\n", tr->hooks->save_llmc,
            wf_weights_fmt_describe(tr->hooks->save_format));
  fflush(tr->out);
}
