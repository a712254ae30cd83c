/*
 * wf_config.h - the validated job configuration.
 *
 * Sources, lowest to highest precedence: built-in defaults, model preset, YAML file
 * (--config FILE), WEFT_* environment variables (WEFT_TRAIN_STEPS=100 sets
 * train.steps), then key=value arguments on the command line (dotted keys).
 * Every key remembers which source set it, so `worker --print-config` can say so.
 *
 * Validation is a pure function of the config and the world size, so every rank
 * computes the same verdict and the same message; main() prints it on rank 0 and
 * every rank exits non-zero.
 *
 * Strings are fixed-size arrays so a wf_config can be copied and broadcast as bytes.
 */
#ifndef WF_CONFIG_H
#define WF_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "wf_runtime.h"

#define WF_PATH_MAX         512
#define WF_MAX_STAGES       64
#define WF_CONFIG_MAX_KEYS  128
#define WF_DATA_MAX_SOURCES 16 /* data.source entries */
#define WF_DATA_FIELD_MAX   64 /* a data.field name, with its NUL */

typedef enum wf_precision { WF_PREC_NO = 0, WF_PREC_FP16, WF_PREC_BF16 } wf_precision;
/* parallel.activation_checkpointing: none; selective (attention's core recomputed,
 * Korthikanti et al. 2022); full (each layer's intermediates recomputed from its input) */
typedef enum wf_recompute {
  WF_RECOMPUTE_NONE = 0,
  WF_RECOMPUTE_SELECTIVE,
  WF_RECOMPUTE_FULL
} wf_recompute;
typedef enum wf_schedule_kind {
  WF_SCHED_1F1B = 0,
  WF_SCHED_GPIPE,
  WF_SCHED_INTERLEAVED
} wf_schedule_kind;
/* parallel.cp_mode: how context parallelism's ranks see each other's keys and values:
 * passed around the cp ring block by block, overlapped with the blocks' attention
 * (ring), or all-gathered once per layer (allgather, as Llama 3's training did). */
typedef enum wf_cp_mode { WF_CP_RING = 0, WF_CP_ALLGATHER } wf_cp_mode;
typedef enum wf_device_pref { WF_DEV_AUTO = 0, WF_DEV_CPU, WF_DEV_CUDA } wf_device_pref;
/* How a GPU computes attention (runtime.attention; docs/gpu-performance.md): cuDNN's fused
 * attention, weft's own bf16 flash kernel on tensor cores, or the fp32 reference kernels;
 * auto takes the first that applies. The CPU has one implementation. */
typedef enum wf_attention_impl {
  WF_ATTN_AUTO = 0,
  WF_ATTN_CUDNN,
  WF_ATTN_FLASH,
  WF_ATTN_REFERENCE
} wf_attention_impl;
/* model.tie_embeddings: the family's choice (GPT-2 ties, Llama does not), or forced. */
typedef enum wf_tie { WF_TIE_AUTO = 0, WF_TIE_YES, WF_TIE_NO } wf_tie;
/* A yes/no whose default is the model family's (model.norm_topk_prob). */
typedef enum wf_switch { WF_SWITCH_AUTO = 0, WF_SWITCH_ON, WF_SWITCH_OFF } wf_switch;
/* RoPE's frequency rule (model.rope_scaling.rope_type; Hugging Face's rope_type): the
 * plain theta^(-2i/hs), or Llama 3.1's rescaled low frequencies. */
typedef enum wf_rope_type { WF_ROPE_NONE = 0, WF_ROPE_LLAMA3 } wf_rope_type;
/* RoPE's frequency scaling, as Hugging Face's config.json `rope_scaling` names it (the
 * kernels' wf_rope_table applies it, kernels/rope.h). Fields 0 are the family's. */
typedef struct wf_rope_scaling {
  wf_rope_type rope_type;
  double factor;                        /* the longest wavelengths are divided by it */
  double low_freq_factor;               /* wavelengths above old_ctx / this: scaled */
  double high_freq_factor;              /* wavelengths below old_ctx / this: kept */
  int original_max_position_embeddings; /* old_ctx: the context it was pre-trained at */
} wf_rope_scaling;
typedef enum wf_config_source {
  WF_SRC_DEFAULT = 0,
  WF_SRC_PRESET,
  WF_SRC_FILE,
  WF_SRC_ENV,
  WF_SRC_CLI,
  WF_SRC_DERIVED /* filled in by wf_config_validate; ranks below every source */
} wf_config_source;

