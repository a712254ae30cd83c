/*
 * wf_model.h - GPT-2 on one rank or one shard: layout, parameters, activations, forward,
 * backward, and the llm.c file formats.
 *
 * Pre-LayerNorm GPT-2 with learned positions and a tied input/output embedding, on
 * one device (wf_device.h): every buffer is device memory, every op a kernel of the
 * device's table. All parameters live in one allocation and all gradients in another
 * with the same layout: the llm.c checkpoint order (wte, wpe, ln1w, ln1b, qkvw, qkvb,
 * attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb; all layers
 * of a kind together). Tensor and pipeline ranks hold shards of this layout, so
 * parameter tensors are addressed by (kind, layer) through wf_gpt_param().
 *
 * Initialisation is GPT-2's (normal std 0.02; residual projections attprojw and
 * fcprojw std 0.02/sqrt(2L); layernorm weights 1; biases 0), each element drawn
 * from wf_rng_normal(seed, stream = parameter kind * 4096 + layer, index = element
 * index in the full tensor), so any slice can be produced alone.
 *
 * Shapes: B batch, T time, C d_model, L layers, NH heads, V vocab, Vp padded vocab.
 */
#ifndef WF_MODEL_H
#define WF_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wf_config.h"
#include "wf_runtime.h"

#define WF_GPT_NUM_KINDS 16

typedef enum wf_param_kind {
  WF_P_WTE = 0,  /* (Vp, C) */
  WF_P_WPE,      /* (maxT, C) */
  WF_P_LN1W,     /* (L, C) */
  WF_P_LN1B,     /* (L, C) */
  WF_P_QKVW,     /* (L, 3C, C) */
  WF_P_QKVB,     /* (L, 3C) */
  WF_P_ATTPROJW, /* (L, C, C) */
  WF_P_ATTPROJB, /* (L, C) */
  WF_P_LN2W,     /* (L, C) */
  WF_P_LN2B,     /* (L, C) */
  WF_P_FCW,      /* (L, 4C, C) */
  WF_P_FCB,      /* (L, 4C) */
  WF_P_FCPROJW,  /* (L, C, 4C) */
  WF_P_FCPROJB,  /* (L, C) */
  WF_P_LNFW,     /* (C) */
  WF_P_LNFB,     /* (C) */
} wf_param_kind;

typedef struct wf_gpt_dims {
  int L, NH, C, maxT, V, Vp;
} wf_gpt_dims;

typedef struct wf_gpt wf_gpt;

/* Dimensions from a validated config. */
wf_gpt_dims wf_gpt_dims_from_config(const wf_config *cfg);
/* Number of elements of each parameter kind (all layers together) and in total. */
size_t wf_gpt_kind_numel(const wf_gpt_dims *d, wf_param_kind k);
size_t wf_gpt_num_params(const wf_gpt_dims *d);
/* Elements of one layer's tensor of kind k (the whole tensor for WTE, WPE, LNFW,
 * LNFB), and the offset of kind k (layer 0) in the parameter layout. */
size_t wf_gpt_layer_numel(const wf_gpt_dims *d, wf_param_kind k);
size_t wf_gpt_kind_offset(const wf_gpt_dims *d, wf_param_kind k);
/* Whether kind k has one tensor per layer; whether AdamW decays it (2-D weights). */
bool wf_gpt_kind_is_layered(wf_param_kind k);
bool wf_gpt_kind_decays(wf_param_kind k);
/* "wte", "wpe", "ln1w", ... (the llm.c names). */
const char *wf_gpt_kind_name(wf_param_kind k);
/* NULL when the dims are usable, else what is wrong with them. */
const char *wf_gpt_dims_check(const wf_gpt_dims *d);

