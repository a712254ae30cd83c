/*
 * llama.c - the Llama family's description: its tensors, their tensor-parallel splits,
 * rules and Hugging Face names (LlamaForCausalLM), its FLOPs and the kernels its block
 * runs.
 *
 * Llama (Meta's Llama 2 and 3, as Hugging Face's modeling_llama.py defines it): no
 * biases, no position table; x = embed[tok]; each block
 *   x += o(attention(rope(q(n1)), rope(k(n1)), v(n1))),   n1 = rmsnorm(x)
 *   x += down(silu(gate(n2)) * up(n2)),                    n2 = rmsnorm(x)
 * with grouped-query attention (KV key/value heads, each serving NH / KV query heads);
 * logits = rmsnorm(x) . head^T, the head its own weight unless tied (model.tie_embeddings;
 * Llama 3.2 1B ties it). q, k and v are one column-parallel GEMM ([q | k | v], each group
 * split by heads over tp), gate and up another ([gate | up], each split by hidden units).
 * Initialisation is Hugging Face's: every matrix normal(0, 0.02) (initializer_range),
 * norm weights 1.
 */
#include "llama_int.h"

#define HF(n)    {{.name = n, .group = -1}}, 1, false, false
#define ROWS1(r) {r}, 1
#define NORM(n, hf)                                                                                \
  {                                                                                                \
    n, WF_PLACE_LAYER, ROWS1(WF_DIM_C), WF_DIM_ONE, WF_SPLIT_REPLICATED, false, false, true,       \
        WF_INIT_ONES, 0, HF(hf)                                                                    \
  }

static const wf_tensor_desc tensors[LL_N] = {
    {"embed", WF_PLACE_FIRST, ROWS1(WF_DIM_VP), WF_DIM_C, WF_SPLIT_VOCAB, true, false, false,
     WF_INIT_NORMAL, 0.02f, HF("model.embed_tokens.weight")},
    NORM("attn_norm", "model.layers.%d.input_layernorm.weight"),
    {"qkvw",
     WF_PLACE_LAYER,
     {WF_DIM_Q, WF_DIM_KV, WF_DIM_KV},
     3,
     WF_DIM_C,
     WF_SPLIT_COLUMN,
     true,
     true,
     false,
     WF_INIT_NORMAL,
     0.02f,
     {{"model.layers.%d.self_attn.q_proj.weight", 0, false},
      {"model.layers.%d.self_attn.k_proj.weight", 1, false},
      {"model.layers.%d.self_attn.v_proj.weight", 2, false}},
     3,
     false,
     false},
    {"ow", WF_PLACE_LAYER, ROWS1(WF_DIM_C), WF_DIM_Q, WF_SPLIT_ROW, true, true, false,
     WF_INIT_NORMAL, 0.02f, HF("model.layers.%d.self_attn.o_proj.weight")},
    NORM("mlp_norm", "model.layers.%d.post_attention_layernorm.weight"),
    {"gate_upw",
     WF_PLACE_LAYER,
     {WF_DIM_F, WF_DIM_F},
     2,
     WF_DIM_C,
     WF_SPLIT_COLUMN,
     true,
     true,
     false,
     WF_INIT_NORMAL,
     0.02f,
     {{"model.layers.%d.mlp.gate_proj.weight", 0, false},
      {"model.layers.%d.mlp.up_proj.weight", 1, false}},
     2,
     false,
     false},
    {"downw", WF_PLACE_LAYER, ROWS1(WF_DIM_C), WF_DIM_F, WF_SPLIT_ROW, true, true, false,
     WF_INIT_NORMAL, 0.02f, HF("model.layers.%d.mlp.down_proj.weight")},
    {"norm", WF_PLACE_LAST, ROWS1(WF_DIM_C), WF_DIM_ONE, WF_SPLIT_REPLICATED, false, false, true,
     WF_INIT_ONES, 0, HF("model.norm.weight")},
    {"head", WF_PLACE_LAST, ROWS1(WF_DIM_VP), WF_DIM_C, WF_SPLIT_VOCAB, true, true, false,
     WF_INIT_NORMAL, 0.02f, HF("lm_head.weight")},
};

/* Tied: the embedding is the head's weight too (a GEMM operand, on both end stages) and
 * there is no head of its own. */
static void describe(const wf_model_dims *d, wf_model_desc *out)
{
  bool tied = d->tie == WF_TIE_YES;
  out->n = tied ? LL_N - 1 : LL_N;
  for (int i = 0; i < out->n; i++)
    out->t[i] = tensors[i];
  if (tied) {
    out->t[LL_EMB].place = WF_PLACE_TIED;
    out->t[LL_EMB].gemm = true;
  }
}

/* Llama 3's defaults: untied (8B; the 1B preset ties), theta 500000, eps 1e-5; no RoPE
 * scaling, and a llama3 scaling's unset fields Llama 3.1's. */
static void resolve(wf_model_dims *d)
{
  if (d->tie == WF_TIE_AUTO)
    d->tie = WF_TIE_NO;
  if (d->rope_theta <= 0)
    d->rope_theta = 500000.0;
  if (d->norm_eps <= 0)
    d->norm_eps = 1e-5f;
  d->rope_scaling = wf_rope_scaling_resolve(&d->rope_scaling);
}

