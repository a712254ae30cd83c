/*
 * wf_model.h - a transformer of any family on one rank or one shard: the family
 * interface (tensor descriptions and what a family computes), the parameter layout of
 * the whole model and of a shard, the model object (parameters, gradients, activation
 * slots, forward and backward), and the weight formats (llm.c, Hugging Face
 * safetensors).
 *
 * A family (GPT-2, Llama) is a versioned table (wf_family), as the device seam is: it
 * DESCRIBES its tensors (wf_tensor_desc: name, shape by rows and columns of the model's
 * dimensions, how tensor parallelism splits it, where it lives, weight decay,
 * initialisation, whether it is tied, whether its gradient is a tp-partial sum under
 * sequence parallelism, its Hugging Face names and layout) and PROVIDES a block's
 * forward and backward, the embedding and the head (model_int.h's ops, private to this
 * folder), its FLOPs and the kernels a step runs (wf_model_costs, for the planner).
 * Layout, shards, the gradient path, ZeRO's units, checkpoints, weight import and
 * export and the planner read the description, never a family's own tensor names: a
 * tensor is an index into the description (wf_model_desc), ordered as the family's
 * checkpoint layout.
 *
 * Layout: all parameters live in one allocation and all gradients in another with the
 * same layout: tensors in description order, the layers of a layered tensor together
 * (GPT-2's is llm.c's checkpoint order: wte, wpe, ln1w, ln1b, qkvw, ...). Tensor and
 * pipeline ranks hold shards of this layout, addressed by (tensor, layer) through
 * wf_model_param().
 *
 * Initialisation: each element of tensor t, layer l is drawn from wf_rng_normal(seed,
 * stream = t * 4096 + l, index = element index in the full tensor) by the tensor's
 * rule (normal of its std, the same over sqrt(2L) for residual projections, ones,
 * zeros), so any slice can be produced alone; vocabulary rows [V, Vp) are zero.
 *
 * Mixture of experts (families with experts, E > 0): each layer's MLP is E experts, each
 * a SwiGLU of width F, and a router (E, C) that sends every token to its K best experts.
 * An expert tensor (wf_tensor_desc.experts) holds the E experts' copies of one weight,
 * expert after expert; expert parallelism gives each of ep ranks E / ep consecutive
 * experts (wf_model_shard.ep), as tensor parallelism gives it a slice of each.
 *
 * Shapes: B batch, T time, C d_model, L layers, NH heads, KV key/value heads, hs head size
 * (C/NH unless the family sets head_dim), F the MLP's (an expert's) hidden width, V
 * vocab, Vp padded vocab, E experts, K experts per token.
 */
#ifndef WF_MODEL_H
#define WF_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_config.h"
#include "wf_runtime.h"

/* ---- dimensions ------------------------------------------------------------------- */

typedef struct wf_family wf_family;
struct json_t; /* jansson's, in the Hugging Face hooks below */

/* The whole model's dimensions. fam NULL is GPT-2 (literals in tests and the llm.c
 * header leave it out); KV 0 is NH, F 0 is 4C, HD 0 is C/NH, tie WF_TIE_AUTO the
 * family's choice (GPT-2 ties, Llama does not), rope_theta, norm_eps, a llama3
 * rope_scaling's fields and the router's 0 (or -1 for the aux coefficient) the
 * family's: all resolved by wf_model_dims_resolve, which every function here applies
 * first. The router's coefficients and capacity shape the loss, not the tensors, so
 * wf_model_dims_same does not compare them. */
typedef struct wf_model_dims {
  const wf_family *fam;
  int L, NH, C, maxT, V, Vp;
  int KV;                       /* key/value heads (grouped-query attention); NH = multi-head */
  int F;                        /* the MLP's hidden width */
  wf_tie tie;                   /* WF_TIE_YES: the head reads the embedding's weight */
  double rope_theta;            /* rotary embeddings' base (families with RoPE) */
  wf_rope_scaling rope_scaling; /* RoPE's frequency scaling (Llama 3.1); zero: none */
  float norm_eps;               /* the normalisation's epsilon (families that take one) */
  int HD;                       /* the head size (head_dim); 0 = C / NH */
  /* mixture of experts (0 for dense families) */
  int E;               /* experts per layer */
  int K;               /* experts each token is routed to (top-k) */
  wf_switch norm_topk; /* the K routing weights renormalised to sum 1 (norm_topk_prob) */
  double aux_coef;     /* load-balancing loss coefficient (router_aux_loss_coef); < 0 = the
                        * family's */
  double z_coef;       /* router z-loss coefficient; 0 = none */
  double capacity;     /* capacity factor: an expert takes at most ceil(capacity N K / E) of
                        * a micro-batch's N tokens, the rest are dropped; 0 = dropless */
} wf_model_dims;

/* d with its defaults filled in (fam, KV, F, norm_eps, rope_theta, rope_scaling). */
wf_model_dims wf_model_dims_resolve(const wf_model_dims *d);
/* Dimensions from a validated config (model.family, model.* keys). */
wf_model_dims wf_model_dims_from_config(const wf_config *cfg);
/* NULL when the dims are usable, else what is wrong with them. */
const char *wf_model_dims_check(const wf_model_dims *d);
/* The model's rules on a config's model.* keys (wf_config_set_model_check's function):
 * model.family names a registered family, and the family's own keys rules hold. Each
 * message names the keys, their values and what to change; WF_ECONFIG. */
wf_status wf_model_config_check(const wf_config *cfg, char *err, size_t len);
/* Whether two dims describe the same model (after resolving), and if not the first
 * field that differs with both values (for messages). */
bool wf_model_dims_same(const wf_model_dims *a, const wf_model_dims *b, const char **field,
                        double *va, double *vb);
/* model.init's dims `file` meet the config: a model.* key the user gave (a file, WEFT_*,
 * the command line) that says otherwise is refused naming both values (model.seq_len may
 * be shorter than the file's context: the length trained on); the others take the
 * file's values (source derived). `init` names the file in messages. WF_ECONFIG. */
wf_status wf_model_dims_meet_config(const wf_model_dims *file, const char *init, wf_config *cfg,
                                    char *err, size_t len);
/* The family's name ("gpt2", "llama"). */
const char *wf_model_family_name(const wf_model_dims *d);

/* ---- the family interface: tensor descriptions ------------------------------------ */