/* Which part of the model this rank holds (the whole model on one rank).
 *  - tensor parallelism: tp ranks split the heads of attention (qkv rows [q|k|v] of
 *    the local heads, attproj columns), the MLP's hidden units (fc rows, fcproj
 *    columns) and the vocabulary (wte rows [tp_rank*Vp/tp, ...)); layernorms, wpe and
 *    the row-parallel biases are replicated. Every local tensor is a slice of the
 *    one-rank tensor, initialised from the same (seed, kind, layer, index) stream.
 *  - pipeline parallelism: layers [l0, l1); the first stage holds the embeddings
 *    (wte, wpe), the last the final layernorm and the loss, which uses the tied wte:
 *    with pp > 1 the first and last stage each hold a copy of (their tp slice of)
 *    wte, kept identical by summing its gradient over the embedding group.
 * The local parameters are laid out as the full model's: kinds in llm.c order, the
 * local layers of a kind together, absent kinds empty. */
typedef struct wf_gpt_shard {
  int tp, tp_rank; /* 1, 0 without tensor parallelism */
  bool sequence;   /* sequence parallelism over the tp group */
  int l0, l1;      /* this stage's layers (its first chunk's, with chunks) */
  int chunks;      /* v model chunks (interleaved schedule; 0 or 1 = one): chunk c
                    * holds layers [l0 + c*chunk_stride, l1 + c*chunk_stride) */
  int chunk_stride;
  bool first, last; /* holds the embeddings / the final layernorm, head and loss */
} wf_gpt_shard;

/* The whole model: tp 1, layers [0, L), first and last. */
wf_gpt_shard wf_gpt_shard_whole(const wf_gpt_dims *d);
/* NULL when the shard fits the dims, else what is wrong. */
const char *wf_gpt_shard_check(const wf_gpt_dims *d, const wf_gpt_shard *s);
/* Elements of shard s's flat parameter vector (wf_gpt_local_params of its model); its
 * layers over all chunks, one layer's elements of kind k, kind k's elements and offset
 * in it, and whether its gradient is a tp-partial sum (wf_gpt_local_layers,
 * _layer_numel, _numel, _offset and wf_gpt_kind_tp_partial of its model, without one). */
size_t wf_gpt_shard_params(const wf_gpt_dims *d, const wf_gpt_shard *s);
int wf_gpt_shard_layers(const wf_gpt_shard *s);
size_t wf_gpt_shard_layer_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k);
size_t wf_gpt_shard_numel(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k);
size_t wf_gpt_shard_offset(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k);
bool wf_gpt_shard_kind_tp_partial(const wf_gpt_shard *s, wf_param_kind k);

/* The local <-> full mapping of a shard, as runs: elements [local, local + n) of the
 * shard's flat parameter vector are elements [full, full + n) of the whole model's
 * (llm.c layout). Runs are maximal within one tensor (kind, layer) and come in local
 * order; together they cover the local vector exactly once. counted is
 * wf_gpt_kind_counted: over all shards of a mesh, the counted runs cover the full
 * layout exactly once (tp-replicated kinds count on tp rank 0, the tied wte on the
 * first stage). It is a pure function of (dims, shard), so a checkpoint loader can
 * map a saved shard without its model; wf_gpt_export_full and wf_gpt_import_full are
 * built on it. */
typedef struct wf_gpt_run {
  wf_param_kind kind;
  int layer; /* global layer; 0 for wte, wpe, lnfw, lnfb */
  bool counted;
  size_t full, local, n;
} wf_gpt_run;
typedef void (*wf_gpt_run_fn)(void *user, const wf_gpt_run *run);
void wf_gpt_shard_runs(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_gpt_run_fn fn, void *user);
/* Elements [lo, hi) of shard s's flat vector, held in local[0 .. hi - lo), against the
 * whole model's vector `full` (llm.c layout), through the runs above: to_full adds the
 * counted ones into full (every shard's adds into zeros assemble the model exactly);
 * else every one of them is copied out of full. A saved shard needs no model for it. */
