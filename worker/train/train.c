/*
 * train.c - the training loop behind wf_train.h.
 *
 * A step is four phases, kept apart so the parallelism issues can slot their
 * communication in between without touching the mathematics:
 *   1. gather: micro-batch m of M of this rank's slice of the global batch (wf_data);
 *   2. forward/backward per micro-batch with loss gradient 1/M, so the accumulated
 *      gradient is that of the mean loss over the whole global batch;
 *   3. global gradient norm, then the clip factor clip / max(norm, clip);
 *   4. AdamW (step t is 1-based) with the scheduled learning rate.
 * Mixed precision (precision bf16/fp16) lives in the model (rounded GEMM operands,
 * wf_model.h); the trainer adds fp16's dynamic loss scaling, as Megatron and apex do:
 * the loss gradient is multiplied by S, so that small activation gradients survive
 * fp16's range; after the reductions the global gradient norm, the same on every rank,
 * tells whether any gradient is non-finite. If one is, the step is skipped (no
 * update: parameters, m, v and AdamW's t stay) and S is halved; otherwise the update
 * unscales by 1/S inside the clip factor, and S doubles after
 * optim.loss_scale_window finite steps in a row. AdamW's t is the step minus the
 * skipped steps. Each dp rank's backward takes its loss over its 1/D of the batch and
 * the dp average divides by D afterwards, so its activation gradients are D times one
 * rank's: it scales the loss gradient by S / D (exact for a power-of-two D), so that
 * every mesh overflows exactly where one rank would and S means the same everywhere.
 * Evaluation runs the forward pass on train.eval_batches fixed validation batches
 * (the same ones every time, so the curve is comparable across evaluations).
 *
 * Invariants: the loss sequence is a pure function of the config (same seed, same
 * bits); only rank 0 prints or writes metrics; a non-finite loss or norm stops the run
 * with an error before it can poison the weights.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wf_ckpt.h"
#include "wf_io.h"
#include "wf_parallel.h"
#include "wf_kernels.h"
#include "wf_model.h"
#include "wf_train.h"

#include <xxhash.h>

typedef struct trainer {
  const wf_config *cfg;
  const wf_train_hooks *hooks;
  FILE *out;
  bool talk; /* rank 0 and not quiet: banner and step lines */
  bool bar;  /* progress bar on stderr (stdout is a terminal) */
  bool can_eval;
  wf_gpt *model;
  wf_dp *dp;        /* gradient averaging and the optimizer; NULL on one rank alone */
  wf_comm *dp_comm; /* borrowed from the caller */
  wf_comm *tp_comm, *pp_comm, *emb_comm, *world; /* borrowed; NULL = size 1 */
  int dp_rank, D;                                /* this rank's data-parallel slice of D */
  int tp, pp, pp_rank, world_size;
  int bounds[WF_MAX_STAGES + 1]; /* stage s holds layers [bounds[s], bounds[s+1]) */
  wf_pipe *pipe;
  wf_trace *trace;
  int chunks; /* model chunks per rank (interleaved schedule), else 1 */
  int step;   /* the step being run (for the batch callback) */
  wf_data_split split;
  long tied_checks;
  wf_data *data;
  wf_gpt_dims dims;
  int B, T, M, steps;    /* micro-batch rows, sequence length, micro-batches, steps */
  int *inputs, *targets; /* (B, T) */
  FILE *metrics;
  double peak_tflops; /* for MFU; 0 = unknown */
  double flops;       /* per step, for the whole global batch */
  double t0;          /* start of the loop */
  wf_ckpt_target ck;  /* what checkpoints save and restore */
  bool fp16;          /* precision=fp16: loss scaling on */
  wf_ckpt_scaler ls;  /* its state (scale S = 1 without fp16; skipped = 0 then) */
  int start;          /* steps done before this run (a resumed checkpoint's step) */
} trainer;

static int comm_size(wf_comm *c) { return c ? wf_comm_size(c) : 1; }
static int comm_rank(wf_comm *c) { return c ? wf_comm_rank(c) : 0; }

/* ---- schedule --------------------------------------------------------------------- */

double wf_train_lr(const wf_config *cfg, int step)
{
  double lr = cfg->train.lr, lo = cfg->train.min_lr;
  int warm = cfg->train.warmup, n = cfg->train.steps;
  if (step <= warm)
    return lr * step / warm;
  if (n <= warm)
    return lr;
  double progress = (double)(step - warm) / (n - warm);
  return lo + 0.5 * (lr - lo) * (1.0 + cos(M_PI * progress));
}

/* ---- set-up ---------------------------------------------------------------------------- */

static wf_status fail_msg(wf_status st, const char *err)
{
  WF_ERROR("%s", err);
  return st;
}

/* A refusal every rank reaches alike from the same config: said once, by rank 0. */
static wf_status refuse(const char *err)
{
  if (wf_rt_rank() <= 0)
    WF_ERROR("%s", err);
  return WF_ECONFIG;
}

/* Micro-batch geometry of one rank: the global batch is split over D data-parallel
 * ranks, then into M micro-batches of B rows each. */
static wf_status setup_geometry(trainer *tr, int M)
{
  const wf_config *cfg = tr->cfg;
  char err[256];
  tr->M = M > 0 ? M : 1;
  tr->D = comm_size(tr->dp_comm);
  tr->dp_rank = comm_rank(tr->dp_comm);
  tr->tp = comm_size(tr->tp_comm);
  tr->pp = comm_size(tr->pp_comm);
  tr->pp_rank = comm_rank(tr->pp_comm);
  tr->world_size = tr->D * tr->tp * tr->pp;
  tr->T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len;
  tr->steps = cfg->train.steps;
  if (cfg->train.batch_size <= 0 || cfg->train.batch_size % (tr->M * tr->D) || tr->T <= 0) {
    snprintf(err, sizeof err,
             "train.batch_size %d must be a positive multiple of dp %d x train.microbatches %d "
             "(and seq_len %d positive)",
             cfg->train.batch_size, tr->D, tr->M, tr->T);
    return fail_msg(WF_ECONFIG, err);
  }
  tr->B = cfg->train.batch_size / (tr->M * tr->D);
  return WF_OK;
}

/* The llm.c checkpoint model.init into this rank's shard: the whole file is read and
 * this rank's slices copied out (wf_gpt_import_full). */
