#!/usr/bin/env python3
"""GPT-2 124M training on one GPU: weft against PyTorch in the same session.

    bench/gpu_train.py build/worker/worker [--batch 16 --batch 32] [--largest]
                       [--steps 30] [--warmup 5] [--precision bf16] [--eager]
                       [--no-torch] [--json FILE] [--timeout S]

The comparison that matters, by default: GPT-2 124M (model.preset=gpt2-small: 12
layers, 12 heads, d_model 768, T 1024), bf16, at B 16 and B 32, each framework at its
best settings (weft: precision=bf16 with its tensor-core attention, runtime.attention
auto; PyTorch: torch.compile, scaled_dot_product_attention's flash backend, fused AdamW,
bf16 autocast, bench/torch_gpt2.py), both on the same tokens: an llm.c token shard of
random GPT-2 tokens written here once (seeded) and given to both. --largest also finds
the largest batch each framework fits (the next of 48, 64, 96, 128, ... until a run
fails) and times it; --eager adds PyTorch without torch.compile.

One table per batch: tokens/s (median step after the warm-up), step time, MFU, device
memory and weft's kernel launches per step (metrics `launches`). MFU is weft's: its
FLOPs per token (the worker's tflops / tokens_per_s, the 6N + attention count of
wf_model_flops_per_step) over the GPU's nominal dense peak that the worker's banner
names (989.4 TFLOP/s for an H100 SXM at bf16); the PyTorch rows use the same two
numbers, so the column compares speed. Peak device memory is measured the same way for
every row: the most the driver (NVML) reports in use on the GPU while the run's process
lives, less what was in use before it started (CUDA context, caching allocators and
workspaces included); each framework's own figure is printed beside it (weft's
accounted mem, PyTorch's max_memory_allocated). --json writes the rows ("rows": the
first batch's, "runs": every batch's). Without a GPU it says so and exits 0: benchmarks
are never tests (scripts/gpu-check.sh asks tests/gpu/gpu_probe first).
"""
import argparse
import array
import ctypes
import json
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
T, VOCAB = 1024, 50257


class DeviceMemory:
    """The most device memory in use on GPU 0 while a child process runs, in MiB above
    what was in use when it started, polled from NVML every 20 ms; None without NVML."""

    class Info(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def __init__(self):
        self.nvml, self.handle = None, ctypes.c_void_p()
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            if nvml.nvmlInit_v2() == 0 and \
                    nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)) == 0:
                self.nvml = nvml
        except OSError:
            pass

    def used(self):
        info = self.Info()
        if self.nvml.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(info)) != 0:
            return 0
        return info.used

    def run(self, cmd, timeout, env=None):
        """subprocess.run(cmd) while polling; returns (CompletedProcess, peak MiB or None)."""
        if not self.nvml:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  env=env), None
        base, peak, done = self.used(), [0], threading.Event()

        def poll():
            while not done.wait(0.02):
                peak[0] = max(peak[0], self.used())
        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        finally:
            done.set()
            t.join()
        return p, max(0, peak[0] - base) / 2**20


MEMORY = DeviceMemory()
TIMED_OUT = "did not finish in the time --timeout left it"


def write_shard(path, tokens, seed=1234):
    """An llm.c token shard (int32[256] header: magic, version, count; uint16 tokens) of
    seeded random GPT-2 tokens."""
    raw = array.array("H", random.Random(seed).randbytes(2 * tokens))
    toks = array.array("H", (x % VOCAB for x in raw))
    if sys.byteorder != "little":
        toks.byteswap()
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, tokens, *([0] * 253)))
        toks.tofile(f)


def weft_command(o, batch, shard, metrics):
    return [o.worker, "model.preset=gpt2-small", f"train.batch_size={batch}",
            f"train.steps={o.warmup + o.steps}", "train.eval_every=0", "runtime.device=cuda",
            f"precision={o.precision}", "runtime.allow_tf32=true", f"data.path={shard}",
            f"train.metrics={metrics}"]


def weft(o, batch, shard, tmp):
    metrics = os.path.join(tmp, f"weft-{batch}.jsonl")
    cmd = weft_command(o, batch, shard, metrics)
    try:
        p, dev_mib = MEMORY.run(cmd, left(o))
    except subprocess.TimeoutExpired:
        return {"name": "weft", "error": TIMED_OUT}
    if p.returncode != 0:
        text = (p.stdout + p.stderr).strip()
        if "no GPU is usable" in text:
            print("no GPU: " + text.splitlines()[-1])
            sys.exit(0)
        return {"name": "weft", "error": (text.splitlines() or ["?"])[-1][:200]}
    rows = [json.loads(l) for l in open(metrics) if l.strip()][o.warmup:]
    peak = re.search(r"peak ([0-9.]+) TFLOP/s per rank for MFU \(([^)]*)\)", p.stdout)
    gpu = re.search(r"using GPU \d+ of \d+: ([^,]+)", p.stdout + p.stderr)
    attn = re.findall(r"attention, B .*", p.stdout + p.stderr)
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    return {"name": "weft", "tokens_per_s": tps,
            "step_ms": statistics.median(r["step_ms"] for r in rows),
            "mem_mib": max(r["mem_mib"] for r in rows), "device_mib": dev_mib,
            "launches": statistics.median(r.get("launches", 0) for r in rows),
            "flops_per_token": statistics.median(r["tflops"] * 1e12 / r["tokens_per_s"]
                                                 for r in rows),
            "peak": float(peak.group(1)) if peak else 0.0,
            "peak_source": peak.group(2) if peak else "unknown",
            "attention": attn[0] if attn else "?",
            "gpu": gpu.group(1) if gpu else "?", "loss": rows[-1]["loss"]}


