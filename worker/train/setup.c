/*
 * setup.c - everything before the first step: the micro-batch geometry, the model's
 * dimensions and this rank's stage, the model on its device (initialised, or loaded
 * from model.init), the pipeline engine, the gradient path and the optimizer, the
 * checkpoint directory and resume, the data, the trace and the metrics file.
 *
 * Order matters in two places: the trace is sized from the model's dimensions before
 * the model that records into it exists, and a checkpoint is restored after the
 * optimizer exists (it restores the optimizer's state) and after the data opens (a
 * data.source stream's position is part of it; the other sources' is the step).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train_int.h"
#include "wf_file.h"

int wf__comm_size(wf_comm *c) { return c ? wf_comm_size(c) : 1; }
int wf__comm_rank(wf_comm *c) { return c ? wf_comm_rank(c) : 0; }

/* Micro-batch geometry of one rank: the global batch is split over D data-parallel
 * ranks, then into M micro-batches of B rows each. */
static wf_status setup_geometry(wf__trainer *tr, int M)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  tr->M = M > 0 ? M : 1;
  tr->D = wf__comm_size(tr->dp_comm);
  tr->dp_rank = wf__comm_rank(tr->dp_comm);
  tr->tp = wf__comm_size(tr->tp_comm);
  tr->pp = wf__comm_size(tr->pp_comm);
  tr->pp_rank = wf__comm_rank(tr->pp_comm);
  tr->cp = wf__comm_size(tr->cp_comm);
  tr->cp_rank = wf__comm_rank(tr->cp_comm);
  tr->grad_size = wf__comm_size(tr->grad_comm);
  tr->world_size = tr->D * tr->tp * tr->pp * tr->cp;
  tr->T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len;
  tr->Tl = tr->T / tr->cp;
  WF_REFUSE(tr->cp == 1 || tr->T % (2 * tr->cp) == 0, WF_ECONFIG,
            "mesh.cp=%d splits each sequence into %d chunks, but train.seq_len=%d is not a "
            "multiple of %d",
            tr->cp, 2 * tr->cp, tr->T, 2 * tr->cp);
  tr->steps = cfg->train.steps;
  WF_REFUSE(cfg->train.batch_size > 0 && cfg->train.batch_size % (tr->M * tr->D) == 0 && tr->T > 0,
            WF_ECONFIG,
            "train.batch_size %d must be a positive multiple of dp %d x train.microbatches %d "
            "(and seq_len %d positive)",
            cfg->train.batch_size, tr->D, tr->M, tr->T);
  tr->B = cfg->train.batch_size / (tr->M * tr->D);
fail:
  return st;
}

/* Run fn on world rank 0 first and agree on its outcome, then on the other ranks and
 * agree again. A file every rank would fail to read alike (model.init missing, truncated,
 * not llm.c) is then reported once per job, by rank 0, and every rank fails with it;
 * what only another rank cannot read (no shared filesystem) is still reported there. */
static wf_status rank0_first(wf__trainer *tr, wf_status (*fn)(wf__trainer *, void *), void *arg)
{
  bool first = wf__comm_rank(tr->world) == 0;
  wf_status st = wf_comm_agree(tr->world, first ? fn(tr, arg) : WF_OK, NULL);
  if (st != WF_OK)
    return st;
  return wf_comm_agree(tr->world, first ? WF_OK : fn(tr, arg), NULL);
}

static wf_status peek_init(wf__trainer *tr, void *arg)
{
  (void)arg;
  return wf_weights_peek(tr->cfg->model.init, "model.init", &tr->dims);
}