static wf_status load_init(trainer *tr)
{
  char err[1024] = "";
  const wf_config *cfg = tr->cfg;
  const wf_gpt_shard *sh = wf_gpt_get_shard(tr->model);
  if (sh->tp == 1 && sh->first && sh->last) {
    wf_status st = wf_gpt_load_llmc(tr->model, cfg->model.init, err, sizeof err);
    return st == WF_OK ? WF_OK : fail_msg(st, err);
  }
  wf_gpt *whole = NULL;
  wf_status st = wf_gpt_create(&whole, &tr->dims, 1, 1);
  if (st == WF_OK)
    st = wf_gpt_load_llmc(whole, cfg->model.init, err, sizeof err);
  if (st == WF_OK)
    wf_gpt_import_full(tr->model, 0, wf_gpt_params(whole));
  wf_gpt_destroy(whole);
  return st == WF_OK ? WF_OK : fail_msg(st, err[0] ? err : "cannot read model.init");
}

/* The interleaved schedule's chunks: stage s = c * pp + r holds layers
 * [s * Lc, (s + 1) * Lc), Lc = L / (pp * v) (validation checked the division). */
static wf_status interleaved_split(trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  int v = cfg->parallel.virtual_stages, lc = tr->dims.L / (tr->pp * v);
  if (tr->pp < 2)
    return refuse("train.schedule=interleaved needs mesh.pp >= 2: with one pipeline rank "
                  "there is nothing to interleave; use train.schedule=1f1b");
  if (cfg->parallel.n_pp_layers > 0)
    return refuse("parallel.pp_layers does not apply to train.schedule=interleaved, whose "
                  "chunks all hold model.layers / (mesh.pp x parallel.virtual_stages) "
                  "layers; remove it");
  tr->chunks = v;
  tr->bounds[tr->pp_rank] = tr->pp_rank * lc;
  tr->bounds[tr->pp_rank + 1] = (tr->pp_rank + 1) * lc;
  return WF_OK;
}

static wf_status setup_stage(trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  char err[1024] = "";
  wf_status st = WF_OK;
  tr->chunks = 1;
  if (cfg->train.schedule == WF_SCHED_INTERLEAVED)
    st = interleaved_split(tr);
  else
    st = wf_pipe_partition(&tr->dims, tr->T, tr->pp, cfg->parallel.pp_layers,
                           cfg->parallel.n_pp_layers, tr->bounds, err, sizeof err);
  if (st != WF_OK)
    return err[0] ? fail_msg(st, err) : st;
  int r = tr->pp_rank, lc = tr->bounds[r + 1] - tr->bounds[r];
  wf_gpt_opts o = {.dims = tr->dims,
                   .shard = {.tp = tr->tp,
                             .tp_rank = comm_rank(tr->tp_comm),
                             .sequence = cfg->parallel.sequence && tr->tp > 1,
                             .l0 = tr->bounds[r],
                             .l1 = tr->bounds[r + 1],
                             .chunks = tr->chunks,
                             .chunk_stride = tr->pp * lc,
                             .first = r == 0,
                             .last = r == tr->pp - 1},
                   .tp_comm = tr->tp_comm,
                   .B = tr->B,
                   .T = tr->T,
                   .slots = wf_pipe_slots(cfg->train.schedule, tr->pp, r, tr->M, tr->chunks),
                   .recompute = cfg->parallel.activation_checkpointing,
                   .precision = cfg->precision};
  st = wf_gpt_create_shard(&tr->model, &o);
  if (st == WF_OK)
    wf_gpt_set_trace(tr->model, tr->trace);
  return st == WF_OK ? WF_OK : fail_msg(st, "cannot allocate the model (see above)");
}

/* The whole model's dimensions: the config's, or model.init's header. */
static wf_status setup_dims(trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  char err[1024] = "";
  tr->dims = wf_gpt_dims_from_config(cfg);
  if (cfg->model.init[0]) {
    wf_status st = wf_gpt_peek_llmc(cfg->model.init, &tr->dims, err, sizeof err);
    if (st != WF_OK)
      return fail_msg(st, err);
  }
  if (tr->T > tr->dims.maxT) {
    snprintf(err, sizeof err, "train.seq_len %d exceeds the model's context %d (model.seq_len)",
             tr->T, tr->dims.maxT);
    return fail_msg(WF_ECONFIG, err);
  }
  return WF_OK;
}

static wf_status setup_model(trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  char err[1024] = "";
  wf_status st = setup_stage(tr);
  if (st == WF_OK && cfg->model.init[0])
    st = load_init(tr);
  else if (st == WF_OK)
    wf_gpt_init(tr->model, cfg->train.seed);
  if (st != WF_OK)
    return st;
  tr->flops = wf_gpt_flops_per_step(&tr->dims, tr->B * tr->M * tr->D, tr->T);
  wf_pipe_opts po = {tr->pp_comm, tr->model, cfg->train.schedule, tr->M, tr->chunks, tr->B,
                     tr->T,       tr->trace};
  st = wf_pipe_create(&tr->pipe, &po, err, sizeof err);
  if (st != WF_OK)
    return fail_msg(st, err);
  if (!tr->dp_comm)
    return WF_OK;
  wf_dp_opts o = {tr->dp_comm, tr->model, (size_t)cfg->optim.bucket_mb << 20, cfg->optim.zero};
  st = wf_dp_create(&tr->dp, &o);
  return st == WF_OK ? WF_OK : fail_msg(st, "cannot set up data parallelism (see above)");
}

/* Check train.checkpoint_dir is writable, then resume from train.resume if set. */
static wf_status setup_checkpoint(trainer *tr)
{
  const wf_train_hooks *h = tr->hooks;
  tr->ck = (wf_ckpt_target){.cfg = tr->cfg,
                            .model = tr->model,
                            .dp = tr->dp,
                            .dp_comm = tr->dp_comm,
                            .world = h ? h->world : NULL,
                            .pp_rank = tr->pp_rank,
                            .tp_rank = comm_rank(tr->tp_comm),
                            .scaler = tr->fp16 ? &tr->ls : NULL};
  if (h && h->on_phase) /* reading a big checkpoint is not a hang */
    h->on_phase(h->user, "checkpoint");
  wf_status st = wf_ckpt_prepare(&tr->ck);
  if (st == WF_OK)
    st = wf_ckpt_resume(&tr->ck, &tr->start);
  if (h && h->on_phase)
    h->on_phase(h->user, "train");
  return st;
}

static wf_status setup_data(trainer *tr)
{
  char err[1024] = "";
  wf_status st = wf_data_open_config(&tr->data, tr->cfg, tr->dims.V, err, sizeof err);
  if (st != WF_OK)
    return fail_msg(st, err);
  size_t n = (size_t)tr->B * tr->T;
  tr->inputs = wf_mem_alloc(n * sizeof *tr->inputs);
  tr->targets = wf_mem_alloc(n * sizeof *tr->targets);
  if (!tr->inputs || !tr->targets)
    return fail_msg(WF_ENOMEM, "cannot allocate the batch buffers");
  bool has_val = wf_data_get_kind(tr->data) == WF_DATA_SYNTHETIC ||
                 wf_data_num_tokens(tr->data, WF_DATA_VAL) > 0;
  tr->can_eval = has_val && tr->cfg->train.eval_batches > 0;
  if (!has_val && tr->talk)
    WF_WARN("data.val_fraction = 0: no validation split, so no evaluation");
  return WF_OK;
}

