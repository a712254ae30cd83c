"""llama_ref.py - an independent reference of Hugging Face's LlamaForCausalLM for weft's
tests: forward (logits, loss) and backward (every parameter's gradient, by PyTorch's
autograd), from the published architecture and the weights in Hugging Face's names and
layouts. It shares no code with weft (and does not use the `transformers` package): it
is written from the model as Hugging Face's modeling_llama.py and Meta's papers define
it, op by op:

  h = embed_tokens[tokens]                                        (B, T, C)
  per layer:
    a = RMSNorm(h; input_layernorm, eps)        rms = x / sqrt(mean(x^2) + eps) * w
    q, k, v = a q_proj^T, a k_proj^T, a v_proj^T; heads: (B, NH|NKV, T, hs)
    q, k = RoPE(q), RoPE(k)                      rotate-half: x cos + rotate_half(x) sin
    o = softmax(q repeat_kv(k)^T / sqrt(hs) + causal mask) repeat_kv(v)
    h = h + o o_proj^T                           (heads joined back to (B, T, NH hs))
    m = RMSNorm(h; post_attention_layernorm, eps)
    h = h + (silu(m gate_proj^T) * (m up_proj^T)) down_proj^T
  logits = RMSNorm(h; model.norm, eps) lm_head^T   (lm_head = embed_tokens when tied)
  loss = mean over the B*T positions of cross_entropy(logits, targets)

RoPE's angles are computed as Hugging Face computes them whatever the model's dtype:
inv_freq = 1 / theta^(arange(0, hs, 2) / hs), rescaled when config.json has a llama3
rope_scaling (Llama 3.1, 3.2: llama3_inv_freq), and the angles t * inv_freq in float32,
cos/sin in float32, then cast (LlamaRotaryEmbedding). Everything else runs in the
chosen dtype (float64 by default: a ground truth for weft's float32).

Inputs and targets are separate (B, T) arrays, weft's convention; Hugging Face's
`labels=` form is the same loss with targets[:, t] = tokens[:, t + 1].

The op functions (rms_norm, rope_cos_sin, apply_rope, repeat_kv, attention, swiglu)
are what the model above uses; tests/kernels/llama_ops.py checks weft's kernels
against them one by one.

Needs PyTorch: Debian's python3-torch (1.13, CPU), run by /usr/bin/python3.

Command line:
  llama_ref.py init CONFIG OUT [--seed N] [--std S]
      random weights for the model of CONFIG (a Hugging Face config.json) into the
      safetensors file OUT (F32, Hugging Face's names and layouts): matrices normal(0, S)
      (default 0.02), norm weights 1 + normal(0, 0.1)
  llama_ref.py run CONFIG WEIGHTS TOKENS TARGETS OUT [--batch B] [--dtype float64|float32]
      TOKENS, TARGETS: raw little-endian int32 files of B*T ids each (T = count / B);
      WEIGHTS: safetensors (F32, F64, BF16 or F16) in Hugging Face's names;
      OUT: safetensors (F32) holding "logits" (B, T, V), "loss" (1) and, for every
      parameter NAME, "grad.NAME" (NAME's shape: d loss / d NAME)
  llama_ref.py selftest
      the reference against itself: autograd against central differences (float64), and
      grouped-query attention against multi-head attention on repeated kv heads
"""
import argparse
import json
import math
import struct
import sys

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit("llama_ref.py needs PyTorch: install Debian's python3-torch (scripts/setup.sh does) "
             "and run it with /usr/bin/python3")


# ---- configuration ------------------------------------------------------------------

class Config:
    """The keys of Hugging Face's LlamaConfig (config.json) that define the model."""

    def __init__(self, d):
        self.V = int(d["vocab_size"])
        self.C = int(d["hidden_size"])
        self.F = int(d["intermediate_size"])
        self.L = int(d["num_hidden_layers"])
        self.NH = int(d["num_attention_heads"])
        self.NKV = int(d.get("num_key_value_heads") or self.NH)
        self.hs = int(d.get("head_dim") or self.C // self.NH)
        self.eps = float(d.get("rms_norm_eps", 1e-6))  # LlamaConfig's default
        self.theta = float(d.get("rope_theta", 10000.0))
        self.tied = bool(d.get("tie_word_embeddings", False))
        self.scaling = d.get("rope_scaling") or None
        if self.scaling:
            kind = self.scaling.get("rope_type", self.scaling.get("type"))
            if kind != "llama3":
                raise ValueError(f"rope_scaling {kind!r} is not modelled by llama_ref.py (llama3)")
        if self.NH % self.NKV or self.hs % 2:
            raise ValueError("num_key_value_heads must divide num_attention_heads, head_dim be even")

    @staticmethod
    def load(path):
        with open(path) as f:
            return Config(json.load(f))


def param_shapes(cfg):
    """[(Hugging Face name, shape)] in the order of the model."""
    C, F_, V, q, kv = cfg.C, cfg.F, cfg.V, cfg.NH * cfg.hs, cfg.NKV * cfg.hs
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg.L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (C,)),
                (p + "self_attn.q_proj.weight", (q, C)),
                (p + "self_attn.k_proj.weight", (kv, C)),
                (p + "self_attn.v_proj.weight", (kv, C)),
                (p + "self_attn.o_proj.weight", (C, q)),
                (p + "post_attention_layernorm.weight", (C,)),
                (p + "mlp.gate_proj.weight", (F_, C)),
                (p + "mlp.up_proj.weight", (F_, C)),
                (p + "mlp.down_proj.weight", (C, F_))]
    out.append(("model.norm.weight", (C,)))
    if not cfg.tied:
        out.append(("lm_head.weight", (V, C)))
    return out