/* The whole model's dimensions: the config's, or model.init's (any weights format). */
static wf_status setup_dims(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  tr->dims = wf_model_dims_from_config(cfg);
  if (cfg->model.init[0]) {
    WF_TRY(rank0_first(tr, peek_init, NULL));
    /* the router's training knobs: the config's, and its aux coefficient when given */
    int ak = wf_config_key_find("model.router_aux_loss_coef");
    if (cfg->source[ak] != WF_SRC_DEFAULT && cfg->model.router_aux_loss_coef >= 0)
      tr->dims.aux_coef = cfg->model.router_aux_loss_coef;
    tr->dims.z_coef = cfg->model.router_z_loss_coef;
    tr->dims.capacity = cfg->model.capacity_factor;
  }
  WF_REFUSE(tr->dims.E > 0 || (cfg->mesh.ep <= 1 && cfg->model.experts == 0), WF_ECONFIG,
            "mesh.ep=%d, model.experts=%d: model.init's model (model.family=%s) has no experts; "
            "remove them, or start from a mixture-of-experts model",
            cfg->mesh.ep, cfg->model.experts, wf_model_family_name(&tr->dims));
  WF_REFUSE(tr->dims.E == 0 || tr->cp == 1, WF_ECONFIG,
            "mesh.cp=%d with model.init's mixture of experts (model.family=%s): the routers' "
            "load-balancing statistics are not yet summed over the context-parallel ranks; set "
            "mesh.cp=1",
            tr->cp, wf_model_family_name(&tr->dims));
  const char *bad = wf_model_dims_check(&tr->dims); /* the family's own rules */
  WF_REFUSE(!bad, WF_ECONFIG, "model (model.family=%s, or model.init's): %s",
            wf_model_family_name(&tr->dims), bad);
  /* model.init's context bounds a derived length (model.seq_len is the file's) */
  bool derived =
      cfg->train.seq_len == 0 || cfg->source[wf_config_key_find("train.seq_len")] == WF_SRC_DERIVED;
  if (cfg->model.init[0] && derived) {
    tr->T = WF_MIN(tr->T, tr->dims.maxT);
    tr->Tl = tr->T / tr->cp; /* each cp rank's share of the capped length */
  }
  WF_REFUSE(tr->T <= tr->dims.maxT, WF_ECONFIG,
            "train.seq_len %d exceeds the model's context %d (model.seq_len)", tr->T,
            tr->dims.maxT);
  /* llm.c's format holds GPT-2 alone: say so now, not after training */
  bool llmc = tr->hooks && tr->hooks->save_llmc && tr->hooks->save_format != WF_WEIGHTS_SAFETENSORS;
  WF_REFUSE(!llmc || wf_model_family(&tr->dims)->llmc, WF_ECONFIG,
            "--save %s writes an llm.c checkpoint (the default --save-format), which holds "
            "GPT-2 only, and this model is model.family=%s: add --save-format safetensors",
            tr->hooks->save_llmc, wf_model_family_name(&tr->dims));
fail:
  return st;
}

/* The ZeRO stage the gradient path runs (wf_grads_create's: none without a dp group). */
static int zero_stage(const wf__trainer *tr) { return tr->grad_comm ? tr->cfg->optim.zero : 0; }

/* Where model.init goes: [lo, hi) of this rank's flat parameters, a host view (v) of
 * the model's flat vector, or under ZeRO-3 (no flat vector) of its dp shard. */
typedef struct init_dst {
  wf_dev_view v;
  size_t lo, hi;
} init_dst;

static wf_status read_init(wf__trainer *tr, void *arg)
{
  init_dst *o = arg;
  return wf_weights_read_shard(tr->cfg->model.init, "model.init", &tr->dims,
                               wf_model_get_shard(tr->model), o->lo, o->hi, o->v.host);
}

/* model.init into this rank's slices [lo, hi) of the parameters at dst
 * (wf_weights_read_shard: each format read at those elements alone, with no whole-model
 * host array, docs/memory.md). */
static wf_status load_range(wf__trainer *tr, float *dst, size_t lo, size_t hi)
{
  init_dst o = {.lo = lo, .hi = hi};
  wf_status st = wf_dev_map(tr->dev, &o.v, dst, (o.hi - o.lo) * sizeof(float), WF_MAP_WRITE);
  if (st != WF_OK)
    return st;
  st = rank0_first(tr, read_init, &o);
  wf_status u = wf_dev_unmap(tr->dev, &o.v);
  return st == WF_OK ? u : st;
}