/* A tensor's extent along one axis, in the model's dimensions. */
typedef enum wf_dim {
  WF_DIM_ONE = 0, /* 1: a vector is (rows, ONE) */
  WF_DIM_C,       /* d_model */
  WF_DIM_Q,       /* NH * hs: the query heads' width (C) */
  WF_DIM_KV,      /* KV * hs: the key or value heads' width */
  WF_DIM_F,       /* the MLP's hidden width */
  WF_DIM_VP,      /* the padded vocabulary */
  WF_DIM_T,       /* the context length (maxT) */
  WF_DIM_E,       /* the experts (a router's rows) */
  WF_DIM_HD,      /* the head size */
  WF_DIM_N_       /* (the number of symbols) */
} wf_dim;

/* How tensor parallelism splits a tensor (Megatron's):
 *  - COLUMN: output rows split; a tensor of several row groups (GPT-2's qkv = [q|k|v],
 *    Llama's [q|k|v] with kv heads, SwiGLU's [gate|up]) splits each group separately
 *    and a rank holds its part of each, in group order;
 *  - ROW: input columns split;
 *  - VOCAB: rows split as the vocabulary (Vp / tp each);
 *  - REPLICATED: every tp rank holds it whole (counted on tp rank 0). */
typedef enum wf_tp_split {
  WF_SPLIT_REPLICATED = 0,
  WF_SPLIT_COLUMN,
  WF_SPLIT_ROW,
  WF_SPLIT_VOCAB
} wf_tp_split;

/* Where a tensor lives: every layer; the first stage (embeddings); the last stage (the
 * final norm, an untied head); or TIED: the embedding the head also reads, held by the
 * first and the last stage (counted on the first; with stages its gradient is summed
 * over the embedding group and the copies are checked equal after each step). */
typedef enum wf_place { WF_PLACE_LAYER = 0, WF_PLACE_FIRST, WF_PLACE_LAST, WF_PLACE_TIED } wf_place;

typedef enum wf_init_rule {
  WF_INIT_ZEROS = 0,
  WF_INIT_ONES,
  WF_INIT_NORMAL,       /* normal(0, std) */
  WF_INIT_NORMAL_DEPTH, /* normal(0, std / sqrt(2L)): residual projections (GPT-2) */
} wf_init_rule;

/* One Hugging Face tensor a weft tensor holds (per layer when layered): `name` is a
 * printf format taking the layer (e.g. "model.layers.%d.self_attn.k_proj.weight"), and
 * for an expert tensor the layer then the expert
 * ("model.layers.%d.mlp.experts.%d.gate_proj.weight");
 * `group` the row group it is (-1: the whole tensor); `transpose` when the file stores
 * it (in, out) as GPT-2's Conv1D does. (Query and key rows need no permutation: weft's
 * RoPE pairs them as Hugging Face's checkpoints are stored, rotate-half, kernels/rope.h.) */
typedef struct wf_hf_part {
  const char *name;
  int group;
  bool transpose;
} wf_hf_part;

#define WF_MAX_GROUPS  3
#define WF_MAX_HF      3
#define WF_MAX_TENSORS 24

typedef struct wf_tensor_desc {
  const char *name; /* short name, checkpoints' and messages' ("wte", "qkvw") */
  wf_place place;
  wf_dim rows[WF_MAX_GROUPS]; /* row groups; the rows are their concatenation */
  int n_groups;               /* >= 1 */
  wf_dim cols;                /* ONE for a vector */
  wf_tp_split split;
  bool decay;      /* AdamW decays it (2-D weights) */
  bool gemm;       /* a GEMM operand: mixed precision keeps it rounded */
  bool sp_partial; /* gradient is a tp-partial sum under sequence parallelism
                    * (norms of the replicated regions: each rank saw its rows) */
  wf_init_rule init;
  float std;                /* of the normal rules */
  wf_hf_part hf[WF_MAX_HF]; /* its Hugging Face tensors (none: not in the HF model) */
  int n_hf;
  bool experts;    /* one copy per expert (E of rows x cols each, expert after expert),
                    * split over ep ranks, each the expert's own as tp splits it */
  bool tp_partial; /* replicated over tp, but each tp rank computes a part of its gradient
                    * (per-head norms: the rank's heads; a router: the rank's slice of each
                    * expert's output), summed over tp after backward */
} wf_tensor_desc;

/* A model's tensors, concrete for its dims (a tied embedding's head is absent). */
typedef struct wf_model_desc {
  int n;
  wf_tensor_desc t[WF_MAX_TENSORS];
} wf_model_desc;

/* ---- the family interface: what the planner counts -------------------------------- */

/* One item of a block's forward work for the time model: a GEMM (m rows, n, k), the
 * attention kernel (m = batch x local heads, n = T, k = head size), elementwise work
 * priced at the measured norm or activation kernel (m elements) or at memory bandwidth
 * (m bytes), or a tp all-reduce (m bytes). */
typedef enum wf_cost_kind {
  WF_COST_GEMM = 0,
  WF_COST_ATTENTION,
  WF_COST_NORM,
  WF_COST_ACT,
  WF_COST_BYTES,
  WF_COST_TP,
} wf_cost_kind;

typedef struct wf_cost {
  wf_cost_kind kind;
  double m, n, k;
} wf_cost;

/* The shape of one micro-batch on one rank: B x T tokens, N = B*T rows, R rows of the
 * replicated regions (N / tp under sequence parallelism), tp, and whether the device
 * keeps attention's probabilities (the CPU does: (B, NH/tp, T, T)). */
typedef struct wf_cost_geo {
  double B, T, N, R, tp;
  bool keeps_probs;
} wf_cost_geo;

#define WF_MAX_COSTS 16
typedef struct wf_model_costs {
  wf_cost block[WF_MAX_COSTS]; /* one block's forward */
  int n_block;
  int block_fwd_ops, block_bwd_ops; /* kernel launches of a block's forward, backward */
  int head_ops;                     /* of the head's forward (norm, logits, the loss) */
} wf_model_costs;

/* ---- the family interface: Hugging Face's names for the dimensions ------------------ */

/* A dimension as Hugging Face's config.json (and weft's safetensors __metadata__) names
 * it: "n_layer" or "num_hidden_layers" for L, ... */
