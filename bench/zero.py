#!/usr/bin/env python3
"""ZeRO stages side by side: the real trainer at dp 2 on a 30M-parameter GPT-2.

    bench/zero.py [--worker build/worker/worker] [--rounds 1] [--np 2] [--steps 8]
                  [--layers 8] [--d-model 512] [--vocab 16384] [--seq 128] [--batch 4]

Runs optim.zero=0, 1, 2, 3 and 3 with parallel.reshard_after_forward=false ("3k")
(optim.bucket_mb=0: one layer per bucket) under mpirun with
the same config and prints, per stage: the median step time and exposed gradient
communication (comm_ms: what backward did not hide) over the steps after the first, the
communication a step needs in theory (comm MiB: the buffers its collectives cover, by
zero.c's and fsdp.c's traffic) and what that takes at raw MPI's speed (raw_ms: each
all-reduce and broadcast at the bandwidth bench/collectives measures for raw MPI
allreduce and bcast at one layer's size on the same ranks, in the same run; comm_ms
below raw_ms is what compute hid), the loss of the last step (equal across stages up to
float32 summation order), and rank 0's memory by kind from the metrics (param_bytes, grad_bytes, optim_bytes, act_bytes: exact
bytes) with the theory beside each, computed here from the llm.c layout by the formulas
of README.md's ZeRO section (wf_zero_mem computes the same in C). A mismatch between a
reported figure and its theory is flagged with '!='.

Every trainer, weft's and PyTorch's, runs with glibc's allocator told to keep freed
memory (GLIBC_TUNABLES, bench/bench_env.py: PyTorch otherwise page-faults its gradients
afresh every step). Then PyTorch on the same model size, batch and threads, in the same run
(bench/zero_torch.py under /usr/bin/python3, Debian's python3-torch 1.13, gloo): DDP,
and FSDP when torch's FSDP runs (Debian 12's 1.13 cannot import it under Python 3.11;
the row then says why). Their memory is rank 0's tensors by kind (no activations, no comm_ms:
torch measures neither). The script says when torch is absent.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_env  # noqa: E402  glibc's allocator alike for weft and PyTorch

MIB = 1 << 20


def layout(L, C, V, T):
    """(kind, numel of the whole kind, layered) in llm.c order; Vp = V here (V % 128 == 0)."""
    return [("wte", V * C, False), ("wpe", T * C, False), ("ln1w", L * C, True),
            ("ln1b", L * C, True), ("qkvw", L * 3 * C * C, True), ("qkvb", L * 3 * C, True),
            ("attprojw", L * C * C, True), ("attprojb", L * C, True), ("ln2w", L * C, True),
            ("ln2b", L * C, True), ("fcw", L * 4 * C * C, True), ("fcb", L * 4 * C, True),
            ("fcprojw", L * 4 * C * C, True), ("fcprojb", L * C, True), ("lnfw", C, False),
            ("lnfb", C, False)]


def theory(L, C, V, T, D, zero, keep=False):
    """Memory by kind per rank 0, in bytes: README's table."""
    kinds = layout(L, C, V, T)
    n = sum(k[1] for k in kinds)
    shard = (n + D - 1) // D
    layer = sum(numel // L for _, numel, lay in kinds if lay)
    edge = sum(numel for _, numel, lay in kinds if not lay)
    if zero == 0:
        return {"param": 4 * n, "grad": 4 * n + (4 * (n + L + 2) if D > 1 else 0),
                "optim": 8 * n}
    s0 = min(0, n)
    optim = 8 * (min(s0 + shard, n) - s0)
    if zero == 1:  # the flat gradient re-laid by bucket and reduced in place, + the shard
        return {"param": 4 * n, "grad": 4 * (n + shard), "optim": optim}
    grad = 4 * (shard + edge + 2 * layer)
    if zero == 2:
        return {"param": 4 * n, "grad": grad, "optim": optim}  # the all-gather is in place
    return {"param": 4 * (shard + edge + (L if keep else 2) * layer), "grad": grad,
            "optim": optim}


def traffic(L, C, V, T, zero, keep):
    """(all-reduced bytes, broadcast bytes) a rank's collectives cover in one step of one
    micro-batch: the gradients all-reduced (every stage: the whole vector, in buckets);
    ZeRO-1/2's parameters all-gathered after the update by one broadcast per owner;
    ZeRO-3's layer units broadcast before each forward and backward (once with keep)
    and its edge unit once after the update."""
    kinds = layout(L, C, V, T)
    n = sum(k[1] for k in kinds)
    layers = sum(numel for _, numel, lay in kinds if lay)
    if zero == 0:
        return 4 * n, 0
    if zero in (1, 2):
        return 4 * n, 4 * n
    return 4 * n, 4 * ((1 if keep else 2) * layers + (n - layers))


def raw_mpi(a, size):
    """Raw MPI's algbw (bytes/s) for allreduce and bcast of `size` bytes on a.np ranks,
    from bench/collectives' raw MPI columns; None when it cannot run."""
    coll = os.path.join(os.path.dirname(os.path.abspath(a.worker)), "..", "bench", "collectives")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(a.np), coll, "--min", str(size), "--max", str(size), "--ops", "allreduce,bcast"]
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    bw = {}
    for line in p.stdout.splitlines():
        f = line.split()
        if len(f) >= 9 and f[0] in ("allreduce", "bcast"):
            bw[f[0]] = float(f[7]) * 1e9  # the raw MPI algbw column, GB/s
    return bw if len(bw) == 2 else None


