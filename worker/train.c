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

#include "wf_checkpoint.h"
#include "wf_data.h"
#include "wf_dp.h"
#include "wf_kernels.h"
#include "wf_model.h"
#include "wf_train.h"

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
  int dp_rank, D;   /* this rank's data-parallel slice of D */
  wf_data *data;
  wf_gpt_dims dims;
  int B, T, M, steps;    /* micro-batch rows, sequence length, micro-batches, steps */
  int *inputs, *targets; /* (B, T) */
  FILE *metrics;
  double peak_tflops; /* for MFU; 0 = unknown */
  double flops;       /* per step, for the whole global batch */
  double t0;          /* start of the loop */
  wf_ckpt_target ck;  /* what checkpoints save and restore */
  int start;          /* steps done before this run (a resumed checkpoint's step) */
} trainer;

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

/* Micro-batch geometry of one rank: the global batch is split over D data-parallel
 * ranks, then into M micro-batches of B rows each. */
static wf_status setup_geometry(trainer *tr, int M)
{
  const wf_config *cfg = tr->cfg;
  char err[256];
  tr->M = M > 0 ? M : 1;
  tr->D = tr->dp_comm ? wf_comm_size(tr->dp_comm) : 1;
  tr->dp_rank = tr->dp_comm ? wf_comm_rank(tr->dp_comm) : 0;
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

static wf_status setup_model(trainer *tr)
{
  const wf_config *cfg = tr->cfg;
  char err[1024] = "";
  wf_status st = WF_OK;
  tr->dims = wf_gpt_dims_from_config(cfg);
  if (cfg->model.init[0]) {
    st = wf_gpt_peek_llmc(cfg->model.init, &tr->dims, err, sizeof err);
    if (st != WF_OK)
      return fail_msg(st, err);
  }
  if (tr->T > tr->dims.maxT) {
    snprintf(err, sizeof err, "train.seq_len %d exceeds the model's context %d (model.seq_len)",
             tr->T, tr->dims.maxT);
    return fail_msg(WF_ECONFIG, err);
  }
  st = wf_gpt_create(&tr->model, &tr->dims, tr->B, tr->T);
  if (st != WF_OK)
    return fail_msg(st, "cannot allocate the model (see above)");
  if (cfg->model.init[0]) {
    st = wf_gpt_load_llmc(tr->model, cfg->model.init, err, sizeof err);
    if (st != WF_OK)
      return fail_msg(st, err);
  } else {
    wf_gpt_init(tr->model, cfg->train.seed);
  }
  tr->flops = wf_gpt_flops_per_step(&tr->dims, tr->B * tr->M * tr->D, tr->T);
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
  tr->ck = (wf_ckpt_target){tr->cfg, tr->model, tr->dp, tr->dp_comm, h ? h->world : NULL, 0, 0};
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
  fflush(tr->out);
}

static wf_status setup(trainer *tr, const wf_config *cfg, const wf_train_hooks *hooks, int M,
                       bool checkpoints)
{
  memset(tr, 0, sizeof *tr);
  tr->cfg = cfg;
  tr->hooks = hooks;
  tr->dp_comm = hooks ? hooks->dp : NULL;
  tr->out = hooks && hooks->out ? hooks->out : stdout;
  tr->talk = wf_rt_rank() <= 0 && !(hooks && hooks->quiet);
  /* mpirun gives ranks a pseudo-terminal, so isatty() alone would draw bars into
   * launcher logs: only a process started by hand on a terminal gets one. */
  tr->bar = tr->talk && isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") &&
            !getenv("SLURM_PROCID") && !getenv("PMI_RANK");
  wf_status st = setup_geometry(tr, M);
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
  wf_gpt_destroy(tr->model);
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

/* Forward and backward of this rank's micro-batches, gradients accumulated with
 * dloss 1/M; returns the mean loss over the global batch. */
static wf_status accumulate(trainer *tr, int step, double *loss)
{
  *loss = 0;
  wf_gpt_zero_grad(tr->model);
  for (int mb = 0; mb < tr->M; mb++) {
    wf_status st = wf_data_batch(tr->data, tr->inputs, tr->targets, WF_DATA_TRAIN, step - 1,
                                 tr->dp_rank, tr->D, mb, tr->M);
    if (st != WF_OK)
      return fail_msg(st, "cannot assemble the training batch");
    *loss += wf_gpt_forward(tr->model, tr->inputs, tr->targets, tr->B, tr->T);
    if (tr->dp && mb == tr->M - 1)
      wf_dp_arm(tr->dp); /* reduce gradient buckets while the last backward runs */
    wf_gpt_backward(tr->model, 1.0f / (float)tr->M);
  }
  *loss = dp_mean(tr, *loss / tr->M);
  return WF_OK;
}

/* Reduce gradients over dp, clip by the global norm, AdamW with the scheduled lr. */
static wf_status reduce_and_update(trainer *tr, int step, double loss, float *norm, double *lr)
{
  const wf_config *cfg = tr->cfg;
  wf_status st = WF_OK;
  if (tr->dp) {
    st = wf_dp_finish(tr->dp);
    if (st == WF_OK)
      st = wf_dp_grad_norm(tr->dp, norm);
    if (st != WF_OK)
      return fail_msg(st, "data-parallel gradient reduction failed");
  } else {
    *norm = wf_gpt_grad_norm(tr->model);
  }
  if (!isfinite(loss) || !isfinite(*norm)) {
    WF_ERROR("step %d: loss %g, gradient norm %g: training diverged; lower train.lr or set "
             "optim.clip",
             step, loss, (double)*norm);
    return WF_EINVAL;
  }
  float clip = (float)cfg->optim.clip;
  float scale = clip > 0 && *norm > clip ? clip / *norm : 1.0f;
  *lr = wf_train_lr(cfg, step);
  float b1 = (float)cfg->optim.beta1, b2 = (float)cfg->optim.beta2, eps = (float)cfg->optim.eps;
  float wd = (float)cfg->optim.weight_decay;
  if (tr->dp)
    return wf_dp_update(tr->dp, (float)*lr, b1, b2, eps, wd, scale, step);
  wf_gpt_update(tr->model, (float)*lr, b1, b2, eps, wd, scale, step);
  return WF_OK;
}

static wf_status train_step(trainer *tr, int step, wf_train_step_info *info)
{
  double t0 = wf_now(), loss = 0, lr = 0;
  float norm = 0;
  wf_status st = accumulate(tr, step, &loss);
  if (st == WF_OK)
    st = reduce_and_update(tr, step, loss, &norm, &lr);
  if (st != WF_OK)
    return st;
  double dt = wf_now() - t0;
  wf_mem_stats ms;
  wf_mem_get_stats(&ms);
  wf_dp_stats ds = {0};
  if (tr->dp)
    wf_dp_get_stats(tr->dp, &ds);
  else
    ds.optimizer_bytes = 2 * wf_gpt_num_params(&tr->dims) * sizeof(float);
  *info = (wf_train_step_info){
      .step = step,
      .steps = tr->steps,
      .loss = loss,
      .lr = lr,
      .grad_norm = norm,
      .step_ms = dt * 1e3,
      .tokens_per_s = (double)tr->B * tr->M * tr->D * tr->T / dt,
      .tflops = tr->flops / dt * 1e-12,
      .val_loss = NAN,
      .entropy_floor = wf_data_entropy_floor(tr->data),
      .mem_bytes = ms.current[WF_MEM_HOST] + ms.current[WF_MEM_DEVICE],
      .comm_ms = ds.exposed_ms,
      .optim_bytes = (int64_t)ds.optimizer_bytes,
  };
  /* The peak was measured for one rank's threads; the job has D such ranks. */
  info->mfu = tr->peak_tflops > 0 ? info->tflops / (tr->peak_tflops * tr->D) : 0;
  return WF_OK;
}

/* Mean loss over the fixed validation batches 0 .. eval_batches-1. */
static wf_status evaluate(trainer *tr, double *val_loss)
{
  int n = tr->cfg->train.eval_batches;
  double sum = 0;
  for (int i = 0; i < n; i++) {
    for (int mb = 0; mb < tr->M; mb++) {
      wf_status st = wf_data_batch(tr->data, tr->inputs, tr->targets, WF_DATA_VAL, i, tr->dp_rank,
                                   tr->D, mb, tr->M);
      if (st != WF_OK)
        return fail_msg(st, "cannot assemble a validation batch");
      sum += wf_gpt_forward(tr->model, tr->inputs, tr->targets, tr->B, tr->T);
    }
  }
  *val_loss = dp_mean(tr, sum / ((double)n * tr->M));
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
          "step_ms=%.1f comm_ms=%.1f mem=%.1fMiB optim=%.2fMiB eta=%.0fs\n",
          in->step, in->steps, in->loss, in->lr, in->grad_norm, in->tokens_per_s, in->tflops,
          in->mfu * 100, in->step_ms, in->comm_ms, (double)in->mem_bytes / (1024.0 * 1024.0),
          (double)in->optim_bytes / (1024.0 * 1024.0), eta);
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
      st = evaluate(tr, &info.val_loss);
      if (st != WF_OK)
        return st;
      eval_ms = (wf_now() - t) * 1e3;
    }
    double eta = (wf_now() - tr->t0) / (step - tr->start) * (tr->steps - step);
    if (tr->talk) {
      print_step(tr, &info, eta);
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

/* The final model as an llm.c checkpoint, written by world rank 0 (every dp rank
 * holds the same parameters). */
static wf_status save_final(trainer *tr)
{
  const char *path = tr->hooks ? tr->hooks->save_llmc : NULL;
  char err[1024];
  if (!path || wf_rt_rank() > 0)
    return WF_OK;
  wf_status st = wf_gpt_save_llmc(tr->model, path, err, sizeof err);
  return st == WF_OK ? WF_OK : fail_msg(st, err);
}

wf_status wf_train_run(const wf_config *cfg, const wf_train_hooks *hooks)
{
  trainer tr;
  wf_status st = setup(&tr, cfg, hooks, cfg->train.microbatches, true);
  if (st == WF_OK)
    st = run_loop(&tr);
  if (st == WF_OK)
    st = save_final(&tr);
  teardown(&tr);
  return st;
}

wf_status wf_train_dump_state(const wf_config *cfg, const char *path)
{
  trainer tr;
  wf_train_hooks quiet = {.quiet = true};
  char err[1024] = "";
  wf_status st = setup(&tr, cfg, &quiet, 1, false); /* the whole global batch at once */
  if (st == WF_OK)
    st = wf_data_batch(tr.data, tr.inputs, tr.targets, WF_DATA_TRAIN, 0, 0, 1, 0, 1);
  if (st == WF_OK) {
    st = wf_gpt_dump_state(tr.model, path, tr.inputs, tr.targets, tr.B, tr.T, err, sizeof err);
    if (st != WF_OK)
      WF_ERROR("%s", err);
  }
  teardown(&tr);
  return st;
}
