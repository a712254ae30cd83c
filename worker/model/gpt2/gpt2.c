/*
 * gpt2.c - the GPT-2 family's description: its tensors (llm.c's checkpoint order, so
 * the flat layout IS an llm.c file's body), their tensor-parallel splits, rules and
 * Hugging Face names (GPT2LMHeadModel), its FLOPs and the kernels its block runs.
 *
 * Pre-LayerNorm GPT-2 with learned positions and a tied input/output embedding:
 * x = wte[tok] + wpe[pos]; each block x += attproj(attention(qkv(ln1(x)))),
 * x += fcproj(gelu(fc(ln2(x)))); logits = lnf(x) . wte^T. Initialisation is GPT-2's:
 * normal std 0.02, the residual projections attprojw and fcprojw std 0.02/sqrt(2L),
 * layernorm weights 1, biases 0.
 */
#include "gpt2_int.h"

#define HF(n, tr) {{.name = n, .group = -1, .transpose = tr}}, 1, false, false
#define ROWS1(r)  {r}, 1
#define W2D(n, r, c, split, decay, init, std, hf, tr)                                              \
  {                                                                                                \
    n, WF_PLACE_LAYER, ROWS1(r), c, split, decay, true, false, init, std, HF(hf, tr)               \
  }
#define VEC(n, r, split, norm, init, hf)                                                           \
  {                                                                                                \
    n, WF_PLACE_LAYER, ROWS1(r), WF_DIM_ONE, split, false, false, norm, init, 0, HF(hf, false)     \
  }

/* In llm.c's order (G_* in gpt2_int.h). */
static const wf_tensor_desc tensors[G_N] = {
    {"wte", WF_PLACE_TIED, ROWS1(WF_DIM_VP), WF_DIM_C, WF_SPLIT_VOCAB, true, true, false,
     WF_INIT_NORMAL, 0.02f, HF("transformer.wte.weight", false)},
    {"wpe", WF_PLACE_FIRST, ROWS1(WF_DIM_T), WF_DIM_C, WF_SPLIT_REPLICATED, true, false, false,
     WF_INIT_NORMAL, 0.02f, HF("transformer.wpe.weight", false)},
    VEC("ln1w", WF_DIM_C, WF_SPLIT_REPLICATED, true, WF_INIT_ONES, "transformer.h.%d.ln_1.weight"),
    VEC("ln1b", WF_DIM_C, WF_SPLIT_REPLICATED, true, WF_INIT_ZEROS, "transformer.h.%d.ln_1.bias"),
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
     HF("transformer.h.%d.attn.c_attn.weight", true)},
    {"qkvb",
     WF_PLACE_LAYER,
     {WF_DIM_Q, WF_DIM_KV, WF_DIM_KV},
     3,
     WF_DIM_ONE,
     WF_SPLIT_COLUMN,
     false,
     false,
     false,
     WF_INIT_ZEROS,
     0,
     HF("transformer.h.%d.attn.c_attn.bias", false)},
    W2D("attprojw", WF_DIM_C, WF_DIM_Q, WF_SPLIT_ROW, true, WF_INIT_NORMAL_DEPTH, 0.02f,
        "transformer.h.%d.attn.c_proj.weight", true),
    VEC("attprojb", WF_DIM_C, WF_SPLIT_REPLICATED, false, WF_INIT_ZEROS,
        "transformer.h.%d.attn.c_proj.bias"),
    VEC("ln2w", WF_DIM_C, WF_SPLIT_REPLICATED, true, WF_INIT_ONES, "transformer.h.%d.ln_2.weight"),
    VEC("ln2b", WF_DIM_C, WF_SPLIT_REPLICATED, true, WF_INIT_ZEROS, "transformer.h.%d.ln_2.bias"),
    W2D("fcw", WF_DIM_F, WF_DIM_C, WF_SPLIT_COLUMN, true, WF_INIT_NORMAL, 0.02f,
        "transformer.h.%d.mlp.c_fc.weight", true),
    VEC("fcb", WF_DIM_F, WF_SPLIT_COLUMN, false, WF_INIT_ZEROS, "transformer.h.%d.mlp.c_fc.bias"),
    W2D("fcprojw", WF_DIM_C, WF_DIM_F, WF_SPLIT_ROW, true, WF_INIT_NORMAL_DEPTH, 0.02f,
        "transformer.h.%d.mlp.c_proj.weight", true),
    VEC("fcprojb", WF_DIM_C, WF_SPLIT_REPLICATED, false, WF_INIT_ZEROS,
        "transformer.h.%d.mlp.c_proj.bias"),
    {"lnfw", WF_PLACE_LAST, ROWS1(WF_DIM_C), WF_DIM_ONE, WF_SPLIT_REPLICATED, false, false, true,
     WF_INIT_ONES, 0, HF("transformer.ln_f.weight", false)},
    {"lnfb", WF_PLACE_LAST, ROWS1(WF_DIM_C), WF_DIM_ONE, WF_SPLIT_REPLICATED, false, false, true,
     WF_INIT_ZEROS, 0, HF("transformer.ln_f.bias", false)},
};