def run(a, zero, keep, tmp):
    metrics = os.path.join(tmp, f"z{zero}{keep}.jsonl")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(a.np), a.worker, f"mesh.dp={a.np}", f"optim.zero={zero}", "optim.bucket_mb=0",
           f"parallel.reshard_after_forward={'false' if keep else 'true'}",
           f"model.layers={a.layers}", f"model.d_model={a.d_model}", "model.heads=8",
           f"model.seq_len={a.seq}", f"model.vocab={a.vocab}", f"train.batch_size={a.batch}",
           f"train.steps={a.steps}", "train.warmup=1", "train.eval_every=0", "runtime.threads=1",
           f"train.metrics={metrics}"]
    p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       env=bench_env.alike())
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return [json.loads(l) for l in open(metrics) if l.strip()]


def run_args(ap):
    """The run both benches take: ranks, steps, the model's shape, the global batch
    (bench/zero_torch.py builds the same model from them)."""
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", default="build/worker/worker")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every stage this many times, in rounds; the table shows the "
                         "median over rounds of each run's medians")
    run_args(ap)
    a = ap.parse_args()
    L, C, V, T, D = a.layers, a.d_model, a.vocab, a.seq, a.np
    n = sum(k[1] for k in layout(L, C, V, T))
    print(f"GPT-2 L{L} C{C} V{V} T{T}: {n / 1e6:.1f}M parameters, dp {D}, global batch "
          f"{a.batch} x {T}, {a.steps} steps (medians over steps 2..{a.steps}"
          f"{f', then over {a.rounds} rounds' if a.rounds > 1 else ''}), rank 0")
    layer = sum(numel // L for _, numel, lay in layout(L, C, V, T) if lay)
    bw = raw_mpi(a, 4 * layer)
    if bw:
        print(f"raw MPI at one layer's {4 * layer} B on {D} ranks: allreduce "
              f"{bw['allreduce'] / 1e9:.2f} GB/s, bcast {bw['bcast'] / 1e9:.2f} GB/s (algbw)")
    print(f"{'zero':>10} {'step_ms':>8} {'comm_ms':>8} {'raw_ms':>7} {'comm MiB':>9} {'loss':>8}  "
          f"{'param MiB (theory)':>19} {'grad MiB (theory)':>19} {'optim MiB (theory)':>19} "
          f"{'act MiB':>8}")
    stages = ((0, False), (1, False), (2, False), (3, False), (3, True))
    steps, comms, lasts = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.rounds):  # rounds of every stage, so drifting load hits all alike
            for st in stages:
                rows = run(a, st[0], st[1], tmp)
                steps.setdefault(st, []).append(statistics.median(r["step_ms"] for r in rows[1:]))
                comms.setdefault(st, []).append(statistics.median(r["comm_ms"] for r in rows[1:]))
                lasts[st] = rows[-1]
    for zero, keep in stages:
        last, th = lasts[(zero, keep)], theory(L, C, V, T, D, zero, keep)
        step = statistics.median(steps[(zero, keep)])
        comm = statistics.median(comms[(zero, keep)])
        ar, bc = traffic(L, C, V, T, zero, keep)
        raw = f"{1e3 * (ar / bw['allreduce'] + bc / bw['bcast']):7.1f}" if bw else f"{'-':>7}"
        cells = []
        for kind in ("param", "grad", "optim"):
            got, want = last[kind + "_bytes"], th[kind]
            mark = "=" if got == want else "!="
            cells.append(f"{got / MIB:8.2f} {mark} {want / MIB:7.2f}")
        print(f"{str(zero) + ('k' if keep else ''):>10} {step:8.1f} {comm:8.1f} {raw} "
              f"{(ar + bc) / MIB:9.1f} {last['loss']:8.4f}  "
              + " ".join(f"{c:>19}" for c in cells) + f" {last['act_bytes'] / MIB:8.2f}")
    if a.rounds > 1:
        print("comm_ms of each round: " + "; ".join(
            f"{z}{'k' if k else ''} " + " ".join(f"{c:.1f}" for c in comms[(z, k)])
            for z, k in stages))
    torch_rows(a)


def torch_rows(a):
    """PyTorch DDP and FSDP (gloo, CPU) on the same model, batch and steps."""
    torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    if torch.returncode != 0:
        print("PyTorch DDP/FSDP: not run (/usr/bin/python3 has no torch; apt-get install "
              "python3-torch)")
        return
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zero_torch.py")
    print("torch rows: uniform random tokens (weft's synthetic source is its own), so their loss "
          "stays near ln V and is not comparable; step time and memory are")
    for mode in ("ddp", "fsdp"):
        cmd = ["/usr/bin/python3", script, "--mode", mode, "--np", str(a.np), "--steps",
               str(a.steps), "--layers", str(a.layers), "--d-model", str(a.d_model), "--vocab",
               str(a.vocab), "--seq", str(a.seq), "--batch", str(a.batch)]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           env=bench_env.alike(OMP_NUM_THREADS="1"))
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        r = json.loads(lines[-1]) if lines else {"error": f"exit {p.returncode}: "
                                                 f"{(p.stderr.strip().splitlines() or [''])[-1]}"}
        name = f"torch {mode}"
        if "error" in r:
            print(f"{name:>10}: not run on this CPU: {r['error']}")
            continue
        cells = " ".join(f"{r[k + '_bytes'] / MIB:19.2f}" for k in ("param", "grad", "optim"))
        print(f"{name:>10} {r['step_ms']:8.1f} {'-':>8} {'-':>7} {'-':>9} {r['loss']:8.4f}  "
              f"{cells} {'-':>8}")


if __name__ == "__main__":
    main()
