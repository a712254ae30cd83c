#!/usr/bin/env python3
"""Activation checkpointing changes memory, never arithmetic: on every mesh,
parallel.activation_checkpointing = selective and = full train bit for bit as none.

`recompute.py WORKER CASE`. Each case trains the same model three times on the same mesh
(none, selective, full: Korthikanti et al. 2022's selective recompute keeps the linear
layers' inputs and recomputes only attention's core, softmax(Q K^T) V; full keeps each
layer's input and recomputes the whole layer), and requires:
 - every step's loss and grad norm, and the --save file, identical byte for byte: each
   recomputation runs the same kernels on the same stored bits (the kernels are
   deterministic; under bf16 the stored inputs are the 16-bit values themselves, and
   the collectives of a recomputed forward sum in the same order), so there is no
   tolerance to state;
 - the activations the step line reports shrink: none > selective > full (selective
   drops each layer's attention probabilities, which the CPU keeps as (B, NH, T, T));
   with T = 64 and d_model 64 the probabilities are the largest thing a layer keeps.
The meshes cover tensor parallelism with sequence parallelism (the tp collectives run
again in a full recompute), pipelines (slots in flight, interleaved chunks), ZeRO-3
(parameters gathered again for the recompute) and mixed precision, for GPT-2 and for
Llama (llama-*: grouped-query attention's core state rebuilt from the rotated qkv).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import fail  # noqa: E402

WORKER, CASE = sys.argv[1], sys.argv[2]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
BASE = ["train.steps=6", "train.batch_size=8", "train.eval_every=0",
        "train.seed=7", "train.warmup=2", "runtime.threads=1"]
CASES = {
    "np1-fp32": (1, []),
    "np1-bf16": (1, ["precision=bf16"]),
    "np1-fp16": (1, ["precision=fp16"]),
    "tp2-seq-bf16": (2, ["mesh.tp=2", "parallel.sequence=true", "precision=bf16"]),
    "pp2-1f1b-bf16": (2, ["mesh.pp=2", "train.microbatches=4", "precision=bf16"]),
    "pp2-interleaved-fp32": (2, ["mesh.pp=2", "train.microbatches=4",
                                 "train.schedule=interleaved", "parallel.virtual_stages=2"]),
    "dp2-zero3-bf16": (2, ["mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0",
                           "precision=bf16"]),
    "3d-bf16": (8, ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.microbatches=2",
                    "parallel.sequence=true", "precision=bf16"]),
    "llama-np1-bf16": (1, ["model.preset=llama-tiny", "precision=bf16"]),
    "llama-tp2-seq-bf16": (2, ["model.preset=llama-tiny", "mesh.tp=2", "parallel.sequence=true",
                               "precision=bf16"]),
}


def preset(args):
    """gpt2-tiny unless the case names the model (the llama-* cases: llama-tiny)."""
    return [] if any(a.startswith("model.preset=") for a in args) else ["model.preset=gpt2-tiny"]


def train(n, args, tmp, mode):
    metrics = os.path.join(tmp, f"{mode}.jsonl")
    save = os.path.join(tmp, f"{mode}.bin")
    # llm.c checkpoints hold GPT-2 only; Llama saves safetensors
    fmt = ["--save-format", "safetensors"] if not preset(args) else []
    cmd = [WORKER] + preset(args) + BASE + args + [f"parallel.activation_checkpointing={mode}",
                                                   f"train.metrics={metrics}", "--save", save] + fmt
    if n > 1:
        cmd = MPIRUN + ["-np", str(n)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}", p.stdout + p.stderr)
    rows = [r for r in (json.loads(line) for line in open(metrics) if line.strip())
            if "step" in r and "act_bytes" in r]
    steps = [(r["step"], r["loss"], r["grad_norm"]) for r in rows]
    return steps, open(save, "rb").read(), rows[-1]["act_bytes"] / 2**20


def main():
    n, args = CASES[CASE]
    with tempfile.TemporaryDirectory() as tmp:
        runs = {m: train(n, args, tmp, m) for m in ("none", "selective", "full")}
    ref_steps, ref_bytes, _ = runs["none"]
    if len(ref_steps) != 6 or not ref_steps[-1][1] < ref_steps[0][1]:
        fail(f"{CASE}: training did not progress: {ref_steps}")
    for mode in ("selective", "full"):
        steps, data, _ = runs[mode]
        if steps != ref_steps:
            fail(f"{CASE}: {mode} recompute's steps differ from none's:\n {steps}\n {ref_steps}")
        if data != ref_bytes:
            first = next(i for i, (a, b) in enumerate(zip(data, ref_bytes)) if a != b) \
                if len(data) == len(ref_bytes) else -1
            fail(f"{CASE}: {mode} recompute's --save differs from none's (byte {first})")
    acts = [runs[m][2] for m in ("none", "selective", "full")]
    if not acts[0] > acts[1] > acts[2]:
        fail(f"{CASE}: activations none {acts[0]} MiB, selective {acts[1]}, full {acts[2]}: "
             "want each recompute to keep less")
    print(f"ok: {CASE}: selective and full recompute train bit for bit as none "
          f"({len(ref_steps)} steps, final loss {ref_steps[-1][1]}); activations "
          f"{acts[0]:.3f} / {acts[1]:.3f} / {acts[2]:.3f} MiB (none / selective / full)")


if __name__ == "__main__":
    main()