void wf_gpt_shard_exchange(const wf_gpt_dims *d, const wf_gpt_shard *s, float *local, size_t lo,
                           size_t hi, float *full, bool to_full);

typedef struct wf_gpt_opts {
  wf_gpt_dims dims;
  wf_gpt_shard shard;
  struct wf_dev *dev;      /* where the model lives and computes (borrowed); NULL = the CPU */
  struct wf_comm *tp_comm; /* the tp group when shard.tp > 1 (borrowed) */
  int B, T;                /* largest micro-batch */
  int slots;               /* micro-batches whose activations live at once (>= 1) */
  bool recompute;          /* activation checkpointing: a slot keeps each layer's output only, and
                            * backward recomputes the layer's intermediates (one more forward) */
  wf_precision precision;  /* GEMM operands in bf16/fp16 (see "Mixed precision" below) */
} wf_gpt_opts;

/* What a model of options o allocates, in bytes: wf_gpt_create_shard allocates exactly
 * these, so an estimate made from them (worker --estimate) is the trainer's own
 * arithmetic. k: the kernels whose attention sizes apply (what the device keeps per
 * layer and its backward scratch); NULL = o->dev's (or the CPU's). A pure function. */
typedef struct wf_gpt_mem {
  size_t params, grads; /* fp32 masters and their gradients */
  size_t wlow;          /* mixed precision's rounded GEMM weights (0 at precision no) */
  size_t slot;          /* one activation slot: one micro-batch of one model chunk */
  size_t slots;         /* slot x o->slots */
  size_t recompute;     /* activation checkpointing's shared layer of intermediates */
  size_t scratch;       /* backward's scratch, shared by the slots */
  size_t io;            /* floats of the stage's input or output, (rows, C) */
  size_t total;         /* all of the above that is allocated (not io) */
} wf_gpt_mem;
struct wf_ktable;
wf_gpt_mem wf_gpt_mem_plan(const wf_gpt_opts *o, const struct wf_ktable *k);

/* Allocate parameters, gradients and activations for micro-batches of at most B x T
 * tokens, on the CPU. Parameters are zero until initialised or loaded. The optimizer's
 * state is not the model's (worker/optim owns it). */
wf_status wf_gpt_create(wf_gpt **out, const wf_gpt_dims *d, int B, int T);
/* The same for one shard on a device, with `slots` activation slots (pipeline
 * micro-batches in flight). */
wf_status wf_gpt_create_shard(wf_gpt **out, const wf_gpt_opts *o);
void wf_gpt_destroy(wf_gpt *m); /* accepts NULL */

const wf_gpt_dims *wf_gpt_get_dims(const wf_gpt *m); /* the whole model's dims */
const wf_gpt_shard *wf_gpt_get_shard(const wf_gpt *m);
struct wf_dev *wf_gpt_dev(const wf_gpt *m);
/* This rank's parameters: count, and each kind's local offset and size. */
size_t wf_gpt_local_params(const wf_gpt *m);
int wf_gpt_local_layers(const wf_gpt *m); /* layers on this rank, all chunks */
size_t wf_gpt_local_offset(const wf_gpt *m, wf_param_kind k);
size_t wf_gpt_local_numel(const wf_gpt *m, wf_param_kind k);
size_t wf_gpt_local_layer_numel(const wf_gpt *m, wf_param_kind k);
/* Whether this rank counts kind k in global sums over the model (the gradient norm):
 * tp-replicated kinds only on tp rank 0, the tied wte only on the first stage. */
bool wf_gpt_kind_counted(const wf_gpt *m, wf_param_kind k);
/* Whether kind k's gradient is a partial sum over the tp group (layernorms under
 * sequence parallelism: each rank saw its own token rows). */
bool wf_gpt_kind_tp_partial(const wf_gpt *m, wf_param_kind k);
/* The parameters and the gradients: one allocation each, in device memory, llm.c
 * layout. Host code reads or writes them through wf_dev_map (or the full-model
 * exchange below), never directly. */
