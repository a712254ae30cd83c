/*
 * moe.c - the mixture-of-experts families' descriptions: OLMoE, Qwen3-MoE and Mixtral as
 * Hugging Face's OlmoeForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM define them:
 * their tensors, splits, rules and names, their defaults, FLOPs and the kernels a block
 * runs.
 *
 * Each is Llama with a sparse MLP (moe_int.h):
 *   x += o(attention(rope(qn(q(n1))), rope(kn(k(n1))), v(n1))),        n1 = rmsnorm(x)
 *   x += sum over the top-K experts e of token's routing of w_e down_e(silu(gate_e(n2)) *
 *        up_e(n2)),   n2 = rmsnorm(x), probs = softmax(router(n2))
 * qn, kn: OLMoE's RMSNorm over the whole q (NH hs) and k (KV hs) projections, Qwen3's over
 * each head (hs), Mixtral none. Under tensor parallelism every expert is split as Llama's
 * MLP is ([gate | up] column-, down row-parallel) and the router is replicated; under
 * expert parallelism each ep rank holds E / ep whole experts. Initialisation is Hugging
 * Face's: matrices normal(0, 0.02), norm weights 1.
 */
#include <jansson.h>
#include <string.h>

#include "moe_int.h"

#define HF(n)    {{.name = n, .group = -1}}, 1
#define ROWS1(r) {r}, 1
/* A norm's weight: sp, a replicated region's (its gradient a tp-partial sum under sequence
 * parallelism: each rank saw its rows); partial, one inside the tp region that every tp rank
 * holds whole but sees a part of (per-head q/k norms: its heads). */
#define NORM(n, r, split, sp, partial, hf)                                                         \
  {                                                                                                \
    n, WF_PLACE_LAYER, ROWS1(r), WF_DIM_ONE, split, false, false, sp, WF_INIT_ONES, 0, HF(hf),     \
        false, partial                                                                             \
  }
#define MATRIX(n, place, r, c, split, hf)                                                          \
  {                                                                                                \
    n, place, ROWS1(r), c, split, true, true, false, WF_INIT_NORMAL, 0.02f, HF(hf), false, false   \
  }
/* The layer's tensors every variant has, the router and norms named by its prefix. */
#define ATTENTION(pre)                                                                             \
  MATRIX("embed", WF_PLACE_FIRST, WF_DIM_VP, WF_DIM_C, WF_SPLIT_VOCAB,                             \
         "model.embed_tokens.weight"),                                                             \
      NORM("attn_norm", WF_DIM_C, WF_SPLIT_REPLICATED, true, false,                                \
           "model.layers.%d.input_layernorm.weight"),                                              \
      {"qkvw",                                                                                     \
       WF_PLACE_LAYER,                                                                             \
       {WF_DIM_Q, WF_DIM_KV, WF_DIM_KV},                                                           \
       3,                                                                                          \
       WF_DIM_C,                                                                                   \
       WF_SPLIT_COLUMN,                                                                            \
       true,                                                                                       \
       true,                                                                                       \
       false,                                                                                      \
       WF_INIT_NORMAL,                                                                             \
       0.02f,                                                                                      \
       {{"model.layers.%d.self_attn.q_proj.weight", 0, false},                                     \
        {"model.layers.%d.self_attn.k_proj.weight", 1, false},                                     \
        {"model.layers.%d.self_attn.v_proj.weight", 2, false}},                                    \
       3,                                                                                          \
       false,                                                                                      \
       false},                                                                                     \
      MATRIX("ow", WF_PLACE_LAYER, WF_DIM_C, WF_DIM_Q, WF_SPLIT_ROW,                               \
             "model.layers.%d.self_attn.o_proj.weight"),                                           \
      NORM("mlp_norm", WF_DIM_C, WF_SPLIT_REPLICATED, true, false,                                 \
           "model.layers.%d.post_attention_layernorm.weight"),                                     \
  {                                                                                                \
    "router", WF_PLACE_LAYER, ROWS1(WF_DIM_E), WF_DIM_C, WF_SPLIT_REPLICATED, true, true, false,   \
        WF_INIT_NORMAL, 0.02f, HF(pre ".gate.weight"), false, true                                 \
  }
#define TAIL                                                                                       \
  {"norm", WF_PLACE_LAST, ROWS1(WF_DIM_C), WF_DIM_ONE, WF_SPLIT_REPLICATED,     false,             \
   false,  true,          WF_INIT_ONES,    0,          HF("model.norm.weight"), false,             \
   false},                                                                                         \
      MATRIX("head", WF_PLACE_LAST, WF_DIM_VP, WF_DIM_C, WF_SPLIT_VOCAB, "lm_head.weight")