def init_weights(cfg, seed, std=0.02):
    """Random weights: matrices normal(0, std) (LlamaConfig's initializer_range is 0.02;
    a larger std makes attention far from uniform in a tiny model), norm weights
    1 + normal(0, 0.1) rather than ones, so that a norm weight that is dropped or
    misplaced changes the result."""
    g = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg):
        if len(shape) == 1:
            out[name] = (1.0 + 0.1 * g.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (std * g.standard_normal(shape)).astype(np.float32)
    return out


# ---- safetensors (the format: u64 header length, JSON header, raw little-endian data) --

_NP = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32}


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode())
    header.pop("__metadata__", None)
    body, out = data[8 + n:], {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        raw = body[b:e]
        if h["dtype"] == "BF16":  # the top half of a float32
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=np.dtype(_NP[h["dtype"]]).newbyteorder("<"))
        out[name] = a.astype(np.float32 if h["dtype"] != "F64" else np.float64).reshape(h["shape"])
    return out


def st_write(path, tensors, dtype="F32"):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        blob = np.ascontiguousarray(a, dtype=np.dtype(_NP[dtype]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(a)),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))


# ---- the ops ------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """LlamaRMSNorm: weight * (x / sqrt(mean(x^2) + eps)) over the last dimension."""
    var = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(var + eps))


def llama3_inv_freq(inv_freq, scaling):
    """Llama 3.1's rescaled frequencies (rope_type "llama3"): wavelengths shorter than
    old_ctx / high_freq_factor keep their frequency, longer than old_ctx /
    low_freq_factor divide it by factor, and those in between interpolate linearly in
    old_ctx / wavelength. The same float32 tensor ops as Hugging Face's
    _compute_llama3_parameters (Python scalars against float32 tensors)."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


def rope_cos_sin(T, hs, theta, dtype=torch.float64, scaling=None):
    """cos, sin (T, hs) of positions 0..T-1, as LlamaRotaryEmbedding computes them: in
    float32 (inv_freq, the angles, cos and sin), then cast to dtype. Columns i and
    i + hs/2 hold the same angle (emb = cat(freqs, freqs)). scaling: config.json's
    rope_scaling (llama3) or None."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if scaling:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    t = torch.arange(T, dtype=torch.int64).float()
    freqs = t[:, None] * inv_freq[None, :]  # HF: inv_freq (hs/2, 1) @ positions (1, T)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h2 = x.shape[-1] // 2
    return torch.cat((-x[..., h2:], x[..., :h2]), dim=-1)


def apply_rope(x, cos, sin):
    """x (B, H, T, hs) turned by position: x * cos + rotate_half(x) * sin."""
    return x * cos + rotate_half(x) * sin


def repeat_kv(x, n_rep):
    """(B, NKV, T, hs) -> (B, NKV * n_rep, T, hs): kv head j serves query heads
    j * n_rep .. (j + 1) * n_rep - 1."""
    B, NKV, T, hs = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(B, NKV, n_rep, T, hs).reshape(B, NKV * n_rep, T, hs)


def attention(q, k, v):
    """Causal grouped-query attention: q (B, NH, T, hs), k, v (B, NKV, T, hs) ->
    (B, NH, T, hs), softmax(q k^T / sqrt(hs) + mask) v on repeated kv heads."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    T, hs = q.shape[2], q.shape[3]
    s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hs)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


def swiglu(gate, up):
    """LlamaMLP's gate: silu(gate) * up."""
    return F.silu(gate) * up


# ---- the model ----------------------------------------------------------------------

def block(cfg, W, l, h, cos, sin):
    p = f"model.layers.{l}."
    B, T, _ = h.shape
    a = rms_norm(h, W[p + "input_layernorm.weight"], cfg.eps)
    q = (a @ W[p + "self_attn.q_proj.weight"].T).view(B, T, cfg.NH, cfg.hs).transpose(1, 2)
    k = (a @ W[p + "self_attn.k_proj.weight"].T).view(B, T, cfg.NKV, cfg.hs).transpose(1, 2)
    v = (a @ W[p + "self_attn.v_proj.weight"].T).view(B, T, cfg.NKV, cfg.hs).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    o = attention(q, k, v).transpose(1, 2).reshape(B, T, cfg.NH * cfg.hs)
    h = h + o @ W[p + "self_attn.o_proj.weight"].T
    m = rms_norm(h, W[p + "post_attention_layernorm.weight"], cfg.eps)
    g = swiglu(m @ W[p + "mlp.gate_proj.weight"].T, m @ W[p + "mlp.up_proj.weight"].T)
    return h + g @ W[p + "mlp.down_proj.weight"].T