typedef struct wf_config {
  struct {
    int world_size;        /* 0 = take from the launcher */
    int num_nodes;         /* 0 = unknown */
    int procs_per_node;    /* 0 = unknown */
    int rank;              /* -1 = take from the launcher */
    int local_rank;        /* -1 = take from the launcher */
    char master_addr[256]; /* "" = rank 0's host (or first Slurm host) */
    int master_port;       /* 0 = 29500 or derived from SLURM_JOB_ID */
  } dist;
  struct {
    int dp, tp, pp;        /* dp 0 = derived as world / (tp * pp * cp) */
    int cp;                /* context parallelism: each sequence split over cp ranks */
    int ep;                /* expert parallelism: experts sharded over groups of ep
                              consecutive dp ranks (ep divides dp); 1 = none */
    int fsdp;              /* HSDP: ZeRO shards within groups of fsdp dp ranks, replicated
                              across the dp / fsdp groups; 0 = one group of all dp ranks */
    char axis_names[4][8]; /* order of mesh_shape axes as given, e.g. dp,tp,pp,cp; always a
                              permutation of "dp","tp","pp","cp" (axes not given follow) */
    bool fsdp_axis;        /* mesh_shape names an "fsdp" axis: its ranks shard the
                              parameters (optim.zero 3 unless it is given) */
  } mesh;
  struct {
    char family[16];                     /* gpt2, llama (worker/model's families) */
    char preset[32];                     /* gpt2-tiny, gpt2-small, llama-tiny, ... */
    int layers, heads, d_model, seq_len; /* seq_len = context length (maxT) */
    int kv_heads;                        /* grouped-query attention; 0 = heads */
    int ffn;                             /* the MLP's hidden width; 0 = 4 x d_model */
    wf_tie tie_embeddings;               /* the head reads the embedding's weight */
    double rope_theta;                   /* RoPE's base; 0 = the family's (Llama 3: 500000) */
    wf_rope_scaling rope_scaling;        /* RoPE's frequency scaling (none by default) */
    double norm_eps;                     /* RMSNorm's epsilon; 0 = the family's (1e-5) */
    int head_dim;                        /* the attention head size; 0 = d_model / heads */
    /* mixture of experts (model.family olmoe, qwen3_moe, mixtral) */
    int experts;                 /* experts per layer (num_experts) */
    int experts_per_token;       /* top-k (num_experts_per_tok) */
    wf_switch norm_topk_prob;    /* renormalise the top-k weights; auto = the family's */
    double router_aux_loss_coef; /* load-balancing loss coefficient; -1 = the family's */
    double router_z_loss_coef;   /* router z-loss coefficient; 0 = none */
    double capacity_factor;      /* expert capacity; 0 = dropless */
    double shard_mb;             /* safetensors folders: the largest file (MB); 0 = 5000 (5 GB) */
    int vocab;                   /* real vocabulary size V */
    int padded_vocab;            /* Vp, V rounded up to a multiple of 128 (derived) */
    char init[WF_PATH_MAX];      /* llm.c checkpoint to start from; "" = random init */
  } model;
  struct {
    int steps;
    int batch_size;   /* global, in sequences */
    int microbatches; /* per step and per dp rank (gradient accumulation) */
    int seq_len;      /* tokens per sequence in training; 0 = model.seq_len */
    double lr, min_lr;
    int warmup; /* warm-up steps, then cosine decay to min_lr */
    uint64_t seed;
    wf_schedule_kind schedule;
    int eval_every, eval_batches;
    char metrics[WF_PATH_MAX];
    char trace[WF_PATH_MAX];
    int trace_steps[2];            /* first and last step traced */
    char tensorboard[WF_PATH_MAX]; /* event files' directory; "" = none */
    double tensorboard_roll_mb;    /* a file past this is closed, the next one started */
    char checkpoint_dir[WF_PATH_MAX];
    int checkpoint_every, keep;
    double checkpoint_minutes; /* of training, by rank 0's clock, between checkpoints */
    bool checkpoint_async;     /* written in the background from a snapshot */
    char resume[WF_PATH_MAX];  /* "", "auto" or a path */
    double peak_tflops;        /* for MFU; 0 = measure/unknown */
    double loss_jump_factor;   /* WARN when loss > this x its running mean; 0 = off */
    /* samples (worker/train/sample.c): every sample_every steps (0 = never) and for
     * --generate, sample_tokens tokens after sample_prompt, from the top sample_top_k
     * (0 = all) of the logits / sample_temperature, drawn from sample_seed */
    int sample_every, sample_tokens, sample_top_k;
    int log_every; /* a step line every log_every steps (and the first, the last, and
                      each evaluated one); the metrics file has every step */
    double sample_temperature;
    uint64_t sample_seed;
    char sample_prompt[1024];
  } train;
  struct {
    char path[WF_PATH_MAX]; /* text file, glob of llm.c shards, or "" = synthetic */
    double val_fraction;
    char val_path[WF_PATH_MAX];  /* validation data (file or glob); "" = the held-out tail */
    char tokenizer[WF_PATH_MAX]; /* tokenizer.json, vocab.json, tokenizer.model or a dir */
    /* streaming JSON Lines corpora (worker/io/stream.c): files or globs, plain or zstd;
     * their mixing weights (n_mix 0: equal); the JSON key of each document's text (one
     * for every source, or one per source); attention kept inside packed documents,
     * positions restarting at each */
    char source[WF_DATA_MAX_SOURCES][WF_PATH_MAX];
    int n_source;
    double mix[WF_DATA_MAX_SOURCES];
    int n_mix;
    char field[WF_DATA_MAX_SOURCES][WF_DATA_FIELD_MAX];
    int n_field;
    bool document_mask;
  } data;
  struct {
    int zero; /* 0 or 1 */
    double weight_decay, clip, beta1, beta2, eps;
    int bucket_mb; /* data-parallel gradient bucket size */
    /* precision=fp16 loss scaling: loss_scale 0 = dynamic (starting at loss_scale_init,
     * halved on an overflow, doubled after loss_scale_window finite steps), > 0 = fixed */
    double loss_scale, loss_scale_init;
    int loss_scale_window;
  } optim;
  struct {
    bool sequence;
    int pp_layers[WF_MAX_STAGES];
    int n_pp_layers; /* 0 = balanced automatically */
    int virtual_stages;
    wf_recompute activation_checkpointing;
    bool reshard_after_forward; /* ZeRO-3: free a unit's gathered parameters after forward */
    wf_cp_mode cp_mode;
  } parallel;
  wf_precision precision;
  struct {
    bool bind;
    int threads;              /* compute threads per rank; 0 = the binding's share */
    double hang_timeout;      /* seconds */
    double heartbeat_timeout; /* seconds of silence after which a rank, or rank 0, is lost */
    double connect_timeout;   /* seconds a rank tries to reach the coordinator at start */
    int metrics_port;         /* 0 = off */
    char listen_addr[64];     /* the listeners' address; "" = MASTER_ADDR's interface */
    char job_name[64];        /* the job's id for the console; "" = host-pid-time or slurm-ID */
    int log_level;
    wf_device_pref device;
    bool allow_tf32;             /* GPU fp32 GEMMs may use TF32 tensor cores */
    wf_attention_impl attention; /* GPU attention: auto, cudnn, flash, reference */
    bool cpu_bf16_gemm;          /* CPU bf16 GEMMs through oneDNN where the CPU has AVX512_BF16 */
  } runtime;

  /* Which source set each key, indexed by the key's position in the key table. */
  uint8_t source[WF_CONFIG_MAX_KEYS];
} wf_config;

