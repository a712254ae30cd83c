/*
 * mem.c - a rank's memory, by kind, from the functions the trainer allocates with:
 * wf_pipe_stage_shard (its stage), wf_pipe_slots (micro-batches in flight),
 * wf_model_mem_plan (the model), wf_grads_mem_plan (the gradient path and the
 * optimizer's range), wf_optim_mem_plan (AdamW) and wf_pipe_mem_plan (the engine).
 * Nothing here sizes a buffer itself, except the trainer's token batch (two B x T int
 * arrays, setup.c's setup_data).
 *
 * ZeRO stages and HSDP enter through wf_grads_mem_plan: zero.c's own plan (the one
 * wf__zero_create allocates by) gives the range the optimizer holds, the buffers the
 * reduction and ZeRO-3's gathers need, and whether the model keeps its flat parameters
 * and gradients. The kinds are the step line's: the reduction's buffers count as the
 * gradients they hold, ZeRO's gathered parameters as parameters.
 */
#include <string.h>

#include "plan_int.h"
#include "wf_io.h"
#include "wf_optim.h"

/* The head sizes the GPU's flash and tensor-core kernels take (kernels/cuda/attention.cu's rule).
 */
static bool tensor_core_heads(int C, int NH) { return NH > 0 && C % NH == 0 && C / NH <= 128; }

static size_t flash_saved(int B, int T, int C, int NH)
{
  return tensor_core_heads(C, NH) ? (size_t)B * NH * T : (size_t)B * NH * T * T;
}

/* What the GPU keeps between attention's forward and backward (attention_impl.cu's
 * wf_cuda_attn_saved): up to head size 128, the lse and the output in bf16, each
 * rounded up to 16 floats. */
static size_t gpu_saved(int B, int T, int C, int NH)
{
  if (!tensor_core_heads(C, NH))
    return flash_saved(B, T, C, NH);
  size_t lse = (size_t)B * NH * T, out = ((size_t)B * T * C + 1) / 2;
  return ((lse + 15) & ~(size_t)15) + ((out + 15) & ~(size_t)15);
}

/* Floats, each part of a buffer rounded up to 64 of them (kernels/cuda/attention.cu's parts). */
static size_t part(size_t floats) { return (floats + 63) / 64 * 64; }

/* Attention backward's scratch in the GPU's 16-bit variants (kernels/cuda/attention.cu):
 * fp16 (and any format above head size 128) widens qkv, (B,T,3C) floats after the fp32
 * kernels' own; bf16 up to head size 128 runs the tensor-core paths on the stored
 * operands and needs D (B,NH,T), dout in bf16 and the bf16 dqkv (at most (B,T,3C)). */
static size_t gpu_scratch_widened(int B, int T, int C, int NH)
{
  return part(flash_saved(B, T, C, NH)) + (size_t)B * T * 3 * C;
}

static size_t gpu_scratch_bf16(int B, int T, int C, int NH)
{
  if (!tensor_core_heads(C, NH))
    return gpu_scratch_widened(B, T, C, NH);
  size_t ny = (size_t)B * T * C;
  return part((size_t)B * NH * T) + part((ny + 1) / 2) + part((3 * ny + 1) / 2);
}

/* A GPU's kernels as the planner sees them: the CPU's, with the GPU's attention sizes
 * (gpu_saved in every element type; backward's scratch as each type's variant sizes it)
 * and the GPU's workspace. */
static wf_kreg gpu_reg;
static wf_kset gpu_sets[WF_DT_COUNT];
static wf_attention_op gpu_attention[WF_DT_COUNT];

static size_t gpu_workspace(void) { return WF_KREG_GPU_WORKSPACE; }

const wf_kset *wf__plan_kernels(const wf_hw *hw)
{
  const wf_kset *cpu = wf_dev_kernels(wf_dev_cpu(), WF_DT_F32);
  if (!hw || !hw->gpu)
    return cpu;
  gpu_reg = *cpu->reg;
  gpu_reg.workspace_bytes = gpu_workspace;
  for (int t = 0; t < WF_DT_COUNT; t++) {
    gpu_sets[t] = *wf_kset_as(cpu, t);
    gpu_sets[t].reg = &gpu_reg, gpu_sets[t].sets = gpu_sets;
    gpu_attention[t] = *WF_K(&gpu_sets[t], attention);
    gpu_attention[t].saved = gpu_saved;
    gpu_attention[t].scratch = t == WF_DT_BF16  ? gpu_scratch_bf16
                               : t == WF_DT_F16 ? gpu_scratch_widened
                                                : flash_saved;
    gpu_sets[t].op[WF_OP_attention] = &gpu_attention[t];
  }
  return &gpu_sets[WF_DT_F32];
}

