"""The PyTorch peers' models for bench/torch_train.py (and bench/zero_torch.py's GPT-2):
GPT-2 as weft and llm.c define it, and Llama as Hugging Face's LlamaForCausalLM defines
it. No weft code runs here; these are the yardsticks.

GPT: learned positions, pre-LayerNorm blocks, tanh GELU, biases, the head tied to the
token embedding, causal attention through scaled_dot_product_attention (SDPA).

Llama: Hugging Face's architecture (modeling_llama.py), written out here with its module
names, so a state dict in Hugging Face's names loads as is (tests/model/
torch_llama_check.py loads tests/model/llama_ref.py's weights that way and compares
the loss and every gradient): RMSNorm computed in float32 and cast back, rotary
embeddings from float32 angles (with Llama 3's `llama3` frequency scaling when given)
cast to the activations' type and applied rotate-half, grouped-query attention by
repeating the kv heads (repeat_kv) into SDPA with is_causal, SwiGLU MLP, no biases,
the head tied to the embedding when asked (Llama 3.2 1B ties it).

Both call `attention()`, which is SDPA where PyTorch has it (2.0 and later; which of its
backends runs is the caller's choice, bench/torch_train.py's --sdpa) and the explicit
causal softmax where it does not (Debian's CPU PyTorch 1.13, on which the checks run).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(q, k, v):
    """Causal attention, q, k, v (B, H, T, hs) -> (B, H, T, hs), scale 1/sqrt(hs)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


def cross_entropy(logits, targets):
    """The mean over positions, on logits in at least float32 (bf16 ones upcast, as
    Hugging Face's loss and llm.c's do)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# ---- GPT-2 --------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.fcproj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.nh, c // self.nh).transpose(1, 2) for y in (q, k, v))
        y = attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, c, seq, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        for m in self.modules():  # GPT-2's initialisation, as weft's (std 0.02, zero biases)
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        return cross_entropy(self.lnf(x) @ self.wte.weight.t(), targets)


# ---- Llama (Hugging Face's LlamaForCausalLM) ---------------------------------------

class LlamaConfig:
    """The numbers of Hugging Face's LlamaConfig that define the model."""

    def __init__(self, layers, heads, kv_heads, d_model, ffn, vocab, theta=500000.0,
                 eps=1e-5, tied=True, rope_scaling=None):
        self.L, self.NH, self.NKV, self.C, self.F, self.V = layers, heads, kv_heads, d_model, \
            ffn, vocab
        self.hs = d_model // heads
        self.theta, self.eps, self.tied, self.rope_scaling = theta, eps, tied, rope_scaling


class LlamaRMSNorm(nn.Module):
    def __init__(self, c, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.eps = eps

    def forward(self, x):
        # Hugging Face's: in float32 whatever the activations' type (float64 stays float64)
        dtype = x.dtype
        x = x.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def llama3_inv_freq(inv_freq, s):
    """Hugging Face's _compute_llama3_parameters: wavelengths above old_ctx /
    low_freq_factor divide their frequency by factor, below old_ctx / high_freq_factor
    keep it, and those in between interpolate in old_ctx / wavelength."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_ctx = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < old_ctx / high) * ~(wavelen > old_ctx / low)
    return torch.where(medium, smoothed, out)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        inv = 1.0 / (cfg.theta ** (torch.arange(0, cfg.hs, 2, dtype=torch.int64).float() / cfg.hs))
        if cfg.rope_scaling:
            inv = llama3_inv_freq(inv, cfg.rope_scaling)
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x, T):
        """cos, sin (T, hs): the angles in float32 (autocast off), cast to x's type."""
        with torch.autocast(x.device.type, enabled=False):
            t = torch.arange(T, device=x.device, dtype=torch.int64).float()
            freqs = t[:, None] * self.inv_freq.float()[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def repeat_kv(x, n_rep):
    """(B, NKV, T, hs) -> (B, NKV n_rep, T, hs): kv head j serves query heads
    j n_rep .. (j + 1) n_rep - 1."""
    b, nkv, t, hs = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(b, nkv, n_rep, t, hs).reshape(b, nkv * n_rep, t, hs)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        q, kv = cfg.NH * cfg.hs, cfg.NKV * cfg.hs
        self.q_proj, self.k_proj = nn.Linear(cfg.C, q, bias=False), nn.Linear(cfg.C, kv, bias=False)
        self.v_proj, self.o_proj = nn.Linear(cfg.C, kv, bias=False), nn.Linear(q, cfg.C, bias=False)

    def forward(self, x, cos, sin):
        c = self.cfg
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, c.NH, c.hs).transpose(1, 2)
        k = self.k_proj(x).view(b, t, c.NKV, c.hs).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.NKV, c.hs).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # bf16 under autocast, as SDPA takes q
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        n = c.NH // c.NKV
        y = attention(q, repeat_kv(k, n), repeat_kv(v, n))
        return self.o_proj(y.transpose(1, 2).reshape(b, t, c.NH * c.hs))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.C, cfg.F, bias=False)
        self.up_proj = nn.Linear(cfg.C, cfg.F, bias=False)
        self.down_proj = nn.Linear(cfg.F, cfg.C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.C, cfg.eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.C, cfg.eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.V, cfg.C)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.L))
        self.norm = LlamaRMSNorm(cfg.C, cfg.eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)

    def forward(self, idx):
        h = self.embed_tokens(idx)
        cos, sin = self.rotary_emb(h, idx.shape[1])
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.norm(h)