def torch_peer(o, batch, shard, compiled):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt2.py"), "--batch", str(batch),
           "--steps", str(o.steps), "--warmup", str(o.warmup), "--data", shard]
    cmd += ["--bf16"] if o.precision == "bf16" else []
    cmd += ["--compile"] if compiled else []
    name = "PyTorch" + (" compiled" if compiled else " eager")
    try:
        p, dev_mib = MEMORY.run(cmd, left(o), env=torch_env())
    except subprocess.TimeoutExpired:
        return {"name": name, "error": TIMED_OUT}
    if p.returncode != 0:
        return {"name": name, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"name": r["peer"], "tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"],
            "mem_mib": r["peak_mib"], "device_mib": dev_mib, "loss": r["loss"]}


def left(o):
    return max(1.0, o.deadline - time.monotonic())


def torch_env():
    """PyTorch loads the CUDA libraries of its own wheels: a weft bundle's env.sh puts
    CUDA folders on LD_LIBRARY_PATH for weft's modules, so they are taken out here."""
    env = dict(os.environ)
    cuda = set(filter(None, env.get("WEFT_CUDA_LIBS", "").split(":")))
    keep = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d and d not in cuda]
    env["LD_LIBRARY_PATH"] = ":".join(keep)
    return env


def runs(o, batch, shard, tmp):
    """weft's row, then PyTorch's (compiled, and eager with --eager) at one batch."""
    rows = [weft(o, batch, shard, tmp)]
    if not o.no_torch:
        rows += [torch_peer(o, batch, shard, True)]
        rows += [torch_peer(o, batch, shard, False)] if o.eager else []
    return rows


def largest(o, run, start):
    """The largest batch in 48, 64, 96, 128, ... whose run succeeds, and its row."""
    best, b = None, start
    while True:
        r = run(b)
        if "error" in r:
            return best
        best = (b, r)
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3  # 64, 96, 128, 192, ...


def table(batch, rows, w):
    print(f"\nB={batch} T={T}")
    print("| | tokens/s | step ms | MFU | device memory MiB (NVML) | own figure MiB | "
          "launches/step | last loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | failed: {r['error']} | | | | | | |")
            continue
        r["mfu"] = r["tokens_per_s"] * w["flops_per_token"] / (w["peak"] * 1e12) \
            if w.get("peak") else 0
        dev = f"{r['device_mib']:.0f}" if r.get("device_mib") is not None else "n/a"
        launches = f"{r['launches']:.0f}" if "launches" in r else ""
        print(f"| {r['name']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | "
              f"{100 * r['mfu']:.1f}% | {dev} | {r['mem_mib']:.0f} | {launches} | "
              f"{r['loss']:.3f} |")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("worker")
    a.add_argument("--batch", type=int, action="append",
                   help="a batch to compare (repeatable; default 16 and 32)")
    a.add_argument("--largest", action="store_true",
                   help="also the largest batch each framework fits")
    a.add_argument("--steps", type=int, default=30)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    a.add_argument("--eager", action="store_true", help="also PyTorch without torch.compile")
    a.add_argument("--no-torch", action="store_true")
    a.add_argument("--json", help="write the rows and settings to this file")
    a.add_argument("--timeout", type=float, default=3600,
                   help="seconds for all runs together (the last runs get what is left)")
    o = a.parse_args()
    o.deadline = time.monotonic() + o.timeout
    batches = o.batch or [16, 32]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        shard = os.path.join(tmp, "tokens.bin")
        write_shard(shard, 8 << 20)  # 8 Mi tokens: >= 60 batches of 128 x 1025
        for b in batches:
            results.append((b, runs(o, b, shard, tmp)))
        if o.largest:
            lw = largest(o, lambda b: weft(o, b, shard, tmp), 48)
            lt = None if o.no_torch else largest(o, lambda b: torch_peer(o, b, shard, True), 48)
            for found in (lw, lt):
                if found:
                    results.append((found[0], [found[1]]))
    w = next((r for _, rows in results for r in rows if r["name"] == "weft" and "error" not in r),
             None)
    if not w:
        sys.exit("weft failed at every batch: " + results[0][1][0].get("error", "?"))
    print(f"GPT-2 124M, T={T}, precision {o.precision}, on {w['gpu']}; MFU over "
          f"{w['peak']:.1f} TFLOP/s ({w['peak_source']}) at {w['flops_per_token'] / 1e9:.3f} "
          f"GFLOP per token; weft's {w['attention']}")
    for b, rows in results:
        table(b, rows, w)
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"batch": results[0][0], "seq": T, "precision": o.precision,
                       "steps": o.steps, "warmup": o.warmup, "gpu": w["gpu"],
                       "peak_tflops": w["peak"], "peak_source": w["peak_source"],
                       "flops_per_token": w["flops_per_token"], "rows": results[0][1],
                       "runs": [{"batch": b, "rows": rows} for b, rows in results]},
                      f, indent=1)


if __name__ == "__main__":
    main()