typedef enum wf_hf_field {
  WF_HF_L = 0,
  WF_HF_NH,
  WF_HF_KV,
  WF_HF_C,
  WF_HF_F,
  WF_HF_T,
  WF_HF_V,
  WF_HF_THETA,
  WF_HF_EPS,
  WF_HF_TIE,
  WF_HF_ROPE_SCALING, /* an object (wf_rope_scaling_json), not a number */
  WF_HF_HD,           /* head_dim */
  WF_HF_E,            /* num_experts (Mixtral: num_local_experts) */
  WF_HF_K,            /* num_experts_per_tok */
  WF_HF_NORM_TOPK,    /* norm_topk_prob, a boolean */
  WF_HF_AUX,          /* router_aux_loss_coef */
} wf_hf_field;

typedef struct wf_hf_key {
  const char *key;
  wf_hf_field field;
} wf_hf_key;

#define WF_MAX_HF_KEYS 18

/* ---- the family table -------------------------------------------------------------- */

#define WF_FAMILY_VERSION 2

struct wf__family_ops; /* model_int.h: the family's compute (block, embedding, head) */

struct wf_family {
  int version;                 /* WF_FAMILY_VERSION */
  const char *name;            /* model.family */
  const char *hf_model_type;   /* config.json's model_type ("gpt2", "llama") */
  const char *hf_architecture; /* config.json's architectures[0] */
  bool llmc;                   /* llm.c's GPT-2 files hold it */
  bool own_head_dim;           /* its head size is a dimension of its own (head_dim), not
                                * d_model / heads */
  /* defaults and checks: check's reason is about dims alone (a file's, a checkpoint's);
   * check_keys checks a config's model.* keys (model.family this family) before any
   * dims are made of them, and says which key to change (wf_model_config_check) */
  void (*resolve)(wf_model_dims *d);
  const char *(*check)(const wf_model_dims *d);
  wf_status (*check_keys)(const wf_config *cfg, char *err, size_t len);
  /* its tensors for dims d (resolved), in layout order */
  void (*describe)(const wf_model_dims *d, wf_model_desc *out);
  /* forward FLOPs per token of one layer over T positions (the stage partition's cost),
   * and of one training step (forward and backward) on B x T tokens */
  double (*layer_flops)(const wf_model_dims *d, int T);
  double (*step_flops)(const wf_model_dims *d, int B, int T);
  /* the kernels a block runs, for the time model */
  void (*costs)(const wf_model_dims *d, const wf_cost_geo *g, wf_model_costs *out);
  /* Hugging Face: the dims' names in config.json; a prefix readers also accept the
   * names without (GPT2Model's files lack GPT2LMHeadModel's "transformer."); suffixes of
   * buffers readers skip (old files' causal masks, rotary tables); the head's name,
   * absent or equal to the embedding when they are tied */
  wf_hf_key hf_keys[WF_MAX_HF_KEYS];
  int n_hf_keys;
  const char *hf_prefix;
  const char *hf_skip[4];
  const char *hf_head;
  const char *hf_config; /* config.json's other keys, as JSON ("hidden_act": "silu", ...) */
  /* the context (WF_HF_T) of a config.json that does not give one and of a model with no
   * position table to read it from: transformers' default for the family's config class */
  int hf_max_positions;
  /* What config.json may hold that the family cannot represent (NULL: nothing): the
   * reason in buf, else NULL. */
  const char *(*hf_refuse)(struct json_t *config, char *buf, size_t len);
  const struct wf__family_ops *ops;
  const void *data; /* the family's own constants, read by its ops (NULL: none) */
};

/* The registered families (GPT-2, Llama), and one by name (NULL: none). */
const wf_family *const *wf_model_families(int *n);
const wf_family *wf_model_family_find(const char *name);
/* The family of d (GPT-2 when d->fam is NULL). */
const wf_family *wf_model_family(const wf_model_dims *d);

/* d's tensors. */
void wf_model_describe(const wf_model_dims *d, wf_model_desc *out);
/* A tensor's rows, columns and elements (one layer's when layered) for dims d. */
size_t wf_tensor_rows(const wf_model_dims *d, const wf_tensor_desc *t);
size_t wf_tensor_cols(const wf_model_dims *d, const wf_tensor_desc *t);
size_t wf_tensor_group_rows(const wf_model_dims *d, const wf_tensor_desc *t, int g);
/* Extent of one dimension symbol. */
size_t wf_dim_size(const wf_model_dims *d, wf_dim x);

/* Elements of one layer's tensor t (the whole tensor when not layered), of all its
 * layers, its offset in the layout, and the number of parameters. */
size_t wf_model_layer_numel(const wf_model_dims *d, int t);
size_t wf_model_tensor_numel(const wf_model_dims *d, int t);
size_t wf_model_tensor_offset(const wf_model_dims *d, int t);
size_t wf_model_num_params(const wf_model_dims *d);
/* Tensors of d, and the one of a given short name (-1: none). */
int wf_model_num_tensors(const wf_model_dims *d);
int wf_model_tensor_find(const wf_model_dims *d, const char *name);
/* FLOPs of one training step (forward + backward) on B*T tokens (the family's count:
 * 6 x parameters x tokens plus attention over the full T x T square), and forward FLOPs
 * per token of one layer. */
double wf_model_flops_per_step(const wf_model_dims *d, int B, int T);
double wf_model_layer_flops(const wf_model_dims *d, int T);
/* The kernels of one block's forward at geometry g (the planner's time model). */
void wf_model_costs_get(const wf_model_dims *d, const wf_cost_geo *g, wf_model_costs *out);

/* ---- shards --------------------------------------------------------------------------
 * Which part of the model this rank holds (the whole model on one rank).
 *  - tensor parallelism: tp ranks split each tensor as its description says; every
 *    local tensor is a slice of the one-rank tensor, initialised from the same (seed,
 *    tensor, layer, index) stream.
 *  - pipeline parallelism: layers [l0, l1); the first stage holds the FIRST tensors,
 *    the last the LAST ones, both the TIED embedding (see wf_place).
 * The local parameters are laid out as the full model's: tensors in description order,
 * the local layers of a tensor together, absent tensors empty. */
typedef struct wf_model_shard {
  int tp, tp_rank; /* 1, 0 without tensor parallelism */
  int ep, ep_rank; /* expert parallelism: experts [ep_rank E / ep, (ep_rank + 1) E / ep) of
                    * every expert tensor; 0 or 1 = all of them */
  bool sequence;   /* sequence parallelism over the tp group */
  int l0, l1;      /* this stage's layers (its first chunk's, with chunks) */
  int chunks;      /* v model chunks (interleaved schedule; 0 or 1 = one): chunk c
                    * holds layers [l0 + c*chunk_stride, l1 + c*chunk_stride) */
  int chunk_stride;
  bool first, last; /* holds the embeddings / the final norm, head and loss */
  int cp, cp_rank;  /* context parallelism (cp 0 or 1: none): this rank holds chunks cp_rank
                     * and 2cp-1-cp_rank of 2cp equal chunks of every sequence, so a
                     * micro-batch's T is that pair's length, the sequence's T / cp */
} wf_model_shard;

