#!/usr/bin/env python3
"""The Llama family on every mesh computes what one rank computes (equiv.py's test for
GPT-2, on llama-tiny: 4 layers, d_model 64, 4 query heads over 2 kv heads, SwiGLU 192
wide, RoPE theta 10000, untied embedding and head).

`llama_equiv.py WORKER CASE`. Each case trains 20 steps on one rank and on meshes with
the same global batch, reads every step's loss from train.metrics and the final
parameters from the safetensors file each run --saves, and compares them with
equiv.py's tolerances, for equiv.py's reasons (its docstring): the same float32 sums in
another order under dp, tp (row-parallel o_proj and down_proj sum NH hs / tp = 32 and
F / tp = 96 terms, fewer than GPT-2's 256) and sequence parallelism (LOSS_RTOL,
PARAM_ATOL); pipeline stages run the same ops, so pipeline-only meshes also meet
PP_LOSS_RTOL and PP_PARAM_ATOL, on every parameter (Llama has no attention key bias,
the one GPT-2 parameter whose gradient is pure rounding noise); ZeRO-3 trains bit for bit
as ZeRO-2; mixed precision within MP_LOSS_RTOL and MP_PARAM_ATOL; --dump-state (one
forward and backward) within the STATE_* tolerances. Cases:

  dp-zero     dp 2 ZeRO-1, ZeRO-2 (one-layer buckets), ZeRO-3 (= ZeRO-2 bit for bit),
              HSDP 2 x 2 ZeRO-3
  tp          tp 2 (a kv head per rank), tp 2 with sequence parallelism, dp 2 x tp 2
              with sequence parallelism and ZeRO-2
  pp          pp 2 1F1B, GPipe, interleaved (2 chunks), against one rank with the same
              4 micro-batches at one thread; the tied embedding (tie_embeddings=true,
              summed over the embedding group) on pp 2
  3d          dp 2 x tp 2 x pp 2, 1F1B, sequence parallelism, ZeRO-1, activation
              checkpointing
  mixed       bf16 dp 2, bf16 tp 2 x pp 2 with recompute (MP_STEPS steps), fp16 dp 2 x
              pp 2 ZeRO-1 from a 2^30 loss scale (the same skipped steps), each against
              one rank at the same precision; one bf16 forward and backward, tp 2 x pp 2
              against one rank and against fp32 (mp_checks.dump_state_bf16)
  dump-state  one forward and backward of the whole batch, one rank vs tp 2 x pp 2
  floor       the 3-D mesh (dp 2 x tp 2 x pp 2) trains a 2-layer llama-tiny to within
              0.15 nats of the synthetic source's entropy floor, step for step as one rank
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equiv  # noqa: E402  the tolerances (and their reasons)
import mp_checks  # noqa: E402  the one-step bf16 check

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "io"))
import st_ref  # noqa: E402  the safetensors reader

WORKER, CASE = sys.argv[1], sys.argv[2]
MPIRUN = equiv.MPIRUN
STEPS = equiv.STEPS
# bf16's steps: llama-tiny's bf16 trajectory is chaotic sooner than gpt2-tiny's. Over
# 20 steps (seeds 1234, 1, 2) bf16 against fp32 on one rank differs by up to 1.6e-3 in
# the loss, and tp 2 x pp 2 against one rank by 1.9e-3 (both past MP_LOSS_RTOL, so the
# 20-step loss cannot tell a mesh from rounding itself); over the first 7 steps the mesh
# stays within 2e-5 at every seed. So the bf16 cases train 6 steps (MP_LOSS_RTOL 12x
# above), and the one-step --dump-state check (MP_STATE_*) tells rounding from none.
MP_STEPS = 6
BASE = ["model.preset=llama-tiny", "train.batch_size=8", "train.eval_every=0",
        "train.seed=1234", "train.warmup=5"]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def train(n, extra, tmp, tag, steps=STEPS, base=BASE):
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    save = os.path.join(tmp, f"{tag}.safetensors")
    args = [WORKER] + base + [f"train.steps={steps}"] + extra + [
        f"train.metrics={metrics}", "--save", save, "--save-format", "safetensors"]
    cmd = (MPIRUN + ["-np", str(n)] + args) if n > 1 else args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    if len(rows) != steps:
        fail(f"{tag}: {len(rows)} metric lines, want {steps}")
    params = {n: v for n, (_, v) in st_ref.read_f32(save).items()}
    return [r["loss"] for r in rows], params, p.stdout, rows


def diffs(ref, got):
    """Worst loss rel diff and max parameter diff (and where)."""
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref[0], got[0]))
    if sorted(ref[1]) != sorted(got[1]):
        fail(f"tensors differ: {sorted(ref[1])} vs {sorted(got[1])}")
    where, dmax = "", 0.0
    for name, a in ref[1].items():
        d = max(abs(x - y) for x, y in zip(a, got[1][name]))
        if d > dmax:
            where, dmax = name, d
    return worst, dmax, where


def compare(ref, got, what, loss_rtol=equiv.LOSS_RTOL, param_atol=equiv.PARAM_ATOL):
    worst, dmax, where = diffs(ref, got)
    if worst > loss_rtol or dmax > param_atol:
        fail(f"{what}: loss rel diff {worst:.2e} (tol {loss_rtol}), max param diff {dmax:.2e} "
             f"in {where} (tol {param_atol})")
    l1 = ref[0]
    if not l1[-1] < l1[0] - 0.1:
        fail(f"{what}: training did not progress: {l1[0]} -> {l1[-1]}")
    print(f"ok: llama {what}: {len(l1)} steps, worst loss rel diff {worst:.2e} (tol {loss_rtol}), "
          f"max param diff {dmax:.2e} in {where} (tol {param_atol}); loss {l1[0]:.4f} -> "
          f"{l1[-1]:.4f}")
    return worst, dmax


def same_bits(a, b, what, other):
    if a[0] != b[0] or a[1] != b[1]:
        fail(f"{what}: parameters or losses differ from {other}'s")
    print(f"ok: llama {what}: --save and every loss identical to {other}'s")


def case_dp_zero(tmp):
    ref = train(1, [], tmp, "ref")
    compare(ref, train(2, ["mesh.dp=2", "optim.zero=1"], tmp, "z1"), "dp 2 ZeRO-1")
    z2 = train(2, ["mesh.dp=2", "optim.zero=2", "optim.bucket_mb=0"], tmp, "z2")
    compare(ref, z2, "dp 2 ZeRO-2")
    z3 = train(2, ["mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0"], tmp, "z3")
    compare(ref, z3, "dp 2 ZeRO-3")
    same_bits(z3, z2, "dp 2 ZeRO-3", "ZeRO-2")
    compare(ref, train(4, ["mesh.dp=4", "mesh.fsdp=2", "optim.zero=3"], tmp, "hsdp"),
            "HSDP 2 x 2 ZeRO-3")


def case_tp(tmp):
    ref = train(1, [], tmp, "ref")
    compare(ref, train(2, ["mesh.tp=2"], tmp, "tp2"), "tp 2 (one kv head per rank)")
    compare(ref, train(2, ["mesh.tp=2", "parallel.sequence=true"], tmp, "tp2s"),
            "tp 2 sequence-parallel")
    compare(ref, train(4, ["mesh.dp=2", "mesh.tp=2", "parallel.sequence=true", "optim.zero=2"],
                       tmp, "dp2tp2"), "dp 2 x tp 2 sequence-parallel ZeRO-2")


def case_pp(tmp):
    one = ["train.microbatches=4", "runtime.threads=1"]
    ref = train(1, one, tmp, "ref")
    for sched in (["train.schedule=1f1b"], ["train.schedule=gpipe"],
                  ["train.schedule=interleaved", "parallel.virtual_stages=2"]):
        got = train(2, one + ["mesh.pp=2"] + sched, tmp, sched[0][15:])
        compare(ref, got, f"pp 2 {' '.join(sched)}", equiv.PP_LOSS_RTOL, equiv.PP_PARAM_ATOL)
    tied = one + ["model.tie_embeddings=true"]
    ref = train(1, tied, tmp, "ref-tied")
    if "lm_head.weight" in ref[1]:
        fail("a tied Llama's --save holds lm_head.weight")
    got = train(2, tied + ["mesh.pp=2"], tmp, "pp2-tied")
    want = f"tied embedding: the first and last stage's copies were identical after each of " \
           f"{STEPS} steps"
    if want not in got[2]:
        fail(f"pp 2 tied: stdout lacks {want!r}\n{got[2]}")
    compare(ref, got, "pp 2 with the tied embedding", equiv.PP_LOSS_RTOL, equiv.PP_PARAM_ATOL)


def case_3d(tmp):
    one = ["train.microbatches=4", "parallel.activation_checkpointing=true"]
    ref = train(1, one, tmp, "ref")
    compare(ref, train(8, one + ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.schedule=1f1b",
                                 "parallel.sequence=true", "optim.zero=1"], tmp, "3d"),
            "dp 2 x tp 2 x pp 2 1F1B sequence-parallel ZeRO-1 recompute")


def case_mixed(tmp):
    for prec, n, mesh, m, steps in (
            (["precision=bf16"], 2, ["mesh.dp=2"], 1, MP_STEPS),
            (["precision=bf16", "parallel.activation_checkpointing=true"], 4,
             ["mesh.tp=2", "mesh.pp=2"], 2, MP_STEPS),
            (["precision=fp16", "optim.loss_scale_init=1073741824"], 4,
             ["mesh.dp=2", "mesh.pp=2", "optim.zero=1"], 2, STEPS)):
        both = prec + [f"train.microbatches={m}"]
        tag = "-".join(a.split("=")[1] for a in prec[:1] + mesh)
        ref = train(1, both, tmp, "ref-" + tag, steps=steps)
        got = train(n, both + mesh, tmp, tag, steps=steps)
        compare(ref, got, f"{' '.join(prec + mesh)}", equiv.MP_LOSS_RTOL, equiv.MP_PARAM_ATOL)
        if prec[0] == "precision=fp16":
            s1 = [(r["loss_scale"], r.get("skipped_steps")) for r in ref[3]]
            s2 = [(r["loss_scale"], r.get("skipped_steps")) for r in got[3]]
            if s1 != s2:
                fail(f"fp16: loss scales / skipped steps differ: {s1} vs {s2}")
            print(f"ok: fp16: the same loss scale and skipped steps at every step "
                  f"({s1[0]} -> {s1[-1]})")
    mp_checks.dump_state_bf16(equiv, tmp, BASE[:3], "llama bf16-dump-state")


def dump_state(n, extra, tmp, tag):
    """The floats of a --dump-state file (logits, loss, gradients) and B*T."""
    states = mp_checks.dump_states(equiv, tmp, BASE, {tag: (n, extra)})
    (B, T), _, _, floats = states[tag]
    return floats, B * T


def case_dump_state(tmp):
    """logits (B*T x V), loss, gradients of one forward and backward."""
    one, N = dump_state(1, [], tmp, "one")
    mesh, _ = dump_state(4, ["mesh.tp=2", "mesh.pp=2"], tmp, "tp2pp2")
    V = 256
    nl = N * V
    dl = max(abs(a - b) for a, b in zip(one[:nl], mesh[:nl]))
    loss_rel = abs(one[nl] - mesh[nl]) / abs(one[nl])
    g1, g2 = one[nl + 1:], mesh[nl + 1:]
    gmax = max(abs(x) for x in g1)
    dg = max(abs(a - b) for a, b in zip(g1, g2))
    if len(g1) != len(g2) or dl > equiv.STATE_LOGIT_ATOL or loss_rel > equiv.STATE_LOSS_RTOL or \
            dg > equiv.STATE_GRAD_RTOL * gmax:
        fail(f"dump-state tp 2 x pp 2: logits {dl:.2e} (tol {equiv.STATE_LOGIT_ATOL}), loss rel "
             f"{loss_rel:.2e} (tol {equiv.STATE_LOSS_RTOL}), gradients {dg:.2e} of the largest "
             f"{gmax:.2e} (tol {equiv.STATE_GRAD_RTOL} x it)")
    print(f"ok: llama --dump-state tp 2 x pp 2: logits within {dl:.2e}, loss rel {loss_rel:.1e}, "
          f"gradients within {dg:.2e} ({dg / gmax:.1e} of the largest, {len(g1)} of them)")


def case_floor(tmp):
    """A 2-layer llama-tiny on the synthetic chain (data.path unset): validation loss
    every 25 steps; the 3-D mesh must match one rank step for step (LOSS_RTOL, as dp
    and tp sums reorder) and both end within 0.15 nats of the entropy floor."""
    base = BASE[:2] + ["model.layers=2", "train.seed=7", "train.warmup=10", "train.lr=1e-2",
                       "train.min_lr=1e-3", "train.eval_every=25", "train.eval_batches=2"]
    steps = 150
    ref = train(1, [], tmp, "floor-one", steps=steps, base=base)
    got = train(8, ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "parallel.sequence=true"], tmp,
                "floor-3d", steps=steps, base=base)
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref[0], got[0]))
    m = re.search(r" floor=(\S+)", ref[2])
    if not m or "val_loss" not in ref[3][-1] or "val_loss" not in got[3][-1]:
        fail(f"floor: no evaluation at the last step, or no floor printed:\n{ref[2][-1500:]}")
    floor = float(m.group(1))
    gaps = [r[-1]["val_loss"] - floor for r in (ref[3], got[3])]
    if worst > equiv.LOSS_RTOL or max(gaps) > 0.15:
        fail(f"floor: loss rel diff {worst:.2e} (tol {equiv.LOSS_RTOL}), final gaps to the "
             f"floor {gaps} (tol 0.15)")
    print(f"ok: llama floor: {steps} steps, 3-D mesh vs one rank: worst loss rel diff "
          f"{worst:.2e}; val_loss {ref[3][-1]['val_loss']:.4f} / {got[3][-1]['val_loss']:.4f}, "
          f"floor {floor:.4f} (gaps {gaps[0]:.4f}, {gaps[1]:.4f})")


CASES = {"dp-zero": case_dp_zero, "tp": case_tp, "pp": case_pp, "3d": case_3d,
         "mixed": case_mixed, "dump-state": case_dump_state, "floor": case_floor}

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmpdir:
        CASES[CASE](tmpdir)