static void describe(const wf_model_dims *d, wf_model_desc *out)
{
  (void)d; /* GPT-2's tensors do not depend on its sizes */
  out->n = G_N;
  for (int i = 0; i < G_N; i++)
    out->t[i] = tensors[i];
}

static void resolve(wf_model_dims *d)
{
  if (d->tie == WF_TIE_AUTO)
    d->tie = WF_TIE_YES;
}

/* The rule broken, when one is: its reason in the dims' words, and in err (when err is
 * given) in the config's, naming the key, its value and the way out. */
static const char *broken(const wf_model_dims *d, char *err, size_t len)
{
  if (d->KV != d->NH) {
    wf__keys_fail(err, len,
                  "model.kv_heads=%d: GPT-2 has no grouped-query attention (model.family=gpt2); "
                  "leave model.kv_heads at 0, or use model.family=llama",
                  d->KV);
    return "GPT-2 has no grouped-query attention (kv heads must equal the heads)";
  }
  if (d->F != 4 * d->C) {
    wf__keys_fail(err, len,
                  "model.ffn=%d: GPT-2's MLP is 4 x d_model = %d wide (model.family=gpt2); leave "
                  "model.ffn at 0, or use model.family=llama",
                  d->F, 4 * d->C);
    return "GPT-2's MLP is 4 x d_model wide";
  }
  if (d->tie != WF_TIE_YES) {
    wf__keys_fail(err, len,
                  "model.tie_embeddings=false: GPT-2 ties its head to the embedding "
                  "(model.family=gpt2); leave it at auto, or use model.family=llama");
    return "GPT-2 ties its head to the embedding";
  }
  if (d->rope_scaling.rope_type != WF_ROPE_NONE) {
    wf__keys_fail(err, len,
                  "model.rope_scaling.rope_type=llama3: GPT-2 has no rotary embeddings "
                  "(model.family=gpt2); leave it at none, or use model.family=llama");
    return "GPT-2 has no rotary embeddings";
  }
  return NULL;
}

/* GPT-2's shape is fixed: multi-head attention, a 4 x d_model MLP, the head tied to the
 * embedding, learned positions. A file's dims and a config's keys meet the same rules. */
static const char *check(const wf_model_dims *d) { return broken(d, NULL, 0); }

static wf_status check_keys(const wf_config *c, char *err, size_t len)
{
  wf_model_dims d = wf_model_dims_from_config(c);
  return broken(&d, err, len) ? WF_ECONFIG : wf__family_dense_keys(c, err, len);
}

/* Forward FLOPs per token of a layer: 24 C^2 in the four matmuls (12 C^2 weights),
 * 4 T C in attention over the full square. Backward is twice forward. */
static double layer_flops(const wf_model_dims *d, int T)
{
  double C = d->C;
  return 24.0 * C * C + 4.0 * T * C;
}

