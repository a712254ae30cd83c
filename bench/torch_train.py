#!/usr/bin/env python3
"""The PyTorch peer of bench/gpu_train.py: GPT-2 or Llama training steps, timed.

    torch_train.py [--model gpt2|llama|mixtral] [--layers 12 --heads 12 --d-model 768
                   --seq 1024 --vocab 50304] [--kv-heads N --ffn N --rope-theta X
                   --rope-scaling FACTOR,LOW,HIGH,OLD_CTX --untied] [--experts E --top-k K
                   --aux A] [--batch 8] [--steps 30] [--warmup 5]
                   [--device cuda] [--bf16] [--compile none|default|max-autotune]
                   [--compile-optimizer] [--sdpa auto|cudnn|flash|efficient|math]
                   [--data SHARD]

The models are bench/torch_models.py's (GPT-2 as weft and llm.c define it; Hugging
Face's LlamaForCausalLM, and MixtralForCausalLM with its loop over experts: bench/moe.py),
trained with AdamW under bf16 autocast (--bf16), PyTorch at
its best settings:

- attention through scaled_dot_product_attention with every backend allowed and
  PyTorch's own choice (--sdpa auto), or the named one first (--sdpa cudnn: cuDNN's,
  then the others in PyTorch's order; flash, efficient or math: that one alone). Which
  backend ran is recorded: the profiler's operator and kernel names over one extra step
  after the timed ones ("sdpa_ran"), and PyTorch's own dispatch answer for the model's
  q, k, v ("sdpa_choice", torch._fused_sdp_choice);
- torch.compile of the model in its default mode or `max-autotune` (--compile);
- the optimizer step (gradient clipping and AdamW) compiled too (--compile-optimizer:
  AdamW's for-each form, compiled in the default mode, as PyTorch's tutorial on compiling
  the optimizer does it); otherwise AdamW's fused CUDA kernel on a GPU;
- TF32 for what stays fp32 under autocast.

Timing is weft's (worker/train/step.c): a step is the cycle from the previous step's end
to this one's, the batch's fetch and the loss read back to the host included (both
trainers read the loss every step); the first step after start is its own span. The
figure is the median step over the `--steps` after `--warmup`; the window's mean
(every timed step's tokens over their summed time) is printed beside it. The batches are
consecutive windows of B x (T + 1) tokens of an llm.c token shard (--data: the file
bench/gpu_train.py also gives weft), else random tokens. Prints one JSON line.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402

BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
            "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
# What each SDPA backend leaves in a profile: its ATen operator (eager and compiled
# graphs call it) and its kernels' names (all a CUDA-graph replay leaves).
TRACES = {"cudnn": ("_scaled_dot_product_cudnn_attention", "cudnn_generated_fort_native_sdpa"),
          "flash": ("_scaled_dot_product_flash_attention", "flash_fwd", "flash_bwd"),
          "efficient": ("_scaled_dot_product_efficient_attention", "fmha_cutlass"),
          "math": ("_scaled_dot_product_attention_math",)}


def sdpa_context(choice):
    """The SDPA backends allowed: all, in PyTorch's order (auto); cuDNN's first, then the
    rest; or one alone."""
    if choice == "auto" or not hasattr(F, "scaled_dot_product_attention"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if choice == "cudnn":
        order = [getattr(SDPBackend, BACKENDS[k]) for k in ("cudnn", "flash", "efficient", "math")]
        return sdpa_kernel(order, set_priority=True)
    return sdpa_kernel([getattr(SDPBackend, BACKENDS[choice])])


def sdpa_choice(o, dev, dtype):
    """PyTorch's dispatch answer (torch._fused_sdp_choice) for q, k, v of the model's
    attention shape, under the same context: the backend its SDPA picks."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return f"none: PyTorch {torch.__version__} has no SDPA (the explicit softmax ran)"
    try:
        from torch.nn.attention import SDPBackend
        hs = o.d_model // o.heads
        q = torch.empty(o.batch, o.heads, o.seq, hs, device=dev, dtype=dtype)
        with sdpa_context(o.sdpa):
            return SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name
    except Exception as e:  # a private function: its absence is recorded, not fatal
        return f"unknown ({type(e).__name__}: {e})"


