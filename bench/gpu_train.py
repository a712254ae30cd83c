#!/usr/bin/env python3
"""GPT-2 124M training on one GPU: weft against PyTorch in the same session.

    bench/gpu_train.py build/worker/worker [--batch 8] [--steps 30] [--warmup 5]
                       [--precision bf16] [--no-torch]

Runs weft's worker (model.preset=gpt2-small: 12 layers, 12 heads, d_model 768, T 1024,
runtime.device=cuda), then bench/torch_gpt2.py with the same model, batch and precision,
eager and with torch.compile. Prints one table: tokens/s (median step after the
warm-up), step time, MFU and device memory. MFU is weft's: its FLOPs per token (the
worker's tflops / tokens_per_s, the 6N + attention count of wf_model_flops_per_step) over
the GPU's nominal dense peak that the worker's banner names (989.4 TFLOP/s for an H100
SXM at bf16); the PyTorch rows use the same two numbers, so the column compares speed.
Without a GPU it says so and exits 0: benchmarks are never tests.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def weft(o, tmp):
    metrics = os.path.join(tmp, "weft.jsonl")
    cmd = [o.worker, "model.preset=gpt2-small", f"train.batch_size={o.batch}",
           f"train.steps={o.warmup + o.steps}", "train.eval_every=0", "runtime.device=cuda",
           f"precision={o.precision}", f"train.metrics={metrics}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        text = (p.stdout + p.stderr).strip()
        if "no GPU is usable" in text:
            print("no GPU: " + text.splitlines()[-1])
            sys.exit(0)
        sys.exit(f"weft exited {p.returncode}:\n{text[-3000:]}")
    rows = [json.loads(l) for l in open(metrics) if l.strip()][o.warmup:]
    peak = re.search(r"peak ([0-9.]+) TFLOP/s per rank for MFU \(([^)]*)\)", p.stdout)
    gpu = re.search(r"using GPU \d+ of \d+: ([^,]+)", p.stdout + p.stderr)
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    return {"name": "weft", "tokens_per_s": tps,
            "step_ms": statistics.median(r["step_ms"] for r in rows),
            "mem_mib": max(r["mem_mib"] for r in rows),
            "flops_per_token": statistics.median(r["tflops"] * 1e12 / r["tokens_per_s"]
                                                 for r in rows),
            "peak": float(peak.group(1)) if peak else 0.0,
            "peak_source": peak.group(2) if peak else "unknown",
            "gpu": gpu.group(1) if gpu else "?", "loss": rows[-1]["loss"]}


def torch_peer(o, compiled):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt2.py"), "--batch", str(o.batch),
           "--steps", str(o.steps), "--warmup", str(o.warmup)]
    cmd += ["--bf16"] if o.precision == "bf16" else []
    cmd += ["--compile"] if compiled else []
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return {"name": "PyTorch" + (" compiled" if compiled else ""),
                "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"name": r["peer"], "tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"],
            "mem_mib": r["peak_mib"], "loss": r["loss"]}


def main():
    a = argparse.ArgumentParser()
    a.add_argument("worker")
    a.add_argument("--batch", type=int, default=8)
    a.add_argument("--steps", type=int, default=30)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    a.add_argument("--no-torch", action="store_true")
    o = a.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [weft(o, tmp)]
    w = rows[0]
    if not o.no_torch:
        rows += [torch_peer(o, False), torch_peer(o, True)]
    print(f"GPT-2 124M, B={o.batch} T=1024, precision {o.precision}, on {w['gpu']}; MFU over "
          f"{w['peak']:.1f} TFLOP/s ({w['peak_source']}) at {w['flops_per_token'] / 1e9:.3f} "
          f"GFLOP per token")
    print("| | tokens/s | step ms | MFU | memory MiB | last loss |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | failed: {r['error']} | | | | |")
            continue
        mfu = r["tokens_per_s"] * w["flops_per_token"] / (w["peak"] * 1e12) if w["peak"] else 0
        print(f"| {r['name']} | {r['tokens_per_s']:.0f} | {r['step_ms']:.1f} | "
              f"{100 * mfu:.1f}% | {r['mem_mib']:.0f} | {r['loss']:.3f} |")


if __name__ == "__main__":
    main()
