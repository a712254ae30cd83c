#!/usr/bin/env python3
"""Step time while a checkpoint is written in the background (train.checkpoint_async).

    python3 bench/ckpt_async.py [--worker build/worker/worker] [--steps 24] [--every 8]
                                [--dir /tmp] [--out FILE] [key=value ...]

GPT-2 124M (model.preset=gpt2-small, batch 1 x 64 tokens) on one rank, three runs of
--steps steps: without a checkpoint directory; with a checkpoint every --every steps
written at once; and the same written in the background. A checkpoint of this model is
1.49 GB (the model file's 0.5 GB and AdamW's 1 GB). From each run's metrics (step_ms,
and `time`, when the step ended) and log (`checkpoint: step N saved ... in X s`, and for a
background write `the step paused P s for its snapshot`) it prints:
  - the median step without checkpoints (steps 3 on: 1 and 2 warm up);
  - for the background run, the steps a write overlapped entirely (the step began after
    the snapshot and ended before the write did), their median, and its ratio to the
    run without: the goal is at most 1.10;
  - what a checkpoint costs the training at its boundary: the whole write for a
    checkpoint written at once, the snapshot for one written in the background.
Extra key=value arguments go to every run (e.g. train.batch_size=4).
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_env import emit

SAVED = re.compile(r"checkpoint: step (\d+) saved to \S+ in ([0-9.]+) s"
                   r"(?: \(in the background; the step paused ([0-9.]+) s)?")


def run(worker, args, tmp, tag):
    metrics = os.path.join(tmp, tag + ".jsonl")
    cmd = [worker, "model.preset=gpt2-small", "train.batch_size=1", "train.seq_len=64",
           "train.eval_every=0", "train.checkpoint_minutes=0", "train.log_every=1000",
           f"train.metrics={metrics}"] + args
    env = dict(os.environ, OMPI_MCA_ess_singleton_isolated="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    rows = {r["step"]: r for r in (json.loads(line) for line in open(metrics) if line.strip())}
    saves = [(int(s), float(x), float(pz) if pz else None)
             for s, x, pz in SAVED.findall(p.stdout + p.stderr)]
    return rows, saves


def overlapped(rows, saves):
    """step_ms of the steps a background write covered entirely: the write of step k began
    at its boundary (time[k]) and lasted X s."""
    out = []
    for k, x, paused in saves:
        if paused is None or k not in rows:
            continue
        begin, end = rows[k]["time"] + paused, rows[k]["time"] + x
        for j, r in rows.items():
            start = r["time"] - r["step_ms"] / 1000.0
            if j > k and start >= begin and r["time"] <= end:
                out.append(r["step_ms"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="build/worker/worker")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--out", default=None)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="weft-ckpt-async-", dir=a.dir)
    base = [f"train.steps={a.steps}"] + a.extra
    ck = ["train.checkpoint_every=%d" % a.every, "train.keep_checkpoints=1",
          "train.resume=never"]
    try:
        none, _ = run(a.worker, base, tmp, "none")
        sync, sync_saves = run(a.worker, base + ck + [f"train.checkpoint_dir={tmp}/sync"], tmp,
                               "sync")
        bg, bg_saves = run(a.worker, base + ck + [f"train.checkpoint_dir={tmp}/bg",
                                                  "train.checkpoint_async=true"], tmp, "bg")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    free = statistics.median(r["step_ms"] for s, r in none.items() if s >= 3)
    cov = overlapped(bg, bg_saves)
    lines = [f"bench/ckpt_async.py, {time.strftime('%Y-%m-%d')}, {platform.node()}, "
             f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
             f"GPT-2 124M, one rank, batch 1 x 64, {a.steps} steps, a checkpoint every "
             f"{a.every} (1.49 GB) {' '.join(a.extra)}".rstrip(),
             f"step without checkpoints (median, steps 3-{a.steps}): {free:.0f} ms"]
    if cov:
        med = statistics.median(cov)
        lines.append(f"steps a background write covered entirely: {len(cov)}, median "
                     f"{med:.0f} ms: {med / free:.2f}x the step without (goal: 1.10x)")
    else:
        lines.append("no step was covered entirely by a background write (each ended within "
                     "the step after its snapshot)")
    for k, x, _ in sync_saves:
        if k < a.steps:
            lines.append(f"written at once, step {k}: training waited {x:.2f} s")
    for k, x, paused in bg_saves:
        if paused is not None:
            lines.append(f"in the background, step {k}: training waited {paused:.2f} s for the "
                         f"snapshot; the write took {x:.2f} s")
    emit(lines, a.out)


if __name__ == "__main__":
    main()