static wf_status setup_metrics(trainer *tr)
{
  const char *path = tr->cfg->train.metrics;
  if (!path[0] || wf_rt_rank() > 0)
    return WF_OK;
  /* A resumed run continues its file (without the steps it is about to redo); a
   * fresh run starts a new one. */
  char err[WF_PATH_MAX + 128];
  if (tr->start > 0 && wf_ckpt_trim_metrics(path, tr->start, err, sizeof err) != WF_OK)
    WF_WARN("train.metrics: %s: cannot drop the steps after %d: %s", path, tr->start, err);
  tr->metrics = fopen(path, tr->start > 0 ? "a" : "w");
  if (!tr->metrics) {
    snprintf(err, sizeof err, "train.metrics: cannot open '%s' for writing: %s", path,
             strerror(errno));
    return fail_msg(WF_EIO, err);
  }
  return WF_OK;
}

/* Best of a few 512^3 GEMMs through the model's own matmul: a cheap stand-in for the
 * machine's peak when train.peak_tflops is not given (~0.1 s). */
static double measure_peak_tflops(void)
{
  const int n = 512;
  size_t nn = (size_t)n * n;
  float *a = wf_mem_alloc(3 * nn * sizeof *a);
  if (!a)
    return 0;
  for (size_t i = 0; i < 2 * nn; i++)
    a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
  double best = INFINITY;
  for (int rep = 0; rep < 6; rep++) {
    double t = wf_now();
    wf_matmul_forward(a + 2 * nn, a, a + nn, NULL, n, n, n);
    t = wf_now() - t;
    if (rep > 0 && t < best) /* rep 0 warms up threads and caches */
      best = t;
  }
  wf_mem_free(a);
  return best > 0 && isfinite(best) ? 2.0 * n * n * n / best * 1e-12 : 0;
}

static void setup_peak(trainer *tr)
{
  tr->peak_tflops = tr->cfg->train.peak_tflops;
  if (tr->peak_tflops > 0 || (!tr->talk && !tr->metrics))
    return;
  tr->peak_tflops = measure_peak_tflops();
  if (tr->talk)
    fprintf(tr->out,
            "peak %.3f TFLOP/s for MFU: measured, best of 5 sgemm 512^3 on %d threads "
            "(set train.peak_tflops to use the hardware peak)\n",
            tr->peak_tflops, wf_kernels_threads());
}

/* What mixed precision does, and that training here runs on the CPU, where it is
 * emulated: the numerics of bf16/fp16 GEMMs, not their speed. */
static void print_precision(const trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  const char *p = tr->fp16 ? "fp16" : "bf16";
  fprintf(tr->out,
          "precision %s: fp32 master weights, gradients and AdamW state; GEMM operands (weights, "
          "activations, activation gradients) rounded to %s, accumulated in fp32\n",
          p, p);
  if (tr->fp16 && cfg->optim.loss_scale > 0)
    fprintf(tr->out, "loss scale fixed at %g (steps whose gradients overflow are skipped)\n",
            cfg->optim.loss_scale);
  else if (tr->fp16)
    fprintf(tr->out,
            "dynamic loss scaling from %g: halved and the step skipped when a gradient "
            "overflows, doubled after %d finite steps\n",
            tr->ls.scale, cfg->optim.loss_scale_window);
  fprintf(tr->out,
          "%s on the CPU is emulated (operands rounded in fp32; OpenBLAS has no %s GEMM): "
          "%s numerics at fp32 speed or slower, not %s speed\n",
          p, p, p, p);
}

static void print_banner(const trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  const wf_gpt_dims *d = &tr->dims;
  size_t np = wf_gpt_num_params(d);
  fprintf(tr->out, "model %s: L=%d NH=%d C=%d V=%d (padded %d) maxT=%d, %.3fM parameters (%zu)\n",
          cfg->model.init[0] ? cfg->model.init : cfg->model.preset, d->L, d->NH, d->C, d->V, d->Vp,
          d->maxT, (double)np * 1e-6, np);
  fprintf(tr->out, "data %s\n", wf_data_describe(tr->data));
  double H = wf_data_entropy_floor(tr->data);
  if (!isnan(H))
    fprintf(tr->out, "entropy floor H = %.4f nats\n", H);
  fprintf(tr->out,
          "training %d steps of %d x %d tokens (dp %d x %d micro-batch%s of %d), lr %.2e "
          "warm-up %d cosine to %.2e, clip %g, weight decay %g, seed %llu%s\n",
          tr->steps, tr->B * tr->M * tr->D, tr->T, tr->D, tr->M, tr->M == 1 ? "" : "es", tr->B,
          cfg->train.lr, cfg->train.warmup, cfg->train.min_lr, cfg->optim.clip,
          cfg->optim.weight_decay, (unsigned long long)cfg->train.seed,
          cfg->optim.zero ? ", ZeRO-1 optimizer" : "");
  if (tr->tp > 1 || tr->pp > 1)
    fprintf(tr->out,
            "mesh dp %d x tp %d x pp %d%s: this rank holds layers [%d, %d) of %d, "
            "%zu of %zu parameters%s\n",
            tr->D, tr->tp, tr->pp,
            tr->tp > 1 && cfg->parallel.sequence ? " (sequence parallel)" : "",
            wf_gpt_get_shard(tr->model)->l0, wf_gpt_get_shard(tr->model)->l1, d->L,
            wf_gpt_local_params(tr->model), np,
            tr->pp > 1
                ? (cfg->train.schedule == WF_SCHED_GPIPE ? ", GPipe schedule" : ", 1F1B schedule")
                : "");
  if (cfg->parallel.activation_checkpointing)
    fprintf(tr->out, "activation checkpointing: each layer's intermediates are recomputed in "
                     "backward\n");
  if (cfg->precision != WF_PREC_NO)
    print_precision(tr);
  fflush(tr->out);
}