/* Parameters of the experts' tensors on a shard (all of them layered). */
static size_t expert_params(const wf_model_dims *d, const wf_model_shard *s)
{
  wf_model_desc desc;
  size_t n = 0;
  wf_model_describe(d, &desc);
  for (int t = 0; t < desc.n; t++)
    if (desc.t[t].experts)
      n += wf_model_shard_layer_numel(d, s, t) * (size_t)wf_model_shard_layers(s);
  return n;
}

const char *wf_plan_mem_kind_name(wf_plan_mem_kind k)
{
  static const char *names[WF_PM_N] = {"params", "grads", "optim", "acts", "comm", "other"};
  return (unsigned)k < WF_PM_N ? names[k] : "?";
}

wf_status wf_plan_stage_mem_get(const wf_model_dims *d, const wf_plan_mesh *m, int pp_rank,
                                int dp_rank, const struct wf_kset *k, wf_plan_stage_mem *out)
{
  wf_status st = WF_OK;
  wf_pipe_stage_opts so = {.dims = d,
                           .T = m->T,
                           .pp = m->pp,
                           .rank = pp_rank,
                           .kind = m->kind,
                           .v = m->v,
                           .pp_layers = m->pp_layers,
                           .n_pp_layers = m->n_pp_layers,
                           .tp = m->tp,
                           .ep = m->ep,
                           .ep_rank = m->ep > 1 ? dp_rank % m->ep : 0, /* ep: consecutive dp */
                           .sequence = m->sp};
  int cp = m->cp > 1 ? m->cp : 1, T = m->T / cp; /* T: this rank's rows of a sequence */
  wf_model_opts o = {.dims = *d,
                     .B = m->B,
                     .T = T,
                     .recompute = m->recompute,
                     .precision = m->prec,
                     .docs = m->docs};
  memset(out, 0, sizeof *out);
  WF_TRY(wf_pipe_stage_shard(&so, &o.shard));
  o.shard.cp = cp;
  o.slots = wf_pipe_slots(m->kind, m->pp, pp_rank, m->M, o.shard.chunks);
  o.inbox = wf_pipe_buffers(m->kind, m->pp, pp_rank, m->M, o.shard.chunks).recv_f;
  wf_model_mem gm = wf_model_mem_plan(&o, k);
  wf_grads_mem gr;
  WF_TRY(wf_grads_mem_plan(d, &o.shard, m->prec, m->dp * cp, dp_rank, m->zero, m->fsdp,
                           m->bucket_bytes, m->keep, &gr));
  /* inputs, targets and document starts: the engine's (this rank's rows); inputs and
   * targets: the trainer's (whole sequences; with cp also the micro-batch it picks this
   * rank's chunks from) */
  size_t tokens = 3 * (size_t)m->B * (size_t)T * sizeof(int);
  size_t seqs = 2 * (size_t)m->B * (size_t)m->T * sizeof(int) * (cp > 1 ? 2 : 1);
  size_t pipe = wf_pipe_mem_plan(m->kind, m->pp, pp_rank, m->M, o.shard.chunks, gm.io, m->B, T);
  wf_cp_geo cg = wf_cp_geo_of(d, m->tp, m->B, T, (int)m->prec);
  out->bytes[WF_PM_PARAMS] = (gr.model_params ? gm.params + gm.wlow : 0) + gr.param;
  out->bytes[WF_PM_GRADS] = (gr.model_grads ? gm.grads : 0) + gr.grad;
  out->bytes[WF_PM_OPTIM] = wf_optim_mem_plan(gr.lo, gr.hi) + wf_optim_mem_plan(gr.lo2, gr.hi2);
  out->bytes[WF_PM_ACTS] = gm.slots + gm.recompute + gm.scratch + gm.stats;
  /* the engine's gradient buffers and the model's spare inputs (activations received) */
  out->bytes[WF_PM_COMM] =
      gr.scalar + (pipe - tokens) + gm.inbox + wf_cp_scratch_bytes(m->cp_mode, cp, &cg);
  size_t own = k ? k->reg->workspace_bytes() : 0; /* the kernels' workspace (NULL: the CPU's) */
  out->bytes[WF_PM_OTHER] = tokens + seqs + own;  /* + the engine's and the trainer's */
  if (m->stream) /* the loader's rows of this rank's lanes: whole sequences */
    out->bytes[WF_PM_OTHER] += wf_data_loader_bytes(m->B * m->M, m->T);
  out->act = gm.slots + gm.recompute;
  for (int i = 0; i < WF_PM_N; i++)
    out->total += out->bytes[i];
  out->slots = o.slots;
  out->params = wf_model_shard_params(d, &o.shard);
  out->expert_params = expert_params(d, &o.shard);
  out->l0 = o.shard.l0, out->l1 = o.shard.l1, out->chunks = o.shard.chunks;
  out->n_buckets = gr.n_buckets;
fail:
  return st;
}

