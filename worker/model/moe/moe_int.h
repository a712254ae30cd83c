/*
 * moe_int.h - private to the mixture-of-experts families (moe.c: the three families'
 * descriptions; block.c: attention and the block; experts.c: the router and the experts):
 * the tensors' indices, what a family's variant changes, and the layer's memory.
 *
 * The three families (OLMoE, Qwen3-MoE, Mixtral, named as Hugging Face's model_type) are
 * one architecture: Llama's attention and norms, with a sparse MLP of E SwiGLU experts
 * behind a softmax router; they differ in the queries' and keys' RMSNorm (none, over the
 * whole projection, per head), whether the top-k weights are renormalised, their default
 * sizes and their Hugging Face names. A family's wf_family.data is its moe_variant.
 */
#ifndef WF_MOE_INT_H
#define WF_MOE_INT_H

#include "model_int.h"

/* The tensors in layout order, as the description of a model with q/k norms and an
 * untied head has them; the expert tensors come last, so a shard's flat vector is its
 * dense part then its experts'. A family without q/k norms, or a tied model, leaves
 * tensors out: moe_tensor() maps these to the description's indices. */
enum {
  MO_EMB = 0, /* (Vp, C) embed_tokens */
  MO_LN1,     /* (L, C) input_layernorm */
  MO_QKV,     /* (L, NH hs + 2 KV hs, C) [q | k | v] */
  MO_O,       /* (L, C, NH hs) o_proj */
  MO_LN2,     /* (L, C) post_attention_layernorm */
  MO_ROUTER,  /* (L, E, C) the router (gate) */
  MO_QN,      /* (L, NH hs) or (L, hs): q_norm */
  MO_KN,      /* (L, KV hs) or (L, hs): k_norm */
  MO_NORM,    /* (C) the final norm */
  MO_HEAD,    /* (Vp, C) lm_head: absent when tied */
  MO_GU,      /* (L, E x 2F, C) each expert's [gate | up] */
  MO_DOWN,    /* (L, E x C, F) each expert's down */
  MO_N
};

/* How a family normalises its queries and keys before RoPE. */
typedef enum moe_qk {
  MOE_QK_NONE = 0, /* Mixtral */
  MOE_QK_WHOLE,    /* OLMoE: q_norm over the NH hs projection, k_norm over KV hs */
  MOE_QK_HEAD,     /* Qwen3-MoE: one weight of hs for every head */
} moe_qk;

typedef struct moe_variant {
  moe_qk qk;
  int E, K;                      /* default experts and top-k (Hugging Face's config defaults) */
  wf_switch norm_topk;           /* default norm_topk_prob */
  bool renorm_fixed;             /* the model always renormalises (Mixtral has no switch) */
  double aux;                    /* default router_aux_loss_coef */
  float eps;                     /* default rms_norm_eps */
  double theta;                  /* default rope_theta */
  const wf_tensor_desc *tensors; /* MO_N of them (the q/k norms ignored without qk) */
} moe_variant;

const moe_variant *wf__moe_variant(const wf_model *m);
/* The description's index of logical tensor x (MO_*). */
int wf__moe_tensor(const wf_model *m, int x);

/* The layer's memory and its sizes (block.c), shared with experts.c. Activations (void *)
 * are stored in the model's format, the rest fp32 (or int). N tokens, R replicated rows,
 * M = N K expert rows, E experts, G q/k norm groups a row; under expert parallelism (ep
 * ranks of El = E / ep experts each) the rows this rank's experts receive, Me at most:
 * dropless, every token of every ep rank may choose them (ep N min(K, El)); under a
 * capacity, each expert takes at most its capacity from each rank (ep El cap). Without it
 * the expert side is the token side (xr, dyr, dxr unused: xp, dyp, dxp serve). */
typedef struct moe_layer {
  wf__norm n1;    /* (R,C), its rstds (R) */
  void *qkv;      /* (N, qkv_l) q and k normalised and rotated */
  void *qk_raw;   /* (N, q_l + kv_l) q and k before their norm */
  float *qk_rstd; /* (N, G) */
  void *atty;     /* (N, q_l) */
  void *att;      /* attention's core state */
  void *res2;     /* (R,C) the residual after attention */
  wf__norm n2;    /* (R,C), its rstds (R) */
  float *probs;   /* (N,E) the router's softmax */
  float *lse;     /* (N) its logsumexp */
  int *idx;       /* (N K) the chosen experts */
  float *w;       /* (N K) their routing weights */
  int *pos;       /* (N K) each pair's expert-major row, -1 dropped */
  int *counts;    /* (E) each expert's rows */
  int *rc;        /* (ep, El) expert parallelism: the rows each rank sent each local expert */
  void *xp;       /* (M, C) the expert inputs, expert-major */
  float *y;       /* (M, C) the experts' outputs (tp-partial sums), expert-major */
  void *xr;       /* (Me, C) expert parallelism: the rows this rank's experts received */
  void *gu;       /* (Me, 2F_l) each expert's [gate | up] */
  void *h;        /* (Me, F_l) silu(gate) * up */
} moe_layer;

typedef struct moe_scratch {
  void *da;       /* (max(Me 2F_l, N qkv_l)): d[gate | up], then dqkv */
  void *db;       /* (max(Me F_l, N q_l)): dh, then datty; a recomputed attention output */
  void *dyp;      /* (M, C) the experts' output gradients, expert-major */
  float *dxp;     /* (M, C) the experts' input gradients */
  void *dyr;      /* (Me, C) expert parallelism: the output gradients this rank received */
  float *dxr;     /* (Me, C) their input gradients; in forward, the experts' outputs */
  void *dlogits;  /* (N, E) */
  float *dw;      /* (N K) the routing weights' gradients */
  float *qk_sums; /* (N, G) the q/k norms' partial sums (tp-reduced) */
  float *scratch; /* (attention_scratch) */
} moe_scratch;

moe_layer wf__moe_layer_at(const wf_model *m, wf__layer_mem mem);
moe_scratch wf__moe_scratch_at(wf_model *m);
size_t wf__moe_hs(const wf__geo *z);
size_t wf__moe_q_local(const wf__geo *z);
size_t wf__moe_qkv_local(const wf__geo *z);
size_t wf__moe_f_local(const wf__geo *z);
size_t wf__moe_rows(const wf__geo *z);        /* M = N K */
size_t wf__moe_expert_rows(const wf__geo *z); /* Me: the most rows this rank's experts take */

/* experts.c: the sparse MLP of layer l on the MoE input xin (N, C, after entering the tp
 * region), its combined output (a tp-partial sum) into out (N, C) fp32, the layer's
 * statistics into keep; and its backward from dy (N, C), the input's gradient (with the
 * router's) WRITTEN into dx (N, C) fp32, n2 (rows(N), C) the MoE input before it entered
 * the tp region (gathered again once dy is read: dy may lie where the gather goes). */
wf_status wf__moe_mlp_forward(wf_model *m, const moe_layer *v, float *keep, const void *xin,
                              float *out, int l, int N);
wf_status wf__moe_mlp_backward(wf_model *m, const moe_layer *v, const moe_scratch *s,
                               const void *n2, const float *dy, float *dx, int l, int N);

extern const wf__family_ops wf__moe_ops;

#endif /* WF_MOE_INT_H */