/* train.trace: a recorder on every rank, on only for train.trace_steps. */
static wf_status setup_trace(trainer *tr)
{
  if (!tr->cfg->train.trace[0])
    return WF_OK;
  char label[128];
  snprintf(label, sizeof label, "rank %d (pp %d, dp %d, tp %d)", wf_rt_rank(), tr->pp_rank,
           tr->dp_rank, comm_rank(tr->tp_comm));
  const int *ts = tr->cfg->train.trace_steps;
  size_t steps = (size_t)(ts[1] - ts[0] + 1);
  /* per micro-batch and model chunk: F, B and their p2p waits; with tp up to 14
   * collectives per layer (sequence parallelism with recompute: 4 forward, 4 again, 6
   * backward; counted over all L layers, a bound for any stage) and a few for the
   * embedding and head; doubled for margin; bounded by 1M spans */
  const wf_config *cfg = tr->cfg;
  size_t v = cfg->train.schedule == WF_SCHED_INTERLEAVED ? (size_t)cfg->parallel.virtual_stages : 1;
  size_t per_mb = 8 * v + (tr->tp > 1 ? 14 * (size_t)tr->dims.L + 8 : 0);
  size_t spans = WF_MIN(2 * steps * ((size_t)tr->M * per_mb + 16), (size_t)1 << 20);
  wf_status st = wf_trace_create(&tr->trace, label, spans);
  return st == WF_OK ? WF_OK : fail_msg(st, "cannot set up train.trace");
}

static wf_status setup(trainer *tr, const wf_config *cfg, const wf_train_hooks *hooks, int M,
                       bool checkpoints)
{
  memset(tr, 0, sizeof *tr);
  tr->cfg = cfg;
  tr->hooks = hooks;
  tr->dp_comm = hooks ? hooks->dp : NULL;
  tr->tp_comm = hooks ? hooks->tp : NULL;
  tr->pp_comm = hooks ? hooks->pp : NULL;
  tr->emb_comm = hooks ? hooks->emb : NULL;
  tr->world = hooks ? hooks->world : NULL;
  tr->out = hooks && hooks->out ? hooks->out : stdout;
  tr->talk = wf_rt_rank() <= 0 && !(hooks && hooks->quiet);
  /* mpirun gives ranks a pseudo-terminal, so isatty() alone would draw bars into
   * launcher logs: only a process started by hand on a terminal gets one. */
  tr->bar = tr->talk && isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") &&
            !getenv("SLURM_PROCID") && !getenv("PMI_RANK");
  /* fp16 loss scaling: a fixed optim.loss_scale, or the dynamic one's start (a
   * checkpoint being resumed restores its own). */
  tr->fp16 = cfg->precision == WF_PREC_FP16;
  tr->ls.scale = !tr->fp16                   ? 1.0
                 : cfg->optim.loss_scale > 0 ? cfg->optim.loss_scale
                                             : cfg->optim.loss_scale_init;
  wf_status st = setup_geometry(tr, M);
  if (st == WF_OK)
    st = setup_dims(tr);
  if (st == WF_OK)
    st = setup_trace(tr); /* sized from the dims, before the model that records into it */
  if (st == WF_OK)
    st = setup_model(tr);
  if (st == WF_OK && checkpoints)
    st = setup_checkpoint(tr);
  if (st == WF_OK)
    st = setup_data(tr);
  if (st == WF_OK)
    st = setup_metrics(tr);
  if (st == WF_OK && tr->talk)
    print_banner(tr);
  if (st == WF_OK)
    setup_peak(tr);
  return st;
}

static void teardown(trainer *tr)
{
  if (tr->metrics)
    fclose(tr->metrics);
  wf_mem_free(tr->inputs);
  wf_mem_free(tr->targets);
  wf_data_destroy(tr->data);
  wf_dp_destroy(tr->dp);
  wf_pipe_destroy(tr->pipe);
  wf_gpt_destroy(tr->model);
  wf_trace_destroy(tr->trace);
}

/* ---- one step ------------------------------------------------------------------------- */

/* Mean of a per-rank value over the dp group (float32 on the wire). */
static double dp_mean(trainer *tr, double x)
{
  if (tr->D == 1)
    return x;
  float v = (float)x;
  wf_comm_allreduce(tr->dp_comm, &v, &v, 1, WF_COMM_F32, WF_COMM_AVG);
  return v;
}

/* The last stage's value on every stage. */
static double from_last_stage(trainer *tr, double x)
{
  if (tr->pp == 1)
    return x;
  float v = (float)x;
  wf_comm_bcast(tr->pp_comm, &v, 1, WF_COMM_F32, tr->pp - 1);
  return v;
}

static wf_status batch_cb(void *user, int mb, int *inputs, int *targets)
{
  trainer *tr = user;
  int index = tr->split == WF_DATA_TRAIN ? tr->step - 1 : tr->step;
  wf_status st =
      wf_data_batch(tr->data, inputs, targets, tr->split, index, tr->dp_rank, tr->D, mb, tr->M);
  return st == WF_OK ? WF_OK : fail_msg(st, "cannot assemble a batch");
}

static void arm_cb(void *user)
{
  trainer *tr = user;
  if (tr->dp)
    wf_dp_arm(tr->dp); /* reduce gradient buckets while the last backward runs */
}

/* Forward and backward of this rank's micro-batches through the pipeline schedule,
 * gradients accumulated with dloss 1/M; returns the mean loss over the global batch. */
static wf_status accumulate(trainer *tr, int step, double *loss, wf_pipe_stats *ps)
{
  tr->step = step;
  tr->split = WF_DATA_TRAIN;
  wf_status st = wf_pipe_step(tr->pipe, step, batch_cb, arm_cb, tr, loss, ps);
  if (st != WF_OK)
    return fail_msg(st, "the pipeline step failed (see above)");
  *loss = from_last_stage(tr, dp_mean(tr, *loss / tr->M));
  return WF_OK;
}

/* The tied embedding: the first and the last stage each hold wte (their tp slice);
 * its gradient is the sum of both stages' contributions. */
static wf_status sum_tied_embedding(trainer *tr)
{
  if (tr->pp == 1 || !tr->emb_comm)
    return WF_OK;
  float *g = wf_gpt_param(tr->model, WF_P_WTE, 0, 1);
  size_t n = wf_gpt_local_numel(tr->model, WF_P_WTE);
  return wf_comm_allreduce(tr->emb_comm, g, g, n, WF_COMM_F32, WF_COMM_SUM);
}

/* Make the gradients complete: sums over tp (sequence-parallel layernorms) and over
 * the embedding group, and the dp average. These sums are linear and commute with
 * the dp average, so without ZeRO they follow wf_dp_finish (which may have started
 * during backward); under ZeRO they must precede its reduce-scatter, after which each
 * rank holds only its shard. */
static wf_status complete_grads(trainer *tr)
{
  bool after = tr->dp && !tr->cfg->optim.zero;
  wf_status st = WF_OK;
  if (after)
    st = wf_dp_finish(tr->dp);
  if (st == WF_OK)
    st = wf_gpt_finish_grads(tr->model);
  if (st == WF_OK)
    st = sum_tied_embedding(tr);
  if (st == WF_OK && tr->dp && !after)
    st = wf_dp_finish(tr->dp);
  return st;
}