/* The whole model: tp 1, layers [0, L), first and last. */
wf_model_shard wf_model_shard_whole(const wf_model_dims *d);
/* NULL when the shard fits the dims, else what is wrong. */
const char *wf_model_shard_check(const wf_model_dims *d, const wf_model_shard *s);
/* Elements of shard s's flat parameter vector; its layers over all chunks; one layer's
 * elements of tensor t, t's elements and offset in it; whether t's gradient is a
 * tp-partial sum (sp_partial under sequence parallelism); whether s holds t; whether
 * its global sums (the gradient norm) count t: tp-replicated tensors only on tp rank 0,
 * the tied embedding only on the first stage. */
size_t wf_model_shard_params(const wf_model_dims *d, const wf_model_shard *s);
int wf_model_shard_layers(const wf_model_shard *s);
size_t wf_model_shard_layer_numel(const wf_model_dims *d, const wf_model_shard *s, int t);
size_t wf_model_shard_numel(const wf_model_dims *d, const wf_model_shard *s, int t);
size_t wf_model_shard_offset(const wf_model_dims *d, const wf_model_shard *s, int t);
bool wf_model_shard_tp_partial(const wf_model_dims *d, const wf_model_shard *s, int t);
bool wf_model_shard_holds(const wf_model_dims *d, const wf_model_shard *s, int t);
bool wf_model_shard_counted(const wf_model_dims *d, const wf_model_shard *s, int t);
/* Whether t has one tensor per layer; whether it is an expert tensor (split over ep). */
bool wf_model_tensor_layered(const wf_model_dims *d, int t);
bool wf_model_shard_expert(const wf_model_dims *d, int t);

/* The local <-> full mapping of a shard, as runs: elements [local, local + n) of the
 * shard's flat parameter vector are elements [full, full + n) of the whole model's.
 * Runs are maximal within one tensor (t, layer) and come in local order; together they
 * cover the local vector exactly once. counted is wf_model_shard_counted: over all
 * shards of a mesh, the counted runs cover the full layout exactly once. A pure
 * function of (dims, shard), so a checkpoint loader can map a saved shard without its
 * model; wf_model_export_full and wf_model_import_full are built on it. */
typedef struct wf_model_run {
  int tensor;
  int layer; /* global layer; 0 for tensors that are not layered */
  bool counted;
  size_t full, local, n;
} wf_model_run;
typedef void (*wf_model_run_fn)(void *user, const wf_model_run *run);
void wf_model_shard_runs(const wf_model_dims *d, const wf_model_shard *s, wf_model_run_fn fn,
                         void *user);
/* The same runs clipped to the local elements [lo, hi): fn sees only each run's part
 * inside it (full, local and n narrowed alike), and no run that misses it. */
void wf_model_shard_runs_in(const wf_model_dims *d, const wf_model_shard *s, size_t lo, size_t hi,
                            wf_model_run_fn fn, void *user);
/* Elements [lo, hi) of shard s's flat vector, held in local[0 .. hi - lo), against the
 * whole model's vector `full`, through the runs above: to_full adds the counted ones
 * into full (every shard's adds into zeros assemble the model exactly); else every one
 * of them is copied out of full. */
void wf_model_shard_exchange(const wf_model_dims *d, const wf_model_shard *s, float *local,
                             size_t lo, size_t hi, float *full, bool to_full);

/* ---- tensor parallelism's region operators -----------------------------------------
 * A transformer block alternates replicated regions (norms, residuals) and tensor-
 * parallel regions (column-parallel -> local op -> row-parallel). Crossing into a
 * tensor-parallel region and out of it are conjugate operators (Megatron's f and g):
 *
 *   enter (f):  forward identity,    backward all-reduce       (tp)
 *   leave (g):  forward all-reduce,  backward identity         (tp)
 *
 * and with sequence parallelism (the replicated regions hold N/tp token rows per rank,
 * rank r rows [r*N/tp, (r+1)*N/tp) of the flattened batch):
 *
 *   enter:  forward all-gather,      backward reduce-scatter
 *   leave:  forward reduce-scatter,  backward all-gather
 *
 * plus a plain all-gather (the vocabulary-parallel loss's row statistics) and an all-reduce
 * (the statistics of a norm over a projection split across ranks). Entering
 * forward moves activations, in the model's storage format; every reduction (and
 * leaving's backward, which moves gradients) is fp32. The model
 * computes and never communicates: worker/parallel provides these (wf_tp_regions, over
 * the tp group) and the model calls them where its forward and backward cross a region.
 * Without a table (tp = 1) every operator is the identity. */
#define WF_TP_OPS_VERSION 3
typedef struct wf_tp_ops {
  int version; /* WF_TP_OPS_VERSION */
  /* x (rows(N), C), an activation stored in format fmt (a wf_precision, storage.h) ->
   * *out, the full (N, C) input of a column-parallel layer: x itself, or `full` after the
   * all-gather (in the same format) */
  wf_status (*enter_fwd)(void *ctx, const void **out, const void *x, void *full, size_t N, size_t C,
                         int fmt);
  /* dfull (N, C), this rank's partial input gradient -> its sum over tp in dx
   * (rows(N), C): all-reduce in place (dx == dfull allowed) or reduce-scatter */
  wf_status (*enter_bwd)(void *ctx, float *dx, float *dfull, size_t N, size_t C);
  /* partial (N, C) outputs of a row-parallel layer -> their sum in y (rows(N), C) */
  wf_status (*leave_fwd)(void *ctx, float *y, float *partial, size_t N, size_t C);
  /* dy (rows(N), C) -> *out, the full (N, C) output gradient */
  wf_status (*leave_bwd)(void *ctx, const float **out, const float *dy, float *full, size_t N,
                         size_t C);
  /* n floats of every tp rank into all (tp * n), rank-major */
  wf_status (*gather)(void *ctx, const float *x, float *all, size_t n);
  /* n floats summed over the tp group in place (statistics of a norm whose groups span
   * the tp ranks) */
  wf_status (*sum)(void *ctx, float *x, size_t n);
} wf_tp_ops;

typedef struct wf_tp_regions {
  const wf_tp_ops *ops; /* NULL: tp = 1, every operator the identity */
  void *ctx;
} wf_tp_regions;