/* The initial parameters: model.init's or the family's initialisation, written where
 * the parameters live (ZeRO-3: the dp shards alone, the dense tensors' and under expert
 * parallelism the experts', bit for bit their slices of the flat vector; sync_shard
 * refreshes what follows them, once a resume has had its turn). */
static wf_status init_params(wf__trainer *tr)
{
  wf_status st = WF_OK;
  wf_grads_part parts[WF_GRADS_PARTS];
  int n = wf_grads_parts(tr->grads, parts);
  bool init = tr->cfg->model.init[0] != '\0';
  if (!parts[0].params) { /* the model's flat vector */
    if (!init)
      return wf_model_init(tr->model, tr->cfg->train.seed);
    WF_TRY(load_range(tr, wf_model_params(tr->model), 0, wf_model_local_params(tr->model)));
    return wf_model_params_changed(tr->model);
  }
  for (int i = 0; i < n; i++) {
    const wf_grads_part *p = &parts[i];
    if (init)
      WF_TRY(load_range(tr, p->params, p->lo, p->hi));
    else
      WF_TRY(wf_model_init_range(tr->model, tr->cfg->train.seed, p->params, p->lo, p->hi));
  }
fail:
  return st;
}

/* ZeRO-3: the copies that follow the parameter shard (the gathered embeddings, mixed
 * precision's 16-bit weights) refreshed from it, once, after init_params and any resume
 * have written it. The refresh is a pure function of the shards (an all-gather, then a
 * rounding) and overwrites all it writes, and nothing reads those copies in between: a
 * refresh after the init alone was redundant without a resume and overwritten with one. */
static wf_status sync_shard(wf__trainer *tr)
{
  return wf_grads_param_shard(tr->grads) ? wf_grads_sync_params(tr->grads, false) : WF_OK;
}

/* Context parallelism's attention for the model of options o (its shard learns its cp
 * position): buffers for the largest micro-batch of this rank's heads. */
static wf_status setup_cp(wf__trainer *tr, wf_model_opts *o)
{
  wf_status st = WF_OK;
  if (tr->cp == 1)
    return WF_OK;
  wf_model_dims d = wf_model_dims_resolve(&tr->dims);
  /* every rank trains on the same kind of device (wf_job_check_devices): one refusal */
  WF_REFUSE(WF_K(wf_dev_kernels(tr->dev, WF_DT_F32), attention_block) != NULL, WF_ECONFIG,
            "mesh.cp=%d: device %s has no block attention kernels for context parallelism "
            "yet; train with mesh.cp on the CPU (runtime.device=cpu) or without mesh.cp",
            tr->cp, wf_dev_name(tr->dev));
  o->shard.cp = tr->cp, o->shard.cp_rank = tr->cp_rank;
  wf_cp_opts co = {.comm = tr->cp_comm,
                   .dev = tr->dev,
                   .mode = tr->cfg->parallel.cp_mode,
                   .max = wf_cp_geo_of(&d, tr->tp, tr->B, tr->Tl, (int)tr->cfg->precision)};
  WF_TRY(wf_cp_create(&tr->cpr, &co));
  wf_cp_set_trace(tr->cpr, tr->trace);
  o->cp = wf_cp_regions_of(tr->cpr);
fail:
  return st;
}

/* This rank's stage (wf_pipe_stage_shard, which the planner sizes too) on its device,
 * with the slots its schedule keeps in flight. */
