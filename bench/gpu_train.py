#!/usr/bin/env python3
"""Training on one GPU: weft against PyTorch in the same session, on the same tokens.

    bench/gpu_train.py build/worker/worker [--model gpt2-124m | llama-1b] [--batch 16 ...]
                       [--peers compile,max-autotune,compile-cudnn,eager | none]
                       [--steps 30] [--warmup 5] [--largest] [--device cuda | cpu]
                       [--probe PATH] [--results DIR] [--json FILE] [--timeout S]

The models (weft's preset, PyTorch's bench/torch_models.py):
  gpt2-124m  model.preset=gpt2-small: 12 layers, 12 heads, d_model 768, T 1024, bf16;
             batches 16 and 32 by default
  llama-1b   model.preset=llama-1b (Llama 3.2 1B: 16 layers, 32 heads over 8 kv heads,
             d_model 2048, SwiGLU 8192, vocabulary 128256, tied, RoPE theta 500000 with
             llama3 scaling) at T 2048, bf16; batch 8 by default
  gpt2-tiny, llama-tiny   the test models at T 64 (for the checks on a CPU)

The rows, each framework at its best settings: weft (precision=bf16, its tensor-core
attention by runtime.attention=auto, TF32 allowed), then the PyTorch peers --peers names
(bench/torch_train.py, bf16 autocast, TF32):
  compile        torch.compile, default mode; the optimizer step compiled; SDPA with every
                 backend allowed in PyTorch's own order
  max-autotune   the same in torch.compile's max-autotune mode (Triton GEMM templates
                 searched, CUDA graphs)
  compile-cudnn  the default mode with SDPA's cuDNN backend first
  eager          no torch.compile; fused AdamW; SDPA with every backend allowed
Each PyTorch row records which SDPA backend ran (the profile of one extra step) and which
PyTorch's dispatch chose. The fairest baseline is the fastest compiled row.

Every row is timed alike (worker/train/step.c's step): the cycle from one step's end to
the next's, the batch's fetch and the loss read back to the host included; the median
over --steps after --warmup (the mean over that window is kept too). MFU is weft's
convention: its FLOPs per token (the worker's tflops / tokens_per_s: 6N + 12 L T (NH hs))
over the nominal dense peak the worker's banner names (989.4 TFLOP/s for an H100 SXM or
an H200 at bf16), the same two numbers for every row, so the column compares speed;
llm.c's count (6N + 6 L T (NH hs), causal attention halved) is kept beside it
(`mfu_llmc`). Device memory is measured alike for every row: the most NVML reports in use
on the GPU while the run lives, less what was in use before it; each framework's own
figure beside it (weft's accounted memory, PyTorch's max_memory_allocated).

Output: one table per batch; --results DIR writes a results file (bench/results.py's
"gpu-train": the machine from tests/gpu/gpu_probe, weft's build id from `worker
--version`, every row), --json FILE the same record to FILE. --largest also finds the
largest batch each framework fits. Without a GPU (and --device cuda) it says so and
exits 0: benchmarks are never tests. --device cpu runs the same rows on the CPU (the
tiny models: the script's own check); PyTorch is then timed with glibc's allocator
kept from returning memory after every step (GLIBC_TUNABLES below, for every trainer
alike, bench/bench_env.py).
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
sys.path.insert(0, HERE)
import bench_env  # noqa: E402
import results  # noqa: E402

SHARD_MAGIC = 20240520

# name: weft's keys, torch_train.py's arguments, (L, T, NH hs) for the attention term
MODELS = {
    "gpt2-124m": (["model.preset=gpt2-small"],
                  ["--model", "gpt2", "--layers", "12", "--heads", "12", "--d-model", "768",
                   "--seq", "1024", "--vocab", "50304"], (12, 1024, 768), 50257, [16, 32]),
    "llama-1b": (["model.preset=llama-1b", "train.seq_len=2048"],
                 ["--model", "llama", "--layers", "16", "--heads", "32", "--kv-heads", "8",
                  "--d-model", "2048", "--ffn", "8192", "--seq", "2048", "--vocab", "128256",
                  "--rope-theta", "500000", "--rope-scaling", "32,1,4,8192"],
                 (16, 2048, 2048), 65536, [8]),
    "gpt2-tiny": (["model.preset=gpt2-tiny"],
                  ["--model", "gpt2", "--layers", "4", "--heads", "4", "--d-model", "64",
                   "--seq", "64", "--vocab", "256"], (4, 64, 64), 256, [4]),
    "llama-tiny": (["model.preset=llama-tiny"],
                   ["--model", "llama", "--layers", "4", "--heads", "4", "--kv-heads", "2",
                    "--d-model", "64", "--ffn", "192", "--seq", "64", "--vocab", "256",
                    "--rope-theta", "10000", "--untied"], (4, 64, 64), 256, [4]),
}
PEERS = {
    "compile": ("torch.compile", ["--compile", "default", "--compile-optimizer"]),
    "max-autotune": ("torch.compile max-autotune",
                     ["--compile", "max-autotune", "--compile-optimizer"]),
    "compile-cudnn": ("torch.compile, cuDNN attention first",
                      ["--compile", "default", "--compile-optimizer", "--sdpa", "cudnn"]),
    "eager": ("PyTorch eager", []),
}
TIMED_OUT = "did not finish in the time --timeout left it"


class DeviceMemory:
    """The most device memory in use on GPU 0 while a child process runs, in MiB above
    what was in use when it started, polled from NVML every 20 ms; None without NVML."""

    class Info(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def __init__(self, on):
        self.nvml, self.handle = None, ctypes.c_void_p()
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1") if on else None
            if nvml and nvml.nvmlInit_v2() == 0 and \
                    nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.handle)) == 0:
                self.nvml = nvml
        except OSError:
            pass

    def used(self):
        info = self.Info()
        if self.nvml.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(info)) != 0:
            return 0
        return info.used

    def run(self, cmd, timeout, env):
        """subprocess.run(cmd) while polling; returns (CompletedProcess, peak MiB or None,
        the process's wall seconds: start-up, compilation and every step)."""
        t0 = time.monotonic()
        if not self.nvml:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            return p, None, time.monotonic() - t0
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
        return p, max(0, peak[0] - base) / 2**20, time.monotonic() - t0


def write_shard(path, tokens, vocab, seed=1234):
    """An llm.c token shard (int32[256] header: magic, version, count; uint16 tokens) of
    seeded random tokens below vocab."""
    raw = array.array("H", random.Random(seed).randbytes(2 * tokens))
    toks = array.array("H", (x % vocab for x in raw))
    if sys.byteorder != "little":
        toks.byteswap()
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", SHARD_MAGIC, 1, tokens, *([0] * 253)))
        toks.tofile(f)


def env_for(o, torch):
    """Every trainer's environment: GLIBC_TUNABLES alike; PyTorch loads the CUDA libraries
    of its own wheels, so a weft bundle's CUDA folders (env.sh) are taken off its path."""
    env = bench_env.for_torch(bench_env.alike()) if torch else bench_env.alike()
    if o.device == "cpu":
        env.setdefault("OMPI_MCA_ess_singleton_isolated", "1")
    return env


def left(o):
    return max(1.0, o.deadline - time.monotonic())


def weft(o, batch, shard, tmp):
    metrics = os.path.join(tmp, f"weft-{o.model}-{batch}.jsonl")
    cmd = [o.worker] + MODELS[o.model][0] + [
        f"train.batch_size={batch}", f"train.steps={o.warmup + o.steps}", "train.eval_every=0",
        f"runtime.device={o.device}", "precision=bf16", "runtime.allow_tf32=true",
        f"data.path={shard}", f"train.metrics={metrics}"]
    try:
        p, dev_mib, wall = o.memory.run(cmd, left(o), env_for(o, False))
    except subprocess.TimeoutExpired:
        return {"name": "weft", "error": TIMED_OUT}
    text = p.stdout + p.stderr
    if p.returncode != 0:
        if "no GPU is usable" in text:
            print("no GPU: " + text.strip().splitlines()[-1])
            sys.exit(0)
        return {"name": "weft", "error": (text.strip().splitlines() or ["?"])[-1][:200]}
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    rows = lines[o.warmup:]
    peak = re.search(r"peak ([0-9.]+) TFLOP/s per rank for MFU \(([^)]*)\)", text)
    gpu = re.search(r"using GPU \d+ of \d+: ([^,]+)", text)
    attn = re.findall(r"attention, B .*", text)
    return {"name": "weft", "attention": attn[0] if attn else "",
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
            "step_ms": statistics.median(r["step_ms"] for r in rows),
            "window_tokens_per_s": batch * T(o) * len(rows) / sum(r["step_ms"] / 1e3
                                                                    for r in rows),
            "first_step_s": lines[0]["step_ms"] / 1e3, "wall_s": wall,
            "own_mib": max(r["mem_mib"] for r in rows), "device_mib": dev_mib,
            "launches": statistics.median(r.get("launches", 0) for r in rows),
            "flops_per_token": statistics.median(r["tflops"] * 1e12 / r["tokens_per_s"]
                                                 for r in rows),
            "peak": float(peak.group(1)) if peak else 0.0,
            "peak_source": peak.group(2) if peak else "unknown",
            "gpu": gpu.group(1) if gpu else o.device, "loss": rows[-1]["loss"]}


def T(o):
    return MODELS[o.model][2][1]


def torch_peer(o, batch, shard, peer):
    name, args = PEERS[peer]
    cmd = [sys.executable, os.path.join(HERE, "torch_train.py")] + MODELS[o.model][1] + [
        "--batch", str(batch), "--steps", str(o.steps), "--warmup", str(o.warmup), "--data",
        shard, "--device", o.device, "--bf16"] + args
    try:
        p, dev_mib, wall = o.memory.run(cmd, left(o), env_for(o, True))
    except subprocess.TimeoutExpired:
        return {"name": name, "error": TIMED_OUT}
    if p.returncode != 0:
        return {"name": name, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    keep = ("torch", "compile", "optimizer", "sdpa", "sdpa_choice", "sdpa_ran", "tokens_per_s",
            "step_ms", "window_tokens_per_s", "first_step_s", "loss")
    return {"name": name, **{k: r[k] for k in keep}, "own_mib": r["peak_mib"],
            "device_mib": dev_mib, "wall_s": wall}


def runs(o, batch, shard, tmp):
    """weft's row, then each peer's, at one batch."""
    return [weft(o, batch, shard, tmp)] + [torch_peer(o, batch, shard, p) for p in o.peers]


def largest(run, start):
    """The largest batch in start, 1.5x, 1.33x, ... whose run succeeds, and its row."""
    best, b = None, start
    while True:
        r = run(b)
        if "error" in r:
            return best
        best = (b, r)
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3  # 64, 96, 128, 192, ...


def add_mfu(o, rows, w):
    """MFU of every row from weft's FLOPs per token and peak; llm.c's count beside it."""
    L, t, A = MODELS[o.model][2]
    llmc = w["flops_per_token"] - 6.0 * L * t * A  # weft's 12 L T A less half of it
    for r in rows:
        if "error" in r or not w.get("peak"):
            continue
        r["mfu"] = r["tokens_per_s"] * w["flops_per_token"] / (w["peak"] * 1e12)
        r["mfu_llmc"] = r["tokens_per_s"] * llmc / (w["peak"] * 1e12)


def print_table(batch, rows, o):
    print(f"\nB={batch} T={T(o)}")
    print("| | tokens/s | step ms | MFU (llm.c's) | device MiB (NVML) | own MiB | launches | "
          "SDPA ran | first step s | run s | last loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | failed: {r['error']} | | | | | | | | | |")
            continue
        f = lambda k, d=0: "" if r.get(k) is None else f"{r[k]:,.{d}f}"
        mfu = "" if "mfu" not in r else f"{100 * r['mfu']:.1f}% ({100 * r['mfu_llmc']:.1f}%)"
        print(f"| {r['name']} | {f('tokens_per_s')} | {f('step_ms', 1)} | {mfu} | "
              f"{f('device_mib')} | {f('own_mib')} | {f('launches')} | "
              f"{r.get('sdpa_ran', '')} | {f('first_step_s', 1)} | {f('wall_s')} | "
              f"{f('loss', 3)} |")


def probe_machine(o, torch_version):
    probe = o.probe or os.path.join(os.path.dirname(os.path.abspath(o.worker)), "..", "tests",
                                    "gpu", "gpu_probe")
    try:
        out = subprocess.run([probe], capture_output=True, text=True, timeout=120).stdout
        facts = json.loads(out[out.index("{"):out.rindex("}") + 1])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        facts = {}
    m = results.machine(facts, torch_version)
    if o.device == "cpu":
        m["gpu"] = "none"
    return m


def record(o, results_runs, w):
    L, t, A = MODELS[o.model][2]
    torch_version = next((r["torch"] for _, rows in results_runs for r in rows if "torch" in r),
                         None)
    figures = {"model": o.model, "seq": T(o), "precision": "bf16", "device": o.device,
               "steps": o.steps, "warmup": o.warmup, "peak_tflops": w["peak"],
               "peak_source": w["peak_source"], "flops_per_token": w["flops_per_token"],
               "flops_per_token_llmc": w["flops_per_token"] - 6.0 * L * t * A,
               "timing": "median step: the cycle from one step's end to the next's, the batch's "
                         "fetch and the loss read back included, after the warm-up",
               "runs": [{"batch": b, "rows": rows} for b, rows in results_runs]}
    return results.record("gpu-train", figures, probe_machine(o, torch_version),
                          results.build_id(o.worker))


def main():
    a = argparse.ArgumentParser()
    a.add_argument("worker")
    a.add_argument("--model", choices=sorted(MODELS), default="gpt2-124m")
    a.add_argument("--batch", type=int, action="append",
                   help="a batch to compare (repeatable; default the model's)")
    a.add_argument("--peers", default="compile,max-autotune,compile-cudnn,eager",
                   help="comma-separated PyTorch rows, of " + ", ".join(PEERS) + "; or none")
    a.add_argument("--largest", action="store_true",
                   help="also the largest batch weft and the first peer fit")
    a.add_argument("--steps", type=int, default=30)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a.add_argument("--probe", help="tests/gpu/gpu_probe (default: beside the worker's build)")
    a.add_argument("--results", help="write a results file (bench/results.py) into this folder")
    a.add_argument("--json", help="write the results record to this file")
    a.add_argument("--timeout", type=float, default=3600,
                   help="seconds for all runs together (the last runs get what is left)")
    o = a.parse_args()
    o.peers = [] if o.peers == "none" else o.peers.split(",")
    bad = [p for p in o.peers if p not in PEERS]
    if bad:
        sys.exit(f"gpu_train: --peers {','.join(bad)}: not one of {', '.join(PEERS)}")
    o.deadline = time.monotonic() + o.timeout
    o.memory = DeviceMemory(o.device == "cuda")
    batches = o.batch or MODELS[o.model][4]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        shard = os.path.join(tmp, "tokens.bin")
        write_shard(shard, max(8 << 20, 64 * max(batches) * (T(o) + 1)), MODELS[o.model][3])
        for b in batches:
            out.append((b, runs(o, b, shard, tmp)))
        if o.largest:
            found = [largest(lambda b: weft(o, b, shard, tmp), 2 * max(batches))]
            if o.peers:
                found.append(largest(lambda b: torch_peer(o, b, shard, o.peers[0]),
                                     2 * max(batches)))
            out += [(f[0], [f[1]]) for f in found if f]
    w = next((r for _, rows in out for r in rows if r["name"] == "weft" and "error" not in r),
             None)
    if not w:
        sys.exit("weft failed at every batch: " + out[0][1][0].get("error", "?"))
    for _, rows in out:
        add_mfu(o, rows, w)
    print(f"{o.model}, T={T(o)}, bf16, on {w['gpu']}; MFU over {w['peak']:.1f} TFLOP/s "
          f"({w['peak_source']}) at {w['flops_per_token'] / 1e9:.3f} GFLOP per token (llm.c's "
          f"count in brackets); weft's {w['attention'] or 'attention: not logged'}")
    for b, rows in out:
        print_table(b, rows, o)
    rec = record(o, out, w)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(rec, f, indent=1)
    if o.results:
        print("results file: " + results.write(o.results, rec))


if __name__ == "__main__":
    main()
