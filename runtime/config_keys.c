/*
 * config_keys.c - the key table, aliases, presets, the environment skip list and
 * "did you mean" suggestions.
 *
 * Everything the config knows about a key is in its one row of wf__cfg_keys:
 * adding a key is adding a row (and a field to struct wf_config). The table order
 * is the print order and the index of cfg->source[]. Defaults are text in the
 * key's own syntax so they go through the same parser as user input.
 *
 * Nothing here is mutable: the tables are const and the functions are pure.
 */
#include <ctype.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "config_int.h"

#define OFF(f) offsetof(wf_config, f)
#define BIG    1e300

#define K_INT(n, f, d, lo, hi, dc)                                                                 \
  {                                                                                                \
    .name = n, .type = WF__CT_INT, .off = OFF(f), .def = d, .min = lo, .max = hi, .doc = dc        \
  }
#define K_DBL(n, f, d, lo, hi, fl, dc)                                                             \
  {                                                                                                \
    .name = n, .type = WF__CT_DOUBLE, .off = OFF(f), .def = d, .min = lo, .max = hi, .flags = fl,  \
    .doc = dc                                                                                      \
  }
#define K_BOOL(n, f, d, dc)                                                                        \
  {                                                                                                \
    .name = n, .type = WF__CT_BOOL, .off = OFF(f), .def = d, .doc = dc                             \
  }
#define K_STR(n, f, d, dc)                                                                         \
  {                                                                                                \
    .name = n, .type = WF__CT_STRING, .off = OFF(f), .cap = sizeof(((wf_config *)0)->f), .def = d, \
    .doc = dc                                                                                      \
  }
#define K_ENUM(n, f, d, e, dc)                                                                     \
  {                                                                                                \
    .name = n, .type = WF__CT_ENUM, .off = OFF(f), .def = d, .enums = e, .doc = dc                 \
  }

/* Enum-typed fields are stored through an int pointer. */
_Static_assert(sizeof(wf_precision) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_attention_impl) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_schedule_kind) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_device_pref) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_tie) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_switch) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_recompute) == sizeof(int), "enum storage");
_Static_assert(sizeof(wf_rope_type) == sizeof(int), "enum storage");

static const wf__cfg_enum schedules[] = {{"1f1b", WF_SCHED_1F1B},
                                         {"gpipe", WF_SCHED_GPIPE},
                                         {"interleaved", WF_SCHED_INTERLEAVED},
                                         {NULL, 0}};
static const wf__cfg_enum precisions[] = {{"no", WF_PREC_NO},     {"fp16", WF_PREC_FP16},
                                          {"bf16", WF_PREC_BF16}, {"none", WF_PREC_NO},
                                          {"fp32", WF_PREC_NO},   {NULL, 0}};
/* true / false keep their meaning from when the key was a boolean: full / none */
static const wf__cfg_enum recomputes[] = {
    {"none", WF_RECOMPUTE_NONE},  {"selective", WF_RECOMPUTE_SELECTIVE},
    {"full", WF_RECOMPUTE_FULL},  {"true", WF_RECOMPUTE_FULL},
    {"false", WF_RECOMPUTE_NONE}, {"yes", WF_RECOMPUTE_FULL},
    {"no", WF_RECOMPUTE_NONE},    {"on", WF_RECOMPUTE_FULL},
    {"off", WF_RECOMPUTE_NONE},   {"1", WF_RECOMPUTE_FULL},
    {"0", WF_RECOMPUTE_NONE},     {NULL, 0}};
static const wf__cfg_enum cp_modes[] = {
    {"ring", WF_CP_RING}, {"allgather", WF_CP_ALLGATHER}, {NULL, 0}};
static const wf__cfg_enum log_levels[] = {{"error", WF_LOG_ERROR},  {"warn", WF_LOG_WARN},
                                          {"info", WF_LOG_INFO},    {"debug", WF_LOG_DEBUG},
                                          {"warning", WF_LOG_WARN}, {NULL, 0}};
static const wf__cfg_enum ties[] = {{"auto", WF_TIE_AUTO}, {"true", WF_TIE_YES},
                                    {"false", WF_TIE_NO},  {"yes", WF_TIE_YES},
                                    {"no", WF_TIE_NO},     {NULL, 0}};
static const wf__cfg_enum switches[] = {{"auto", WF_SWITCH_AUTO}, {"true", WF_SWITCH_ON},
                                        {"false", WF_SWITCH_OFF}, {"yes", WF_SWITCH_ON},
                                        {"no", WF_SWITCH_OFF},    {NULL, 0}};
static const wf__cfg_enum rope_types[] = {
    {"none", WF_ROPE_NONE}, {"llama3", WF_ROPE_LLAMA3}, {NULL, 0}};
static const wf__cfg_enum devices[] = {{"auto", WF_DEV_AUTO},
                                       {"cpu", WF_DEV_CPU},
                                       {"cuda", WF_DEV_CUDA},
                                       {"gpu", WF_DEV_CUDA},
                                       {NULL, 0}};
static const wf__cfg_enum attention_impls[] = {{"auto", WF_ATTN_AUTO},
                                               {"cudnn", WF_ATTN_CUDNN},
                                               {"flash", WF_ATTN_FLASH},
                                               {"reference", WF_ATTN_REFERENCE},
                                               {NULL, 0}};

