"""moe_ref.py - an independent reference of Hugging Face's mixture-of-experts causal language
models for weft's tests: OlmoeForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM,
forward (logits, the cross-entropy, the load-balancing loss) and backward (every parameter's
gradient, by PyTorch's autograd), from the weights in Hugging Face's names and layouts. It
shares no code with weft (nor uses the `transformers` package): it is written from the models
as transformers' modeling_olmoe.py, modeling_qwen3_moe.py and modeling_mixtral.py define them,
and takes Llama's ops (RMSNorm, RoPE, grouped-query attention, SwiGLU) from llama_ref.py:

  h = embed_tokens[tokens]
  per layer:
    a = RMSNorm(h; input_layernorm)
    q, k, v = a q_proj^T, a k_proj^T, a v_proj^T
      olmoe:     q = RMSNorm(q; q_norm) over all NH hs of it, k = RMSNorm(k; k_norm) over KV hs
      qwen3_moe: q, k = RMSNorm per head (q_norm, k_norm: hs weights each), head_dim hs
      mixtral:   none
    q, k = RoPE(q), RoPE(k); o = attention(q, k, v); h = h + o o_proj^T
    m = RMSNorm(h; post_attention_layernorm)
    logits_r = m gate^T (the router, "mlp.gate" / "block_sparse_moe.gate")
    p = softmax(logits_r); the top-k experts of each token and their weights p (divided by
        their sum when norm_topk_prob; Mixtral always)
    h = h + sum over the chosen e of w_e down_e(silu(gate_e(m)) * up_e(m))
  logits = RMSNorm(h; model.norm) lm_head^T
  loss = cross_entropy + router_aux_loss_coef * aux (+ z_loss_coef * z)

aux is transformers' load_balancing_loss_func: every layer's router logits concatenated
(R = L N rows), probs = softmax, the top-k again, tokens_per_expert = mean over rows of the
one-hot choices (K, E), router_prob_per_expert = mean over rows of probs (E), aux =
E sum(tokens_per_expert * router_prob_per_expert). z (not in transformers; ST-MoE's router
z-loss as weft defines it) = mean over the R rows of logsumexp(logits_r)^2.

Capacity (weft's, not transformers'): with --capacity c each expert takes at most
ceil(c N K / E) of a layer's (token, choice) pairs, the first in token order then choice
order; the others add nothing to their token's output (aux still counts every choice).

Command line:
  moe_ref.py init CONFIG OUT [--seed N] [--std S]
      random weights for CONFIG (a config.json: model_type olmoe, qwen3_moe or mixtral) into
      the safetensors file OUT (F32): matrices normal(0, S), norm weights 1 + normal(0, 0.1)
  moe_ref.py run CONFIG WEIGHTS TOKENS TARGETS OUT [--batch B] [--z Z] [--capacity C]
      TOKENS, TARGETS raw int32 files of B*T ids; OUT (safetensors, F32): "logits" (B, T, V),
      "loss" (the cross-entropy), "aux", "z", and "grad.NAME" of the total loss for every
      parameter NAME
  moe_ref.py selftest
      autograd against central differences (float64) for each family, and the expert loop
      against a dense computation of every expert weighted by a mask
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402  Llama's ops, safetensors in and out

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("moe_ref.py needs PyTorch: install Debian's python3-torch and run it with "
             "/usr/bin/python3")


class Config:
    """The keys of the three configs that define the model (transformers' defaults)."""

    def __init__(self, d):
        self.kind = d["model_type"]
        if self.kind not in ("olmoe", "qwen3_moe", "mixtral"):
            raise ValueError(f"model_type {self.kind!r} is not olmoe, qwen3_moe or mixtral")
        self.V, self.C, self.L = int(d["vocab_size"]), int(d["hidden_size"]), int(d["num_hidden_layers"])
        self.NH = int(d["num_attention_heads"])
        self.NKV = int(d.get("num_key_value_heads") or self.NH)
        self.hs = int(d.get("head_dim") or self.C // self.NH) if self.kind == "qwen3_moe" else self.C // self.NH
        self.F = int(d["moe_intermediate_size"] if self.kind == "qwen3_moe" else d["intermediate_size"])
        self.E = int(d["num_local_experts"] if self.kind == "mixtral" else d["num_experts"])
        self.K = int(d["num_experts_per_tok"])
        self.renorm = True if self.kind == "mixtral" else bool(d.get("norm_topk_prob", False))
        self.eps = float(d.get("rms_norm_eps", 1e-6 if self.kind == "qwen3_moe" else 1e-5))
        self.theta = float(d.get("rope_theta", 1e6 if self.kind == "mixtral" else 10000.0))
        self.tied = bool(d.get("tie_word_embeddings", False))
        self.aux_coef = float(d.get("router_aux_loss_coef", 0.0))
        self.scaling = None

    @staticmethod
    def load(path):
        with open(path) as f:
            return Config(json.load(f))

    def moe(self):
        return "block_sparse_moe" if self.kind == "mixtral" else "mlp"

    def expert_names(self):
        """gate, up, down of an expert, as the family names them."""
        return ("w1", "w3", "w2") if self.kind == "mixtral" else ("gate_proj", "up_proj", "down_proj")


def param_shapes(cfg):
    C, q, kv, E, Fw = cfg.C, cfg.NH * cfg.hs, cfg.NKV * cfg.hs, cfg.E, cfg.F
    out = [("model.embed_tokens.weight", (cfg.V, C))]
    gate, up, down = cfg.expert_names()
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (q, C)),
                (p + "self_attn.k_proj.weight", (kv, C)),
                (p + "self_attn.v_proj.weight", (kv, C)),
                (p + "self_attn.o_proj.weight", (C, q))]
        if cfg.kind == "olmoe":
            out += [(p + "self_attn.q_norm.weight", (q,)), (p + "self_attn.k_norm.weight", (kv,))]
        if cfg.kind == "qwen3_moe":
            out += [(p + "self_attn.q_norm.weight", (cfg.hs,)),
                    (p + "self_attn.k_norm.weight", (cfg.hs,))]
        out += [(p + "post_attention_layernorm.weight", (C,)),
                (p + f"{cfg.moe()}.gate.weight", (E, C))]
        for e in range(E):
            x = p + f"{cfg.moe()}.experts.{e}."
            out += [(x + f"{gate}.weight", (Fw, C)), (x + f"{up}.weight", (Fw, C)),
                    (x + f"{down}.weight", (C, Fw))]
    out.append(("model.norm.weight", (C,)))
    if not cfg.tied:
        out.append(("lm_head.weight", (cfg.V, C)))
    return out