#define EXPERTS(gate, up, down)                                                                    \
  {"expert_gate_upw",                                                                              \
   WF_PLACE_LAYER,                                                                                 \
   {WF_DIM_F, WF_DIM_F},                                                                           \
   2,                                                                                              \
   WF_DIM_C,                                                                                       \
   WF_SPLIT_COLUMN,                                                                                \
   true,                                                                                           \
   true,                                                                                           \
   false,                                                                                          \
   WF_INIT_NORMAL,                                                                                 \
   0.02f,                                                                                          \
   {{gate, 0, false}, {up, 1, false}},                                                             \
   2,                                                                                              \
   true,                                                                                           \
   false},                                                                                         \
  {                                                                                                \
    "expert_downw", WF_PLACE_LAYER, ROWS1(WF_DIM_C), WF_DIM_F, WF_SPLIT_ROW, true, true, false,    \
        WF_INIT_NORMAL, 0.02f, HF(down), true, false                                               \
  }

/* OLMoE's norms span the whole projection: split with it over tp (each rank its heads'
 * weights; their statistics are summed over tp, block.c). Qwen3's are one head's, on
 * every tp rank, each rank computing its heads' share of their gradient. */
static const wf_tensor_desc olmoe_tensors[MO_N] = {
    ATTENTION("model.layers.%d.mlp"),
    NORM("q_norm", WF_DIM_Q, WF_SPLIT_COLUMN, false, false,
         "model.layers.%d.self_attn.q_norm.weight"),
    NORM("k_norm", WF_DIM_KV, WF_SPLIT_COLUMN, false, false,
         "model.layers.%d.self_attn.k_norm.weight"),
    TAIL,
    EXPERTS("model.layers.%d.mlp.experts.%d.gate_proj.weight",
            "model.layers.%d.mlp.experts.%d.up_proj.weight",
            "model.layers.%d.mlp.experts.%d.down_proj.weight"),
};

static const wf_tensor_desc qwen3_tensors[MO_N] = {
    ATTENTION("model.layers.%d.mlp"),
    NORM("q_norm", WF_DIM_HD, WF_SPLIT_REPLICATED, false, true,
         "model.layers.%d.self_attn.q_norm.weight"),
    NORM("k_norm", WF_DIM_HD, WF_SPLIT_REPLICATED, false, true,
         "model.layers.%d.self_attn.k_norm.weight"),
    TAIL,
    EXPERTS("model.layers.%d.mlp.experts.%d.gate_proj.weight",
            "model.layers.%d.mlp.experts.%d.up_proj.weight",
            "model.layers.%d.mlp.experts.%d.down_proj.weight"),
};

/* Mixtral's experts are w1 (gate), w3 (up) and w2 (down) in block_sparse_moe. */
static const wf_tensor_desc mixtral_tensors[MO_N] = {
    ATTENTION("model.layers.%d.block_sparse_moe"),
    {0},
    {0},
    TAIL,
    EXPERTS("model.layers.%d.block_sparse_moe.experts.%d.w1.weight",
            "model.layers.%d.block_sparse_moe.experts.%d.w3.weight",
            "model.layers.%d.block_sparse_moe.experts.%d.w2.weight"),
};

/* Hugging Face's config defaults (OlmoeConfig, Qwen3MoeConfig, MixtralConfig). */
static const moe_variant olmoe = {MOE_QK_WHOLE, 64,    8,       WF_SWITCH_OFF, false,
                                  0.01,         1e-5f, 10000.0, olmoe_tensors};
static const moe_variant qwen3 = {MOE_QK_HEAD, 128,   8,       WF_SWITCH_OFF, false,
                                  0.001,       1e-6f, 10000.0, qwen3_tensors};
static const moe_variant mixtral = {MOE_QK_NONE, 8,     2,         WF_SWITCH_ON,   true,
                                    0.001,       1e-5f, 1000000.0, mixtral_tensors};

static const moe_variant *variant_of(const wf_model_dims *d) { return d->fam->data; }

const moe_variant *wf__moe_variant(const wf_model *m) { return variant_of(&m->d); }

