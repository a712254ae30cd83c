#!/usr/bin/env python3
"""Step time while a checkpoint is written in the background (worker/ckpt/saver.c).

    python3 bench/ckpt_async.py [--worker build/worker/worker] [--steps 48] [--every 12]
                                [--dir /tmp] [--out FILE] [--no-baseline] [--nice N]
                                [key=value ...]

GPT-2 124M (model.preset=gpt2-small, batch 4 x 64 tokens) on one rank with
train.checkpoint_dir in --dir and train.checkpoint_every=--every: at each checkpoint the
rank copies its state (the model file's 0.5 GB and AdamW's 1 GB) into its snapshot, and
its checkpoint writer writes it (fsync included) while training goes on. From the
metrics file (step_ms: the whole cycle from one step's end to the next, less what ran
aside, the snapshot among it; ckpt_write_ms: how long a write was in flight during the
step; ckpt_snapshot_ms: the copy taken after the step before) it prints
  - the median step time of the steps a write overlapped (ckpt_write_ms at least 90% of
    step_ms) and of the steps without one (0); a step a write ended in is neither;
  - the paired ratio: each step during a write against the median of the steps without
    a write within 4 steps of it, the median of those ratios: what a machine whose load
    drifts over minutes (this one's does) still measures fairly;
  - the snapshot's time, and each write's duration from the log;
and, unless --no-baseline, the median step of a run without a checkpoint directory, run
first (its ratio is only as good as the load was steady). Steps 1 and 2 (warm-up) are
left out. Extra key=value arguments go to every run (e.g. train.batch_size=8).

--nice N runs the trainer at that niceness (root may give a negative one): on a machine
shared with other jobs, their load moves a step's time by tens of percent from one step
to the next, and a negative niceness keeps the trainer ahead of them, as on a machine of
its own; the checkpoint writer sets its own niceness, 19, whatever the trainer's.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def run(worker, args, tmp, tag, nice):
    metrics = os.path.join(tmp, tag + ".jsonl")
    cmd = [worker, "model.preset=gpt2-small", "train.batch_size=4", "train.seq_len=64",
           "train.eval_every=0", "train.checkpoint_minutes=0", f"train.metrics={metrics}"] + args
    env = dict(os.environ, OMPI_MCA_ess_singleton_isolated="1")
    if nice:
        cmd = ["nice", "-n", str(nice)] + cmd
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    return rows, p.stdout + p.stderr, time.monotonic() - t0


def build_id(worker):
    p = subprocess.run([worker, "--version"], capture_output=True, text=True)
    return p.stdout.strip()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def during(r):
    return r.get("ckpt_write_ms", 0) >= 0.9 * r["step_ms"]


def free(r):
    return r.get("ckpt_write_ms", 0) == 0


def paired(rows, window=4):
    """Each step during a write over the median of the write-free steps near it."""
    near_free = {r["step"]: r["step_ms"] for r in rows if free(r)}
    out = []
    for r in rows:
        near = [v for s, v in near_free.items() if abs(s - r["step"]) <= window]
        if during(r) and near:
            out.append(r["step_ms"] / med(near))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="build/worker/worker")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--every", type=int, default=12)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--nice", type=int, default=0)
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where the checkpoints go (a disk, as a run's would)")
    ap.add_argument("--out", help="also write the table to this file")
    opts, extra = ap.parse_known_args()
    tmp = tempfile.mkdtemp(prefix="weft-bench-ckpt-", dir=opts.dir)
    try:
        steps = [f"train.steps={opts.steps}"] + extra
        base, base_s = [], 0
        if not opts.no_baseline:
            base, _, base_s = run(opts.worker, steps, tmp, "base", opts.nice)
        ck = os.path.join(tmp, "ck")
        rows, log, ck_s = run(opts.worker, steps + [f"train.checkpoint_dir={ck}",
                                                  f"train.checkpoint_every={opts.every}"],
                              tmp, "ckpt", opts.nice)
        last = max(r for r in os.listdir(ck) if r.startswith("step-"))
        nbytes = sum(os.path.getsize(os.path.join(ck, last, f))
                     for f in os.listdir(os.path.join(ck, last)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    late = lambda rs: [r for r in rs if r["step"] > 2]  # noqa: E731
    b = med([r["step_ms"] for r in late(base)])
    writing = [r["step_ms"] for r in late(rows) if during(r)]
    without = [r["step_ms"] for r in late(rows) if free(r)]
    pairs = paired(late(rows))
    snaps = [r["ckpt_snapshot_ms"] for r in rows if "ckpt_snapshot_ms" in r]
    writes = [float(s) for s in re.findall(r"saved to \S+ in ([\d.]+) s", log)]
    lines = [
        f"GPT-2 124M, one rank, {' '.join(steps)}; checkpoint every {opts.every} steps of "
        f"{nbytes / 1e9:.2f} GB into {opts.dir}; trainer at nice {opts.nice}, its writer at 19",
        build_id(opts.worker),
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} on {os.uname().nodename}, "
        f"load average {os.getloadavg()[0]:.1f}; runs {base_s:.0f} s and {ck_s:.0f} s",
        f"{'':32} {'steps':>5} {'median step_ms':>14}",
        f"{'no checkpoint directory':32} {len(late(base)):5} {b:14.1f}",
        f"{'during a background write':32} {len(writing):5} {med(writing):14.1f}",
        f"{'no write in flight':32} {len(without):5} {med(without):14.1f}",
        f"step during a write / the write-free steps within 4 of it: median {med(pairs):.3f}x "
        f"of {len(pairs)} (min {min(pairs, default=float('nan')):.3f}, max "
        f"{max(pairs, default=float('nan')):.3f}); medians {med(writing) / med(without):.3f}x; "
        f"against the run without: {med(writing) / b:.3f}x",
        f"snapshot (the copy at the boundary, not in step_ms): median {med(snaps):.0f} ms of "
        f"{len(snaps)}, {med(snaps) / (opts.every * med(without)) * 100:.1f}% of "
        f"{opts.every} write-free steps",
        f"background writes (snapshot to published): {', '.join(f'{w:.1f}' for w in writes)} s",
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if opts.out:
        os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
        with open(opts.out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