def init_weights(cfg, seed, std=0.02):
    """Matrices normal(0, std), norm weights 1 + normal(0, 0.1): a dropped or misplaced norm
    weight changes the result."""
    g = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg):
        scale = 0.1 if len(shape) == 1 else std
        base = 1.0 if len(shape) == 1 else 0.0
        out[name] = (base + scale * g.standard_normal(shape)).astype(np.float32)
    return out


# ---- the model ------------------------------------------------------------------------

def attention_block(cfg, W, p, a, cos, sin):
    B, T, _ = a.shape
    q = a @ W[p + "self_attn.q_proj.weight"].T
    k = a @ W[p + "self_attn.k_proj.weight"].T
    v = a @ W[p + "self_attn.v_proj.weight"].T
    if cfg.kind == "olmoe":  # OlmoeAttention: the norms over the whole projections
        q = L.rms_norm(q, W[p + "self_attn.q_norm.weight"], cfg.eps)
        k = L.rms_norm(k, W[p + "self_attn.k_norm.weight"], cfg.eps)
    q = q.view(B, T, cfg.NH, cfg.hs)
    k = k.view(B, T, cfg.NKV, cfg.hs)
    if cfg.kind == "qwen3_moe":  # Qwen3MoeAttention: per head, before the transpose
        q = L.rms_norm(q, W[p + "self_attn.q_norm.weight"], cfg.eps)
        k = L.rms_norm(k, W[p + "self_attn.k_norm.weight"], cfg.eps)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    v = v.view(B, T, cfg.NKV, cfg.hs).transpose(1, 2)
    q, k = L.apply_rope(q, cos, sin), L.apply_rope(k, cos, sin)
    o = L.attention(q, k, v).transpose(1, 2).reshape(B, T, cfg.NH * cfg.hs)
    return o @ W[p + "self_attn.o_proj.weight"].T


def kept_pairs(chosen, E, cap):
    """(N, K) bool: the pairs each expert takes, the first cap in token then choice order
    (cap 0: all)."""
    keep = torch.ones_like(chosen, dtype=torch.bool)
    if cap <= 0:
        return keep
    seen = [0] * E
    for n in range(chosen.shape[0]):
        for j in range(chosen.shape[1]):
            e = int(chosen[n, j])
            keep[n, j] = seen[e] < cap
            seen[e] += 1
    return keep