const wf__cfg_key wf__cfg_keys[] = {
    K_INT("dist.world_size", dist.world_size, "0", 0, 1 << 24,
          "number of ranks; 0 = take it from the launcher"),
    K_INT("dist.num_nodes", dist.num_nodes, "0", 0, 1 << 20, "number of nodes; 0 = unknown"),
    K_INT("dist.procs_per_node", dist.procs_per_node, "0", 0, 1 << 16,
          "processes per node; 0 = unknown"),
    K_INT("dist.rank", dist.rank, "-1", -1, 1 << 24, "this process's rank; -1 = launcher"),
    K_INT("dist.local_rank", dist.local_rank, "-1", -1, 1 << 16,
          "rank on this node; -1 = launcher"),
    K_STR("dist.master_addr", dist.master_addr, "", "rank 0's host; \"\" = detect"),
    K_INT("dist.master_port", dist.master_port, "0", 0, 65535,
          "rendezvous port; 0 = 29500 or from SLURM_JOB_ID"),
    K_INT("mesh.dp", mesh.dp, "0", 0, 1 << 24, "data-parallel size; 0 = world / (tp * pp * cp)"),
    K_INT("mesh.tp", mesh.tp, "1", 1, 1 << 16, "tensor-parallel size"),
    K_INT("mesh.pp", mesh.pp, "1", 1, WF_MAX_STAGES, "pipeline-parallel size (stages)"),
    K_INT("mesh.cp", mesh.cp, "1", 1, 1 << 16,
          "context-parallel size: each sequence split over this many ranks (ring attention)"),
    K_INT("mesh.ep", mesh.ep, "1", 1, 1 << 16,
          "expert-parallel size: the experts are sharded over groups of this many consecutive "
          "dp ranks (it divides mesh.dp and the experts)"),
    K_INT("mesh.fsdp", mesh.fsdp, "0", 0, 1 << 24,
          "HSDP: ZeRO shards within groups of this many dp ranks and replicates across "
          "them; 0 = all dp ranks"),
    {.name = "mesh.axis_names",
     .type = WF__CT_AXES,
     .off = OFF(mesh.axis_names),
     .def = "[dp, tp, pp, cp]",
     .doc = "order of the mesh_shape axes as given"},
    K_STR("model.family", model.family, "gpt2",
          "model family: gpt2, llama, olmoe, qwen3_moe, mixtral"),
    K_STR("model.preset", model.preset, "gpt2-tiny",
          "gpt2-tiny, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, llama-1b, "
          "llama-8b, olmoe-tiny, qwen3-moe-tiny, mixtral-tiny, olmoe-1b-7b, qwen3-30b-a3b, "
          "mixtral-8x7b"),
    K_INT("model.layers", model.layers, "4", 1, 4096, "transformer blocks (L)"),
    K_INT("model.heads", model.heads, "4", 1, 4096, "attention heads (NH)"),
    K_INT("model.d_model", model.d_model, "64", 1, 1 << 20, "channels (C)"),
    K_INT("model.seq_len", model.seq_len, "64", 1, 1 << 24, "context length (maxT)"),
    K_INT("model.vocab", model.vocab, "256", 1, 1 << 26, "vocabulary size (V)"),
    K_INT("model.kv_heads", model.kv_heads, "0", 0, 4096,
          "key/value heads (grouped-query attention); 0 = model.heads"),
    K_INT("model.ffn", model.ffn, "0", 0, 1 << 22, "the MLP's hidden width; 0 = 4 x d_model"),
    K_ENUM("model.tie_embeddings", model.tie_embeddings, "auto", ties,
           "the head reads the embedding's weight: auto (the family's: gpt2 ties, llama "
           "not), true, false"),
    K_DBL("model.rope_theta", model.rope_theta, "0", 0, 1e12, 0,
          "RoPE's base theta (llama); 0 = 500000 (Llama 3)"),
    K_ENUM("model.rope_scaling.rope_type", model.rope_scaling.rope_type, "none", rope_types,
           "RoPE's frequency scaling (llama): none, llama3 (Llama 3.1's; config.json's "
           "rope_scaling)"),
    K_DBL("model.rope_scaling.factor", model.rope_scaling.factor, "0", 0, 1e6, 0,
          "llama3: the long wavelengths' divisor; 0 = 8 (Llama 3.1)"),
    K_DBL("model.rope_scaling.low_freq_factor", model.rope_scaling.low_freq_factor, "0", 0, 1e6, 0,
          "llama3: wavelengths above original / this are divided by factor; 0 = 1"),
    K_DBL("model.rope_scaling.high_freq_factor", model.rope_scaling.high_freq_factor, "0", 0, 1e6,
          0, "llama3: wavelengths below original / this are kept; 0 = 4"),
    K_INT("model.rope_scaling.original_max_position_embeddings",
          model.rope_scaling.original_max_position_embeddings, "0", 0, 1 << 24,
          "llama3: the pre-training context (original); 0 = 8192"),
    K_DBL("model.norm_eps", model.norm_eps, "0", 0, 1, 0,
          "RMSNorm's epsilon (llama and the MoE families); 0 = the family's (1e-5; qwen3_moe "
          "1e-6)"),
    K_INT("model.head_dim", model.head_dim, "0", 0, 1 << 16,
          "attention head size (qwen3_moe); 0 = d_model / heads"),
    K_INT("model.experts", model.experts, "0", 0, 1 << 16,
          "experts per layer (olmoe, qwen3_moe, mixtral: num_experts, num_local_experts)"),
    K_INT("model.experts_per_token", model.experts_per_token, "0", 0, 1 << 16,
          "experts each token is routed to, top-k (num_experts_per_tok); 0 = the family's"),
    K_ENUM("model.norm_topk_prob", model.norm_topk_prob, "auto", switches,
           "renormalise the top-k routing weights to sum 1: auto (the family's: olmoe and "
           "qwen3_moe no, mixtral yes), true, false"),
    K_DBL("model.router_aux_loss_coef", model.router_aux_loss_coef, "-1", -1, 1e6, 0,
          "the load-balancing loss's coefficient (transformers' load_balancing_loss_func over "
          "all layers); -1 = the model's (config.json's, or the family's)"),
    K_DBL("model.router_z_loss_coef", model.router_z_loss_coef, "0", 0, 1e6, 0,
          "router z-loss coefficient (the mean over layers and tokens of logsumexp(logits)^2); "
          "0 = none"),
    K_DBL("model.capacity_factor", model.capacity_factor, "0", 0, 1e6, 0,
          "expert capacity: each expert takes at most ceil(factor x tokens x top-k / experts) "
          "of a micro-batch's tokens and the rest are dropped (counted); 0 = dropless"),
    K_DBL("model.shard_mb", model.shard_mb, "0", 0, 1e9, 0,
          "safetensors model folders: the largest file in MB (1e6 bytes) before sharding "
          "with an index; 0 = 5000 (save_pretrained's 5GB)"),
    {.name = "model.padded_vocab",
     .type = WF__CT_INT,
     .off = OFF(model.padded_vocab),
     .min = 0,
     .max = INT_MAX,
     .flags = WF__KF_DERIVED,
     .doc = "V rounded up to a multiple of 128 (Vp); derived"},
    K_STR("model.init", model.init, "",
          "weights to start from (llm.c .bin, .safetensors, or a weft checkpoint); \"\" = random"),
    K_INT("train.steps", train.steps, "300", 1, INT_MAX, "optimizer steps"),
    K_INT("train.batch_size", train.batch_size, "8", 1, 1 << 24, "global batch, in sequences"),
    K_INT("train.microbatches", train.microbatches, "1", 1, 1 << 20,
          "microbatches per step and dp rank"),
    K_INT("train.seq_len", train.seq_len, "0", 0, 1 << 24,
          "tokens per training sequence; 0 = model.seq_len"),
    K_DBL("train.lr", train.lr, "3e-3", 0, 10, WF__KF_MIN_OPEN, "peak learning rate"),
    K_DBL("train.min_lr", train.min_lr, "3e-4", 0, 10, 0, "learning rate at the end"),
    K_INT("train.warmup", train.warmup, "20", 0, INT_MAX, "linear warm-up steps"),
    {.name = "train.seed",
     .type = WF__CT_U64,
     .off = OFF(train.seed),
     .def = "1337",
     .doc = "seed of weights and data order"},
    K_ENUM("train.schedule", train.schedule, "1f1b", schedules,
           "pipeline schedule: 1f1b, gpipe, interleaved"),
    K_INT("train.eval_every", train.eval_every, "50", 0, INT_MAX,
          "steps between evaluations; 0 = never"),
    K_INT("train.eval_batches", train.eval_batches, "4", 0, 1 << 20, "batches per evaluation"),
    K_STR("train.metrics", train.metrics, "", "JSON-lines metrics file; \"\" = none"),
    K_STR("train.trace", train.trace, "", "Chrome trace file; \"\" = none"),
    K_STR("train.tensorboard", train.tensorboard, "",
          "directory of TensorBoard event files (rank 0 writes them); \"\" = none"),
    K_DBL("train.tensorboard_roll_mb", train.tensorboard_roll_mb, "64", 0.001, 1e6, 0,
          "an event file past this size (MB) is closed and the next one started"),
    {.name = "train.trace_steps",
     .type = WF__CT_INTLIST,
     .off = OFF(train.trace_steps),
     .cap = 2,
     .def = "[2, 3]",
     .min = 0,
     .max = INT_MAX,
     .flags = WF__KF_FIXED_LEN,
     .doc = "[first, last] step traced"},
    K_STR("train.checkpoint_dir", train.checkpoint_dir, "", "checkpoint directory"),
    K_INT("train.checkpoint_every", train.checkpoint_every, "0", 0, INT_MAX,
          "steps between checkpoints; 0 = by train.checkpoint_minutes alone"),
    K_DBL("train.checkpoint_minutes", train.checkpoint_minutes, "15", 0, 1e6, 0,
          "minutes of training between checkpoints (rank 0's clock); 0 = by steps alone"),
    K_INT("train.keep_checkpoints", train.keep, "3", 0, 1 << 20,
          "checkpoints kept, the newest; 0 = all"),
    K_BOOL("train.checkpoint_async", train.checkpoint_async, "false",
           "write periodic checkpoints in the background from a snapshot in host memory "
           "(the last one, and a stop's, are written at once)"),
    K_STR("train.resume", train.resume, "",
          "\"\" (resume the run train.checkpoint_dir holds, if any), \"never\" (start over "
          "there), \"auto\" or a checkpoint path"),
    K_DBL("train.peak_tflops", train.peak_tflops, "0", 0, 1e9, 0,
          "device peak for MFU; 0 = unknown"),
    K_DBL("train.loss_jump_factor", train.loss_jump_factor, "3", 0, 1e9, 0,
          "warn when a step's loss exceeds this times its running mean; 0 = never"),
    K_INT("train.log_every", train.log_every, "1", 1, INT_MAX,
          "steps between step lines (the first, the last and evaluated steps always print; "
          "train.metrics has every step)"),
    K_INT("train.sample_every", train.sample_every, "0", 0, INT_MAX,
          "steps between printed samples; 0 = never"),
    K_INT("train.sample_tokens", train.sample_tokens, "64", 1, 1 << 20,
          "tokens generated per sample (and by --generate)"),
    K_INT("train.sample_top_k", train.sample_top_k, "40", 0, 1 << 26,
          "sample from the k most likely tokens; 0 = all, 1 = greedy"),
    K_DBL("train.sample_temperature", train.sample_temperature, "1", 0, 100, WF__KF_MIN_OPEN,
          "logits are divided by it before sampling"),
    {.name = "train.sample_seed",
     .type = WF__CT_U64,
     .off = OFF(train.sample_seed),
     .def = "1337",
     .doc = "seed of the sampling draws (the same sample on any mesh)"},
    K_STR("train.sample_prompt", train.sample_prompt, "",
          "text samples start from; \"\" = <|endoftext|> (or a newline byte)"),
    K_STR("data.path", data.path, "", "text file or glob of llm.c shards; \"\" = synthetic"),
    K_DBL("data.val_fraction", data.val_fraction, "0.1", 0, 0.99, 0,
          "share of the data held out for evaluation"),
    K_STR("data.val_path", data.val_path, "",
          "validation text file or glob of llm.c shards; \"\" = hold out data.val_fraction"),
    K_STR("data.tokenizer", data.tokenizer, "",
          "tokenizer for text: GPT-2's tokenizer.json or vocab.json (merges.txt beside it), Llama "
          "3's tokenizer.model, or a folder"),
    {.name = "data.source",
     .type = WF__CT_STRLIST,
     .off = OFF(data.source),
     .cap = WF_PATH_MAX,
     .items = WF_DATA_MAX_SOURCES,
     .count_off = OFF(data.n_source),
     .def = "[]",
     .doc = "streaming JSON Lines corpora (plain or zstd), files or globs, one or a list; "
            "[] = data.path"},
    {.name = "data.mix",
     .type = WF__CT_DBLLIST,
     .off = OFF(data.mix),
     .cap = WF_DATA_MAX_SOURCES,
     .count_off = OFF(data.n_mix),
     .def = "[]",
     .min = 0,
     .max = 1e9,
     .flags = WF__KF_MIN_OPEN,
     .doc = "data.source's mixing weights, by tokens, one per source; [] = equal"},
    {.name = "data.field",
     .type = WF__CT_STRLIST,
     .off = OFF(data.field),
     .cap = WF_DATA_FIELD_MAX,
     .items = WF_DATA_MAX_SOURCES,
     .count_off = OFF(data.n_field),
     .def = "[text]",
     .doc = "the JSON key of a document's text: one for every data.source, or one per source"},
    K_BOOL("data.document_mask", data.document_mask, "false",
           "data.source: attention stays inside each packed document and positions restart at "
           "each"),
    K_INT("optim.zero", optim.zero, "0", 0, 3,
          "1 = shard optimizer state over dp (ZeRO-1), 2 = and gradients (ZeRO-2), 3 = and "
          "parameters (FSDP)"),
    K_DBL("optim.weight_decay", optim.weight_decay, "0.1", 0, 10, 0, "AdamW weight decay"),
    K_DBL("optim.clip", optim.clip, "1.0", 0, BIG, 0, "global grad-norm clip; 0 = off"),
    K_DBL("optim.beta1", optim.beta1, "0.9", 0, 0.999999, 0, "AdamW beta1"),
    K_DBL("optim.beta2", optim.beta2, "0.95", 0, 0.999999, 0, "AdamW beta2"),
    K_DBL("optim.eps", optim.eps, "1e-8", 0, 1, WF__KF_MIN_OPEN, "AdamW epsilon"),
    K_INT("optim.bucket_mb", optim.bucket_mb, "4", 0, 1 << 16,
          "dp gradient bucket size, MiB (0 = one layer per bucket)"),
    K_DBL("optim.loss_scale", optim.loss_scale, "0", 0, 1e38, 0,
          "precision=fp16: 0 = dynamic loss scaling, > 0 = this fixed scale"),
    K_DBL("optim.loss_scale_init", optim.loss_scale_init, "65536", 1, 1e38, 0,
          "precision=fp16: the dynamic loss scale's start"),
    K_INT("optim.loss_scale_window", optim.loss_scale_window, "1000", 1, INT_MAX,
          "precision=fp16: finite steps before the dynamic loss scale doubles"),
    K_BOOL("parallel.sequence", parallel.sequence, "false", "Megatron sequence parallelism"),
    {.name = "parallel.pp_layers",
     .type = WF__CT_INTLIST,
     .off = OFF(parallel.pp_layers),
     .cap = WF_MAX_STAGES,
     .count_off = OFF(parallel.n_pp_layers),
     .def = "[]",
     .min = 1,
     .max = 4096,
     .doc = "layers per pipeline stage; [] = balanced"},
    K_INT("parallel.virtual_stages", parallel.virtual_stages, "1", 1, WF_MAX_STAGES,
          "model chunks per stage (interleaved)"),
    K_ENUM("parallel.activation_checkpointing", parallel.activation_checkpointing, "none",
           recomputes,
           "recompute activations in backward: none, selective (attention's core: "
           "Korthikanti et al. 2022) or full (every layer's intermediates); true = full, "
           "false = none"),
    K_BOOL("parallel.reshard_after_forward", parallel.reshard_after_forward, "true",
           "optim.zero=3: gather each layer's parameters again for backward (false: keep "
           "them from forward)"),
    K_ENUM("parallel.cp_mode", parallel.cp_mode, "ring", cp_modes,
           "mesh.cp > 1: keys and values pass around the cp ring overlapped with attention "
           "(ring), or are all-gathered once per layer (allgather)"),
    K_ENUM("precision", precision, "no", precisions,
           "mixed precision: no (fp32), bf16 or fp16: activations, pipeline messages and GEMM "
           "operands in 16 bits; fp32 masters, gradients, optimizer state and reductions"),
    K_BOOL("runtime.bind", runtime.bind, "true", "bind ranks to cores with hwloc"),
    K_INT("runtime.threads", runtime.threads, "0", 0, 4096,
          "compute threads per rank; 0 = the cores the rank is bound to"),
    K_DBL("runtime.hang_timeout", runtime.hang_timeout, "300", 0, 1e7, 0,
          "seconds without progress before abort; 0 = off"),
    K_DBL("runtime.heartbeat_timeout", runtime.heartbeat_timeout, "2", 0.5, 3600, 0,
          "seconds without a heartbeat after which rank 0 takes a rank for lost (a rank takes "
          "rank 0 for lost one heartbeat later); a lost host ends the job this long after"),
    K_DBL("runtime.connect_timeout", runtime.connect_timeout, "30", 0.5, 3600, 0,
          "seconds a rank keeps trying to reach the coordinator (MASTER_ADDR:MASTER_PORT) at "
          "start before it fails, naming the address and port"),
    K_INT("runtime.metrics_port", runtime.metrics_port, "0", 0, 65535, "Prometheus port; 0 = off"),
    K_STR("runtime.listen_addr", runtime.listen_addr, "",
          "address rank 0's control and metrics ports listen on; \"\" = MASTER_ADDR's "
          "interface, 0.0.0.0 = every interface"),
    K_STR("runtime.job_name", runtime.job_name, "",
          "the job's id, which the console names it by (letters, digits, . _ -); \"\" = "
          "host-pid-time, or slurm-JOBID under Slurm"),
    K_ENUM("runtime.log_level", runtime.log_level, "info", log_levels, "error, warn, info, debug"),
    K_ENUM("runtime.device", runtime.device, "auto", devices, "auto, cpu, cuda"),
    K_BOOL("runtime.allow_tf32", runtime.allow_tf32, "false",
           "GPU: fp32 GEMMs on TF32 tensor cores (10-bit mantissa inputs)"),
    K_BOOL("runtime.cpu_bf16_gemm", runtime.cpu_bf16_gemm, "true",
           "CPU, precision=bf16: GEMMs on bf16 dot products through oneDNN where the CPU has "
           "AVX512_BF16 (false: on operands widened to fp32)"),
    K_ENUM("runtime.attention", runtime.attention, "auto", attention_impls,
           "GPU attention: auto (precision=bf16: cudnn, else flash, else reference; "
           "otherwise reference), cudnn, flash (bf16 tensor cores, head size 64 or 128), "
           "reference (fp32)"),
};
const int wf__cfg_nkeys = (int)WF_ARRAY_LEN(wf__cfg_keys);
_Static_assert(WF_ARRAY_LEN(wf__cfg_keys) <= WF_CONFIG_MAX_KEYS, "cfg->source is too small");