float *wf_gpt_params(wf_gpt *m);
float *wf_gpt_grads(wf_gpt *m);
/* Pointer to parameter (or gradient, grads != 0) tensor `k` of layer `layer` (a
 * global layer index in [l0, l1); ignored for WTE, WPE, LNFW, LNFB). */
float *wf_gpt_param(wf_gpt *m, wf_param_kind k, int layer, int grads);
/* ZeRO-2's gradient windows. Backward writes the gradient of kind k, local layer j
 * (0 for the unlayered kinds) at p from now on (NULL: back in the flat buffer). Once
 * wf_gpt_drop_grads has freed the flat buffer, every tensor backward writes must have
 * been placed so; wf_gpt_zero_grad then does nothing (the windows' owner zeroes them)
 * and the whole-model gradient exports fail. */
void wf_gpt_set_grad_tensor(wf_gpt *m, wf_param_kind k, int j, float *p);
void wf_gpt_drop_grads(wf_gpt *m);
/* ZeRO-3's parameter windows, as the gradients': forward and backward read kind k of
 * local layer j at p (NULL: the flat buffer); wf_gpt_drop_params frees the flat buffer
 * (after which wf_gpt_params is NULL, wf_gpt_params_changed does nothing and the
 * whole-model exports fail) and wf_gpt_restore_params allocates it again (contents
 * undefined; the caller fills it, clears the windows and calls wf_gpt_params_changed).
 * Under mixed precision the flat rounded copy goes and comes with it, and `low` (room
 * for the tensor) receives the window's GEMM weights rounded, which the GEMMs then read
 * (NULL: no rounded copy, e.g. for a kind that is no GEMM weight). */
void wf_gpt_set_param_tensor(wf_gpt *m, wf_param_kind k, int j, float *p, float *low);
void wf_gpt_drop_params(wf_gpt *m);
wf_status wf_gpt_restore_params(wf_gpt *m);
/* Told before local layer j's forward (backward = false) and before its backward (and
 * its recomputation), so ZeRO-3 can gather that layer's parameters. */
typedef void (*wf_gpt_unit_hook)(void *user, int j, bool backward);
void wf_gpt_set_unit_hook(wf_gpt *m, wf_gpt_unit_hook fn, void *user); /* fn NULL = off */
/* The gradient of kind k's first local layer (for a kind placed contiguously: all of it). */
float *wf_gpt_grad_kind(wf_gpt *m, wf_param_kind k);
/* Bytes of the flat gradient buffer (0 once dropped). */
size_t wf_gpt_grad_bytes(const wf_gpt *m);
/* Bytes of the parameters and (mixed precision) their rounded GEMM copy. */
size_t wf_gpt_param_bytes(const wf_gpt *m);

/* Full-layout exchange with the host (buffers of wf_gpt_num_params(dims) floats, llm.c
 * layout), staged through the device. export ADDS the elements this rank owns
 * (wf_gpt_kind_counted) into `full`, so summing every model-parallel rank's export
 * gives the whole model; import copies this rank's slices out of a whole model.
 * which: 0 parameters, 1 gradients. */
wf_status wf_gpt_export_full(wf_gpt *m, int which, float *full);
wf_status wf_gpt_import_full(wf_gpt *m, int which, const float *full);
/* The whole model's parameters (which 0) or gradients (1) in `full` on every rank of
 * `world`: the ranks with `contribute` add their counted slices into zeros and a sum
 * over the world assembles the model (one model-parallel replica contributes; world
 * NULL: this rank alone). `full` is the only whole-model allocation it needs. */
wf_status wf_gpt_gather_full(wf_gpt *m, int which, float *full, struct wf_comm *world,
                             bool contribute);

/* GPT-2 initialisation of every parameter (see above), written through the device. */
wf_status wf_gpt_init(wf_gpt *m, uint64_t seed);
/* Elements [first, first + n) of the initial value of tensor (k, layer), as laid out
 * in the full tensor; equal to the same range of wf_gpt_init's result. */