/* Logical index x less the tensors this model leaves out before it. */
static int tensor_index(const wf_model_dims *d, int x)
{
  bool qk = variant_of(d)->qk != MOE_QK_NONE, tied = d->tie == WF_TIE_YES;
  return x - (!qk && x > MO_KN ? 2 : 0) - (tied && x > MO_HEAD ? 1 : 0);
}

int wf__moe_tensor(const wf_model *m, int x) { return tensor_index(&m->d, x); }

static void describe(const wf_model_dims *d, wf_model_desc *out)
{
  const moe_variant *v = variant_of(d);
  bool tied = d->tie == WF_TIE_YES;
  out->n = 0;
  for (int x = 0; x < MO_N; x++) {
    if ((v->qk == MOE_QK_NONE && (x == MO_QN || x == MO_KN)) || (tied && x == MO_HEAD))
      continue;
    out->t[out->n++] = v->tensors[x];
  }
  if (tied) { /* the embedding is the head's weight too, on both end stages */
    out->t[MO_EMB].place = WF_PLACE_TIED;
    out->t[MO_EMB].gemm = true;
  }
}

static void resolve(wf_model_dims *d)
{
  const moe_variant *v = variant_of(d);
  if (d->tie == WF_TIE_AUTO)
    d->tie = WF_TIE_NO;
  if (d->rope_theta <= 0)
    d->rope_theta = v->theta;
  if (d->norm_eps <= 0)
    d->norm_eps = v->eps;
  d->rope_scaling = wf_rope_scaling_resolve(&d->rope_scaling);
  if (d->E <= 0)
    d->E = v->E;
  if (d->K <= 0)
    d->K = WF_MIN(v->K, d->E);
  if (d->norm_topk == WF_SWITCH_AUTO)
    d->norm_topk = v->norm_topk;
  if (d->aux_coef < 0)
    d->aux_coef = v->aux;
}

static const char *check(const wf_model_dims *d)
{
  const moe_variant *v = variant_of(d);
  if (d->HD % 2)
    return "RoPE needs an even head size";
  if (d->K < 1 || d->K > d->E)
    return "experts_per_token (num_experts_per_tok) must lie between 1 and the experts: each token "
           "is routed to that many distinct experts";
  if (v->renorm_fixed && d->norm_topk != WF_SWITCH_ON)
    return "this family always renormalises its top-k weights (norm_topk_prob must be true)";
  if (!(d->aux_coef >= 0) || !(d->z_coef >= 0) || !(d->capacity >= 0))
    return "the router's coefficients and the capacity factor must not be negative";
  return wf_rope_scaling_check(&d->rope_scaling);
}

/* A config's expert keys: each token picks experts_per_token distinct experts, so no more
 * than there are; ep ranks hold equal shares of the experts. The family's own defaults
 * (model.experts and model.experts_per_token 0) are checked with the model (check). */
static wf_status check_keys(const wf_config *c, char *err, size_t len)
{
  int E = c->model.experts, K = c->model.experts_per_token, ep = c->mesh.ep;
  if (E > 0 && K > E)
    return wf__keys_fail(err, len,
                         "model.experts_per_token=%d is more than model.experts=%d: each token "
                         "is routed to that many distinct experts; choose experts_per_token <= %d",
                         K, E, E);
  if (E > 0 && E % ep != 0)
    return wf__keys_fail(err, len,
                         "mesh.ep=%d does not divide model.experts=%d; every expert-parallel rank "
                         "holds an equal share of the experts, so choose an ep that divides %d",
                         ep, E, E);
  if (c->model.head_dim % 2)
    return wf__keys_fail(err, len, "model.head_dim=%d: RoPE needs an even head size",
                         c->model.head_dim);
  /* The load-balancing loss is a product of two means over a micro-batch's tokens, which
   * context parallelism would split over its ranks (each would see part of the batch). */
  if (c->mesh.cp > 1)
    return wf__keys_fail(err, len,
                         "mesh.cp=%d with model.family=%s: the routers' load-balancing statistics "
                         "are not yet summed over the context-parallel ranks; set mesh.cp=1 "
                         "(expert, tensor, pipeline and data parallelism all apply)",
                         c->mesh.cp, c->model.family);
  return WF_OK;
}

/* Per token and layer, the GEMM weights a token meets: attention's C (q + 2 kv) + q C, the
 * router's E C and K experts' 3 F C. */
static double layer_weights(const wf_model_dims *d)
{
  double C = d->C, q = wf_dim_size(d, WF_DIM_Q), kv = wf_dim_size(d, WF_DIM_KV);
  return C * (q + 2 * kv) + q * C + (double)d->E * C + (double)d->K * 3.0 * d->F * C;
}