static const char *check(const wf_model_dims *d)
{
  if ((d->C / d->NH) % 2)
    return "RoPE needs an even head size (d_model / heads)";
  return wf_rope_scaling_check(&d->rope_scaling);
}

/* One layer's GEMM weights per token: C (NH hs + 2 KV hs) + NH hs C + 3 F C. */
static double layer_weights(const wf_model_dims *d)
{
  double C = d->C, q = wf_dim_size(d, WF_DIM_Q), kv = wf_dim_size(d, WF_DIM_KV);
  return C * (q + 2 * kv) + q * C + 3.0 * d->F * C;
}

/* Forward FLOPs per token of a layer: 2 per multiply-add of its GEMMs, and 4 T q of
 * attention over the full square (Q.K^T and att.V over every query head). */
static double layer_flops(const wf_model_dims *d, int T)
{
  return 2.0 * layer_weights(d) + 4.0 * T * (double)wf_dim_size(d, WF_DIM_Q);
}

/* 6 x parameters x tokens (every parameter, as llm.c and GPT-2's count) plus attention,
 * 12 L B T^2 (NH hs) (forward 4, backward twice that); norms, RoPE, SwiGLU, residuals
 * and AdamW are not counted. */
static double step_flops(const wf_model_dims *d, int B, int T)
{
  double tokens = (double)B * T;
  double matmul = 6.0 * (double)wf_model_num_params(d) * tokens;
  double attn = 12.0 * d->L * tokens * T * (double)wf_dim_size(d, WF_DIM_Q);
  return matmul + attn;
}

/* One block's forward (block.c's ops): qkv (N,C)x(C,(q+2kv)/tp), o (N,q/tp)x(q/tp,C),
 * gate_up (N,C)x(C,2F/tp), down (N,F/tp)x(F/tp,C); attention over the local query heads;
 * two RMSNorms (2RC elements, at the measured layernorm rate) and SwiGLU (N F/tp, at the
 * GELU rate); RoPE (read and write the q and k heads), the residuals and the CPU's
 * softmax over T x T at memory bandwidth; two tp all-reduces of (N,C). Kernel launches:
 * rmsnorm, qkv, rope, attention, o, residual + rmsnorm, gate_up, swiglu, down, residual;
 * backward about twice as many; the head: rmsnorm, logits, the loss's pack and combine. */
static void costs(const wf_model_dims *d, const wf_cost_geo *g, wf_model_costs *out)
{
  double N = g->N, C = d->C, tp = g->tp, T = g->T, R = g->R, F = d->F;
  double q = (double)wf_dim_size(d, WF_DIM_Q), kv = (double)wf_dim_size(d, WF_DIM_KV);
  double NHl = (double)d->NH / tp, hs = C / d->NH;
  double soft = g->keeps_probs ? 3 * g->B * NHl * T * T : 0;
  double rope = 2 * N * (q + kv) / tp;
  wf_cost c[] = {
      {WF_COST_GEMM, N, (q + 2 * kv) / tp, C}, {WF_COST_GEMM, N, C, q / tp},
      {WF_COST_GEMM, N, 2 * F / tp, C},        {WF_COST_GEMM, N, C, F / tp},
      {WF_COST_ATTENTION, g->B * NHl, T, hs},  {WF_COST_NORM, 2 * R * C, 0, 0},
      {WF_COST_ACT, N * F / tp, 0, 0},         {WF_COST_BYTES, 4 * (6 * R * C + soft + rope), 0, 0},
      {WF_COST_TP, N * C * 4, 0, 0},           {WF_COST_TP, N * C * 4, 0, 0},
  };
  for (size_t i = 0; i < WF_ARRAY_LEN(c); i++)
    out->block[out->n_block++] = c[i];
  out->block_fwd_ops = 10;
  out->block_bwd_ops = 18;
  out->head_ops = 6;
}

const wf_family wf__family_llama = {
    .version = WF_FAMILY_VERSION,
    .name = "llama",
    .hf_model_type = "llama",
    .hf_architecture = "LlamaForCausalLM",
    .llmc = false,
    .resolve = resolve,
    .check = check,
    .check_keys = wf__family_dense_keys,
    .describe = describe,
    .layer_flops = layer_flops,
    .step_flops = step_flops,
    .costs = costs,
    .hf_keys = {{"num_hidden_layers", WF_HF_L},
                {"num_attention_heads", WF_HF_NH},
                {"num_key_value_heads", WF_HF_KV},
                {"hidden_size", WF_HF_C},
                {"intermediate_size", WF_HF_F},
                {"max_position_embeddings", WF_HF_T},
                {"vocab_size", WF_HF_V},
                {"rope_theta", WF_HF_THETA},
                {"rms_norm_eps", WF_HF_EPS},
                {"tie_word_embeddings", WF_HF_TIE},
                {"rope_scaling", WF_HF_ROPE_SCALING}},
    .n_hf_keys = 11,
    .hf_prefix = NULL,
    .hf_skip = {"rotary_emb.inv_freq"},
    .hf_head = "lm_head.weight",
    .hf_config = "{\"hidden_act\": \"silu\", \"attention_bias\": false, \"mlp_bias\": false, "
                 "\"initializer_range\": 0.02}",
    .hf_max_positions = 2048, /* transformers' LlamaConfig(max_position_embeddings=2048) */
    .ops = &wf__llama_ops,
};