const wf__cfg_preset wf__cfg_presets[] = {
    /* name, family, layers, heads, d_model, seq_len, vocab, lr; then kv_heads, ffn,
     * rope_theta, tie_embeddings (0 / auto: the family's), rope_scaling (none: {0}).
     * GPT-2 sizes as in llm.c. lr: the tiny test models' 3e-3; GPT-2 small 6e-4 as llm.c and
     * nanoGPT train it; the larger sizes take the GPT-3 paper's (Table 2.1) rates for the same
     * sizes. Llama: llama-1b is Llama 3.2 1B (16 layers, d 2048, 32 heads, 8 kv heads, ffn 8192,
     * vocabulary 128256, theta 500000, its embedding tied to the head as Meta ships it) and
     * llama-8b Llama 3.1 8B (32 layers, d 4096, ffn 14336, untied), both with their published RoPE
     * scaling (config.json's rope_scaling: llama3, factor 32 for 3.2 1B and 8 for 3.1 8B,
     * low_freq_factor 1, high_freq_factor 4, original context 8192), an 8192-token context (Llama
     * 3's pre-training length; their 131072 is longer than a training run here holds) and Llama 3's
     * peak rate 3e-4; llama-tiny is a test model (grouped-query attention with 2 kv heads, a
     * 192-wide SwiGLU, theta 10000 so short contexts rotate, no scaling).
     * Mixture of experts, then experts, top-k, head_dim, norm_topk_prob, router_aux_loss_coef:
     * olmoe-1b-7b is allenai/OLMoE-1B-7B-0924 (16 layers, d 2048, 16 heads, 64 experts of
     * width 1024, top-8, vocabulary 50304, theta 10000, aux 0.01) at its 4096-token context and
     * the paper's peak rate 4e-4; qwen3-30b-a3b is Qwen/Qwen3-30B-A3B (48 layers, d 2048, 32
     * heads of 128 over 4 kv heads, 128 experts of width 768, top-8 renormalised, vocabulary
     * 151936, theta 1e6, aux 0.001) at its 4096-token pre-training context; mixtral-8x7b is
     * mistralai/Mixtral-8x7B-v0.1 (32 layers, d 4096, 32 heads over 8 kv heads, 8 experts of
     * width 14336, top-2, vocabulary 32000, theta 1e6, aux 0.02) at 4096 tokens. The *-tiny
     * MoE presets are test models: 2 layers, d 64, 4 experts of width 96, top-2, a context of
     * 32; qwen3-moe-tiny has 32-wide heads (head_dim != d_model / heads, as Qwen3's 128). */
    /* clang-format off */
    {"gpt2-tiny", "gpt2", 4, 4, 64, 64, 256, 3e-3, 0, 0, 0, WF_TIE_AUTO, {0}, 0, 0, 0, 0, 0},
    {"gpt2-small", "gpt2", 12, 12, 768, 1024, 50257, 6e-4, 0, 0, 0, WF_TIE_AUTO, {0}, 0, 0, 0, 0, 0},
    {"gpt2-medium", "gpt2", 24, 16, 1024, 1024, 50257, 3e-4, 0, 0, 0, WF_TIE_AUTO, {0}, 0, 0, 0, 0, 0},
    {"gpt2-large", "gpt2", 36, 20, 1280, 1024, 50257, 2.5e-4, 0, 0, 0, WF_TIE_AUTO, {0}, 0, 0, 0, 0, 0},
    {"gpt2-xl", "gpt2", 48, 25, 1600, 1024, 50257, 2e-4, 0, 0, 0, WF_TIE_AUTO, {0}, 0, 0, 0, 0, 0},
    {"llama-tiny", "llama", 4, 4, 64, 64, 256, 3e-3, 2, 192, 10000, WF_TIE_AUTO, {0}, 0, 0, 0, 0, 0},
    {"llama-1b", "llama", 16, 32, 2048, 8192, 128256, 3e-4, 8, 8192, 500000, WF_TIE_YES,
     {WF_ROPE_LLAMA3, 32, 1, 4, 8192}, 0, 0, 0, 0, 0},
    {"llama-8b", "llama", 32, 32, 4096, 8192, 128256, 3e-4, 8, 14336, 500000, WF_TIE_NO,
     {WF_ROPE_LLAMA3, 8, 1, 4, 8192}, 0, 0, 0, 0, 0},
    {"olmoe-tiny", "olmoe", 2, 4, 64, 32, 256, 3e-3, 4, 96, 10000, WF_TIE_AUTO, {0},
     4, 2, 0, WF_SWITCH_AUTO, 0.01},
    {"qwen3-moe-tiny", "qwen3_moe", 2, 4, 64, 32, 256, 3e-3, 2, 96, 10000, WF_TIE_AUTO, {0},
     4, 2, 32, WF_SWITCH_ON, 0.01},
    {"mixtral-tiny", "mixtral", 2, 4, 64, 32, 256, 3e-3, 2, 96, 10000, WF_TIE_AUTO, {0},
     4, 2, 0, WF_SWITCH_AUTO, 0.01},
    {"olmoe-1b-7b", "olmoe", 16, 16, 2048, 4096, 50304, 4e-4, 16, 1024, 10000, WF_TIE_NO, {0},
     64, 8, 0, WF_SWITCH_OFF, 0.01},
    {"qwen3-30b-a3b", "qwen3_moe", 48, 32, 2048, 4096, 151936, 3e-4, 4, 768, 1e6, WF_TIE_NO, {0},
     128, 8, 128, WF_SWITCH_ON, 0.001},
    {"mixtral-8x7b", "mixtral", 32, 32, 4096, 4096, 32000, 3e-4, 8, 14336, 1e6, WF_TIE_NO, {0},
     8, 2, 0, WF_SWITCH_ON, 0.02},
    /* clang-format on */
};
const int wf__cfg_npresets = (int)WF_ARRAY_LEN(wf__cfg_presets);