static wf_status setup_stage(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  int r = tr->pp_rank;
  wf_pipe_stage_opts so = {.dims = &tr->dims,
                           .T = tr->T,
                           .pp = tr->pp,
                           .rank = r,
                           .kind = cfg->train.schedule,
                           .v = cfg->parallel.virtual_stages,
                           .pp_layers = cfg->parallel.pp_layers,
                           .n_pp_layers = cfg->parallel.n_pp_layers,
                           .tp = tr->tp,
                           .tp_rank = wf__comm_rank(tr->tp_comm),
                           .sequence = cfg->parallel.sequence,
                           .ep = wf__comm_size(tr->ep_comm),
                           .ep_rank = wf__comm_rank(tr->ep_comm)};
  wf_model_opts o = {.dims = tr->dims,
                     .dev = tr->dev,
                     .B = tr->B,
                     .T = tr->Tl,
                     .recompute = cfg->parallel.activation_checkpointing,
                     .precision = cfg->precision,
                     .zero = zero_stage(tr),
                     .docs = cfg->data.document_mask};
  /* every stage's layers, for the banner; this rank's shard among them */
  for (int s = 0; s < tr->pp; s++) {
    wf_model_shard sh;
    so.rank = s;
    WF_TRY(wf_pipe_stage_shard(&so, &sh));
    tr->bounds[s] = sh.l0;
    tr->bounds[s + 1] = sh.l1;
    if (s == r)
      o.shard = sh;
  }
  tr->chunks = o.shard.chunks;
  o.slots = wf_pipe_slots(cfg->train.schedule, tr->pp, r, tr->M, tr->chunks);
  o.inbox = wf_pipe_buffers(cfg->train.schedule, tr->pp, r, tr->M, tr->chunks).recv_f;
  if (tr->tp > 1) {
    WF_TRY(wf_tp_create(&tr->tpr, tr->tp_comm, tr->dev, o.shard.sequence));
    wf_tp_set_trace(tr->tpr, tr->trace);
    o.tp = wf_tp_regions_of(tr->tpr);
  }
  WF_TRY(setup_cp(tr, &o));
  if (tr->ep_comm) {
    WF_TRY(wf_ep_create(&tr->epr, tr->ep_comm));
    wf_ep_set_trace(tr->epr, tr->trace);
    o.ep = wf_ep_regions_of(tr->epr);
  }
  WF_TRY(wf_model_create_shard(&tr->model, &o));
fail:
  return st;
}

/* The gradient path and, over the range it hands this rank, the optimizer. */
static wf_status setup_optim(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  wf_grads_opts go = {.model = tr->model,
                      .dp = tr->grad_comm,
                      .pp = tr->pp_comm,
                      .emb = tr->emb_comm,
                      .tp = tr->tp_comm,
                      .tp_regions = tr->tpr,
                      .ep = tr->ep_comm,
                      .edp = tr->edp_comm,
                      .bucket_bytes = (size_t)cfg->optim.bucket_mb << 20,
                      .zero = zero_stage(tr),
                      .fsdp = cfg->mesh.fsdp,
                      .keep_gathered = !cfg->parallel.reshard_after_forward};
  WF_TRY(wf_grads_create(&tr->grads, &go));
  wf_grads_part parts[WF_GRADS_PARTS];
  int n = wf_grads_parts(tr->grads, parts);
  wf_optim_opts oo = {.cfg = cfg,
                      .model = tr->model,
                      .dp_size = tr->grad_size,
                      .lo = parts[0].lo,
                      .hi = parts[0].hi,
                      .params = parts[0].params};
  if (n > 1) /* ZeRO under expert parallelism: the experts' edp shard too */
    oo.lo2 = parts[1].lo, oo.hi2 = parts[1].hi, oo.grads2 = parts[1].grads,
    oo.params2 = parts[1].params;
  st = wf_optim_create(&tr->optim, &oo);
fail:
  return st;
}