static double layer_flops(const wf_model_dims *d, int T)
{
  return 2.0 * layer_weights(d) + 4.0 * T * (double)wf_dim_size(d, WF_DIM_Q);
}

/* The active parameters' 6 x tokens (every dense tensor, and K of the E experts' weights a
 * token uses) plus attention's 12 L B T^2 (NH hs). */
static double step_flops(const wf_model_dims *d, int B, int T)
{
  double tokens = (double)B * T, all = (double)wf_model_num_params(d);
  double experts = 3.0 * d->E * (double)d->F * d->C * d->L;
  double active = all - experts + experts * d->K / d->E;
  return 6.0 * active * tokens + 12.0 * d->L * tokens * T * (double)wf_dim_size(d, WF_DIM_Q);
}

/* One block's forward: Llama's attention (block.c), the router (N, E, C), the experts' two
 * GEMMs over the N K rows, SwiGLU on them, the moves into expert order and back (a few
 * N K C elements each way) at memory bandwidth, two tp all-reduces. Kernel launches: the
 * attention's, the router's 5 (GEMM, softmax/top-k, dispatch, permute, combine) and 3
 * per expert. */
static void costs(const wf_model_dims *d, const wf_cost_geo *g, wf_model_costs *out)
{
  double N = g->N, C = d->C, tp = g->tp, T = g->T, R = g->R, F = d->F, M = N * d->K;
  double q = (double)wf_dim_size(d, WF_DIM_Q), kv = (double)wf_dim_size(d, WF_DIM_KV);
  double NHl = (double)d->NH / tp, hs = (double)wf_dim_size(d, WF_DIM_HD);
  double soft = g->keeps_probs ? 3 * g->B * NHl * T * T : 0;
  double moves = 3 * M * C + N * d->E;
  wf_cost c[] = {
      {WF_COST_GEMM, N, (q + 2 * kv) / tp, C},
      {WF_COST_GEMM, N, C, q / tp},
      {WF_COST_GEMM, N, d->E, C},
      {WF_COST_GEMM, M, 2 * F / tp, C},
      {WF_COST_GEMM, M, C, F / tp},
      {WF_COST_ATTENTION, g->B * NHl, T, hs},
      {WF_COST_NORM, 2 * R * C, 0, 0},
      {WF_COST_ACT, M * F / tp, 0, 0},
      {WF_COST_BYTES, 4 * (6 * R * C + soft + 2 * N * (q + kv) / tp + moves), 0, 0},
      {WF_COST_TP, N * C * 4, 0, 0},
      {WF_COST_TP, N * C * 4, 0, 0},
  };
  for (size_t i = 0; i < WF_ARRAY_LEN(c); i++)
    out->block[out->n_block++] = c[i];
  out->block_fwd_ops = 15 + 3 * d->E;
  out->block_bwd_ops = 28 + 3 * d->E;
  out->head_ops = 7;
}

/* Qwen3-MoE layers are all sparse only with decoder_sparse_step 1 and no mlp_only_layers;
 * a sliding window is not modelled by any of the three. */
static const char *refuse(json_t *cfg, char *buf, size_t len)
{
  json_t *step = json_object_get(cfg, "decoder_sparse_step");
  json_t *dense = json_object_get(cfg, "mlp_only_layers");
  json_t *win = json_object_get(cfg, "use_sliding_window");
  json_t *sw = json_object_get(cfg, "sliding_window");
  if (step && !(json_is_integer(step) && json_integer_value(step) == 1))
    snprintf(buf, len,
             "decoder_sparse_step is not 1: some layers would be dense MLPs, which "
             "weft's MoE families do not mix in");
  else if (json_array_size(dense) > 0)
    snprintf(buf, len,
             "mlp_only_layers is not empty: those layers would be dense MLPs, which "
             "weft's MoE families do not mix in");
  else if (json_is_true(win) || (!win && json_is_integer(sw)))
    snprintf(buf, len,
             "a sliding attention window is set (sliding_window, use_sliding_window): "
             "weft attends over the whole context");
  else
    return NULL;
  return buf;
}