void wf_gpt_init_slice(float *dst, wf_param_kind k, int layer, const wf_gpt_dims *d, uint64_t seed,
                       size_t first, size_t n);

/* Forward one micro-batch on one rank holding the whole model. inputs, targets (B, T)
 * int32 token ids in host memory; *loss (may be NULL) gets the mean cross-entropy loss
 * over the B*T positions when targets != NULL (else 0). */
wf_status wf_gpt_forward(wf_gpt *m, const int *inputs, const int *targets, int B, int T,
                         float *loss);
/* Logits of the last forward (B, T, Vp), device memory; valid until the next
 * forward/backward. */
const float *wf_gpt_logits(const wf_gpt *m);

/* Zero the gradients (on the model's default stream). */
wf_status wf_gpt_zero_grad(wf_gpt *m);
/* Backward of the last forward, ADDING into the gradients. The loss gradient of
 * each position is dloss_scale / (B*T): pass 1 for one micro-batch, 1/M when
 * accumulating M micro-batches. */
wf_status wf_gpt_backward(wf_gpt *m, float dloss_scale);

/* Pipeline stages. A stage runs micro-batches in activation slots 0 .. slots-1. Its
 * input and output are (rows, C) activations in device memory, rows = B*T, or B*T/tp
 * under sequence parallelism. chunk_forward runs model chunk `chunk` (the embeddings
 * are chunk 0's on the first stage, the head chunk v-1's on the last; 0 without
 * interleaving): inputs (B,T) (host) are needed by the first chunk, x (the previous
 * stage's output, device) by the others, targets (host) by the last (NULL: no loss).
 * The last chunk's mean loss over the micro-batch is added to the model's loss sum
 * (wf_gpt_take_loss). Backward knows the slot's chunk. */
wf_status wf_gpt_chunk_forward(wf_gpt *m, int slot, int chunk, const int *inputs, const float *x,
                               const int *targets, int B, int T);
/* The sum of the micro-batch losses of the forwards since the last call (0 on a rank
 * without the head), read back from the device; the sum starts again at 0. */
wf_status wf_gpt_take_loss(wf_gpt *m, double *sum);
const float *wf_gpt_stage_output(const wf_gpt *m, int slot);
size_t wf_gpt_stage_io_numel(const wf_gpt *m, int B, int T); /* rows * C */
/* Backward of the slot's forward, adding into the gradients; dy is the gradient of
 * this stage's output (ignored on the last stage, whose loss gradient per position is
 * dloss_scale / (B*T)). Afterwards wf_gpt_stage_dinput holds the gradient of the
 * stage's input until the next backward (not on the first stage). */
wf_status wf_gpt_stage_backward(wf_gpt *m, int slot, const float *dy, float dloss_scale);
const float *wf_gpt_stage_dinput(const wf_gpt *m);
/* Drop a slot's activations without a backward (evaluation). */
void wf_gpt_stage_release(wf_gpt *m, int slot);
/* Bytes of one slot's activations, and the most slots that held a forward's
 * activations at once since the last call (then reset). */
size_t wf_gpt_slot_bytes(const wf_gpt *m);
/* Activations held with `slots` slots in use, with activation checkpointing's one
 * shared layer of recomputed intermediates. */
size_t wf_gpt_act_bytes(const wf_gpt *m, int slots);
int wf_gpt_peak_slots(wf_gpt *m);
/* Sum n floats of device memory in place over the model's tp group, counted in the tp
 * time like the model's own collectives (gradients of replicated parameters that each
 * tp rank computed from its own token rows). A no-op without tp. */