/* Defaults for every key (source WF_SRC_DEFAULT) and the default preset. */
void wf_config_init(wf_config *cfg);

/* Load a YAML file. On error writes "FILE:LINE: key: what was wrong; how to fix". */
wf_status wf_config_load_file(wf_config *cfg, const char *path, char *err, size_t err_len);

/* Set one dotted key from text (as from the command line or environment). Unknown
 * keys get a "did you mean" suggestion. */
wf_status wf_config_set(wf_config *cfg, const char *key, const char *value, wf_config_source src,
                        char *err, size_t err_len);

/* The name among names[0..n) closest to `typed` (edit distance, as the config's "did you
 * mean" measures it), or NULL when none is close enough to be what was meant. */
const char *wf_closest_name(const char *typed, const char *const *names, size_t n);

/* Apply WEFT_<SECTION>_<KEY> variables from `envp` (NULL-terminated, like environ).
 * Variables that are not config keys (WEFT_LOG_LEVEL, WEFT_MODULE_PATH...) are
 * listed in the implementation and skipped. */
wf_status wf_config_load_env(wf_config *cfg, char *const *envp, char *err, size_t err_len);

/* Check every rule against the world size (0 = do not check world-dependent rules)
 * and fill derived values (mesh.dp, model.padded_vocab, train.seq_len). WF_EINVAL when
 * no model check is set (below). */
wf_status wf_config_validate(wf_config *cfg, int world_size, char *err, size_t err_len);

/* The model's own rules on the model.* keys: which families exist and the shapes each
 * allows, which worker/model knows and runtime/ does not. wf_config_validate calls it
 * among its rules (on its working copy, model.padded_vocab derived); a broken rule writes
 * its message into err and returns WF_ECONFIG. Every program that validates a config sets
 * it once at start-up, before the first validation: worker/model's wf_model_config_check. */
typedef wf_status (*wf_config_model_check)(const wf_config *cfg, char *err, size_t err_len);
void wf_config_set_model_check(wf_config_model_check fn);

/* Print "key = value   (source)" for every key. */
void wf_config_print(const wf_config *cfg, FILE *out);

/* Name of a source, e.g. "default", "file", "env", "cli". */
const char *wf_config_source_str(wf_config_source s);

/* The key table: keys are numbered 0..count-1 in print order, which is also the
 * index into cfg->source. wf_config_key_find returns -1 for an unknown key. */
int wf_config_key_count(void);
const char *wf_config_key_name(int index);
int wf_config_key_find(const char *key);

/* A rope scaling with its unset (0) fields filled: Llama 3.1's published values for a
 * llama3 scaling (factor 8, low_freq_factor 1, high_freq_factor 4, original context
 * 8192); all zero for none. */
wf_rope_scaling wf_rope_scaling_resolve(const wf_rope_scaling *s);
/* NULL when a resolved scaling is usable, else what is wrong (in config.json's names). */
const char *wf_rope_scaling_check(const wf_rope_scaling *s);

#endif /* WF_CONFIG_H */
