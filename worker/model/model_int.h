/*
 * model_int.h - private to worker/model: the model's struct, its activation slots,
 * and the tensor-parallel region operators its forward and backward are built from.
 *
 * Error idiom (the worker's): every function that can fail returns a wf_status, logs
 * what failed where it failed, and callers propagate with WF_TRY / goto fail. Kernel
 * launches report through wf_dev_check(), which the forward and backward passes call
 * before they return.
 *
 * Memory: every tensor here is memory of the model's device (wf_device.h): reached by
 * kernels and collectives only; the host reads and writes it through staged views.
 *
 * Legend: B batch, T time, C d_model, L layers, NH heads, hs = C/NH, V vocab, Vp padded
 * vocab, N = B*T rows, R = rows of the replicated regions (N, or N/tp under sequence
 * parallelism), nl = layers in a slot.
 */
#ifndef WF_MODEL_INT_H
#define WF_MODEL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "wf_check.h"
#include "wf_collectives.h"
#include "wf_device.h"
#include "wf_io.h"
#include "wf_model.h"

/* ---- tensor-parallel regions (tp.c) ---------------------------------------------
 * A transformer block alternates replicated regions (layernorm, residual) and
 * tensor-parallel regions (column-parallel -> local op -> row-parallel). Crossing into
 * a tensor-parallel region and out of it are conjugate operators (Megatron's f and g):
 *
 *   enter (f):  forward identity,    backward all-reduce       (tp)
 *   leave (g):  forward all-reduce,  backward identity         (tp)
 *
 * With sequence parallelism the replicated regions hold only N/tp token rows per
 * rank, and the pair becomes
 *
 *   enter:  forward all-gather,      backward reduce-scatter   (tp + sequence)
 *   leave:  forward reduce-scatter,  backward all-gather       (tp + sequence)
 *
 * so a block's communication reads off its code: enter before each column-parallel
 * matmul, leave after each row-parallel one. Rank r of the tp group owns token rows
 * [r*N/tp, (r+1)*N/tp) of the (B*T, C) activations in the sequence-parallel regions
 * (contiguous blocks of the flattened batch x sequence, which the collectives scatter
 * and gather without a copy; layernorm and residuals are per token, so which rows a
 * rank holds does not change the mathematics). With tp = 1 every operator is the
 * identity and communicates nothing. */
typedef struct wf_tp {
  wf_comm *comm; /* the tp group; NULL when tp = 1 */
  wf_dev *dev;   /* where the activations live (the copies of the identity cases) */
  int size, rank;
  bool sequence;          /* sequence parallelism */
  double comm_s;          /* seconds spent in tp collectives (for the step log) */
  double comm_bytes;      /* bytes this rank sent into tp collectives */
  struct wf_trace *trace; /* spans of each collective while it records; NULL = none */
} wf_tp;

/* Rows of the replicated regions on this rank: N, or N / size with sequence parallelism. */
static inline size_t wf__tp_rows(const wf_tp *tp, size_t N)
{
  return tp->sequence ? N / (size_t)tp->size : N;
}

/* enter, forward: x (rows(N), C) -> *out, the full (N, C) input of a column-parallel
 * layer: x itself without sequence parallelism, else `full` after the all-gather. */
wf_status wf__tp_enter_fwd(wf_tp *tp, const float **out, const float *x, float *full, size_t N,
                           size_t C);
/* enter, backward: dfull (N, C) holds this rank's partial input gradient; the result,
 * summed over tp, lands in dx (rows(N), C): all-reduce in place (dx == dfull allowed)
 * or reduce-scatter. */
wf_status wf__tp_enter_bwd(wf_tp *tp, float *dx, float *dfull, size_t N, size_t C);
/* leave, forward: partial (N, C) outputs of a row-parallel layer -> their sum over tp
 * in y (rows(N), C): all-reduce or reduce-scatter. y may equal partial. */
wf_status wf__tp_leave_fwd(wf_tp *tp, float *y, float *partial, size_t N, size_t C);
/* leave, backward: dy (rows(N), C) -> *out, the full (N, C) output gradient: dy itself
 * without sequence parallelism, else `full` after the all-gather. */
wf_status wf__tp_leave_bwd(wf_tp *tp, const float **out, const float *dy, float *full, size_t N,
                           size_t C);
/* Gather n floats of every tp rank into all (tp * n), rank-major. */
wf_status wf__tp_allgather(wf_tp *tp, const float *x, float *all, size_t n);

/* ---- activations ------------------------------------------------------------------ */

/* Activations of one micro-batch in one slot, for this stage's nl = l1 - l0 layers,
 * carved from one allocation sized for Bmax x Tmax. Per-layer tensors use a fixed
 * stride of the Bmax x Tmax size, and the first rows of each are live. The tensor-
 * parallel regions hold all N rows of the local heads (NHl = NH/tp) and hidden units
 * (4C/tp). */
typedef struct wf__acts {
  float *encoded;                   /* (R,C) the stage's input */
  float *ln1, *ln1_mean, *ln1_rstd; /* (nl,R,C), (nl,R), (nl,R) */
  float *qkv;                       /* (nl,N,3C/tp) */
  float *atty;                      /* (nl,N,C/tp) */
  float *att;                       /* (nl, attention_saved): (B,NHl,T,T) on the CPU */
  float *residual2;                 /* (nl,R,C) */
  float *ln2, *ln2_mean, *ln2_rstd; /* (nl,R,C), (nl,R), (nl,R) */
  float *fch, *fch_gelu;            /* (nl,N,4C/tp) */
  float *residual3;                 /* (nl,R,C) */
  float *lnf, *lnf_mean, *lnf_rstd; /* (R,C), (R), (R): last stage */
  float *logits;                    /* (N,Vp/tp): last stage; dlogits after backward */
  float *row_max, *row_sumexp;      /* (N) global over the vocabulary */
  float *target_logit, *losses;     /* (N) */
  int *inputs, *targets;            /* (N) this micro-batch's tokens */
  int B, T, chunk;
  bool live;         /* forward done, backward not */
  bool have_targets; /* computed a loss, so backward may run */
} wf__acts;