/* ---- context parallelism's attention -------------------------------------------------
 * Under context parallelism (shard.cp > 1) a rank holds two chunks of each sequence,
 * cp_rank and 2cp-1-cp_rank (of 2cp; Megatron-Core's and torchtitan's load balance for
 * causal masks), as its T rows: positions (learned or rotary) are the global ones, and
 * everything but attention is row-wise, so only attention crosses ranks. worker/parallel
 * provides it (wf_cp_create) and the model calls it where a block attends, as it calls
 * the tp regions. qkv (B, T, C + 2 NKV hs) is this rank's rows as attention_gqa_forward
 * reads them (q and k rotated for RoPE families); out (B, T, C) and dqkv in format fmt;
 * lse (B, NH, T) fp32 is attention's core state (what backward needs beside qkv and
 * out; selective recompute drops it and runs forward again). NKV == NH: multi-head.
 * Backward WRITES dqkv, as the one-rank kernels do. */
#define WF_CP_OPS_VERSION 1
typedef struct wf_cp_ops {
  int version; /* WF_CP_OPS_VERSION */
  wf_status (*forward)(void *ctx, void *out, float *lse, const void *qkv, int B, int T, int C,
                       int NH, int NKV, int fmt);
  wf_status (*backward)(void *ctx, void *dqkv, const void *dout, const void *qkv, const void *out,
                        const float *lse, int B, int T, int C, int NH, int NKV, int fmt);
} wf_cp_ops;

typedef struct wf_cp_regions {
  const wf_cp_ops *ops; /* NULL: cp = 1 */
  void *ctx;
} wf_cp_regions;

/* Where local row t of a micro-batch of T rows (per sequence) sits in its sequence under
 * cp ranks (rank r): rows [0, T/2) are chunk r, rows [T/2, T) chunk 2cp-1-r; cp <= 1 is
 * the identity. */
int wf_cp_position(int cp, int rank, int T, int t);
/* ---- expert parallelism's exchange ---------------------------------------------------
 * Under expert parallelism (wf_model_shard.ep > 1) each of the ep group's ranks holds
 * E / ep experts, and tokens reach them and come back by all-to-all inside the group:
 * rows of activations (a micro-batch's expert inputs, going; their outputs, coming back;
 * the reverse in backward) and the counts that size them. As with tensor parallelism the
 * model never communicates: worker/parallel provides these (wf_ep_regions, over the ep
 * group) and the model calls them where its experts' forward and backward cross ranks.
 * Every rank takes part in every exchange, whatever it sends or receives (an expert with
 * no tokens included). */
#define WF_EP_OPS_VERSION 1
typedef struct wf_ep_ops {
  int version; /* WF_EP_OPS_VERSION */
  /* n ints to each ep rank: send (ep * n) block p to rank p, recv (ep * n) block p from
   * rank p (host memory) */
  wf_status (*counts)(void *ctx, const int *send, int *recv, size_t n);
  /* rows of `width` elements of format fmt (a wf_precision: WF_PREC_NO is fp32; device
   * memory): send_rows[p] consecutive rows from send to rank p, in rank order; recv_rows[p]
   * rows from rank p into recv the same way (ep entries each) */
  wf_status (*rows)(void *ctx, const void *send, const size_t *send_rows, void *recv,
                    const size_t *recv_rows, size_t width, int fmt);
} wf_ep_ops;

typedef struct wf_ep_regions {
  const wf_ep_ops *ops; /* NULL: ep = 1, every expert local */
  void *ctx;
} wf_ep_regions;

/* ---- the model object ---------------------------------------------------------------- */

typedef struct wf_model wf_model;

typedef struct wf_model_opts {
  wf_model_dims dims;
  wf_model_shard shard;
  struct wf_dev *dev;     /* where the model lives and computes (borrowed); NULL = the CPU */
  wf_tp_regions tp;       /* the region operators when shard.tp > 1 (borrowed) */
  wf_cp_regions cp;       /* context parallelism's attention when shard.cp > 1 (borrowed) */
  wf_ep_regions ep;       /* the experts' exchange when shard.ep > 1 (borrowed) */
  int B, T;               /* largest micro-batch (T: this rank's rows per sequence, the
                           * sequence's T / cp under context parallelism) */
  int slots;              /* micro-batches whose activations live at once (>= 1) */
  int inbox;              /* spare stage inputs a pipeline receives activations into (>= 0) */
  wf_recompute recompute; /* activation checkpointing: full keeps each layer's output only, and
                           * backward recomputes the layer's intermediates (one more forward);
                           * selective drops attention's core state and recomputes it */
  wf_precision precision; /* activations stored in bf16/fp16 (see "Mixed precision" below) */
  int zero;               /* ZeRO stage whose gradient path will own this model (worker/parallel):
                           * 2 = no flat gradient buffer is ever allocated (ZeRO-2's windows
                           * take every gradient), 3 = no flat parameters nor their 16-bit copy
                           * either (ZeRO-3's shard and windows hold them): set-up never holds
                           * the whole shard's vectors; 0 or 1 = both allocated */
  bool docs;              /* packed documents (data.document_mask): forwards may take each
                           * row's document starts, which every slot keeps with the positions
                           * they give (2 x B x T ints more a slot) */
} wf_model_opts;

/* What a model of options o allocates, in bytes: wf_model_create_shard allocates
 * exactly these, so an estimate made from them (worker --estimate) is the trainer's own
 * arithmetic. The activations are the family's plan (what a block saves for backward,
 * its head's, its backward scratch), stored in the precision's format (16 bits under
 * mixed precision; statistics fp32). k: the device's (fp32) kernels, whose tables of
 * each format give the attention sizes; NULL = o->dev's (or the CPU's). A pure
 * function. */
typedef struct wf_model_mem {
  size_t params, grads; /* fp32 masters and their gradients */
  size_t wlow;          /* mixed precision's 16-bit copy of the parameters (0 at precision no) */
  size_t slot;          /* one activation slot: one micro-batch of one model chunk */
  size_t slots;         /* slot x o->slots */
  size_t recompute;     /* activation checkpointing's shared buffer: one layer's intermediates
                         * (full), one layer's attention core state (selective) */
  size_t scratch;       /* backward's scratch, shared by the slots, and the family's
                         * constant tables (RoPE's angles) */
  size_t stats;         /* the layers' statistics summed over a step (a mixture of experts'
                         * routers: wf_model_take_stats) */
  size_t io;            /* bytes of the stage's input or output, (rows, C) activations: one
                         * pipeline message */
  size_t inbox;         /* o->inbox spare stage inputs (communication memory) */
  size_t total;         /* all of the above that is allocated (not io) */
} wf_model_mem;
struct wf_kset;
wf_model_mem wf_model_mem_plan(const wf_model_opts *o, const struct wf_kset *k);