/* fp16: the factor this rank's backward multiplies the loss gradient by, S / D (see the
 * top of the file); 1 without loss scaling. The gradients it leaves, dp-averaged, are
 * this factor times the true ones. */
static double backward_scale(const trainer *tr) { return tr->fp16 ? tr->ls.scale / tr->D : 1.0; }

/* Global gradient norm: each rank's counted sum of squares, summed over dp (ZeRO
 * shards), tp and pp. With fp16 loss scaling the gradients are S times the true ones:
 * the sum is unscaled (in double, before it narrows to float) so *norm is the true
 * norm. */
static wf_status global_norm(trainer *tr, float *norm)
{
  double ss = 0;
  wf_status st = tr->dp ? wf_dp_grad_sumsq(tr->dp, &ss) : WF_OK;
  if (!tr->dp)
    ss = wf_gpt_grad_sumsq(tr->model);
  if (tr->fp16)
    ss /= backward_scale(tr) * backward_scale(tr);
  float x = (float)ss;
  if (st == WF_OK && tr->tp > 1)
    st = wf_comm_allreduce(tr->tp_comm, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM);
  if (st == WF_OK && tr->pp > 1)
    st = wf_comm_allreduce(tr->pp_comm, &x, &x, 1, WF_COMM_F32, WF_COMM_SUM);
  *norm = sqrtf(x);
  return st;
}

/* fp16, non-finite gradients: no update (parameters, m, v and t stay) and S halves. At
 * S <= 1 no smaller scale can help: that is divergence, not overflow. */
static wf_status skip_step(trainer *tr, int step)
{
  double old = tr->ls.scale;
  bool fixed = tr->cfg->optim.loss_scale > 0;
  if (old <= 1.0) {
    WF_ERROR("step %d: gradients are not finite at loss scale %g: training diverged; lower "
             "train.lr or set optim.clip",
             step, old);
    return WF_EINVAL;
  }
  tr->ls.skipped++;
  tr->ls.good_steps = 0;
  if (!fixed)
    tr->ls.scale = fmax(1.0, old / 2);
  if (tr->talk)
    WF_INFO("step %d: gradient overflow at loss scale %g: optimizer step skipped (%d so far), "
            "loss scale %s %g",
            step, old, tr->ls.skipped, fixed ? "stays" : "now", tr->ls.scale);
  return WF_OK;
}

/* fp16, a finite step: S doubles after optim.loss_scale_window of them in a row (up to
 * 2^64, far beyond where fp16 activation gradients overflow, which bounds it first). */
static void scaler_good(trainer *tr)
{
  if (!tr->fp16 || tr->cfg->optim.loss_scale > 0)
    return;
  if (++tr->ls.good_steps < tr->cfg->optim.loss_scale_window)
    return;
  tr->ls.good_steps = 0;
  tr->ls.scale = fmin(tr->ls.scale * 2, 0x1p64);
}

/* Clip by the global norm (and unscale by 1/S in the same factor), AdamW at step t. */
static wf_status update(trainer *tr, int step, float norm, double lr)
{
  const wf_config *cfg = tr->cfg;
  float clip = (float)cfg->optim.clip;
  float scale = clip > 0 && norm > clip ? clip / norm : 1.0f;
  if (tr->fp16)
    scale = (float)(scale / backward_scale(tr));
  float b1 = (float)cfg->optim.beta1, b2 = (float)cfg->optim.beta2, eps = (float)cfg->optim.eps;
  float wd = (float)cfg->optim.weight_decay;
  int t = step - tr->ls.skipped; /* AdamW counts the updates it made */
  scaler_good(tr);
  if (tr->dp)
    return wf_dp_update(tr->dp, (float)lr, b1, b2, eps, wd, scale, t);
  wf_gpt_update(tr->model, (float)lr, b1, b2, eps, wd, scale, t);
  return WF_OK;
}

/* Reduce gradients, clip by the global norm, AdamW with the scheduled lr; under fp16 an
 * overflow anywhere skips the update. *skipped says whether it did. */
static wf_status reduce_and_update(trainer *tr, int step, double loss, float *norm, double *lr,
                                   bool *skipped)
{
  double t0 = wf_now();
  wf_status st = complete_grads(tr);
  if (wf_trace_on(tr->trace))
    wf_trace_span(tr->trace, "gradient reduction", "comm", t0, wf_now(), step, -1);
  if (st == WF_OK)
    st = global_norm(tr, norm);
  if (st != WF_OK)
    return fail_msg(st, "gradient reduction failed");
  /* fp16 overflow anywhere in the job: the norm is every counted gradient's sum of
   * squares, all-reduced over dp, tp and pp, so one inf or NaN makes it non-finite on
   * every rank alike (the uncounted copies, replicated tensors and the last stage's wte,
   * equal counted ones once the reductions are done). */
  *skipped = tr->fp16 && !isfinite(*norm);
  *lr = wf_train_lr(tr->cfg, step);
  if (*skipped)
    return skip_step(tr, step);
  if (!isfinite(loss) || !isfinite(*norm)) {
    WF_ERROR("step %d: loss %g, gradient norm %g: training diverged; lower train.lr or set "
             "optim.clip",
             step, loss, (double)*norm);
    return WF_EINVAL;
  }
  return update(tr, step, *norm, *lr);
}

/* The two copies of the tied embedding must stay bit-identical: compare a 60-bit hash
 * of each (two floats whose exponents cannot make a NaN) over the embedding group. */
static wf_status check_tied(trainer *tr, int step)
{
  if (tr->pp == 1 || !tr->emb_comm)
    return WF_OK;
  uint64_t h = XXH3_64bits(wf_gpt_param(tr->model, WF_P_WTE, 0, 0),
                           wf_gpt_local_numel(tr->model, WF_P_WTE) * sizeof(float));
  h &= 0x3fffffff3fffffffull;
  float mine[2], all[4];
  memcpy(mine, &h, sizeof h);
  wf_status st = wf_comm_allgather(tr->emb_comm, mine, all, 2, WF_COMM_F32);
  if (st != WF_OK)
    return st;
  if (memcmp(all, all + 2, 2 * sizeof(float)) != 0) {
    WF_ERROR("step %d: the tied embedding's copies on the first and last pipeline stage "
             "differ; their gradients were not summed over the embedding group",
             step);
    return WF_EINVAL;
  }
  tr->tied_checks++;
  return WF_OK;
}

/* Pipeline figures of every stage on every rank: peak activations (bytes and
 * micro-batches), and the bubble as the theory defines it: the idle share of the
 * pipeline's span, 1 - mean(busy) / longest schedule wall time. The stages start a
 * step together (after the previous step's collectives) but the last one finishes
 * early, while stage 0 runs the final backwards: its own wall time would hide that
 * idle tail. */