/* config.json's names of the dimensions the three share. */
#define COMMON_KEYS                                                                                \
  {"num_hidden_layers", WF_HF_L}, {"num_attention_heads", WF_HF_NH},                               \
      {"num_key_value_heads", WF_HF_KV}, {"hidden_size", WF_HF_C},                                 \
      {"max_position_embeddings", WF_HF_T}, {"vocab_size", WF_HF_V}, {"rope_theta", WF_HF_THETA},  \
      {"rms_norm_eps", WF_HF_EPS}, {"tie_word_embeddings", WF_HF_TIE},                             \
      {"rope_scaling", WF_HF_ROPE_SCALING}, {"num_experts_per_tok", WF_HF_K},                      \
  {                                                                                                \
    "router_aux_loss_coef", WF_HF_AUX                                                              \
  }

const wf_family wf__family_olmoe = {
    .version = WF_FAMILY_VERSION,
    .name = "olmoe",
    .hf_model_type = "olmoe",
    .hf_architecture = "OlmoeForCausalLM",
    .resolve = resolve,
    .check = check,
    .check_keys = check_keys,
    .describe = describe,
    .layer_flops = layer_flops,
    .step_flops = step_flops,
    .costs = costs,
    .hf_keys = {COMMON_KEYS,
                {"intermediate_size", WF_HF_F},
                {"num_experts", WF_HF_E},
                {"norm_topk_prob", WF_HF_NORM_TOPK}},
    .n_hf_keys = 15,
    .hf_skip = {"rotary_emb.inv_freq"},
    .hf_head = "lm_head.weight",
    .hf_config = "{\"hidden_act\": \"silu\", \"attention_bias\": false, \"clip_qkv\": null, "
                 "\"initializer_range\": 0.02, \"output_router_logits\": false}",
    .hf_refuse = refuse,
    .ops = &wf__moe_ops,
    .hf_max_positions = 4096, /* transformers' OlmoeConfig(max_position_embeddings=4096) */
    .data = &olmoe,
};

const wf_family wf__family_qwen3_moe = {
    .version = WF_FAMILY_VERSION,
    .name = "qwen3_moe",
    .hf_model_type = "qwen3_moe",
    .hf_architecture = "Qwen3MoeForCausalLM",
    .own_head_dim = true,
    .resolve = resolve,
    .check = check,
    .check_keys = check_keys,
    .describe = describe,
    .layer_flops = layer_flops,
    .step_flops = step_flops,
    .costs = costs,
    /* intermediate_size is the width of dense MLP layers, which an all-sparse model has
     * none of: read first, so moe_intermediate_size (the experts') wins, and written as it */
    .hf_keys = {COMMON_KEYS,
                {"intermediate_size", WF_HF_F},
                {"moe_intermediate_size", WF_HF_F},
                {"num_experts", WF_HF_E},
                {"norm_topk_prob", WF_HF_NORM_TOPK},
                {"head_dim", WF_HF_HD}},
    .n_hf_keys = 17,
    .hf_skip = {"rotary_emb.inv_freq"},
    .hf_head = "lm_head.weight",
    .hf_config = "{\"hidden_act\": \"silu\", \"attention_bias\": false, "
                 "\"decoder_sparse_step\": 1, \"mlp_only_layers\": [], "
                 "\"use_sliding_window\": false, \"initializer_range\": 0.02, "
                 "\"output_router_logits\": false}",
    .hf_refuse = refuse,
    .ops = &wf__moe_ops,
    .hf_max_positions = 32768, /* transformers' Qwen3MoeConfig(max_position_embeddings=32768) */
    .data = &qwen3,
};

const wf_family wf__family_mixtral = {
    .version = WF_FAMILY_VERSION,
    .name = "mixtral",
    .hf_model_type = "mixtral",
    .hf_architecture = "MixtralForCausalLM",
    .resolve = resolve,
    .check = check,
    .check_keys = check_keys,
    .describe = describe,
    .layer_flops = layer_flops,
    .step_flops = step_flops,
    .costs = costs,
    .hf_keys = {COMMON_KEYS, {"intermediate_size", WF_HF_F}, {"num_local_experts", WF_HF_E}},
    .n_hf_keys = 14,
    .hf_skip = {"rotary_emb.inv_freq"},
    .hf_head = "lm_head.weight",
    .hf_config = "{\"hidden_act\": \"silu\", \"sliding_window\": null, "
                 "\"initializer_range\": 0.02, \"output_router_logits\": false}",
    .hf_refuse = refuse,
    .ops = &wf__moe_ops,
    .hf_max_positions = 131072, /* transformers' MixtralConfig(max_position_embeddings=4096 * 32) */
    .data = &mixtral,
};