def sdpa_ran(names):
    """The backends whose operator or kernels a profile's event names show."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return "explicit softmax (no SDPA)"
    found = sorted(k for k, keys in TRACES.items() if any(x in n for n in names for x in keys))
    if found:
        return ",".join(found)
    near = sorted({n for n in names if any(w in n.lower() for w in ("attn", "attention", "sdpa",
                                                                    "fmha", "flash"))})
    return "none recognised" + (f" (attention-like names: {'; '.join(near[:4])})" if near else "")


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
        yield w[:, :-1].contiguous() % vocab, w[:, 1:].contiguous() % vocab


def build(o):
    if o.model == "gpt2":
        return torch_models.GPT(o.layers, o.heads, o.d_model, o.seq, o.vocab)
    scaling = None
    if o.rope_scaling:
        f, lo, hi, ctx = (float(x) for x in o.rope_scaling.split(","))
        scaling = {"factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
                   "original_max_position_embeddings": ctx}
    cfg = torch_models.LlamaConfig(o.layers, o.heads, o.kv_heads or o.heads, o.d_model, o.ffn,
                                   o.vocab, o.rope_theta, tied=not o.untied,
                                   rope_scaling=scaling)
    if o.model == "mixtral":
        cfg.E, cfg.K, cfg.aux = o.experts, o.top_k, o.aux
        return torch_models.Mixtral(cfg)
    return torch_models.Llama(cfg)


def optimizer(o, model, dev):
    """(AdamW, the step's function: clipping then AdamW's step)."""
    params = [p for p in model.parameters()]
    if o.compile_optimizer:
        opt = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.0, foreach=True)

        @torch.compile
        def step():
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
        return opt, step
    fused = {"fused": True} if dev.type == "cuda" else {}  # (PyTorch 1.13 on a CPU has none)
    opt = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.0, **fused)

    def step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return opt, step


def train(o, model, fwd, opt, opt_step, data, dev):
    """Steps' cycle times (seconds) after the warm-up, the first step's, the last loss."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times, first, loss = [], 0.0, math.nan
    sync()
    last_end = time.perf_counter()
    for s in range(o.warmup + o.steps):
        x, y = next(data)
        with sdpa_context(o.sdpa):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=o.bf16):
                l = fwd(x, y)
            l.backward()  # outside autocast, as PyTorch recommends
        opt_step()
        opt.zero_grad(set_to_none=True)
        loss = l.item()  # the host reads the loss, as weft's step does
        sync()
        end = time.perf_counter()
        if s == 0:
            first = end - last_end
        if s >= o.warmup:
            times.append(end - last_end)
        last_end = end
    return times, first, loss


def observe(o, fwd, opt, opt_step, data, dev):
    """One more step under the profiler: the names of its operators and kernels."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        with torch.profiler.profile(activities=acts) as prof:
            x, y = next(data)
            with sdpa_context(o.sdpa):
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=o.bf16):
                    l = fwd(x, y)
                l.backward()
            opt_step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        return sdpa_ran({e.name for e in prof.events()})
    except Exception as e:
        return f"not observed ({type(e).__name__}: {e})"


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--model", choices=["gpt2", "llama", "mixtral"], default="gpt2")
    for name, default in [("layers", 12), ("heads", 12), ("kv-heads", 0), ("d-model", 768),
                          ("ffn", 0), ("seq", 1024), ("vocab", 50304), ("batch", 8),
                          ("steps", 30), ("warmup", 5), ("experts", 8), ("top-k", 2)]:
        a.add_argument("--" + name, type=int, default=default)
    a.add_argument("--rope-theta", type=float, default=500000.0)
    a.add_argument("--aux", type=float, default=0.02, help="mixtral: router_aux_loss_coef")
    a.add_argument("--rope-scaling", help="llama3 scaling: FACTOR,LOW,HIGH,OLD_CTX")
    a.add_argument("--untied", action="store_true", help="Llama's head its own weight")
    a.add_argument("--device", default="cuda")
    a.add_argument("--bf16", action="store_true")
    a.add_argument("--compile", choices=["none", "default", "max-autotune"], default="none")
    a.add_argument("--compile-optimizer", action="store_true")
    a.add_argument("--sdpa", choices=["auto"] + sorted(BACKENDS), default="auto")
    a.add_argument("--data", help="an llm.c token shard (bench/gpu_train.py writes one)")
    o = a.parse_args()
    if o.compile != "none" or o.compile_optimizer:
        if not hasattr(torch, "compile"):
            sys.exit(f"torch_train: PyTorch {torch.__version__} has no torch.compile (2.0+)")
    dev = torch.device(o.device)
    torch.manual_seed(1234)
    # initialised where it trains (a device context needs PyTorch 2.0): a 1B model's
    # normal_ draws on one CPU would take seconds
    with dev if hasattr(torch, "compile") else contextlib.nullcontext():
        model = build(o).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt, opt_step = optimizer(o, model, dev)
    fwd = model if o.compile == "none" else torch.compile(
        model, mode=None if o.compile == "default" else o.compile)
    if dev.type == "cuda":  # what stays fp32 under autocast may use TF32, as weft's may not
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats()
    data = batches(o.data, o.batch, o.seq, o.vocab, dev)
    times, first, loss = train(o, model, fwd, opt, opt_step, data, dev)
    peak = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else None
    ran = observe(o, fwd, opt, opt_step, data, dev)
    dt = statistics.median(times)
    tokens = o.batch * o.seq
    name = "PyTorch " + torch.__version__ + ("" if o.compile == "none" else
                                             f" compiled ({o.compile})")
    print(json.dumps({
        "peer": name, "torch": torch.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "model": o.model, "params": n_params, "batch": o.batch, "seq": o.seq, "bf16": o.bf16,
        "compile": o.compile, "optimizer": ("AdamW for-each, compiled" if o.compile_optimizer
                                            else "AdamW fused" if dev.type == "cuda"
                                            else "AdamW"),
        "sdpa": o.sdpa, "sdpa_choice": sdpa_choice(o, dev, torch.bfloat16 if o.bf16 else
                                                   torch.float32),
        "sdpa_ran": ran, "step_ms": dt * 1e3, "tokens_per_s": tokens / dt,
        "window_tokens_per_s": tokens * len(times) / sum(times), "first_step_s": first,
        "peak_mib": peak, "loss": loss}))


if __name__ == "__main__":
    main()
