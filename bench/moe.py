#!/usr/bin/env python3
"""A mixture-of-experts layer against a dense one of the same active FLOPs, and expert
parallelism's all-to-all against the transport's own rate, with PyTorch in the same run.

    bench/moe.py [--worker build/worker/worker] [--collectives build/bench/collectives]
                 [--layers 2 --d-model 256 --heads 4 --seq 128 --batch 8 --vocab 256]
                 [--experts 8 --top-k 2 --ffn 512] [--steps 8] [--eps 2,4] [--out FILE]

1. Layers. Mixtral's layout (Llama's attention, every MLP E SwiGLU experts of width F,
   top-K renormalised, the load-balancing loss) against Llama with one SwiGLU K x F wide:
   per token both run the same attention and the same MLP FLOPs (2 x 3 x C x K F a
   layer, forward), the MoE adding its router (2 C E) and the token permutation. Each is
   trained on one rank for --steps steps of --batch x --seq tokens by weft (the trainer,
   CPU, fp32) and by PyTorch (bench/torch_train.py: Hugging Face's modules, the MoE as
   MixtralSparseMoeBlock's loop over experts, which tests/model/torch_mixtral_check.py
   holds equal to the reference). Figure: the median step's tokens/s over the steps
   after the first, and the MoE's share of the dense model's rate for each trainer.
2. Expert parallelism. The same MoE under mpirun on ep ranks (mesh.ep = mesh.dp = ep,
   the global batch split over them): the step's time in the tokens' exchanges and the
   bytes rank 0 sent in them (the metrics' ep_ms and ep_mib), against the same exchanges
   at the transport's rate: bench/collectives' all-to-all of weft's communicator,
   measured in this run at the size of one exchange of rows (a rank's --batch / ep x
   --seq x K rows of C floats) and of one of counts, times the exchanges a step makes
   (per layer, forward and backward each: one of counts, two of rows). The ratio says how
   much more the exchanges take inside training (waiting for the slowest rank of the
   group: its routing, its experts' share of the tokens) than back to back.

Every trainer runs with the same glibc malloc tunables (bench/bench_env.py). The machine
is shared: its load average is recorded before and after. Writes a Markdown table to
stdout and to --out.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_env  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
TORCH = "/usr/bin/python3"  # Debian's python3-torch (the python3 on PATH may lack it)


def run(cmd, env, timeout=1800):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def shape_keys(a, moe):
    keys = [f"model.layers={a.layers}", f"model.d_model={a.d_model}", f"model.heads={a.heads}",
            f"model.kv_heads={a.heads}", f"model.seq_len={a.seq}", f"model.vocab={a.vocab}",
            "model.tie_embeddings=false", f"train.batch_size={a.batch}",
            f"train.steps={a.steps}", "train.eval_every=0", "train.warmup=0",
            "runtime.log_level=warn"]
    if moe:
        return ["model.preset=mixtral-tiny"] + keys + [
            f"model.ffn={a.ffn}", f"model.experts={a.experts}",
            f"model.experts_per_token={a.top_k}", "model.router_aux_loss_coef=0.02"]
    return ["model.preset=llama-tiny"] + keys + [f"model.ffn={a.top_k * a.ffn}"]


def weft(a, moe, tmp, ep=1):
    """Median tokens/s after the first step, and the median ep_ms and ep_mib."""
    metrics = os.path.join(tmp, f"{'moe' if moe else 'dense'}-ep{ep}.jsonl")
    cmd = [a.worker] + shape_keys(a, moe) + [f"train.metrics={metrics}"]
    if ep > 1:
        cmd = MPIRUN + ["-np", str(ep)] + cmd + [f"mesh.ep={ep}", f"mesh.dp={ep}"]
    run(cmd, bench_env.alike())
    rows = [json.loads(line) for line in open(metrics) if line.strip()][1:]
    med = statistics.median
    return (med(r["tokens_per_s"] for r in rows), med(r.get("ep_ms") or 0 for r in rows),
            med(r.get("ep_mib") or 0 for r in rows), med(r["step_ms"] for r in rows))


def torch(a, moe):
    cmd = [TORCH, os.path.join(HERE, "torch_train.py"), "--model", "mixtral" if moe else "llama",
           "--device", "cpu", "--layers", str(a.layers), "--heads", str(a.heads),
           "--d-model", str(a.d_model), "--seq", str(a.seq), "--vocab", str(a.vocab),
           "--ffn", str(a.ffn if moe else a.top_k * a.ffn), "--untied", "--batch", str(a.batch),
           "--steps", str(a.steps - 1), "--warmup", "1", "--experts", str(a.experts),
           "--top-k", str(a.top_k), "--aux", "0.02", "--rope-theta", "10000"]
    out = json.loads(run(cmd, bench_env.for_torch(bench_env.alike())).strip().splitlines()[-1])
    return out["tokens_per_s"], out["peer"]


def alltoall_us(a, ep, sizes):
    """weft's all-to-all time (us, median) at each size in bytes (a rank's send buffer)."""
    out = {}
    for size in sizes:
        text = run(MPIRUN + ["-np", str(ep), a.collectives, "--ops", "alltoall", "--min",
                             str(size), "--max", str(size), "--reps", "11"], bench_env.alike())
        for line in text.splitlines():
            f = line.split()
            if f and f[0] == "alltoall":
                out[size] = (float(f[3]), float(f[4]), int(f[1]))  # us, algbw GB/s, bytes
    return out


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def machine():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({model})"


def layer_table(a, tmp):
    w_moe, w_dense = weft(a, True, tmp)[0], weft(a, False, tmp)[0]
    t_moe, peer = torch(a, True)
    t_dense, _ = torch(a, False)
    rows = [("weft (CPU, fp32)", w_moe, w_dense), (f"{peer} (CPU, fp32)", t_moe, t_dense)]
    lines = ["| trainer | MoE tokens/s | dense tokens/s | MoE / dense |", "|---|---|---|---|"]
    for name, m, d in rows:
        lines.append(f"| {name} | {m:.0f} | {d:.0f} | {m / d:.2f} |")
    lines.append(f"| weft / PyTorch | {w_moe / t_moe:.2f} | {w_dense / t_dense:.2f} | |")
    return lines


def ep_table(a, tmp):
    lines = ["| ep | step ms | ep_ms | ep MiB sent | in training GB/s | all-to-all of rows: "
             "bytes, us, GB/s | predicted ep ms | ep_ms / predicted |",
             "|---|---|---|---|---|---|---|---|"]
    for ep in a.eps:
        _, ep_ms, ep_mib, step_ms = weft(a, True, tmp, ep)
        rows = a.batch // ep * a.seq * a.top_k  # a rank's rows of one exchange
        row_bytes, count_bytes = rows * a.d_model * 4, a.experts * ep * 4
        t = alltoall_us(a, ep, [row_bytes, count_bytes])
        us_rows, bw, shown = t[row_bytes]
        us_counts = t[count_bytes][0]
        # per layer: forward and backward each exchange counts once and rows twice
        predicted = a.layers * 2 * (us_counts + 2 * us_rows) * 1e-3
        achieved = ep_mib * 2**20 / (ep_ms * 1e-3) * 1e-9 if ep_ms > 0 else 0
        lines.append(f"| {ep} | {step_ms:.1f} | {ep_ms:.1f} | {ep_mib:.2f} | {achieved:.2f} | "
                     f"{shown}, {us_rows:.0f}, {bw:.2f} | {predicted:.1f} | "
                     f"{ep_ms / predicted:.2f} |")
    return lines


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", default="build/worker/worker")
    p.add_argument("--collectives", default="build/bench/collectives")
    for name, default in [("layers", 2), ("d-model", 256), ("heads", 4), ("seq", 128),
                          ("batch", 8), ("vocab", 256), ("experts", 8), ("top-k", 2),
                          ("ffn", 512), ("steps", 8)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--eps", default="2,4")
    p.add_argument("--out")
    a = p.parse_args()
    a.eps = [int(x) for x in a.eps.split(",") if x]
    version = run([a.worker, "--version"], bench_env.alike()).strip().splitlines()[-1]
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        layers = layer_table(a, tmp)
        eps = ep_table(a, tmp)
    text = "\n".join([
        "# A mixture-of-experts layer against a dense one, and ep's all-to-all (bench/moe.py)",
        "",
        f"{datetime.date.today().isoformat()}, {machine()}, load average {before} before and "
        f"{load()} after; {version}.",
        "",
        f"{a.layers} layers, d_model {a.d_model}, {a.heads} heads, vocabulary {a.vocab}, "
        f"{a.batch} x {a.seq} tokens a step, {a.steps} steps (the median of all but the "
        f"first). MoE: Mixtral's layout, {a.experts} experts of width {a.ffn}, top-{a.top_k} "
        f"renormalised, aux 0.02; dense: Llama with a SwiGLU {a.top_k * a.ffn} wide (the same "
        "active FLOPs but the router's).",
        "", *layers, "",
        "Expert parallelism (mesh.ep = mesh.dp, the global batch split over the ranks):", "",
        *eps, ""])
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