def sparse_moe(cfg, W, p, m, capacity):
    """The sparse MLP on m (N, C): its output and the router logits (N, E), as the sparse
    MoE blocks compute them: a loop over experts, each weighted and added at its tokens."""
    logits = m @ W[p + f"{cfg.moe()}.gate.weight"].T
    probs = torch.softmax(logits, dim=-1)
    w, chosen = torch.topk(probs, cfg.K, dim=-1)
    if cfg.renorm:
        w = w / w.sum(dim=-1, keepdim=True)
    cap = math.ceil(capacity * m.shape[0] * cfg.K / cfg.E) if capacity > 0 else 0
    keep = kept_pairs(chosen, cfg.E, cap)
    out = torch.zeros_like(m)
    gate, up, down = cfg.expert_names()
    for e in range(cfg.E):
        n, j = torch.where((chosen == e) & keep)
        if n.numel() == 0:
            continue
        x = p + f"{cfg.moe()}.experts.{e}."
        h = L.swiglu(m[n] @ W[x + f"{gate}.weight"].T, m[n] @ W[x + f"{up}.weight"].T)
        out = out.index_add(0, n, (h @ W[x + f"{down}.weight"].T) * w[n, j, None])
    return out, logits


def load_balancing(all_logits, E, K):
    """transformers' load_balancing_loss_func without an attention mask."""
    probs = torch.softmax(all_logits, dim=-1)
    _, chosen = torch.topk(probs, K, dim=-1)
    mask = F.one_hot(chosen, E).to(probs.dtype)
    tokens_per_expert = mask.mean(dim=0)
    prob_per_expert = probs.mean(dim=0)
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * E


def forward(cfg, W, tokens, targets, z_coef=0.0, capacity=0.0):
    B, T = tokens.shape
    cos, sin = L.rope_cos_sin(T, cfg.hs, cfg.theta, W["model.embed_tokens.weight"].dtype)
    h = W["model.embed_tokens.weight"][tokens]
    router_logits = []
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        h = h + attention_block(cfg, W, p, L.rms_norm(h, W[p + "input_layernorm.weight"], cfg.eps),
                                cos, sin)
        m = L.rms_norm(h, W[p + "post_attention_layernorm.weight"], cfg.eps)
        out, lg = sparse_moe(cfg, W, p, m.reshape(B * T, cfg.C), capacity)
        h = h + out.view(B, T, cfg.C)
        router_logits.append(lg)
    h = L.rms_norm(h, W["model.norm.weight"], cfg.eps)
    head = W["model.embed_tokens.weight"] if cfg.tied else W["lm_head.weight"]
    logits = h @ head.T
    ce = F.cross_entropy(logits.reshape(-1, cfg.V), targets.reshape(-1))
    all_logits = torch.cat(router_logits, dim=0)
    aux = load_balancing(all_logits, cfg.E, cfg.K)
    z = torch.logsumexp(all_logits, dim=-1).pow(2).mean()
    total = ce + cfg.aux_coef * aux + z_coef * z
    return logits, ce, aux, z, total


def run(cfg, weights, tokens, targets, z_coef=0.0, capacity=0.0, dtype=torch.float64):
    want = dict(param_shapes(cfg))
    missing = [n for n in want if n not in weights]
    if missing:
        raise KeyError(f"weights lack {missing[:3]} ({len(missing)} missing)")
    for n, shape in want.items():
        if tuple(weights[n].shape) != tuple(shape):
            raise ValueError(f"{n}: shape {tuple(weights[n].shape)}, expected {tuple(shape)}")
    W = {n: torch.tensor(weights[n], dtype=dtype, requires_grad=True) for n in want}
    tok = torch.as_tensor(np.asarray(tokens), dtype=torch.int64)
    tgt = torch.as_tensor(np.asarray(targets), dtype=torch.int64)
    logits, ce, aux, z, total = forward(cfg, W, tok, tgt, z_coef, capacity)
    total.backward()
    # an expert no token chose has no gradient: zeros (as weft leaves it)
    grads = {n: W[n].grad.numpy() if W[n].grad is not None else np.zeros(want[n], W[n].detach().numpy().dtype)
             for n in want}
    return logits.detach().numpy(), float(ce), float(aux), float(z), float(total), grads


# ---- self-test -------------------------------------------------------------------------

TINY = {"vocab_size": 19, "hidden_size": 16, "intermediate_size": 12, "moe_intermediate_size": 12,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
        "router_aux_loss_coef": 0.3, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}