/* The seeds' names (a DistributedConfig) and other spellings users bring along. */
typedef struct alias {
  const char *name;
  const char *key; /* NULL for a special */
  wf__cfg_special special;
} alias;

static const alias aliases[] = {
    {"world_size", "dist.world_size", WF__SP_NONE},
    {"num_nodes", "dist.num_nodes", WF__SP_NONE},
    {"num_processes_per_node", "dist.procs_per_node", WF__SP_NONE},
    {"rank", "dist.rank", WF__SP_NONE},
    {"local_rank", "dist.local_rank", WF__SP_NONE},
    {"master_addr", "dist.master_addr", WF__SP_NONE},
    {"master_port", "dist.master_port", WF__SP_NONE},
    {"tensor_parallel_size", "mesh.tp", WF__SP_NONE},
    {"pipeline_parallel_size", "mesh.pp", WF__SP_NONE},
    {"data_parallel_size", "mesh.dp", WF__SP_NONE},
    {"context_parallel_size", "mesh.cp", WF__SP_NONE},
    {"mixed_precision", "precision", WF__SP_NONE},
    {"mesh_axis_names", "mesh.axis_names", WF__SP_NONE},
    {"mesh_shape", NULL, WF__SP_MESH_SHAPE},
    {"expert_parallel_size", "mesh.ep", WF__SP_NONE},
    /* Hugging Face's names of the MoE keys */
    {"model.num_experts", "model.experts", WF__SP_NONE},
    {"model.num_local_experts", "model.experts", WF__SP_NONE},
    {"model.num_experts_per_tok", "model.experts_per_token", WF__SP_NONE},
    {"model.mesh_shape", NULL, WF__SP_MESH_SHAPE},
    {"train.keep", "train.keep_checkpoints", WF__SP_NONE}, /* its earlier name */
};