/*
 * Matmuls: 6 * num_params * tokens (2 flops per multiply-add, forward 1x, backward 2x:
 * input and weight gradients), counting every parameter as llm.c does.
 * Attention, per layer, forward: Q.K^T is B*NH*T*T*hs multiply-adds and att.V as many,
 * so 2 * 2 * B*NH*T*T*hs = 4*B*T*T*C flops, counted over the full T x T square (the
 * usual convention, although the causal kernel skips about half); backward is 2x
 * forward. Total attention = 3 * 4 * L*B*T*T*C = 12 * L*B*T*T*C.
 * Layernorm, GELU, softmax, residuals and AdamW are not counted.
 */
static double step_flops(const wf_model_dims *d, int B, int T)
{
  double tokens = (double)B * T;
  double matmul = 6.0 * (double)wf_model_num_params(d) * tokens;
  double attn = 12.0 * d->L * tokens * T * d->C;
  return matmul + attn;
}

/* One block's forward (block.c's ops): qkv (N,C)x(C,3C/tp), attproj (N,C/tp)x(C/tp,C),
 * fc (N,C)x(C,4C/tp), fcproj (N,4C/tp)x(4C/tp,C); attention over the local heads; two
 * layernorms (2RC elements) and a GELU (N 4C/tp) at their measured rates; residuals
 * and the CPU's softmax over T x T at memory bandwidth; two tp all-reduces of (N,C).
 * Kernel launches: layernorm, qkv, attention, attproj, residual + layernorm, fc + GELU,
 * fcproj, residual; backward about twice as many; the head: layernorm, logits, the
 * loss's pack and combine. */
static void costs(const wf_model_dims *d, const wf_cost_geo *g, wf_model_costs *out)
{
  double N = g->N, C = d->C, tp = g->tp, T = g->T, R = g->R;
  double NHl = (double)d->NH / tp, hs = C / d->NH;
  double soft = g->keeps_probs ? 3 * g->B * NHl * T * T : 0;
  wf_cost c[] = {
      {WF_COST_GEMM, N, 3 * C / tp, C},       {WF_COST_GEMM, N, C, C / tp},
      {WF_COST_GEMM, N, 4 * C / tp, C},       {WF_COST_GEMM, N, C, 4 * C / tp},
      {WF_COST_ATTENTION, g->B * NHl, T, hs}, {WF_COST_NORM, 2 * R * C, 0, 0},
      {WF_COST_ACT, N * 4 * C / tp, 0, 0},    {WF_COST_BYTES, 4 * (6 * R * C + soft), 0, 0},
      {WF_COST_TP, N * C * 4, 0, 0},          {WF_COST_TP, N * C * 4, 0, 0},
  };
  for (size_t i = 0; i < WF_ARRAY_LEN(c); i++)
    out->block[out->n_block++] = c[i];
  out->block_fwd_ops = 8;
  out->block_bwd_ops = 14;
  out->head_ops = 6;
}

const wf_family wf__family_gpt2 = {
    .version = WF_FAMILY_VERSION,
    .name = "gpt2",
    .hf_model_type = "gpt2",
    .hf_architecture = "GPT2LMHeadModel",
    .llmc = true,
    .resolve = resolve,
    .check = check,
    .check_keys = check_keys,
    .describe = describe,
    .layer_flops = layer_flops,
    .step_flops = step_flops,
    .costs = costs,
    .hf_keys = {{"n_layer", WF_HF_L},
                {"n_head", WF_HF_NH},
                {"n_embd", WF_HF_C},
                {"n_ctx", WF_HF_T},
                {"n_positions", WF_HF_T},
                {"vocab_size", WF_HF_V}},
    .n_hf_keys = 6,
    .hf_prefix = "transformer.",
    .hf_skip = {".attn.bias", ".attn.masked_bias"},
    .hf_head = "lm_head.weight",
    .hf_config = "{\"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05}",
    .hf_max_positions = 1024, /* transformers' GPT2Config(n_positions=1024) */
    .ops = &wf__gpt2_ops,
};
