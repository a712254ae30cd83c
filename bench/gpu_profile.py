#!/usr/bin/env python3
"""Where one training step's GPU time goes, kernel by kernel, from Nsight Compute.

    bench/gpu_profile.py build/worker/worker [--batch 16] [--precision bf16] [--ncu ncu]
                         [--csv FILE] [--json FILE] [--timeout S]
    bench/gpu_profile.py --from-csv FILE [--step-ms MS]

GPT-2 124M at T 1024 on one GPU, with bench/gpu_train.py's settings and token shard. Two
runs of the worker: a plain one (8 steps) for the median step time and the kernel
launches a step (the metrics' `launches`), then one under `ncu --metrics
gpu__time_duration.sum` that profiles about three steps' kernels past set-up and the
first steps (skipped by the plain run's counts; a cuBLASLt or cuDNN call is one launch to
weft and may be several kernels to ncu, so the window starts early and runs long). One
step is the kernels from an embedding_forward_kernel, each step's embedding, to the next.

Prints each kernel's total time and count in that step, the time by what the kernels
do (GEMMs, attention, column sums, elementwise, ...) and their sum against the plain
run's step time: the rest is time with no kernel running (host work and launch gaps,
memsets and copies, synchronizations). --csv keeps ncu's output; --from-csv analyses one
kept before (with --step-ms for the comparison; a capture of fewer than two steps is
taken whole). Without a GPU or without ncu it says so and exits 0: benchmarks are never
tests.
"""
import argparse
import collections
import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_train  # noqa: E402  (the shard, the worker's command line, the timeout)

STEP_START = "embedding_forward_kernel"
# What a kernel does, by its name (the first match wins); the order is the table's.
GROUPS = [
    ("GEMMs (cuBLASLt)", r"nvjet|gemm|xmma|cutlass|splitKreduce"),
    ("attention", r"cudnn|sdpa|flash|attn|attention"),
    ("column sums (bias, norm weight gradients)",
     r"colsum|bias_grad|norm_params|bias_backward|backward_params"),
    ("layernorm, RMSNorm", r"layernorm|rmsnorm|normalize"),
    ("GELU, SwiGLU", r"gelu|swiglu"),
    ("residual", r"residual"),
    ("cross-entropy", r"xent|classifier|::stats_kernel|::grad_kernel"),
    ("stores and loads (rounding to the format)", r"store_kernel|load_kernel|round"),
    ("AdamW", r"adamw"),
    ("reductions (norm, loss)", r"sumsq|small_kernel|grid_kernel|finish|loss"),
    ("embedding", r"encoder"),
    ("other", r"."),
]


def parse(text):
    """[(kernel name, ns)] in launch order from ncu's --csv output (other lines ignored)."""
    lines = [l for l in text.splitlines() if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if not rows or "Kernel Name" not in rows[0]:
        return []
    h = rows[0]
    name, metric, value = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
    return [(re.sub(r"\(.*", "", r[name]).strip(), float(r[value].replace(",", "")))
            for r in rows[1:] if len(r) == len(h) and r[metric] == "gpu__time_duration.sum"]


def one_step(kernels):
    """The kernels from the first step start to the next (all of them with fewer than
    two starts) and how many complete steps the capture held."""
    starts = [i for i, (n, _) in enumerate(kernels) if n.endswith(STEP_START)]
    if len(starts) < 2:
        return kernels, 0
    return kernels[starts[0]:starts[1]], len(starts) - 1


def group_of(name):
    return next(g for g, rx in GROUPS if re.search(rx, name, re.I))


def report(kernels, step_ms, whole):
    by_name = collections.defaultdict(lambda: [0, 0.0])
    by_group = collections.defaultdict(lambda: [0, 0.0])
    for n, ns in kernels:
        for d, k in ((by_name, n), (by_group, group_of(n))):
            d[k][0] += 1
            d[k][1] += ns / 1e6
    total = sum(ms for _, ms in by_group.values())
    what = "the whole capture" if whole else "one step"
    print(f"{len(kernels)} kernels in {what}, {total:.2f} ms of kernel time"
          + (f", step {step_ms:.2f} ms: {step_ms - total:.2f} ms "
             f"({100 * (step_ms - total) / step_ms:.1f}%) with no kernel running"
             if step_ms else ""))
    print("\n| kernels | launches | ms | share |\n|---|---:|---:|---:|")
    for g, _ in GROUPS:
        if g in by_group:
            c, ms = by_group[g]
            print(f"| {g} | {c} | {ms:.3f} | {100 * ms / total:.1f}% |")
    print("\n| kernel | launches | ms | us each |\n|---|---:|---:|---:|")
    for n, (c, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"| `{n[:90]}` | {c} | {ms:.3f} | {1000 * ms / c:.1f} |")
    return {"kernels": len(kernels), "kernel_ms": total, "step_ms": step_ms,
            "groups": {g: {"launches": c, "ms": ms} for g, (c, ms) in by_group.items()},
            "by_kernel": {n: {"launches": c, "ms": ms} for n, (c, ms) in by_name.items()}}


def profile(o, tmp):
    """(ncu's output, the plain run's step ms) or exits when there is nothing to run on."""
    ncu = shutil.which(o.ncu)
    if not ncu:
        print(f"no {o.ncu} on PATH: nothing profiled")
        sys.exit(0)
    shard = os.path.join(tmp, "tokens.bin")
    gpu_train.write_shard(shard, 1 << 20)
    o.steps, o.warmup, o.deadline = 6, 2, time.monotonic() + o.timeout
    plain = gpu_train.weft(o, o.batch, shard, tmp)
    if "error" in plain:
        sys.exit("weft failed: " + plain["error"])
    rows = [json.loads(l) for l in open(os.path.join(tmp, f"weft-{o.batch}.jsonl")) if l.strip()]
    first, per_step = rows[0]["launches"], int(plain["launches"])
    metrics = os.path.join(tmp, "profiled.jsonl")
    # --clock-control none: ncu's default locks the GPU to its base clock, which made the
    # step's kernels add up to more than the unprofiled step (38.2 against 35.4 ms, H100)
    cmd = [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv",
           "--launch-skip", str(first + per_step), "--launch-count", str(3 * per_step)]
    cmd += gpu_train.weft_command(o, o.batch, shard, metrics)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=gpu_train.left(o))
    if p.returncode != 0:
        sys.exit(f"ncu exited {p.returncode}: " + (p.stdout + p.stderr).strip()[-2000:])
    return p.stdout, plain["step_ms"]


def main():
    a = argparse.ArgumentParser()
    a.add_argument("worker", nargs="?")
    a.add_argument("--batch", type=int, default=16)
    a.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    a.add_argument("--ncu", default="ncu")
    a.add_argument("--csv", help="keep ncu's output here")
    a.add_argument("--json", help="write the tables to this file")
    a.add_argument("--from-csv", help="analyse ncu's output kept before")
    a.add_argument("--step-ms", type=float, default=0.0, help="with --from-csv: the step time")
    a.add_argument("--timeout", type=float, default=300)
    o = a.parse_args()
    if o.from_csv:
        text, step_ms = open(o.from_csv).read(), o.step_ms
    elif o.worker:
        with tempfile.TemporaryDirectory() as tmp:
            text, step_ms = profile(o, tmp)
    else:
        a.error("give the worker, or --from-csv")
    if o.csv:
        with open(o.csv, "w") as f:
            f.write(text)
    kernels = parse(text)
    if not kernels:
        sys.exit("no kernel times in ncu's output")
    step, complete = one_step(kernels)
    result = report(step, step_ms, complete == 0)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