/* Seed names weft deliberately does not take, with the reason, so a config copied
 * from a DistributedConfig gets an explanation instead of a bare "unknown key". */
static const struct {
  const char *name;
  const char *why;
} unsupported[] = {
    {"enabled", "weft always runs distributed, one rank per process; remove it"},
    {"backend", "weft picks the transport itself (NCCL for GPU buffers, MPI for host "
                "buffers); remove it"},
};

/* WEFT_ variables that other parts of weft read; never config keys. A name ending
 * in '_' is a prefix. */
static const char *const env_skip[] = {
    "WEFT_LOG_LEVEL",        /* runtime/log.c, before any config exists */
    "WEFT_MODULE_PATH",      /* runtime/module.c */
    "WEFT_JOB_DIR",          /* coordinator job files */
    "WEFT_COMM_CHECK",       /* collectives debugging */
    "WEFT_COMM_TRACE_CLOCK", /* collectives/comm.c: the trace recorder's clock */
    "WEFT_TEST_",            /* test harnesses */
    "WEFT_BENCH_",           /* benchmarks */
    "WEFT_MAX_RESTARTS",     /* scripts/weft-run and the Slurm scripts */
    "WEFT_RESTART_",         /* scripts/weft-run: WEFT_RESTART_BACKOFF, ..._MAX */
    "WEFT_BUNDLE",           /* a GPU bundle's env.sh (scripts/gpu-bundle-env.sh) */
    "WEFT_BUNDLE_",          /* scripts/gpu_bundle.py: WEFT_BUNDLE_JOBS */
    "WEFT_CUDA_LIBS",        /* a GPU bundle's env.sh: the CUDA library folders */
};