static void stage_stats(trainer *tr, const wf_pipe_stats *ps, wf_train_step_info *info)
{
  enum { K = 4 };
  float mine[K] = {(float)ps->act_bytes, (float)ps->peak_slots, (float)ps->busy_s,
                   (float)ps->wall_s};
  float all[K * WF_MAX_STAGES];
  info->n_stages = tr->pp;
  if (tr->pp > 1)
    wf_comm_allgather(tr->pp_comm, mine, all, K, WF_COMM_F32);
  else
    memcpy(all, mine, sizeof mine);
  double busy = 0, span = 0;
  for (int s = 0; s < tr->pp && s < WF_MAX_STAGES; s++) {
    info->stage_act_bytes[s] = (int64_t)all[K * s];
    info->stage_peak_slots[s] = (int)all[K * s + 1];
    busy += all[K * s + 2];
    span = WF_MAX(span, (double)all[K * s + 3]);
  }
  info->bubble = tr->pp > 1 && span > 0 ? 1 - busy / tr->pp / span : 0;
  wf_sched_params prm = {tr->cfg->train.schedule, tr->pp, tr->M, tr->chunks};
  info->bubble_theory = tr->pp > 1 ? wf_schedule_bubble_theory(&prm) : 0;
}

static bool tracing(const trainer *tr, int step)
{
  const int *ts = tr->cfg->train.trace_steps;
  return tr->trace && step >= ts[0] && step <= ts[1];
}

static wf_status train_step(trainer *tr, int step, wf_train_step_info *info)
{
  double t0 = wf_now(), loss = 0, lr = 0, tp_s = 0, tp_bytes = 0, scale = tr->ls.scale;
  float norm = 0;
  bool skipped = false;
  wf_pipe_stats ps = {0};
  if (tr->trace)
    wf_trace_set_on(tr->trace, tracing(tr, step));
  wf_gpt_set_loss_scale(tr->model, (float)backward_scale(tr));
  wf_status st = accumulate(tr, step, &loss, &ps);
  double tr0 = wf_now();
  if (st == WF_OK)
    st = reduce_and_update(tr, step, loss, &norm, &lr, &skipped);
  if (st == WF_OK)
    st = check_tied(tr, step);
  if (st != WF_OK)
    return st;
  double dt = wf_now() - t0;
  if (tr->trace && wf_trace_on(tr->trace))
    wf_trace_span(tr->trace, "step end (reduction, norm, AdamW)", "optim", tr0, wf_now(), step, -1);
  wf_mem_stats ms;
  wf_mem_get_stats(&ms);
  wf_dp_stats ds = {0};
  if (tr->dp)
    wf_dp_get_stats(tr->dp, &ds);
  else
    ds.optimizer_bytes = 2 * wf_gpt_local_params(tr->model) * sizeof(float);
  wf_gpt_tp_stats(tr->model, &tp_s, &tp_bytes);
  *info = (wf_train_step_info){
      .step = step,
      .steps = tr->steps,
      .loss = loss,
      .lr = lr,
      .grad_norm = skipped ? NAN : norm, /* an overflowed step has no norm */
      .step_ms = dt * 1e3,
      .tokens_per_s = (double)tr->B * tr->M * tr->D * tr->T / dt,
      .tflops = tr->flops / dt * 1e-12,
      .val_loss = NAN,
      .entropy_floor = wf_data_entropy_floor(tr->data),
      .mem_bytes = ms.current[WF_MEM_HOST] + ms.current[WF_MEM_DEVICE],
      .comm_ms = ds.exposed_ms,
      .tp_ms = tp_s * 1e3,
      .optim_bytes = (int64_t)ds.optimizer_bytes,
      .params = (int64_t)wf_gpt_local_params(tr->model),
      .loss_scale = tr->fp16 ? scale : NAN,
      .skipped = skipped,
      .skipped_steps = tr->ls.skipped,
  };
  stage_stats(tr, &ps, info);
  /* The peak was measured for one rank's threads; the job has world_size such ranks. */
  info->mfu = tr->peak_tflops > 0 ? info->tflops / (tr->peak_tflops * tr->world_size) : 0;
  return WF_OK;
}

/* Mean loss over the fixed validation batches 0 .. eval_batches-1. */
static wf_status evaluate(trainer *tr, double *val_loss)
{
  int n = tr->cfg->train.eval_batches;
  double sum = 0;
  tr->split = WF_DATA_VAL;
  for (int i = 0; i < n; i++) {
    double part = 0;
    tr->step = i;
    wf_status st = wf_pipe_forward(tr->pipe, batch_cb, tr, &part);
    if (st != WF_OK)
      return fail_msg(st, "evaluation failed (see above)");
    sum += part;
  }
  *val_loss = from_last_stage(tr, dp_mean(tr, sum / ((double)n * tr->M)));
  return WF_OK;
}

/* ---- reporting ---------------------------------------------------------------------------- */

static void clear_bar(const trainer *tr)
{
  if (tr->bar)
    fputs("\r\033[K", stderr);
}

static void draw_bar(const trainer *tr, const wf_train_step_info *in, double eta)
{
  enum { WIDTH = 30 };
  static const char full[] = "##############################";
  static const char empty[] = "..............................";
  int fill = (int)((long long)WIDTH * in->step / in->steps);
  fprintf(stderr, "\r[%.*s%.*s] %d/%d loss %.4f eta %.0fs", fill, full, WIDTH - fill, empty,
          in->step, in->steps, in->loss, eta);
  fflush(stderr);
}

static void print_step(const trainer *tr, const wf_train_step_info *in, double eta)
{
  clear_bar(tr);
  fprintf(tr->out,
          "step %d/%d loss=%.4f lr=%.2e grad_norm=%.3f tok/s=%.0f tflops=%.3f mfu=%.1f%% "
          "step_ms=%.1f comm_ms=%.1f mem=%.1fMiB optim=%.2fMiB eta=%.0fs",
          in->step, in->steps, in->loss, in->lr, in->grad_norm, in->tokens_per_s, in->tflops,
          in->mfu * 100, in->step_ms, in->comm_ms, (double)in->mem_bytes / (1024.0 * 1024.0),
          (double)in->optim_bytes / (1024.0 * 1024.0), eta);
  if (tr->fp16) /* the scale this step's backward used, and the skips so far */
    fprintf(tr->out, " loss_scale=%g skipped=%d%s", in->loss_scale, in->skipped_steps,
            in->skipped ? " (this step)" : "");
  fputc('\n', tr->out);
}