static wf_status setup_model(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  WF_TRY(setup_stage(tr));
  tr->flops = wf_model_flops_per_step(&tr->dims, tr->B * tr->M * tr->D, tr->T);
  wf_pipe_opts po = {tr->pp_comm, tr->model, cfg->train.schedule,    tr->M, tr->chunks, tr->B,
                     tr->Tl,      tr->trace, cfg->data.document_mask};
  WF_TRY(wf_pipe_create(&tr->pipe, &po));
  WF_TRY(setup_optim(tr));
  size_t k = wf_model_stats_floats(tr->model);
  if (k) { /* the experts' figures of each step (step.c) */
    WF_CHECK_ALLOC(tr->router_stats = calloc((size_t)tr->dims.L * k, sizeof(float)));
    WF_CHECK_ALLOC(tr->expert_load = calloc((size_t)tr->dims.L * 3, sizeof(float)));
  }
  st = init_params(tr); /* once ZeRO-3's shard exists: the parameters go there alone */
fail:
  return st;
}

/* ZeRO-3 under expert parallelism: the experts' parameter shard (the second part). */
static wf_ckpt_part expert_shard(wf__trainer *tr)
{
  wf_grads_part parts[WF_GRADS_PARTS];
  if (wf_grads_parts(tr->grads, parts) < 2 || !parts[1].params)
    return (wf_ckpt_part){0};
  return (wf_ckpt_part){parts[1].params, parts[1].lo, parts[1].hi};
}

/* Check train.checkpoint_dir is writable, then resume from train.resume if set. */
static wf_status setup_checkpoint(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_train_hooks *h = tr->hooks;
  int replica;
  wf_comm *fsdp = wf_grads_hsdp_group(tr->grads, &replica); /* HSDP: fsdp group 0 writes */
  tr->ck = (wf_ckpt_target){.cfg = tr->cfg,
                            .model = tr->model,
                            .optim = tr->optim,
                            .optim_sharded = tr->grad_comm && tr->cfg->optim.zero,
                            .param_shard = wf_grads_param_shard(tr->grads),
                            .expert_shard = expert_shard(tr),
                            .dp_comm = fsdp ? fsdp : tr->grad_comm,
                            .edp_comm = tr->edp_comm,
                            .replica = replica,
                            .replicas = fsdp ? tr->D / wf_comm_size(fsdp) : 1,
                            .world = tr->world,
                            .pp_rank = tr->pp_rank,
                            .tp_rank = wf__comm_rank(tr->tp_comm),
                            .data = tr->data};
  if (tr->cfg->train.checkpoint_dir[0] && tr->cfg->train.checkpoint_async)
    WF_TRY(wf_ckpt_saver_new(&tr->ck.saver));
  if (h && h->on_phase) /* reading a big checkpoint is not a hang */
    h->on_phase(h->user, "checkpoint");
  st = wf_ckpt_prepare(&tr->ck);
  if (st == WF_OK)
    st = wf_ckpt_resume(&tr->ck, &tr->start); /* ZeRO-3: into the shard (sync_shard follows) */
  if (h && h->on_phase)
    h->on_phase(h->user, "train");
fail:
  return st;
}

static wf_status setup_data(wf__trainer *tr)
{
  wf_status st = WF_OK;
  char err[1024] = "";
  size_t n = (size_t)tr->B * tr->T;
  int bad = -1;
  /* Every rank opens (and checks) its source at once; a bad file fails alike on all of
   * them, so only the lowest failing rank says why: one line per job. */
  /* the trainer's sequence length: model.init's context may have shortened a derived one */
  wf_status mine = wf_data_open_config(&tr->data, tr->cfg, tr->dims.V, tr->T, tr->dp_rank, tr->D,
                                       err, sizeof err);
  st = wf_comm_agree(tr->world, mine, &bad);
  if (mine != WF_OK && bad == wf__comm_rank(tr->world))
    WF_ERROR("%s", err);
  if (st != WF_OK) /* WF_OK only when every rank's open succeeded */
    goto fail;
  WF_CHECK_ALLOC(tr->inputs = wf_mem_alloc(n * sizeof *tr->inputs));
  WF_CHECK_ALLOC(tr->targets = wf_mem_alloc(n * sizeof *tr->targets));
  if (tr->cp > 1) {
    WF_CHECK_ALLOC(tr->seq_in = wf_mem_alloc(n * sizeof *tr->seq_in));
    WF_CHECK_ALLOC(tr->seq_tg = wf_mem_alloc(n * sizeof *tr->seq_tg));
  }
  bool has_val = wf_data_has_val(tr->data);
  tr->can_eval = has_val && tr->cfg->train.eval_batches > 0;
  if (!has_val && tr->talk)
    WF_WARN("%s: no validation split, so no evaluation",
            tr->cfg->data.n_source ? "data.source without data.val_path" : "data.val_fraction = 0");
fail:
  return st;
}