class Llama(nn.Module):
    """LlamaForCausalLM: forward(idx, targets) is the mean cross-entropy, computed on the
    logits in float32 (as Hugging Face's loss upcasts them)."""

    def __init__(self, cfg):
        super().__init__()
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.C, cfg.V, bias=False)
        for m in self.modules():  # LlamaConfig's initializer_range
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        if cfg.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, idx, targets):
        return cross_entropy(self.lm_head(self.model(idx)), targets)


# ---- Mixtral (Hugging Face's MixtralForCausalLM) -----------------------------------

class MixtralBlockSparseTop2MLP(nn.Module):
    """One expert: SwiGLU with Hugging Face's names (w1 gate, w3 up, w2 down)."""

    def __init__(self, cfg):
        super().__init__()
        self.w1 = nn.Linear(cfg.C, cfg.F, bias=False)
        self.w2 = nn.Linear(cfg.F, cfg.C, bias=False)
        self.w3 = nn.Linear(cfg.C, cfg.F, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(nn.Module):
    """Hugging Face's MixtralSparseMoeBlock: a router (no bias), softmax in float32, the
    top-k experts renormalised, and the loop over experts, each taking its tokens by
    index (torch.where of the one-hot choices) and adding its weighted output back with
    index_add_. Returns the output and the router's logits."""

    def __init__(self, cfg):
        super().__init__()
        self.E, self.K = cfg.E, cfg.K
        self.gate = nn.Linear(cfg.C, cfg.E, bias=False)
        self.experts = nn.ModuleList(MixtralBlockSparseTop2MLP(cfg) for _ in range(cfg.E))

    def forward(self, h):
        b, t, c = h.shape
        x = h.view(-1, c)
        logits = self.gate(x)
        # in float32 whatever the activations' type, as Hugging Face's (float64 stays float64)
        w = F.softmax(logits, dim=1, dtype=torch.promote_types(logits.dtype, torch.float32))
        w, chosen = torch.topk(w, self.K, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        mask = F.one_hot(chosen, num_classes=self.E).permute(2, 1, 0)
        for e in range(self.E):
            idx, top = torch.where(mask[e])
            y = self.experts[e](x[top]) * w[top, idx, None]
            out.index_add_(0, top, y.to(x.dtype))
        return out.view(b, t, c), logits


def load_balancing_loss(all_logits, E, K):
    """transformers' load_balancing_loss_func: every layer's router logits together."""
    probs = F.softmax(torch.cat(all_logits, dim=0), dim=-1)
    _, chosen = torch.topk(probs, K, dim=-1)
    mask = F.one_hot(chosen, E).to(probs.dtype)
    tokens_per_expert = mask.mean(dim=0)
    return (tokens_per_expert * probs.mean(dim=0).unsqueeze(0)).sum() * E


class MixtralDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.C, cfg.eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.C, cfg.eps)
        self.block_sparse_moe = MixtralSparseMoeBlock(cfg)

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        y, logits = self.block_sparse_moe(self.post_attention_layernorm(h))
        return h + y, logits


class MixtralModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.V, cfg.C)
        self.layers = nn.ModuleList(MixtralDecoderLayer(cfg) for _ in range(cfg.L))
        self.norm = LlamaRMSNorm(cfg.C, cfg.eps)
        self.rotary_emb = LlamaRotaryEmbedding(cfg)

    def forward(self, idx):
        h = self.embed_tokens(idx)
        cos, sin = self.rotary_emb(h, idx.shape[1])
        logits = []
        for layer in self.layers:
            h, lg = layer(h, cos, sin)
            logits.append(lg)
        return self.norm(h), logits


class Mixtral(nn.Module):
    """MixtralForCausalLM with output_router_logits: the mean cross-entropy (on float32
    logits) plus cfg.aux times the load-balancing loss; Hugging Face's module names, so
    its state dict loads as is (tests/model/torch_mixtral_check.py). cfg: a LlamaConfig
    with E, K and aux set."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = MixtralModel(cfg)
        self.lm_head = nn.Linear(cfg.C, cfg.V, bias=False)
        for m in self.modules():  # MixtralConfig's initializer_range
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        h, logits = self.model(idx)
        ce = cross_entropy(self.lm_head(h), targets)
        return ce + self.cfg.aux * load_balancing_loss(logits, self.cfg.E, self.cfg.K)