/* The sizes the carves are made of (gpt.c), from the model's options: C, tp, N = Bmax *
 * Tmax rows, R replicated rows, the device's attention sizes (floats), the local
 * vocabulary rows, and whether GEMM operands are rounded (mixed precision). */
typedef struct wf__geo {
  size_t C, tp, N, R, att_saved, att_scratch, Vl;
  bool low;
} wf__geo;

/* Scratch shared by all slots: one layer's worth, reused layer after layer. */
typedef struct wf__dacts {
  float *proj;    /* (N,C) row-parallel partial output */
  float *full;    /* (N,C) a gathered input or output gradient (sequence parallelism) */
  float *dres;    /* (R,C) gradient of the residual stream */
  float *dc;      /* (N,C) partial input gradient of a column-parallel matmul */
  float *dl;      /* (R,C) dln1, dln2, dlnf after the tp reduction */
  float *d4a;     /* (N,4C/tp) dfch_gelu, then dqkv (N,3C/tp) */
  float *d4b;     /* (N,4C/tp) dfch */
  float *scratch; /* (attention_scratch) attention backward scratch */
  float *stats;   /* (tp+1,N,3) every rank's packed xent row statistics, then this rank's */
  float *rdy;     /* (N,C) a GEMM's rounded output gradient (mixed precision; else empty) */
} wf__dacts;

/* Layer j's intermediates: in the slot, or in the shared recompute buffer. */
typedef struct wf__layer {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
      *fchg;
} wf__layer;

struct wf_gpt {
  wf_gpt_dims d;
  wf_gpt_shard s;
  wf_dev *dev;        /* borrowed */
  const wf_ktable *k; /* the device's kernels */
  wf_tp tp;
  int nl; /* layers on this rank: v chunks of lc layers */
  int nchunk, lc;
  int NHl, Vl; /* local heads, local vocabulary rows */
  int Bmax, Tmax, n_slots, in_use, peak;
  size_t num_params;                /* local */
  size_t off[WF_GPT_NUM_KINDS + 1]; /* local offset of each kind; [16] = total */
  size_t slot_floats;
  wf__geo g; /* the carves' sizes */
  float *params, *grads;
  wf_precision prec; /* GEMM operands rounded to bf16/fp16; WF_PREC_NO = fp32 */
  float *wlow;       /* mixed precision: the GEMM weights rounded (params layout), else NULL */
  float loss_scale;  /* backward's loss gradient is multiplied by it (fp16 loss scaling) */
  float *act_mem, *dact_mem, *re_mem;
  double *loss_acc; /* (1) the sum of micro-batch losses since wf_gpt_take_loss */
  int *bad_token;   /* (2) wf_tokens_check's answer */
  wf__acts *a;      /* n_slots */
  bool recompute;   /* activation checkpointing: slots keep layer outputs only */
  wf__acts re;      /* recompute: one layer's intermediates */
  wf__dacts da;
  wf_gpt_grad_hook hook; /* told when each group of gradients is final (dp overlap) */
  /* ZeRO-2: where each (kind, local layer) gradient tensor lives instead of `grads`
   * (WF_GPT_NUM_KINDS x gstride entries, NULL = in `grads`); see wf_gpt_set_grad_tensor */
  float **gptr;
  float **pptr; /* ZeRO-3: the same for the parameters (wf_gpt_set_param_tensor) */
  float **lptr; /* ZeRO-3 with mixed precision: a GEMM weight's rounded copy, else NULL */
  int gstride;
  wf_gpt_unit_hook unit_hook; /* ZeRO-3: told before each layer's forward and backward */
  void *unit_user;
  void *hook_user;
};

/* ---- shared across the model's files --------------------------------------------- */

/* layout.c: local layer i (chunk-major) <-> global layer l, and the shard geometry the
 * initialisation walks row by row. */
int wf__global_layer(const wf_gpt *m, int i);
int wf__local_layer(const wf_gpt *m, int l);
typedef struct wf__geom {
  size_t rows, cols, full_cols, col0;
} wf__geom;
wf__geom wf__tensor_geom(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k);
size_t wf__full_index(const wf_gpt_dims *d, const wf_gpt_shard *s, wf_param_kind k,
                      const wf__geom *g, size_t i);
bool wf__kind_present(const wf_gpt_shard *s, wf_param_kind k);

/* gpt.c: layer j's intermediates, the residual entering local layer j, GEMM weights
 * (rounded under mixed precision), and rounding an activation or gradient. */
wf__layer wf__layer_at(const wf_gpt *m, const wf__acts *a, int j);
float *wf__layer_input(const wf_gpt *m, const wf__acts *a, int j);
const float *wf__gemm_weight(wf_gpt *m, wf_param_kind k, int layer);
void wf__round_operand(const wf_gpt *m, float *x, size_t n);
const float *wf__rounded_grad(wf_gpt *m, const float *dy, size_t n);
/* The chunk of slot work: whether it holds the embeddings / the head. */
bool wf__chunk_first(const wf_gpt *m, int c);
bool wf__chunk_last(const wf_gpt *m, int c);
/* Real (non-padding) vocabulary columns in this rank's slice. */
int wf__local_real_vocab(const wf_gpt *m);

/* forward.c: one block forward (backward recomputes with it under checkpointing). */
wf_status wf__block_forward(wf_gpt *m, wf__acts *a, int j, int B, int T);

#endif /* WF_MODEL_INT_H */