int wf__cfg_key_index(const char *name)
{
  for (int i = 0; i < wf__cfg_nkeys; i++)
    if (strcmp(wf__cfg_keys[i].name, name) == 0)
      return i;
  return -1;
}

static bool target_of(const alias *a, wf__cfg_target *out)
{
  out->special = a->special;
  out->key = a->key ? wf__cfg_key_index(a->key) : -1;
  return true;
}

static const alias *alias_find(const char *name)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(aliases); i++)
    if (strcmp(aliases[i].name, name) == 0)
      return &aliases[i];
  return NULL;
}

bool wf__cfg_resolve(const char *name, wf__cfg_target *out)
{
  static const char nested[] = "distributed.";
  int k = wf__cfg_key_index(name);
  if (k >= 0) {
    *out = (wf__cfg_target){k, WF__SP_NONE};
    return true;
  }
  const alias *a = alias_find(name);
  /* The seeds' names also live under a `distributed:` block. */
  if (!a && strncmp(name, nested, sizeof nested - 1) == 0 && !strchr(name + sizeof nested - 1, '.'))
    a = alias_find(name + sizeof nested - 1);
  return a ? target_of(a, out) : false;
}

const char *wf__cfg_unsupported(const char *name)
{
  static const char nested[] = "distributed.";
  if (strncmp(name, nested, sizeof nested - 1) == 0)
    name += sizeof nested - 1;
  for (size_t i = 0; i < WF_ARRAY_LEN(unsupported); i++)
    if (strcmp(unsupported[i].name, name) == 0)
      return unsupported[i].why;
  return NULL;
}