/* Allocate parameters, gradients and activations for micro-batches of at most B x T
 * tokens, on the CPU. Parameters are zero until initialised or loaded. The optimizer's
 * state is not the model's (worker/optim owns it). */
wf_status wf_model_create(wf_model **out, const wf_model_dims *d, int B, int T);
/* The same for one shard on a device, with `slots` activation slots (pipeline
 * micro-batches in flight). */
wf_status wf_model_create_shard(wf_model **out, const wf_model_opts *o);
void wf_model_destroy(wf_model *m); /* accepts NULL */

const wf_model_dims *wf_model_get_dims(const wf_model *m); /* the whole model's (resolved) */
const wf_model_shard *wf_model_get_shard(const wf_model *m);
const wf_model_desc *wf_model_get_desc(const wf_model *m);
struct wf_dev *wf_model_dev(const wf_model *m);
/* This rank's parameters: count, layers (all chunks), and each tensor's local offset
 * and size. */
size_t wf_model_local_params(const wf_model *m);
int wf_model_local_layers(const wf_model *m);
size_t wf_model_local_offset(const wf_model *m, int t);
size_t wf_model_local_numel(const wf_model *m, int t);
size_t wf_model_local_layer_numel(const wf_model *m, int t);
/* Whether this rank counts tensor t in global sums over the model (the gradient norm),
 * and whether t's gradient is a partial sum over the tp group (wf_model_shard_counted,
 * wf_model_shard_tp_partial of its dims and shard). */
bool wf_model_counted(const wf_model *m, int t);
/* The same as if this rank were ep rank 0: a sharded vector's (ZeRO's) dense elements
 * count on every ep rank, each holding its own shard of them. */
bool wf_model_counted_any_ep(const wf_model *m, int t);
bool wf_model_tp_partial(const wf_model *m, int t);
/* The parameters and the gradients: one allocation each, in device memory. Host code
 * reads or writes them through wf_dev_map (or the full-model exchange below). */
float *wf_model_params(wf_model *m);
float *wf_model_grads(wf_model *m);
/* Pointer to parameter (or gradient, grads != 0) tensor t of layer `layer` (a global
 * layer in [l0, l1); ignored for tensors that are not layered). */
float *wf_model_param(wf_model *m, int t, int layer, int grads);
/* ZeRO-2's gradient windows. Backward writes the gradient of tensor t, local layer j
 * (0 for the unlayered ones) at p from now on (NULL: back in the flat buffer). Once
 * wf_model_drop_grads has freed the flat buffer, every tensor backward writes must have
 * been placed so; wf_model_zero_grad then does nothing (the windows' owner zeroes them)
 * and the whole-model gradient exports fail. */
void wf_model_set_grad_tensor(wf_model *m, int t, int j, float *p);
void wf_model_drop_grads(wf_model *m);
/* ZeRO-3's parameter windows, as the gradients': forward and backward read tensor t of
 * local layer j at p (NULL: the flat buffer); wf_model_drop_params frees the flat buffer
 * (after which wf_model_params is NULL, wf_model_params_changed does nothing and the
 * whole-model exports fail). Under mixed precision the flat 16-bit copy goes with it, and `low`
 * (room for the tensor in the 16-bit format, wf_model_low_bytes per element) receives the window's
 * GEMM weights in 16 bits, which the GEMMs then read (NULL: no 16-bit copy, e.g. for a tensor that
 * is no GEMM weight). */
void wf_model_set_param_tensor(wf_model *m, int t, int j, float *p, void *low);
/* Bytes of one element of the 16-bit weight copy (2), or 0 at precision no. */
size_t wf_model_low_bytes(wf_precision p);
void wf_model_drop_params(wf_model *m);
/* Told before local layer j's forward (backward = false) and before its backward (and
 * its recomputation), so ZeRO-3 can gather that layer's parameters. */
typedef void (*wf_model_unit_hook)(void *user, int j, bool backward);
void wf_model_set_unit_hook(wf_model *m, wf_model_unit_hook fn, void *user); /* fn NULL = off */
/* The gradient of tensor t's first local layer (for a tensor placed contiguously: all). */
float *wf_model_grad_tensor(wf_model *m, int t);
/* Bytes of the flat gradient buffer (0 once dropped). */
size_t wf_model_grad_bytes(const wf_model *m);
/* Bytes of the parameters and (mixed precision) their 16-bit copy. */
size_t wf_model_param_bytes(const wf_model *m);

/* Full-layout exchange with the host (buffers of wf_model_num_params(dims) floats),
 * staged through the device. export ADDS the elements this rank owns (counted) into
 * `full`, so summing every model-parallel rank's export gives the whole model; import
 * copies this rank's slices out of a whole model. which: 0 parameters, 1 gradients. */
wf_status wf_model_export_full(wf_model *m, int which, float *full);
wf_status wf_model_import_full(wf_model *m, int which, const float *full);
/* The family's initialisation of every parameter (see above), through the device. */
wf_status wf_model_init(wf_model *m, uint64_t seed);
/* The same values for elements [lo, hi) of this rank's flat parameter vector alone,
 * written to dst (hi - lo floats of device memory): a dp shard (ZeRO-3) initialises
 * without the flat vector, bit for bit the slice wf_model_init would make. */
wf_status wf_model_init_range(wf_model *m, uint64_t seed, float *dst, size_t lo, size_t hi);
/* Elements [first, first + n) of the initial value of tensor (t, layer), as laid out in
 * the full tensor; equal to the same range of wf_model_init's result. */
void wf_model_init_slice(float *dst, int t, int layer, const wf_model_dims *d, uint64_t seed,
                         size_t first, size_t n);

/* Forward one micro-batch on one rank holding the whole model. inputs, targets (B, T)
 * int32 token ids in host memory; *loss (may be NULL) gets the mean cross-entropy loss
 * over the B*T positions when targets != NULL (else 0). */
wf_status wf_model_forward(wf_model *m, const int *inputs, const int *targets, int B, int T,
                           float *loss);
/* Elements [first, first + n) of the logits of the last forward (B, T, Vp/tp), widened
 * to fp32, into host memory; valid until the next forward/backward. */
