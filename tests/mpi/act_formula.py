#!/usr/bin/env python3
"""The trainer's activation memory follows docs/memory.md's formula, byte for byte.

`act_formula.py WORKER CASE`. Each case trains one step of a small GPT-2 (s = 64 tokens,
b = 2 rows, h = 64 channels, a = 4 heads) with 2 and with 4 layers, under
parallel.activation_checkpointing = none, selective and full, and reads the step's
act_bytes (the trainer's `act=`: the activation slots plus the recompute buffer). The
difference between the two depths, halved, is one layer's activations per micro-batch,
which must equal the formula exactly (every tensor here is a multiple of the carve's
64-byte alignment, so there is no padding to tolerate):

  p = bytes per stored element (2 under bf16/fp16, 4 at fp32), r = rows a rank keeps of
  the replicated tensors (s*b without sequence parallelism, s*b/t with it):
    none       p*(4*r*h + 12*s*b*h/t) + 16*r + p*a*s*s*b/t   (CPU: softmax output kept)
    selective  p*(4*r*h + 12*s*b*h/t) + 16*r                 (core recomputed)
    full       p*r*h                                          (the layer's input only)

and the recompute buffer (selective: one layer's core, full: one whole layer) must not
grow with depth (it is part of both totals, so it cancels in the difference; it is
checked against the formula too: full's buffer is none's per-layer bytes less the
layer output, selective's the core).

Context parallelism (cp-* cases, mesh.cp = c): a rank holds s/c tokens of each sequence,
so every sequence-dependent term above takes s/c for s; attention's core state becomes
the rows' log-sum-exp, 4*a*(s/c)*b bytes (fp32; ring attention rebuilds the
probabilities in backward, as flash attention does), 1/c of the one-rank log-sum-exp.

Every case also asks `worker --estimate --json` for the same config: the planner's
act_bytes (activation slots and the recompute buffer, from the allocators' own sizing)
must equal the trainer's act_bytes byte for byte, at every depth and mode.
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
S, B, H, A = 64, 2, 64, 4
BASE = ["model.preset=gpt2-tiny", f"model.d_model={H}", f"model.heads={A}",
        f"model.seq_len={S}", f"train.seq_len={S}", f"train.batch_size={B}",
        "train.steps=1", "train.warmup=0", "train.eval_every=0", "runtime.threads=1"]
# case: (tp, sequence parallelism, precision, cp)
CASES = {
    "np1-bf16": (1, False, "bf16", 1),
    "np1-fp32": (1, False, "no", 1),
    "tp2-bf16": (2, False, "bf16", 1),
    "tp2-sp-bf16": (2, True, "bf16", 1),
    "cp2-fp32": (1, False, "no", 2),
    "cp4-bf16": (1, False, "bf16", 4),
}


def act_bytes(t, sp, prec, cp, layers, mode, tmp):
    """The trainer's act_bytes and the planner's for the same config."""
    metrics = os.path.join(tmp, f"{layers}-{mode}.jsonl")
    keys = BASE + [f"model.layers={layers}", f"precision={prec}",
                   f"parallel.activation_checkpointing={mode}"]
    if t > 1:
        keys += [f"mesh.tp={t}", f"parallel.sequence={str(sp).lower()}"]
    if cp > 1:
        keys += [f"mesh.cp={cp}"]
    cmd = [WORKER] + keys + [f"train.metrics={metrics}"]
    if t * cp > 1:
        cmd = MPIRUN + ["-np", str(t * cp)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}", p.stdout + p.stderr)
    rows = [r for r in (json.loads(x) for x in open(metrics) if x.strip()) if "act_bytes" in r]
    est = subprocess.run([WORKER, "--estimate", "--json"] + keys, capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    if est.returncode != 0:
        fail(f"--estimate {' '.join(keys)} exited {est.returncode}", est.stdout + est.stderr)
    return rows[-1]["act_bytes"], json.loads(est.stdout)["stages"][0]["act_bytes"]


def formula(t, sp, prec, cp):
    p = 2 if prec != "no" else 4
    s = S // cp  # the tokens of each sequence a rank holds
    r = s * B // t if sp else s * B
    kept = p * (4 * r * H + 12 * s * B * H // t) + 16 * r
    core = p * A * S * S * B // t if cp == 1 else 4 * A * s * B // t
    return {"none": kept + core, "selective": kept, "full": p * r * H}, kept - p * r * H, core


def main():
    t, sp, prec, cp = CASES[CASE]
    per_layer, layer_less_out, core = formula(t, sp, prec, cp)
    with tempfile.TemporaryDirectory() as tmp:
        both = {m: {L: act_bytes(t, sp, prec, cp, L, m, tmp) for L in (2, 4)}
                for m in ("none", "selective", "full")}
    got = {m: {L: v[0] for L, v in d.items()} for m, d in both.items()}
    for m, d in both.items():
        for L, (trainer, planner) in d.items():
            if trainer != planner:
                fail(f"{CASE} {m} {L} layers: the trainer's act_bytes {trainer}, the planner's "
                     f"{planner}")
    for mode, want in per_layer.items():
        d = (got[mode][4] - got[mode][2]) / 2
        if d != want:
            fail(f"{CASE} {mode}: one layer's activations are {d:.0f} bytes "
                 f"(act_bytes {got[mode][2]} at 2 layers, {got[mode][4]} at 4); "
                 f"docs/memory.md's formula gives {want}")
    # the recompute buffer: what each mode's total holds beyond its per-layer bytes,
    # against none's (same slot otherwise)
    base = got["none"][2] - 2 * per_layer["none"]
    extra = {m: got[m][2] - 2 * per_layer[m] - base for m in ("selective", "full")}
    want_extra = {"selective": core, "full": layer_less_out + core}
    if extra != want_extra:
        fail(f"{CASE}: recompute buffers {extra}, want {want_extra} (one layer's core; one "
             "whole layer less its output)")
    print(f"ok: {CASE}: per layer per micro-batch (s {S}, b {B}, h {H}, a {A}, t {t}, "
          f"sp {sp}, {prec}, cp {cp}): none {per_layer['none']}, selective "
          f"{per_layer['selective']}, full {per_layer['full']} bytes, as the formula; recompute "
          f"buffers {extra}; the planner's act_bytes equal the trainer's at 2 and 4 layers")


if __name__ == "__main__":
    main()