bool wf__cfg_target_is_list(wf__cfg_target t)
{
  if (t.key < 0)
    return true;
  wf__cfg_type ty = wf__cfg_keys[t.key].type;
  return ty == WF__CT_INTLIST || ty == WF__CT_AXES || ty == WF__CT_STRLIST || ty == WF__CT_DBLLIST;
}

bool wf__cfg_takes_one(wf__cfg_target t)
{
  return t.key >= 0 &&
         (wf__cfg_keys[t.key].type == WF__CT_STRLIST || wf__cfg_keys[t.key].type == WF__CT_DBLLIST);
}

/* "train.d_model" -> "WEFT_TRAIN_D_MODEL". */
static void env_name(const char *key, char *out, size_t len)
{
  size_t n = (size_t)snprintf(out, len, "WEFT_%s", key);
  for (size_t i = 5; i < n && i < len; i++)
    out[i] = out[i] == '.' ? '_' : (char)toupper((unsigned char)out[i]);
}

bool wf__cfg_resolve_env(const char *var, wf__cfg_target *out, const char **name)
{
  char buf[128];
  for (int i = 0; i < wf__cfg_nkeys; i++) {
    env_name(wf__cfg_keys[i].name, buf, sizeof buf);
    if (strcmp(buf, var) == 0) {
      *name = wf__cfg_keys[i].name;
      *out = (wf__cfg_target){i, WF__SP_NONE};
      return true;
    }
  }
  for (size_t i = 0; i < WF_ARRAY_LEN(aliases); i++) {
    env_name(aliases[i].name, buf, sizeof buf);
    if (strcmp(buf, var) == 0) {
      *name = aliases[i].name;
      return target_of(&aliases[i], out);
    }
  }
  return false;
}

