#!/usr/bin/env python3
"""The PyTorch peer of bench/gpu_train.py: GPT-2 training steps, timed.

    torch_gpt2.py [--layers 12 --heads 12 --d-model 768 --seq 1024 --vocab 50304]
                  [--batch 8] [--steps 30] [--warmup 5] [--device cuda] [--bf16]
                  [--compile] [--data SHARD]

The model is GPT-2 as weft and llm.c define it (learned positions, pre-layernorm blocks,
tanh GELU, tied embedding, causal attention through scaled_dot_product_attention, held
to its flash backend on a GPU), trained with AdamW (fused on a GPU), under bf16 autocast
with --bf16 and torch.compile with --compile: PyTorch at its best settings. The batches
are consecutive windows of B x (T + 1) tokens of an llm.c token shard (--data: the file
bench/gpu_train.py also gives weft), else random tokens. Prints one JSON line: tokens/s
(median step after the warm-up), step_ms, peak device memory in MiB and the settings.
No weft code runs here; this is the yardstick.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def sdpa_backend():
    """FlashAttention's kernel where PyTorch has one (CUDA, 16-bit inputs), else its
    default choice: the same algorithm weft's attention runs."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # PyTorch before 2.3: let it choose
        import contextlib
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def batches(path, B, T, vocab, dev):
    """(x, y) pairs: consecutive windows of an llm.c shard (int32[256] header, uint16
    tokens), wrapping around; random tokens without a shard."""
    if not path:
        idx = torch.randint(0, vocab, (B, T + 1), device=dev)
        while True:
            yield idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    with open(path, "rb") as f:
        head = torch.frombuffer(bytearray(f.read(1024)), dtype=torch.int32)
        assert int(head[0]) == 20240520, f"{path}: not an llm.c token shard"
        tok = torch.frombuffer(bytearray(f.read()), dtype=torch.int16).to(torch.int64) & 0xFFFF
    n, pos = B * (T + 1), 0
    assert tok.numel() >= n, f"{path}: {tok.numel()} tokens, a batch needs {n}"
    while True:
        if pos + n > tok.numel():
            pos = 0
        w = tok[pos:pos + n].view(B, T + 1).to(dev)
        pos += n
        yield w[:, :-1].contiguous(), w[:, 1:].contiguous()


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
        with sdpa_backend():
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, c, seq, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(seq, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        for p in self.parameters():  # GPT-2's initialisation scale
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    a = argparse.ArgumentParser()
    for name, default in [("layers", 12), ("heads", 12), ("d-model", 768), ("seq", 1024),
                          ("vocab", 50304), ("batch", 8), ("steps", 30), ("warmup", 5)]:
        a.add_argument("--" + name, type=int, default=default)
    a.add_argument("--device", default="cuda")
    a.add_argument("--bf16", action="store_true")
    a.add_argument("--compile", action="store_true")
    a.add_argument("--data", help="an llm.c token shard (bench/gpu_train.py writes one)")
    o = a.parse_args()
    dev = torch.device(o.device)
    torch.manual_seed(1234)
    model = GPT(o.layers, o.heads, o.d_model, o.seq, o.vocab).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    fused = {"fused": True} if dev.type == "cuda" else {}  # (PyTorch 1.13 on a CPU has none)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.0, **fused)
    step_fn = torch.compile(model) if o.compile else model
    if dev.type == "cuda":  # what stays fp32 under autocast may use TF32, as weft's may not
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    data = batches(o.data, o.batch, o.seq, o.vocab, dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], math.nan
    for s in range(o.warmup + o.steps):
        sync()
        x, y = next(data)
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=o.bf16):
            l = step_fn(x, y)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if s >= o.warmup:
            times.append(time.perf_counter() - t0)
        loss = l.item()
    dt = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else math.nan
    print(json.dumps({"peer": f"PyTorch {torch.__version__}" + (" compiled" if o.compile else ""),
                      "params": n_params, "batch": o.batch, "seq": o.seq, "bf16": o.bf16,
                      "step_ms": dt * 1e3, "tokens_per_s": o.batch * o.seq / dt,
                      "peak_mib": peak, "loss": loss}))


if __name__ == "__main__":
    main()