/* train.trace: a recorder on every rank, on only for train.trace_steps. Per micro-batch
 * and model chunk: F, B and their p2p waits; with tp up to 14 collectives per layer
 * (sequence parallelism with recompute: 4 forward, 4 again, 6 backward; counted over
 * all L layers, a bound for any stage) and a few for the embedding and head; cp's waits;
 * doubled for margin; bounded by 1M spans. */
/* Rank 0 writes the trace after the last traced step: a path it cannot write to is said
 * now, before training, not when the run is over. */
static wf_status trace_dir_ok(const char *path)
{
  char dir[WF_PATH_MAX];
  struct stat sb;
  const char *slash = strrchr(path, '/'), *why = NULL;
  wf_status st = wf_file_make_parent(path, "train.trace");
  if (st != WF_OK) /* said why */
    return st;
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  if (stat(dir, &sb) != 0)
    why = strerror(errno), st = wf_file_errno_status(errno);
  else if (!S_ISDIR(sb.st_mode))
    why = "not a directory", st = WF_ECONFIG;
  else if (access(dir, W_OK | X_OK) != 0)
    why = strerror(errno), st = wf_file_errno_status(errno);
  if (!why)
    return WF_OK;
  WF_ERROR("train.trace=%s: cannot write in %s: %s; point it at a writable directory", path, dir,
           why);
  return st;
}

static wf_status setup_trace(wf__trainer *tr)
{
  wf_status st = WF_OK;
  const wf_config *cfg = tr->cfg;
  char label[128];
  if (!cfg->train.trace[0])
    return WF_OK;
  bool writer = wf__comm_rank(tr->world) == 0;
  WF_TRY(wf_comm_agree(tr->world, writer ? trace_dir_ok(cfg->train.trace) : WF_OK, NULL));
  if (tr->cp > 1)
    snprintf(label, sizeof label, "rank %d (pp %d, dp %d, cp %d, tp %d)", wf_rt_rank(), tr->pp_rank,
             tr->dp_rank, tr->cp_rank, wf__comm_rank(tr->tp_comm));
  else
    snprintf(label, sizeof label, "rank %d (pp %d, dp %d, tp %d)", wf_rt_rank(), tr->pp_rank,
             tr->dp_rank, wf__comm_rank(tr->tp_comm));
  const int *ts = cfg->train.trace_steps;
  size_t steps = (size_t)(ts[1] - ts[0] + 1);
  size_t v = cfg->train.schedule == WF_SCHED_INTERLEAVED ? (size_t)cfg->parallel.virtual_stages : 1;
  size_t per_mb = 8 * v + (tr->tp > 1 ? 14 * (size_t)tr->dims.L + 8 : 0);
  /* context parallelism: up to cp waits per layer forward, cp + 1 backward, cp again
   * under selective recompute */
  per_mb += tr->cp > 1 ? (3 * (size_t)tr->cp + 1) * (size_t)tr->dims.L : 0;
  size_t spans = WF_MIN(2 * steps * ((size_t)tr->M * per_mb + 16), (size_t)1 << 20);
  st = wf_trace_create(&tr->trace, label, spans);
  WF_CHECK(st == WF_OK, st, "cannot set up train.trace (%s)", wf_status_str(st));
fail:
  return st;
}