bool wf__cfg_env_skipped(const char *var)
{
  for (size_t i = 0; i < WF_ARRAY_LEN(env_skip); i++) {
    size_t n = strlen(env_skip[i]);
    bool prefix = env_skip[i][n - 1] == '_';
    if (prefix ? strncmp(var, env_skip[i], n) == 0 : strcmp(var, env_skip[i]) == 0)
      return true;
  }
  return false;
}

const wf__cfg_preset *wf__cfg_preset_find(const char *name)
{
  for (int i = 0; i < wf__cfg_npresets; i++)
    if (strcasecmp(wf__cfg_presets[i].name, name) == 0)
      return &wf__cfg_presets[i];
  return NULL;
}

int wf__cfg_pad_vocab(int vocab) { return (vocab + 127) / 128 * 128; }

/* Optimal-string-alignment distance (Levenshtein plus adjacent transpositions),
 * case-insensitive; strings longer than 63 characters are "far". */
static int osa_distance(const char *a, const char *b)
{
  enum { N = 64 };
  size_t la = strlen(a), lb = strlen(b);
  if (la >= N || lb >= N)
    return INT_MAX / 2;
  int d[N][N];
  for (size_t i = 0; i <= la; i++)
    d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++)
    d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      int cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      int best = WF_MIN(d[i - 1][j] + 1, d[i][j - 1] + 1);
      best = WF_MIN(best, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        best = WF_MIN(best, d[i - 2][j - 2] + 1);
      d[i][j] = best;
    }
  }
  return d[la][lb];
}

/* Distance from what the user typed to a candidate: the whole name, or the part
 * after the section (so a bare "steps" finds "train.steps"). */
static int name_distance(const char *typed, const char *cand)
{
  int d = osa_distance(typed, cand);
  const char *dot = strchr(cand, '.');
  if (dot && !strchr(typed, '.'))
    d = WF_MIN(d, osa_distance(typed, dot + 1) + 1);
  return d;
}

typedef struct best_match {
  const char *typed;
  int dist;
  char name[128];
} best_match;

static void consider(best_match *b, const char *cand, bool env)
{
  char buf[128];
  if (env)
    env_name(cand, buf, sizeof buf);
  else
    wf_strlcpy(buf, cand, sizeof buf);
  int d = name_distance(b->typed, buf);
  if (d < b->dist) {
    b->dist = d;
    wf_strlcpy(b->name, buf, sizeof b->name);
  }
}

/* Writes the closest key (or WEFT_ variable) to `name`, or "" when none is close. */
void wf__cfg_suggest(const char *name, bool env, char *out, size_t out_len)
{
  best_match b = {.typed = name, .dist = INT_MAX};
  for (int i = 0; i < wf__cfg_nkeys; i++)
    if (!(wf__cfg_keys[i].flags & WF__KF_DERIVED))
      consider(&b, wf__cfg_keys[i].name, env);
  for (size_t i = 0; i < WF_ARRAY_LEN(aliases); i++)
    consider(&b, aliases[i].name, env);
  size_t len = strlen(name) - (env ? 5 : 0);
  int limit = WF_MAX(2, (int)len / 3);
  wf_strlcpy(out, b.dist <= limit ? b.name : "", out_len);
}

const char *wf_closest_name(const char *typed, const char *const *names, size_t n)
{
  const char *best = NULL;
  int dist = INT_MAX;
  for (size_t i = 0; i < n; i++) {
    int d = osa_distance(typed, names[i]);
    if (d < dist)
      dist = d, best = names[i];
  }
  return best && dist <= WF_MAX(2, (int)strlen(typed) / 3) ? best : NULL;
}
