#!/usr/bin/env python3
"""Context parallelism on the CPU: step time, the longest sequence a memory budget holds,
and the exposed ring communication against theory.

    bench/cp.py [--worker build/worker/worker] [--seq 8192] [--steps 4] [--cps 1,2,4]
                [--mode ring] [--budget-mib 1024] [--out FILE]

A small Llama (llama-tiny's shape: 2 layers, d_model 64, 4 query heads over 2 kv heads,
head size 16, SwiGLU 192 wide) on one sequence of --seq tokens per step, trained with
mesh.cp = 1, 2 and 4 (cp ranks under mpirun, one compute thread each). Per cp:

  step_ms   the median step time over the steps after the first (the metrics' step_ms)
  cp_ms     the median exposed context-parallel communication: time rank 0 waited for
            keys and values (or their gradients) after its own block's compute was done
  exposed   cp_ms as a share of the step
  sent MiB  what rank 0 sent per step (the metrics' cp_mib), and the theory beside it:
            per layer, forward (cp-1) K/V blocks of B x T/cp rows x 2 x kv heads x head
            size x 4 bytes, backward the same again plus cp fp32 dK/dV sums (ring); or the
            all-gather's and reduce-scatter's (cp-1)/cp of the whole sequence's (all-gather)
  plan      the planner's (worker --estimate) exposed share of the step for the same mesh
  max T     the longest sequence (a multiple of 2 cp, to 1/64 of it) whose rank fits
            --budget-mib by the planner's memory model (the allocators' own sizing, equal
            to the trainer's accounting byte for byte: tests/mpi/act_formula.py); one rank
            keeps attention's (T, T) probabilities per head, a cp rank the log-sum-exp, so
            the quadratic term goes and the rest shrinks as 1/cp

The machine's cores are shared by the cp ranks: on 2 cores cp 2 has twice one rank's
compute, cp 4 the same as cp 2. Write the table to --out as well as stdout.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MIB = 1 << 20
MODEL = ["model.preset=llama-tiny", "model.layers=2", "train.batch_size=1",
         "train.eval_every=0", "train.warmup=0", "runtime.threads=1", "runtime.log_level=warn"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def train(a, cp, T, tmp):
    metrics = os.path.join(tmp, f"cp{cp}.jsonl")
    cmd = [a.worker] + MODEL + [f"model.seq_len={T}", f"train.steps={a.steps}",
                                f"mesh.cp={cp}", f"parallel.cp_mode={a.mode}",
                                f"train.metrics={metrics}"]
    run((MPIRUN + ["-np", str(cp)] + cmd) if cp > 1 else cmd, 3600)
    rows = [json.loads(line) for line in open(metrics) if line.strip()][1:]
    return (statistics.median(r["step_ms"] for r in rows),
            statistics.median(r.get("cp_ms") or 0 for r in rows),
            statistics.median(r.get("cp_mib") or 0 for r in rows))


def estimate(a, cp, T):
    keys = MODEL + [f"model.seq_len={T}", f"mesh.cp={cp}", f"parallel.cp_mode={a.mode}"]
    return json.loads(run([a.worker, "--estimate", "--json", "--hw", a.hw] + keys, 600))


def theory_mib(cp, T, mode, layers=2, kv_heads=2, hs=16):
    """Bytes rank 0 sends per step (fp32 activations: 4 bytes)."""
    if cp == 1:
        return 0.0
    kv = T // cp * 2 * kv_heads * hs * 4  # one block of keys and values, B = 1
    if mode == "ring":
        per_layer = (cp - 1) * kv + (cp - 1) * kv + cp * kv  # fwd K/V, bwd K/V, dK/dV sums
    else:
        per_layer = 3 * (cp - 1) * kv  # all-gather fwd and bwd, reduce-scatter of dK/dV
    return layers * per_layer / MIB


def max_seq(a, cp):
    """The longest T (a multiple of 2 cp and of 64) whose rank fits the budget."""
    step = max(64, 2 * cp)

    def fits(T):
        est = estimate(a, cp, T)
        return max(s["total_bytes"] for s in est["stages"]) <= a.budget_mib * MIB

    lo, hi = 0, step
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="build/worker/worker")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cps", default="1,2,4")
    ap.add_argument("--mode", default="ring", choices=["ring", "allgather"])
    ap.add_argument("--budget-mib", type=int, default=1024)
    ap.add_argument("--out")
    a = ap.parse_args()
    cps = [int(x) for x in a.cps.split(",")]
    lines = [f"llama-tiny shape, 2 layers, B 1 x T {a.seq}, {a.mode} attention, "
             f"{a.steps} steps (median of steps 2-{a.steps}), {os.cpu_count()} cores, "
             f"memory budget {a.budget_mib} MiB per rank",
             f"{'cp':>3} {'step_ms':>9} {'cp_ms':>8} {'exposed':>8} {'plan':>7} "
             f"{'sent MiB':>9} {'theory':>8} {'act MiB':>8} {'max T':>8}"]
    print(lines[0], flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        a.hw = os.path.join(tmp, "hw.json")  # this machine, measured once for every estimate
        run([a.worker, "--profile-hw", a.hw], 1200)
        for cp in cps:
            step, cp_ms, sent = train(a, cp, a.seq, tmp)
            est = estimate(a, cp, a.seq)
            t = est["time"]
            plan = t["cp_exposed_ms"] / t["step_ms"] if t["step_ms"] > 0 else 0
            act = est["stages"][0]["act_bytes"] / MIB
            row = (f"{cp:>3} {step:>9.1f} {cp_ms:>8.1f} {cp_ms / step:>8.1%} {plan:>7.1%} "
                   f"{sent:>9.2f} {theory_mib(cp, a.seq, a.mode):>8.2f} {act:>8.2f} "
                   f"{max_seq(a, cp):>8}")
            lines.append(row)
            print(row, flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