wf_status wf_model_logits_read(wf_model *m, float *host, size_t first, size_t n);

/* Zero the gradients (on the model's default stream). */
wf_status wf_model_zero_grad(wf_model *m);
/* Backward of the last forward, ADDING into the gradients. The loss gradient of each
 * position is dloss_scale / (B*T): 1 for one micro-batch, 1/M accumulating M. */
wf_status wf_model_backward(wf_model *m, float dloss_scale);

/* Pipeline stages. A stage runs micro-batches in activation slots 0 .. slots-1. Its
 * input and output are (rows, C) activations in device memory, rows = B*T, or B*T/tp
 * under sequence parallelism, stored in the model's format (storage.h: fp32, or 16 bits
 * under mixed precision), and so is the gradient of its input. chunk_forward runs model chunk
 * `chunk` (the embeddings are chunk 0's on the first stage, the head chunk v-1's on the last; 0
 * without interleaving): inputs (B,T) (host) are needed by the first chunk, x (the previous stage's
 * output, device) by the others, targets (host) by the last (NULL: no loss). The last chunk's mean
 * loss over the micro-batch is added to the model's loss sum (wf_model_take_loss). Backward knows
 * the slot's chunk.
 * starts (B,T) (host, NULL: one sequence per row): where the document of each position
 * begins in its row (wf_io.h's wf_data_batch; a model made with opts.docs): attention
 * stays inside documents and positions (learned and rotary) restart at each, in this
 * chunk's forward and its backward. A start that is neither the previous one nor its own
 * position is refused (WF_EINVAL). */
wf_status wf_model_chunk_forward(wf_model *m, int slot, int chunk, const int *inputs, const void *x,
                                 const int *targets, const int *starts, int B, int T);
/* The sum of the micro-batch losses of the forwards since the last call (0 on a rank
 * without the head), read back from the device; the sum starts again at 0. */
wf_status wf_model_take_loss(wf_model *m, double *sum);
/* The same for the auxiliary losses of a family with experts (0 for others): sums[0] the
 * load-balancing loss (transformers' load_balancing_loss_func over every layer, without its
 * coefficient), sums[1] the router z-loss (without its coefficient), each the sum of the
 * micro-batches' values, and sums[2] the (token, expert) choices a capacity dropped in them,
 * added by the last chunk; all start again at 0. What training minimises is the
 * cross-entropy plus router_aux_loss_coef and router_z_loss_coef times sums[0], sums[1]. */
wf_status wf_model_take_aux(wf_model *m, double sums[3]);
/* The statistics each layer of this rank kept (a router's: wf_model_stats_floats of them a
 * layer, its choices per expert first), summed over the forwards since the last call, ADDED
 * into full (L rows of that many floats, host memory) at each layer's global row; they start
 * again at 0. Nothing for a family that keeps none. */
size_t wf_model_stats_floats(const wf_model *m);
wf_status wf_model_take_stats(wf_model *m, float *full);
const void *wf_model_stage_output(const wf_model *m, int slot);
/* Spare stage input i (0 <= i < wf_model_stage_inboxes): a pipeline receives an
 * activation into it, and chunk_forward, given it as x, keeps it as the slot's input
 * without a copy (the slot's previous input becomes spare input i). */
void *wf_model_stage_inbox(const wf_model *m, int i);
int wf_model_stage_inboxes(const wf_model *m);
size_t wf_model_stage_io_numel(const wf_model *m, int B, int T); /* rows * C */
size_t wf_model_stage_io_bytes(const wf_model *m, int B, int T); /* in the model's format */
/* Backward of the slot's forward, adding into the gradients; dy is the gradient of this
 * stage's output (ignored on the last stage, whose loss gradient per position is
 * dloss_scale / (B*T)). Afterwards wf_model_stage_dinput stores the gradient of the
 * stage's input (kept in fp32 inside the stage) into dst (io_numel elements in the
 * model's format, device memory) until the next backward (not on the first stage). */
wf_status wf_model_stage_backward(wf_model *m, int slot, const void *dy, float dloss_scale);
wf_status wf_model_stage_dinput(wf_model *m, void *dst);
/* Drop a slot's activations without a backward (evaluation). */
void wf_model_stage_release(wf_model *m, int slot);
/* Bytes of one slot's activations, and the most slots that held a forward's
 * activations at once since the last call (then reset). */
size_t wf_model_slot_bytes(const wf_model *m);
/* Activations held with `slots` slots in use, with activation checkpointing's one
 * shared layer of recomputed intermediates. */
size_t wf_model_act_bytes(const wf_model *m, int slots);
int wf_model_peak_slots(wf_model *m);

/* Told during backward when a group of gradients is final and will not change again
 * in this backward: group 0 = the LAST tensors (final norm, an untied head), 1..n =
 * this stage's layer l1-g (layers finish from the last to the first), n+1 = the FIRST
 * and TIED ones (embeddings), n = l1 - l0. With pipeline stages the embeddings' group
 * is never announced: the tied embedding is summed over the embedding group after the
 * step's last backward. Data parallelism starts reducing a bucket as soon as its
 * groups are final. */
typedef void (*wf_model_grad_hook)(void *user, int group);
void wf_model_set_grad_hook(wf_model *m, wf_model_grad_hook fn, void *user); /* NULL = off */

/* Mixed precision (wf_model_opts.precision bf16 or fp16), as Megatron-LM, torchtitan
 * and llm.c train: every activation a layer keeps for its backward (the residual
 * stream included, as Megatron-LM without fp32_residual_connection and llm.c keep it),
 * the logits and every pipeline message are stored in the 16-bit format; GEMMs read
 * 16-bit operands (the activations, a 16-bit copy of the weights the model keeps, 2
 * bytes per parameter, and the output gradient in backward) and accumulate in fp32.
 * The fp32 masters, the gradients (parameters' and, inside a stage, the activations'),
 * the norms' statistics, the loss, the tp reductions and the optimizer's state stay
 * fp32. Each kernel computes in fp32 and rounds what it stores (kernels/storage.h). With
 * precision no everything is fp32 and nothing is copied.
 *
 * Whoever writes the parameters other than through this header's init, import and
 * load (which do it themselves) must call wf_model_params_changed() afterwards, before
 * the next forward, so the 16-bit copy follows: the optimizer's update, the ZeRO-1
 * all-gather of updated shards, a checkpoint restore. A no-op with precision no. */