def forward(cfg, W, tokens, targets):
    """W: name -> tensor; tokens, targets (B, T) int64. Returns logits (B, T, V), loss."""
    T = tokens.shape[1]
    cos, sin = rope_cos_sin(T, cfg.hs, cfg.theta, W["model.embed_tokens.weight"].dtype,
                            cfg.scaling)
    h = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg.L):
        h = block(cfg, W, l, h, cos, sin)
    h = rms_norm(h, W["model.norm.weight"], cfg.eps)
    head = W["model.embed_tokens.weight"] if cfg.tied else W["lm_head.weight"]
    logits = h @ head.T
    loss = F.cross_entropy(logits.reshape(-1, cfg.V), targets.reshape(-1))
    return logits, loss


def run(cfg, weights, tokens, targets, dtype=torch.float64):
    """weights: name -> numpy array. Returns logits, loss and {name: gradient} (numpy)."""
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
    logits, loss = forward(cfg, W, tok, tgt)
    loss.backward()
    grads = {n: W[n].grad.numpy() for n in want}
    return logits.detach().numpy(), float(loss.item()), grads


# ---- self-test ----------------------------------------------------------------------

TINY = {"vocab_size": 19, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False}


def selftest():
    """Autograd through the reference against central differences of its own float64 loss
    (h = 1e-5: truncation h^2 |d3L| / 6 ~ 2e-11 |d3L|, rounding 2.2e-16 |L| / h ~ 7e-11 for
    the loss ~3 here; so |fd - grad| <= 1e-6 of the gradient's scale + 1e-9); and
    grouped-query attention against multi-head attention on explicitly repeated kv heads
    (the same float64 products: 1e-12)."""
    for tied in (False, True):
        cfg = Config(dict(TINY, tie_word_embeddings=tied))
        w = init_weights(cfg, 5, std=0.3)
        g = np.random.default_rng(6)
        tok, tgt = g.integers(0, cfg.V, (2, 7)), g.integers(0, cfg.V, (2, 7))
        _, loss, grads = run(cfg, w, tok, tgt)
        for name in [n for n, _ in param_shapes(cfg)][::3] + ["model.embed_tokens.weight"]:
            flat = w[name].reshape(-1)
            scale = np.abs(grads[name]).max()
            for i in range(0, flat.size, max(1, flat.size // 5)):
                wp = {n: a.astype(np.float64) for n, a in w.items()}
                wm = {n: a.astype(np.float64) for n, a in w.items()}
                wp[name].reshape(-1)[i] += 1e-5
                wm[name].reshape(-1)[i] -= 1e-5
                fd = (run(cfg, wp, tok, tgt)[1] - run(cfg, wm, tok, tgt)[1]) / 2e-5
                got = grads[name].reshape(-1)[i]
                assert abs(fd - got) <= 1e-6 * (abs(fd) + scale) + 1e-9, (tied, name, i, fd, got)
        print(f"llama_ref selftest: tied={tied} loss {loss:.6f}, gradients match finite differences")
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 6, 9, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64)
    kr = torch.cat([k[:, j:j + 1].expand(2, 3, 9, 4) for j in range(2)], dim=1)
    vr = torch.cat([v[:, j:j + 1].expand(2, 3, 9, 4) for j in range(2)], dim=1)
    assert torch.allclose(attention(q, k, v), attention(q, kr, vr), rtol=0, atol=1e-12)
    print("llama_ref selftest: grouped-query attention = multi-head attention on repeated kv")


# ---- command line -------------------------------------------------------------------

def read_ids(path):
    return np.fromfile(path, dtype="<i4")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("init")
    a.add_argument("config")
    a.add_argument("out")
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--std", type=float, default=0.02, help="of the matrices' entries")
    r = sub.add_parser("run")
    for name in ("config", "weights", "tokens", "targets", "out"):
        r.add_argument(name)
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    sub.add_parser("selftest")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.mode == "selftest":
        selftest()
        return 0
    cfg = Config.load(args.config)
    if args.mode == "init":
        st_write(args.out, init_weights(cfg, args.seed, args.std))
        return 0
    tok, tgt = read_ids(args.tokens), read_ids(args.targets)
    if tok.size != tgt.size or tok.size == 0 or tok.size % args.batch:
        sys.exit(f"llama_ref.py: {tok.size} tokens and {tgt.size} targets: need the same "
                 f"count, a multiple of --batch {args.batch}")
    if tok.min() < 0 or tok.max() >= cfg.V or tgt.min() < 0 or tgt.max() >= cfg.V:
        sys.exit(f"llama_ref.py: ids must lie in [0, {cfg.V}) (vocab_size)")
    shape = (args.batch, tok.size // args.batch)
    logits, loss, grads = run(cfg, st_read(args.weights), tok.reshape(shape), tgt.reshape(shape),
                              getattr(torch, args.dtype))
    out = {"logits": logits, "loss": np.array([loss])}
    out.update({"grad." + n: g for n, g in grads.items()})
    st_write(args.out, out)
    print(f"llama_ref: loss {loss:.9g} over {shape[0]} x {shape[1]} positions -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