/* Model-parallel figures, on the step line's continuation when there are any. */
static void print_parallel(const trainer *tr, const wf_train_step_info *in)
{
  if (tr->tp == 1 && tr->pp == 1)
    return;
  if (tr->tp > 1)
    fprintf(tr->out, "  tp_ms=%.1f", in->tp_ms);
  if (tr->pp > 1)
    fprintf(tr->out, "  bubble=%.1f%% theory=%.1f%%", in->bubble * 100, in->bubble_theory * 100);
  fprintf(tr->out, "  act_mib=[");
  for (int s = 0; s < in->n_stages && s < WF_MAX_STAGES; s++)
    fprintf(tr->out, "%s%.2f", s ? "," : "", (double)in->stage_act_bytes[s] / (1 << 20));
  fputs("]\n", tr->out);
}

static void print_eval(const trainer *tr, const wf_train_step_info *in, double eval_ms)
{
  clear_bar(tr);
  fprintf(tr->out, "eval %d/%d val_loss=%.4f", in->step, in->steps, in->val_loss);
  if (!isnan(in->entropy_floor))
    fprintf(tr->out, " floor=%.4f gap=%.4f", in->entropy_floor, in->val_loss - in->entropy_floor);
  fprintf(tr->out, " eval_ms=%.1f\n", eval_ms);
}

/* jansson refuses NaN and infinities (they are not JSON): write null instead. */
static json_t *real_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }

/* Model-parallel figures: tp_ms, the pipeline bubble beside its theory, and per stage
 * the peak activations in MiB and in micro-batches held (act_mib, act_slots). */
static void add_parallel_metrics(json_t *o, const wf_train_step_info *in)
{
  json_t *mib = json_array(), *slots = json_array();
  for (int s = 0; s < in->n_stages && s < WF_MAX_STAGES; s++) {
    json_array_append_new(mib, json_real((double)in->stage_act_bytes[s] / (1024.0 * 1024.0)));
    json_array_append_new(slots, json_integer(in->stage_peak_slots[s]));
  }
  json_object_set_new(o, "tp_ms", real_or_null(in->tp_ms));
  json_object_set_new(o, "bubble", real_or_null(in->bubble));
  json_object_set_new(o, "bubble_theory", real_or_null(in->bubble_theory));
  json_object_set_new(o, "act_mib", mib);
  json_object_set_new(o, "act_slots", slots);
}

static void write_metrics(trainer *tr, const wf_train_step_info *in)
{
  json_t *o = json_object();
  if (!o)
    return;
  json_object_set_new(o, "step", json_integer(in->step));
  json_object_set_new(o, "loss", real_or_null(in->loss));
  json_object_set_new(o, "lr", real_or_null(in->lr));
  json_object_set_new(o, "grad_norm", real_or_null(in->grad_norm));
  json_object_set_new(o, "tokens_per_s", real_or_null(in->tokens_per_s));
  json_object_set_new(o, "step_ms", real_or_null(in->step_ms));
  json_object_set_new(o, "tflops", real_or_null(in->tflops));
  json_object_set_new(o, "mfu", real_or_null(in->mfu));
  json_object_set_new(o, "mem_mib", real_or_null((double)in->mem_bytes / (1024.0 * 1024.0)));
  json_object_set_new(o, "comm_ms", real_or_null(in->comm_ms));
  json_object_set_new(o, "optim_mib", real_or_null((double)in->optim_bytes / (1024.0 * 1024.0)));
  if (!isnan(in->val_loss))
    json_object_set_new(o, "val_loss", real_or_null(in->val_loss));
  if (tr->tp > 1 || tr->pp > 1)
    add_parallel_metrics(o, in);
  if (tr->fp16) {
    json_object_set_new(o, "loss_scale", real_or_null(in->loss_scale));
    json_object_set_new(o, "skipped_steps", json_integer(in->skipped_steps));
    json_object_set_new(o, "step_skipped", json_boolean(in->skipped));
  }
  if (json_dumpf(o, tr->metrics, JSON_COMPACT) == 0)
    fputc('\n', tr->metrics);
  fflush(tr->metrics); /* one complete line per step, even if the run dies */
  json_decref(o);
}

/* ---- the loop ---------------------------------------------------------------------------- */

static bool eval_due(const trainer *tr, int step)
{
  int every = tr->cfg->train.eval_every;
  return tr->can_eval && (step == tr->steps || (every > 0 && step % every == 0));
}

/* After step's on_step: write a checkpoint when one is due. stopping: on_step ended
 * the run (SIGTERM, the console's stop), so this is the last chance. */
static wf_status maybe_checkpoint(trainer *tr, int step, bool stopping)
{
  const wf_config *cfg = tr->cfg;
  const wf_train_hooks *h = tr->hooks;
  int every = cfg->train.checkpoint_every;
  if (!cfg->train.checkpoint_dir[0])
    return WF_OK;
  bool due = stopping || step == tr->steps || (every > 0 && step % every == 0) ||
             (h && h->checkpoint_now && h->checkpoint_now(h->user));
  if (!due)
    return WF_OK;
  if (h && h->on_phase)
    h->on_phase(h->user, "checkpoint");
  wf_status st = wf_ckpt_save(&tr->ck, step);
  if (h && h->on_phase)
    h->on_phase(h->user, "train");
  if (st != WF_OK)
    WF_ERROR("step %d: the checkpoint could not be written (see above); training stops here so "
             "no progress goes unsaved",
             step);
  return st;
}

static wf_status run_loop(trainer *tr)
{
  tr->t0 = wf_now();
  if (tr->start >= tr->steps && tr->talk)
    fprintf(tr->out, "the checkpoint is at step %d of train.steps %d: nothing to train\n",
            tr->start, tr->steps);
  for (int step = tr->start + 1; step <= tr->steps; step++) {
    wf_train_step_info info;
    wf_status st = train_step(tr, step, &info);
    if (st != WF_OK)
      return st;
    double eval_ms = 0;
    if (eval_due(tr, step)) {
      double t = wf_now();
      wf_trace_set_on(tr->trace, false); /* the trace shows training steps */
      st = evaluate(tr, &info.val_loss);
      if (st != WF_OK)
        return st;
      eval_ms = (wf_now() - t) * 1e3;
    }
    double eta = (wf_now() - tr->t0) / (step - tr->start) * (tr->steps - step);
    if (tr->talk) {
      print_step(tr, &info, eta);
      print_parallel(tr, &info);
      if (!isnan(info.val_loss))
        print_eval(tr, &info, eval_ms);
      fflush(tr->out);
      if (tr->bar)
        draw_bar(tr, &info, eta);
    }
    if (tr->metrics)
      write_metrics(tr, &info);
    bool go_on = !tr->hooks || !tr->hooks->on_step || tr->hooks->on_step(tr->hooks->user, &info);
    st = maybe_checkpoint(tr, step, !go_on);
    if (st != WF_OK || !go_on) {
      clear_bar(tr);
      return st;
    }
  }
  clear_bar(tr);
  return WF_OK;
}