def selftest():
    """Per family: autograd against central differences of the float64 total loss (h = 1e-5,
    as llama_ref.py's selftest argues: |fd - grad| <= 1e-6 of the gradient's scale + 1e-9;
    the top-k choices do not move under a 1e-5 step unless two probabilities tie within it,
    which these seeds avoid), with the z-loss on; and the expert loop against every expert
    computed densely and masked by the choices (the same float64 products: 1e-12)."""
    for kind, extra in (("olmoe", {"num_key_value_heads": 4}), ("qwen3_moe", {"head_dim": 8,
                        "norm_topk_prob": True}), ("mixtral", {})):
        cfg = Config(dict(TINY, model_type=kind, **extra))
        w = init_weights(cfg, 5, std=0.3)
        g = np.random.default_rng(6)
        tok, tgt = g.integers(0, cfg.V, (2, 5)), g.integers(0, cfg.V, (2, 5))
        *_, total, grads = run(cfg, w, tok, tgt, z_coef=0.01)
        for name in [n for n, _ in param_shapes(cfg)][::5] + ["model.embed_tokens.weight"]:
            flat, scale = w[name].reshape(-1), np.abs(grads[name]).max()
            for i in range(0, flat.size, max(1, flat.size // 4)):
                wp = {n: a.astype(np.float64) for n, a in w.items()}
                wm = {n: a.astype(np.float64) for n, a in w.items()}
                wp[name].reshape(-1)[i] += 1e-5
                wm[name].reshape(-1)[i] -= 1e-5
                fd = (run(cfg, wp, tok, tgt, 0.01)[4] - run(cfg, wm, tok, tgt, 0.01)[4]) / 2e-5
                got = grads[name].reshape(-1)[i]
                assert abs(fd - got) <= 1e-6 * (abs(fd) + scale) + 1e-9, (kind, name, i, fd, got)
        print(f"moe_ref selftest: {kind} total loss {total:.6f}, gradients match finite differences")
        W = {n: torch.tensor(a, dtype=torch.float64) for n, a in w.items()}
        m = torch.randn(7, cfg.C, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        p = "model.layers.0."
        out, logits = sparse_moe(cfg, W, p, m, 0.0)
        probs = torch.softmax(logits, dim=-1)
        wt, chosen = torch.topk(probs, cfg.K, dim=-1)
        if cfg.renorm:
            wt = wt / wt.sum(-1, keepdim=True)
        dense = torch.zeros_like(m)
        gate, up, down = cfg.expert_names()
        for e in range(cfg.E):
            x = p + f"{cfg.moe()}.experts.{e}."
            y = L.swiglu(m @ W[x + f"{gate}.weight"].T, m @ W[x + f"{up}.weight"].T) @ W[x + f"{down}.weight"].T
            dense += y * ((chosen == e) * wt).sum(-1, keepdim=True)
        assert torch.allclose(out, dense, rtol=0, atol=1e-12), kind
    print("moe_ref selftest: the expert loop equals every expert computed densely and masked")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("init")
    a.add_argument("config")
    a.add_argument("out")
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--std", type=float, default=0.02)
    r = sub.add_parser("run")
    for name in ("config", "weights", "tokens", "targets", "out"):
        r.add_argument(name)
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--z", type=float, default=0.0, help="the router z-loss's coefficient")
    r.add_argument("--capacity", type=float, default=0.0, help="capacity factor; 0 = dropless")
    sub.add_parser("selftest")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.mode == "selftest":
        selftest()
        return 0
    cfg = Config.load(args.config)
    if args.mode == "init":
        L.st_write(args.out, init_weights(cfg, args.seed, args.std))
        return 0
    tok, tgt = np.fromfile(args.tokens, dtype="<i4"), np.fromfile(args.targets, dtype="<i4")
    if tok.size != tgt.size or tok.size == 0 or tok.size % args.batch:
        sys.exit(f"moe_ref.py: {tok.size} tokens and {tgt.size} targets: need the same count, a "
                 f"multiple of --batch {args.batch}")
    shape = (args.batch, tok.size // args.batch)
    logits, ce, aux, z, total, grads = run(cfg, L.st_read(args.weights), tok.reshape(shape),
                                           tgt.reshape(shape), args.z, args.capacity)
    out = {"logits": logits, "loss": np.array([ce]), "aux": np.array([aux]), "z": np.array([z])}
    out.update({"grad." + n: g for n, g in grads.items()})
    L.st_write(args.out, out)
    print(f"moe_ref: {cfg.kind} cross-entropy {ce:.9g}, aux {aux:.9g}, z {z:.9g}, total "
          f"{total:.9g} over {shape[0]} x {shape[1]} positions -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