static void setup_hooks(wf__trainer *tr, const wf_config *cfg, const wf_train_hooks *hooks)
{
  memset(tr, 0, sizeof *tr);
  tr->cfg = cfg;
  tr->hooks = hooks;
  tr->dp_comm = hooks ? hooks->dp : NULL;
  tr->cp_comm = hooks ? hooks->cp : NULL;
  tr->grad_comm = hooks && hooks->dpcp ? hooks->dpcp : tr->dp_comm;
  tr->tp_comm = hooks ? hooks->tp : NULL;
  tr->pp_comm = hooks ? hooks->pp : NULL;
  tr->emb_comm = hooks ? hooks->emb : NULL;
  tr->ep_comm = hooks ? hooks->ep : NULL;
  tr->edp_comm = hooks ? hooks->edp : NULL;
  tr->world = hooks ? hooks->world : NULL;
  tr->dev = hooks && hooks->dev ? hooks->dev : wf_dev_cpu();
  tr->out = hooks && hooks->out ? hooks->out : stdout;
  tr->talk = wf_rt_rank() <= 0 && !(hooks && hooks->quiet);
  /* mpirun gives ranks a pseudo-terminal, so isatty() alone would draw bars into
   * launcher logs: only a process started by hand on a terminal gets one. */
  tr->bar = tr->talk && isatty(STDOUT_FILENO) && !getenv("OMPI_COMM_WORLD_SIZE") &&
            !getenv("SLURM_PROCID") && !getenv("PMI_RANK");
  tr->fp16 = cfg->precision == WF_PREC_FP16;
}

wf_status wf__train_setup(wf__trainer *tr, const wf_config *cfg, const wf_train_hooks *hooks, int M,
                          bool checkpoints)
{
  wf_status st = WF_OK;
  setup_hooks(tr, cfg, hooks);
  WF_TRY(setup_geometry(tr, M));
  WF_TRY(setup_dims(tr));
  WF_TRY(setup_trace(tr)); /* sized from the dims, before the model that records into it */
  WF_TRY(setup_model(tr));
  WF_TRY(setup_data(tr));
  if (checkpoints)
    WF_TRY(setup_checkpoint(tr));
  WF_TRY(sync_shard(tr));
  if (checkpoints)
    WF_TRY(wf__rescue_setup(tr));
  /* rank 0 alone opens it: agreed, so its failure stops every rank at once */
  WF_TRY(wf_comm_agree(tr->world, wf__open_metrics(tr), NULL));
  if (checkpoints) /* a training run's; not --generate's or --dump-state's */
    WF_TRY(wf_comm_agree(tr->world, wf__open_tensorboard(tr), NULL));
  WF_TRY(wf__setup_peak(tr)); /* before the banner, which says where the peak came from */
  if (tr->talk)
    wf__print_banner(tr);
fail:
  return st;
}

void wf__train_teardown(wf__trainer *tr)
{
  wf__rescue_teardown(tr);          /* before what a writer would copy goes */
  wf_ckpt_saver_free(tr->ck.saver); /* a write under way when training failed is given up */
  if (tr->metrics)
    fclose(tr->metrics);
  wf_tfevents_close(tr->tb);
  wf_mem_free(tr->inputs);
  wf_mem_free(tr->targets);
  wf_mem_free(tr->seq_in);
  wf_mem_free(tr->seq_tg);
  free(tr->router_stats);
  free(tr->expert_load);
  wf_data_destroy(tr->data);
  wf_optim_destroy(tr->optim);
  wf_grads_destroy(tr->grads);
  wf_pipe_destroy(tr->pipe);
  wf_model_destroy(tr->model);
  wf_tp_destroy(tr->tpr);
  wf_cp_destroy(tr->cpr);
  wf_ep_destroy(tr->epr);
  wf_trace_destroy(tr->trace);
  wf_tokenizer_destroy(tr->tok);
}