/* The final model as an llm.c checkpoint, written by world rank 0. With model
 * parallelism every rank of dp rank 0 adds its slices into a whole-model buffer
 * (wf_gpt_export_full) and a sum over the world assembles it. */
static wf_status save_final(trainer *tr)
{
  const char *path = tr->hooks ? tr->hooks->save_llmc : NULL;
  char err[1024];
  if (!path)
    return WF_OK;
  wf_gpt *out = tr->model, *whole = NULL;
  wf_status st = WF_OK;
  if (tr->tp > 1 || tr->pp > 1) {
    st = wf_gpt_create(&whole, &tr->dims, 1, 1);
    if (st != WF_OK)
      return fail_msg(st, "cannot allocate the whole model to save");
    memset(wf_gpt_params(whole), 0, wf_gpt_num_params(&tr->dims) * sizeof(float));
    if (tr->dp_rank == 0)
      wf_gpt_export_full(tr->model, 0, wf_gpt_params(whole));
    st = wf_comm_allreduce(tr->world, wf_gpt_params(whole), wf_gpt_params(whole),
                           wf_gpt_num_params(&tr->dims), WF_COMM_F32, WF_COMM_SUM);
    out = whole;
  }
  if (st == WF_OK && wf_rt_rank() <= 0) {
    st = wf_gpt_save_llmc(out, path, err, sizeof err);
    if (st != WF_OK)
      WF_ERROR("%s", err);
  }
  wf_gpt_destroy(whole);
  return st;
}

/* train.trace: every rank's spans into one Chrome trace file (collective). */
static wf_status write_trace(trainer *tr)
{
  if (!tr->trace)
    return WF_OK;
  wf_status st = wf_trace_write(tr->trace, tr->cfg->train.trace);
  if (st == WF_OK && tr->talk)
    fprintf(tr->out, "trace: steps %d..%d of every rank in %s\n", tr->cfg->train.trace_steps[0],
            tr->cfg->train.trace_steps[1], tr->cfg->train.trace);
  return st;
}

wf_status wf_train_run(const wf_config *cfg, const wf_train_hooks *hooks)
{
  trainer tr;
  wf_status st = setup(&tr, cfg, hooks, cfg->train.microbatches, true);
  if (st == WF_OK)
    st = run_loop(&tr);
  if (st == WF_OK)
    st = write_trace(&tr);
  if (st == WF_OK)
    st = save_final(&tr);
  if (st == WF_OK && tr.tied_checks > 0 && tr.talk)
    fprintf(tr.out,
            "tied embedding: the first and last stage's copies were identical after "
            "each of %ld steps\n",
            tr.tied_checks);
  teardown(&tr);
  return st;
}

/* Sum a whole-model-sized buffer over the world onto every rank (debug paths only). */
static wf_status world_sum(trainer *tr, float *x, size_t n)
{
  return tr->world ? wf_comm_allreduce(tr->world, x, x, n, WF_COMM_F32, WF_COMM_SUM) : WF_OK;
}

/* A model-parallel debug state: one forward and backward of the global batch through
 * the stages, then the whole gradients and the logits assembled by sums over the
 * world (only dp rank 0 contributes; every dp replica computed the same batch). */
static wf_status dump_sharded(trainer *tr, const char *path, int dp_rank)
{
  char err[1024] = "";
  size_t np = wf_gpt_num_params(&tr->dims), N = (size_t)tr->B * tr->T;
  size_t nl = N * (size_t)tr->dims.Vp;
  double loss = 0;
  float *grads = calloc(np, sizeof *grads), *logits = calloc(nl, sizeof *logits);
  wf_status st = grads && logits ? WF_OK : WF_ENOMEM;
  /* the logits of the forward, before backward turns them into their gradient */
  if (st == WF_OK && wf_gpt_get_shard(tr->model)->last && dp_rank == 0) {
    tr->split = WF_DATA_TRAIN, tr->step = 1;
    st = wf_pipe_forward(tr->pipe, batch_cb, tr, &loss);
    int Vl = tr->dims.Vp / tr->tp, r = comm_rank(tr->tp_comm);
    const float *mine = wf_gpt_logits(tr->model);
    for (size_t i = 0; i < N; i++)
      memcpy(logits + i * tr->dims.Vp + (size_t)r * Vl, mine + i * Vl, Vl * sizeof(float));
  } else if (st == WF_OK) {
    tr->split = WF_DATA_TRAIN, tr->step = 1;
    st = wf_pipe_forward(tr->pipe, batch_cb, tr, &loss);
  }
  if (st == WF_OK)
    st = accumulate(tr, 1, &loss, NULL);
  if (st == WF_OK)
    st = complete_grads(tr);
  if (st == WF_OK && dp_rank == 0)
    wf_gpt_export_full(tr->model, 1, grads);
  if (st == WF_OK)
    st = world_sum(tr, grads, np);
  if (st == WF_OK)
    st = world_sum(tr, logits, nl);
  if (st == WF_OK && wf_rt_rank() <= 0) {
    st = wf_data_batch(tr->data, tr->inputs, tr->targets, WF_DATA_TRAIN, 0, 0, 1, 0, 1);
    if (st == WF_OK)
      st = wf_llmc_write_state(path, &tr->dims, tr->B, tr->T, tr->inputs, tr->targets, logits,
                               (float)loss, grads, err, sizeof err);
    if (st != WF_OK)
      WF_ERROR("%s", err[0] ? err : "cannot assemble the debug state");
  }
  free(grads);
  free(logits);
  return st;
}

wf_status wf_train_dump_state(const wf_config *cfg, const char *path, const wf_train_hooks *comms)
{
  trainer tr;
  wf_train_hooks quiet = {.quiet = true};
  if (comms && (comms->tp || comms->pp)) {
    quiet.tp = comms->tp, quiet.pp = comms->pp, quiet.emb = comms->emb;
    quiet.world = comms->world;
  }
  char err[1024] = "";
  wf_status st = setup(&tr, cfg, &quiet, 1, false); /* the whole global batch at once */
  if (st == WF_OK && (tr.tp > 1 || tr.pp > 1)) {
    st = dump_sharded(&tr, path, comms->dp ? wf_comm_rank(comms->dp) : 0);
  } else {
    if (st == WF_OK)
      st = wf_data_batch(tr.data, tr.inputs, tr.targets, WF_DATA_TRAIN, 0, 0, 1, 0, 1);
    if (st == WF_OK) {
      st = wf_gpt_dump_state(tr.model, path, tr.inputs, tr.targets, tr.B, tr.T, err, sizeof err);
      if (st != WF_OK)
        WF_ERROR("%s", err);
    }
  }
  teardown(&tr);
  return st;
}