int wf_plan_world(const wf_config *cfg)
{
  if (cfg->dist.world_size > 0)
    return cfg->dist.world_size;
  if (cfg->dist.num_nodes > 0 && cfg->dist.procs_per_node > 0)
    return cfg->dist.num_nodes * cfg->dist.procs_per_node;
  long long w =
      (long long)(cfg->mesh.dp > 0 ? cfg->mesh.dp : 1) * cfg->mesh.tp * cfg->mesh.pp * cfg->mesh.cp;
  return w > 0 && w <= 1 << 24 ? (int)w : 0;
}

wf_status wf_plan_mesh_from_config(const wf_config *cfg, int world, wf_plan_mesh *m)
{
  wf_status st = WF_OK;
  int tp = cfg->mesh.tp, pp = cfg->mesh.pp, cp = cfg->mesh.cp;
  int dp = cfg->mesh.dp > 0 ? cfg->mesh.dp : (tp * pp * cp > 0 ? world / (tp * pp * cp) : 0);
  int M = cfg->train.microbatches > 0 ? cfg->train.microbatches : 1;
  WF_REFUSE(dp >= 1 && dp * tp * pp * cp == world, WF_ECONFIG,
            "world size %d is not mesh.dp %d x mesh.tp %d x mesh.pp %d x mesh.cp %d", world, dp, tp,
            pp, cp);
  WF_REFUSE(cfg->train.batch_size % (dp * M) == 0, WF_ECONFIG,
            "train.batch_size %d must be a multiple of dp %d x train.microbatches %d",
            cfg->train.batch_size, dp, M);
  *m = (wf_plan_mesh){
      .dp = dp,
      .tp = tp,
      .pp = pp,
      .v = cfg->train.schedule == WF_SCHED_INTERLEAVED ? cfg->parallel.virtual_stages : 1,
      .M = M,
      .B = cfg->train.batch_size / (dp * M),
      .T = cfg->train.seq_len > 0 ? cfg->train.seq_len : cfg->model.seq_len,
      .kind = cfg->train.schedule,
      .zero = cfg->optim.zero,
      .fsdp = cfg->mesh.fsdp,
      .keep = !cfg->parallel.reshard_after_forward,
      .sp = cfg->parallel.sequence && tp > 1,
      .recompute = cfg->parallel.activation_checkpointing,
      .prec = cfg->precision,
      .threads = cfg->runtime.threads,
      .bucket_bytes = (size_t)cfg->optim.bucket_mb << 20,
      .pp_layers = cfg->parallel.n_pp_layers ? cfg->parallel.pp_layers : NULL,
      .n_pp_layers = cfg->parallel.n_pp_layers,
      .cp = cp,
      .cp_mode = cfg->parallel.cp_mode,
      .ep = cfg->mesh.ep,
      .docs = cfg->data.document_mask,
      .stream = cfg->data.n_source > 0};
fail:
  return st;
}

#define GIB (1024.0 * 1024.0 * 1024.0)

wf_status wf_plan_fits(const wf_config *cfg, const wf_model_dims *d, double limit,
                       const char *limit_desc, const struct wf_kset *k, char *err, size_t len)
{
  wf_status st = WF_OK;
  wf_plan_mesh m;
  wf_plan_stage_mem sm, peak = {.total = 0};
  int peak_stage = 0;
  err[0] = '\0';
  if (limit <= 0)
    return WF_OK; /* unknown: the allocator finds out */
  /* the planner refuses (rank 0 says why) what the trainer would refuse */
  WF_TRY(
      wf_plan_mesh_from_config(cfg, cfg->mesh.dp * cfg->mesh.tp * cfg->mesh.pp * cfg->mesh.cp, &m));
  for (int r = 0; r < m.pp; r++) {
    WF_TRY(wf_plan_stage_mem_get(d, &m, r, 0, k, &sm)); /* dp rank 0: the largest shard */
    if (sm.total > peak.total)
      peak = sm, peak_stage = r;
  }
  if ((double)peak.total <= limit)
    return WF_OK;
  snprintf(err, len,
           "the model does not fit: a rank needs %.2f GiB (pp stage %d: params %.2f, grads %.2f, "
           "optimizer %.2f, activations %.2f GiB; worker --estimate with these keys shows it "
           "all) but has %.2f GiB (%s); choose a smaller model (model.d_model=%d, "
           "model.layers=%d), fewer rows per step (train.batch_size=%d), or more ranks to share "
           "it (mesh.tp, mesh.pp, optim.zero=3)",
           peak.total / GIB, peak_stage, peak.bytes[WF_PM_PARAMS] / GIB,
           peak.bytes[WF_PM_GRADS] / GIB, peak.bytes[WF_PM_OPTIM] / GIB,
           peak.bytes[WF_PM_ACTS] / GIB, limit / GIB, limit_desc, d->C, d->L,
           cfg->train.batch_size);
  st = WF_ECONFIG;
fail:
  return st;
}