wf_status wf_gpt_tp_allreduce(wf_gpt *m, float *x, size_t n);
/* Record each tp collective as a "comm" span while `trace` is on (NULL = none). */
struct wf_trace;
void wf_gpt_set_trace(wf_gpt *m, struct wf_trace *trace);
/* Seconds and bytes of tp communication since the last call (then reset). */
void wf_gpt_tp_stats(wf_gpt *m, double *seconds, double *bytes);

/* Told during backward when a group of gradients is final and will not change
 * again in this backward: group 0 = final layernorm, 1..n = this stage's layer l1-g
 * (layers finish from the last to the first), n+1 = the embeddings (wte, wpe), n =
 * l1 - l0. With pipeline stages the embeddings' group is never announced: the tied
 * wte is summed over the embedding group after the step's last backward. Data
 * parallelism starts reducing a bucket as soon as its groups are final. */
typedef void (*wf_gpt_grad_hook)(void *user, int group);
void wf_gpt_set_grad_hook(wf_gpt *m, wf_gpt_grad_hook fn, void *user); /* fn NULL = off */

/* Mixed precision (wf_gpt_opts.precision bf16 or fp16), as tensor cores compute:
 * every GEMM operand is rounded to the narrow format and the products accumulate in
 * fp32. The operands are the weights of the linear layers (qkv, attproj, fc, fcproj and
 * the tied wte in the head), used through a rounded copy the model keeps; the
 * activations entering each GEMM (layernorm outputs, attention output, GELU output,
 * the final layernorm output), rounded in place as they are made; and in backward the
 * output gradient entering each GEMM (the activation gradient, fp16's overflow risk).
 * The parameters stay the fp32 masters; gradients, the embedding lookup, layernorm,
 * attention's softmax and its two batched products, GELU, residuals and the loss stay
 * fp32. With precision no, nothing is rounded and nothing is copied.
 *
 * Whoever writes the parameters other than through this header's init, import and
 * load (which do it themselves) must call wf_gpt_params_changed() afterwards, before
 * the next forward, so the rounded copy follows: the optimizer's update, the ZeRO-1
 * all-gather of updated shards, a checkpoint restore. A no-op with precision no. */
wf_status wf_gpt_params_changed(wf_gpt *m);
wf_precision wf_gpt_precision(const wf_gpt *m);
/* Loss scaling (fp16): backward multiplies the loss gradient by s (default 1), so every
 * gradient comes out scaled by s; the optimizer unscales. */
void wf_gpt_set_loss_scale(wf_gpt *m, float s);

/* ---- llm.c files (llmc.c) ------------------------------------------------------------
 * GPT-2 checkpoint (train_gpt2.c, magic 20240326, version 3): an int32[256] header
 * {magic, version, maxT, V, L, NH, C, Vp, 0...} then the float32 parameters in llm.c
 * order, which is exactly the whole model's flat layout. Version 5 (train_gpt2.cu) is the
 * same with bf16 parameters; readers take either, widening bf16 exactly. One codec for the header
 * serves every reader and writer of it (these functions, checkpoints, the data loader's
 * mix-up check). Errors are logged, naming the file and what was expected. */
#define WF_LLMC_MAGIC        20240326
#define WF_LLMC_VERSION      3 /* float32 parameters: what weft writes by default */
#define WF_LLMC_VERSION_BF16 5 /* bf16 parameters (llm.c's GPU trainer) */
#define WF_LLMC_STATE_MAGIC  20240327
#define WF_LLMC_HEADER_INTS  256
#define WF_LLMC_HEADER_BYTES (WF_LLMC_HEADER_INTS * 4)
/* The header of a checkpoint of dims d. */
void wf_llmc_header_encode(int32_t h[WF_LLMC_HEADER_INTS], const wf_gpt_dims *d);
/* The dims of header h; WF_EFORMAT (logged, naming `path`) when h is not a valid
 * version-3 or version-5 GPT-2 checkpoint header. */
wf_status wf_llmc_header_decode(const int32_t h[WF_LLMC_HEADER_INTS], const char *path,
                                wf_gpt_dims *d);