wf_status wf_model_params_changed(wf_model *m);
wf_precision wf_model_precision(const wf_model *m);
/* Mixed precision's 16-bit copy of the flat parameters (num_params elements of the
 * model's format, device memory), or NULL (precision no, or ZeRO-3 dropped the flat
 * vector). An optimizer that updates the whole flat vector writes it in the same pass
 * (wf_kset's adamw_update_store) instead of calling wf_model_params_changed. */
void *wf_model_params_low(wf_model *m);
/* Loss scaling (fp16): backward multiplies the loss gradient by s (default 1), so every
 * gradient comes out scaled by s; the optimizer unscales. */
void wf_model_set_loss_scale(wf_model *m, float s);

/* ---- llm.c files (llmc.c): GPT-2 only ------------------------------------------------
 * GPT-2 checkpoint (train_gpt2.c, magic 20240326, version 3): an int32[256] header
 * {magic, version, maxT, V, L, NH, C, Vp, 0...} then the float32 parameters in llm.c
 * order, which is exactly the GPT-2 family's flat layout. Version 5 (train_gpt2.cu) is
 * the same with bf16 parameters; readers take either, widening bf16 exactly. One codec
 * for the header serves every reader and writer of it. Errors are logged, naming the
 * file and what was expected; a model of another family is refused. */
#define WF_LLMC_MAGIC        20240326
#define WF_LLMC_VERSION      3 /* float32 parameters: what weft writes by default */
#define WF_LLMC_VERSION_BF16 5 /* bf16 parameters (llm.c's GPU trainer) */
#define WF_LLMC_STATE_MAGIC  20240327
#define WF_LLMC_HEADER_INTS  256
#define WF_LLMC_HEADER_BYTES (WF_LLMC_HEADER_INTS * 4)
void wf_llmc_header_encode(int32_t h[WF_LLMC_HEADER_INTS], const wf_model_dims *d);
wf_status wf_llmc_header_decode(const int32_t h[WF_LLMC_HEADER_INTS], const char *path,
                                wf_model_dims *d);
bool wf_llmc_dims(const char *path, wf_model_dims *d);
wf_status wf_llmc_peek(const char *path, wf_model_dims *d);
wf_status wf_llmc_read(const char *path, const wf_model_dims *d, float *full);
/* Elements [lo, hi) of shard s's flat parameter vector alone, read from where the file
 * holds them, into dst (host memory, hi - lo floats): no whole-model array. dst NULL
 * checks: the range read through a bounded buffer with one open, nothing kept. */
wf_status wf_llmc_read_shard(const char *path, const wf_model_dims *d, const wf_model_shard *s,
                             size_t lo, size_t hi, float *dst);
wf_status wf_llmc_write(const char *path, const wf_model_dims *d, const float *full);
wf_status wf_llmc_write_version(const char *path, const wf_model_dims *d, const float *full,
                                int version);
/* A whole model on one rank from / to a checkpoint (staged through the device). */
wf_status wf_model_load_llmc(wf_model *m, const char *path);
wf_status wf_model_save_llmc(wf_model *m, const char *path);
/* llm.c debug state (magic 20240327, version 2) for one batch: inputs, targets, logits
 * (B,T,V unpadded), loss, and gradients in checkpoint layout. dump_state runs a forward
 * and backward of a whole model on a fresh gradient buffer. */
wf_status wf_model_dump_state(wf_model *m, const char *path, const int *inputs, const int *targets,
                              int B, int T);
wf_status wf_llmc_write_state(const char *path, const wf_model_dims *d, int B, int T,
                              const int *inputs, const int *targets, const float *logits,
                              float loss, const float *grads);

/* ---- Hugging Face safetensors (safetensors.c, safetensors_read.c, safetensors_dims.c) -
 * The whole model's flat float32 array `full` (wf_model_num_params(d) floats; padded
 * vocabulary rows zero and not in the file) to and from the family's Hugging Face
 * tensors (wf_tensor_desc.hf: names, row groups, Conv1D transposes, RoPE's q/k row
 * permutation). Pure functions over host memory; errors name the file and the tensor.
 *  - read: every tensor must be there with the shape d implies (F32, BF16 or F16); a
 *    tied head (lm_head.weight), if present, must equal the embedding; buffers the
 *    family lists as skipped are; any other tensor is refused. `path` is one
 *    .safetensors file or a sharded model's model.safetensors.index.json (whose
 *    weight_map names the file of each tensor).
 *  - peek: the family and dims of a file: from config.json beside it (Hugging Face's
 *    keys), else the file's __metadata__ (weft writes it), else the tensor shapes.
 *  - write: F32, atomically, with __metadata__ {format: pt, ...dims}. A path ending in
 *    ".safetensors.index.json" writes shards of at most shard_bytes each (0: 5 GB, as
 *    transformers' save_pretrained) beside it, model-0000N-of-0000M.safetensors, and
 *    the index; config.json is written beside either (write_config). */
wf_status wf_safetensors_read(const char *path, const wf_model_dims *d, float *full, char *err,
                              size_t len);
/* Elements [lo, hi) of shard s's flat parameter vector alone (wf_llmc_read_shard's
 * contract, dst NULL included), with every check wf_safetensors_read makes of the file;
 * a tied head is compared with the embedding over the rows the range reads. Holds a
 * bounded piece of one tensor at a time, never the whole model; each file is opened and
 * its header parsed once per call, so a check of a whole model is one call. */
wf_status wf_safetensors_read_shard(const char *path, const wf_model_dims *d,
                                    const wf_model_shard *s, size_t lo, size_t hi, float *dst,
                                    char *err, size_t len);
wf_status wf_safetensors_peek(const char *path, wf_model_dims *d, char *err, size_t len);
wf_status wf_safetensors_write(const char *path, const wf_model_dims *d, const float *full,
                               size_t shard_bytes, bool write_config, char *err, size_t len);

/* RoPE's scaling as config.json's `rope_scaling` (and the checkpoint manifest) hold it:
 * null for none, else {"rope_type": "llama3", "factor", "low_freq_factor",
 * "high_freq_factor", "original_max_position_embeddings"}. parse takes NULL, null or
 * rope_type "default" as none, a llama3 object whose four numbers are all there, and
 * refuses anything else: NULL when *out is set, else what is wrong (in buf). */
struct json_t *wf_rope_scaling_json(const wf_rope_scaling *s);
const char *wf_rope_scaling_parse(struct json_t *v, wf_rope_scaling *out, char *buf, size_t len);

#endif /* WF_MODEL_H */