/* Whether `path` starts with a valid checkpoint header, and its dims: a quiet probe that
 * logs nothing (for descriptions; wf_llmc_peek is the check). */
bool wf_llmc_dims(const char *path, wf_gpt_dims *d);
/* Just the dims of a checkpoint file (to size a model from it); checks its length. */
wf_status wf_llmc_peek(const char *path, wf_gpt_dims *d);
/* The parameters of a checkpoint into full (wf_gpt_num_params(d) floats); refuses a
 * file of other dims, naming the field that differs. */
wf_status wf_llmc_read(const char *path, const wf_gpt_dims *d, float *full);
/* Write a checkpoint atomically (runtime/wf_file.h): version 3; or version 3 or 5, the
 * latter with every parameter rounded to the nearest bf16 (ties to even). */
wf_status wf_llmc_write(const char *path, const wf_gpt_dims *d, const float *full);
wf_status wf_llmc_write_version(const char *path, const wf_gpt_dims *d, const float *full,
                                int version);
/* A whole model on one rank from / to a checkpoint (staged through the device). */
wf_status wf_gpt_load_llmc(wf_gpt *m, const char *path);
wf_status wf_gpt_save_llmc(wf_gpt *m, const char *path);

/* llm.c debug state (magic 20240327, version 2) for one batch: inputs, targets, logits
 * (B,T,V unpadded), loss, and gradients in checkpoint layout. dump_state runs a forward
 * and backward of a whole model on a fresh gradient buffer: the model's gradients are
 * zeroed first and hold this batch's gradients afterwards. */
wf_status wf_gpt_dump_state(wf_gpt *m, const char *path, const int *inputs, const int *targets,
                            int B, int T);
/* The same file from whole-model host arrays: logits (B*T, Vp), gradients in
 * checkpoint layout (a model-parallel run assembles them first). */
wf_status wf_llmc_write_state(const char *path, const wf_gpt_dims *d, int B, int T,
                              const int *inputs, const int *targets, const float *logits,
                              float loss, const float *grads);

/* Hugging Face safetensors (GPT2LMHeadModel names: transformer.wte.weight, ...,
 * transformer.h.N.attn.c_attn.weight, ...; Conv1D weights stored (in, out), the transpose
 * of llm.c's (out, in); lm_head.weight tied, so absent) to and from the whole model's
 * flat float32 array `full` (wf_gpt_num_params(d) floats, llm.c layout; the padded
 * vocabulary rows [V, Vp) of wte are zero and not in the file). Pure functions over host
 * memory; errors name the file and the tensor.
 *  - read: every tensor must be there with the shape d implies (F32, BF16 or F16);
 *    lm_head.weight, if present, must equal wte; attn.bias / attn.masked_bias buffers
 *    are skipped; any other tensor is refused.
 *  - peek: the dims of a file: V, C from wte, maxT from wpe, L from the h.N names, NH
 *    from the file's __metadata__ n_head, else config.json beside it, else C / 64.
 *  - write: F32, atomically, with __metadata__ {format: pt, n_layer, n_head, ...}. */
wf_status wf_safetensors_read(const char *path, const wf_gpt_dims *d, float *full, char *err,
                              size_t len);
wf_status wf_safetensors_peek(const char *path, wf_gpt_dims *d, char *err, size_t len);
wf_status wf_safetensors_write(const char *path, const wf_gpt_dims *d, const float *full, char *err,
                               size_t len);

/* FLOPs of one training step (forward + backward) on B*T tokens:
 * 6 * num_params * B*T  +  12 * L * B * T*T * C
 * (attention: Q.K^T and att.V are 2 * B*NH*T*T*hs multiply-adds per layer forward,
 * counted over the full T x T square, backward twice the forward). */
double wf_gpt_flops_per_step(const wf_gpt_dims *d, int B, int T);

#endif /* WF_MODEL_H */
