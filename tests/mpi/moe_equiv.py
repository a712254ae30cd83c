#!/usr/bin/env python3
"""The mixture-of-experts families on every mesh compute what one rank computes
(equiv.py's test for GPT-2, llama_equiv.py's for Llama), on the tiny MoE presets: 2 layers,
d_model 64, 4 heads, 4 experts of width 96, top-2, a 32-token context, a load-balancing
loss of coefficient 0.01 (olmoe-tiny: whole-projection q/k norms; qwen3-moe-tiny: 32-wide
heads over 2 kv heads, per-head q/k norms, renormalised top-k; mixtral-tiny: neither).

`moe_equiv.py WORKER CASE`. Each case trains 20 steps on one rank and on meshes with the same
global batch, reads every step's loss (and load-balancing loss) from train.metrics and the
final parameters from the safetensors file each run --saves, and compares them with
equiv.py's tolerances, for equiv.py's reasons (its docstring): the same float32 sums in
another order under dp, tp and sequence parallelism (LOSS_RTOL, PARAM_ATOL: the experts'
row-parallel down projections sum F / tp = 48 terms, fewer than GPT-2's 256); pipeline-only
meshes run the same ops, so they meet PP_LOSS_RTOL and PP_PARAM_ATOL; mixed precision
MP_LOSS_RTOL and MP_PARAM_ATOL.

The load-balancing loss and a capacity are computed per micro-batch (transformers computes
them per forward call), so a one-rank reference of a mesh with dp ranks takes dp times the
micro-batches: one rank's micro-batch m x dp + r is dp rank r's micro-batch m (data.c deals
the rows so), and each micro-batch sees the same tokens on both. Expert choices follow the
probabilities; a choice two experts tie for within float32 rounding could go either way on
two meshes and move one token's output by O(1): these seeds have none (a flip shows as a
loss jump far beyond the tolerances).

Cases:
  tp        olmoe tp 2 (its q/k norms' statistics summed over tp) with sequence parallelism,
            qwen3_moe tp 2 (per-head norms: their gradients summed over tp), mixtral dp 2 x
            tp 2 with sequence parallelism
  pp        olmoe pp 2 1F1B and GPipe (the routers' statistics cross the stages in the
            pipeline messages), 4-layer qwen3_moe interleaved (2 chunks), each against one
            rank with the same 4 micro-batches at one thread
  dp-zero   mixtral dp 2, ZeRO-1, ZeRO-3 (= ZeRO-2 bit for bit)
  capacity  olmoe with capacity factor 1 (tokens dropped and counted) on dp 2 and on ep 2,
            and the z-loss, against one rank
  mixed     bf16 tp 2 x pp 2 with activation checkpointing, against one rank in bf16
  ep        expert parallelism: olmoe ep 2 and ep 4 (each rank one expert), mixtral ep 2
            inside dp 4 (two expert-data-parallel replicas)
  ep-tp     qwen3_moe ep 2 x tp 2 with sequence parallelism
  ep-pp     mixtral ep 2 x pp 2, 1F1B
  ep-zero   olmoe ep 2 ZeRO-1, ZeRO-2, ZeRO-3 (= ZeRO-2 bit for bit), ep 2 inside dp 4 ZeRO-3
            (the dense tensors sharded over dp, the experts' over their edp group)
  ep-bf16   bf16 ep 2, and bf16 ep 2 x tp 2, against one rank in bf16
  skew      every token to one expert: a model whose embedding rows are all equal (so every
            token's router input is the same: attention averages equal values) and top-1, so
            at the first step one expert takes all tokens and three take none on every rank;
            ep 4 trains without a hang and equals one rank, the load says so
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equiv  # noqa: E402  the tolerances (and their reasons)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "io"))
import st_ref  # noqa: E402  the safetensors reader

WORKER, CASE = sys.argv[1], sys.argv[2]
MPIRUN = equiv.MPIRUN
STEPS = equiv.STEPS
MP_STEPS = 6  # bf16's chaotic trajectory: llama_equiv.py's reason for 6 steps
# Under bf16 a mesh's reordered fp32 sums flip some bf16 operands by an ulp (equiv.py), and a
# router input so moved can change a token's choice where two experts' scores nearly tie:
# the load-balancing loss E / R^2 sum_e cnt_e psum_e then moves by E / R^2 |psum_a - psum_b|,
# for these models (E 4, R = 2 layers x 128 tokens, psums a few tens apart) about 3e-4 of it
# per flipped choice (measured: 2.2e-3 on mixtral bf16 ep 2 x tp 2, a handful of flips, the
# loss still within 2.2e-5). MP_AUX_RTOL = 1e-2 allows some thirty; a wrong aux loss is O(1).
MP_AUX_RTOL = 1e-2
# The skewed model's tokens start equal and part slowly: its routing stays near-degenerate
# (every token's scores almost alike), where an ulp can move a token to another expert, so
# it trains the few steps in which the skew holds (case_skew).
SKEW_STEPS = 4
BASE = ["train.batch_size=8", "train.eval_every=0", "train.seed=1234", "train.warmup=5"]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def train(n, preset, extra, tmp, tag, steps=STEPS):
    metrics = os.path.join(tmp, f"{tag}.jsonl")
    save = os.path.join(tmp, f"{tag}.safetensors")
    args = [WORKER, f"model.preset={preset}"] + BASE + [f"train.steps={steps}"] + extra + [
        f"train.metrics={metrics}", "--save", save, "--save-format", "safetensors"]
    cmd = (MPIRUN + ["-np", str(n)] + args) if n > 1 else args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    rows = [json.loads(x) for x in open(metrics) if x.strip()]
    if len(rows) != steps:
        fail(f"{tag}: {len(rows)} metric lines, want {steps}")
    params = {k: v for k, (_, v) in st_ref.read_f32(save).items()}
    return [r["loss"] for r in rows], params, p.stdout, rows


def compare(ref, got, what, loss_rtol=equiv.LOSS_RTOL, param_atol=equiv.PARAM_ATOL, skip=(),
            aux_rtol=None):
    aux_rtol = aux_rtol or loss_rtol
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref[0], got[0]))
    if sorted(ref[1]) != sorted(got[1]):
        fail(f"{what}: tensors differ: {sorted(set(ref[1]) ^ set(got[1]))[:4]}")
    where, dmax = "", 0.0
    for name, a in ref[1].items():
        if any(k in name for k in skip):
            continue
        d = max(abs(x - y) for x, y in zip(a, got[1][name]))
        if d > dmax:
            where, dmax = name, d
    aux = [(r.get("router/aux_loss"), g.get("router/aux_loss")) for r, g in zip(ref[3], got[3])]
    daux = max(abs(a - b) / a for a, b in aux) if all(a and b for a, b in aux) else None
    if worst > loss_rtol or dmax > param_atol or daux is None or daux > aux_rtol:
        fail(f"{what}: loss rel diff {worst:.2e} (tol {loss_rtol}), aux_loss rel diff {daux} (tol "
             f"{aux_rtol}), max param diff {dmax:.2e} in {where} (tol {param_atol})")
    l1 = ref[0]
    if not l1[-1] < l1[0] - (0.1 if len(l1) >= STEPS else 0.0):
        fail(f"{what}: training did not progress: {l1[0]} -> {l1[-1]}")
    print(f"ok: {what}: {len(l1)} steps, worst loss rel diff {worst:.2e} (tol {loss_rtol}), "
          f"aux_loss {daux:.2e} (tol {aux_rtol}), max param diff {dmax:.2e} in {where} (tol "
          f"{param_atol}); loss "
          f"{l1[0]:.4f} -> {l1[-1]:.4f}, aux_loss {ref[3][0]['router/aux_loss']:.4f} -> "
          f"{ref[3][-1]['router/aux_loss']:.4f}")


def same_bits(a, b, what, other):
    if a[0] != b[0] or a[1] != b[1]:
        fail(f"{what}: parameters or losses differ from {other}'s")
    print(f"ok: {what}: --save and every loss identical to {other}'s")


def case_tp(tmp):
    ref = train(1, "olmoe-tiny", [], tmp, "olmoe")
    compare(ref, train(2, "olmoe-tiny", ["mesh.tp=2", "parallel.sequence=true"], tmp, "olmoe-tp2"),
            "olmoe tp 2 sequence-parallel")
    ref = train(1, "qwen3-moe-tiny", [], tmp, "qwen3")
    compare(ref, train(2, "qwen3-moe-tiny", ["mesh.tp=2"], tmp, "qwen3-tp2"), "qwen3_moe tp 2")
    one = ["train.microbatches=2"]
    ref = train(1, "mixtral-tiny", one, tmp, "mixtral")
    compare(ref, train(4, "mixtral-tiny", ["mesh.dp=2", "mesh.tp=2", "parallel.sequence=true"],
                       tmp, "mixtral-dp2tp2"), "mixtral dp 2 x tp 2 sequence-parallel")


def case_pp(tmp):
    one = ["train.microbatches=4", "runtime.threads=1"]
    ref = train(1, "olmoe-tiny", one, tmp, "olmoe")
    for sched in ("1f1b", "gpipe"):
        got = train(2, "olmoe-tiny", one + ["mesh.pp=2", f"train.schedule={sched}"], tmp, sched)
        compare(ref, got, f"olmoe pp 2 {sched}", equiv.PP_LOSS_RTOL, equiv.PP_PARAM_ATOL)
    four = one + ["model.layers=4"]
    ref = train(1, "qwen3-moe-tiny", four, tmp, "qwen3-l4")
    got = train(2, "qwen3-moe-tiny", four + ["mesh.pp=2", "train.schedule=interleaved",
                                             "parallel.virtual_stages=2"], tmp, "interleaved")
    compare(ref, got, "qwen3_moe pp 2 interleaved", equiv.PP_LOSS_RTOL, equiv.PP_PARAM_ATOL)


def case_dp_zero(tmp):
    ref = train(1, "mixtral-tiny", ["train.microbatches=2"], tmp, "ref")
    compare(ref, train(2, "mixtral-tiny", ["mesh.dp=2"], tmp, "dp2"), "mixtral dp 2")
    compare(ref, train(2, "mixtral-tiny", ["mesh.dp=2", "optim.zero=1"], tmp, "z1"),
            "mixtral dp 2 ZeRO-1")
    z2 = train(2, "mixtral-tiny", ["mesh.dp=2", "optim.zero=2", "optim.bucket_mb=0"], tmp, "z2")
    z3 = train(2, "mixtral-tiny", ["mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0"], tmp, "z3")
    compare(ref, z3, "mixtral dp 2 ZeRO-3")
    same_bits(z3, z2, "mixtral dp 2 ZeRO-3", "ZeRO-2")


def case_capacity(tmp):
    knobs = ["model.capacity_factor=1", "model.router_z_loss_coef=0.001"]
    ref = train(1, "olmoe-tiny", knobs + ["train.microbatches=2"], tmp, "ref")
    if not any(r.get("router/dropped_tokens", 0) > 0 for r in ref[3]):
        fail(f"capacity factor 1 dropped no tokens: {[r.get('router/dropped_tokens') for r in ref[3]]}")
    for tag, mesh in (("dp2", ["mesh.dp=2"]), ("ep2", ["mesh.dp=2", "mesh.ep=2"])):
        got = train(2, "olmoe-tiny", knobs + mesh, tmp, tag)
        if [r["router/dropped_tokens"] for r in ref[3]] != [r["router/dropped_tokens"] for r in got[3]]:
            fail(f"the dropped tokens differ between one rank and {tag}")
        compare(ref, got, f"olmoe capacity 1 {tag} with the z-loss")


def case_ep(tmp):
    for n in (2, 4):
        ref = train(1, "olmoe-tiny", [f"train.microbatches={n}"], tmp, f"ref{n}")
        compare(ref, train(n, "olmoe-tiny", [f"mesh.dp={n}", f"mesh.ep={n}"], tmp, f"ep{n}"),
                f"olmoe ep {n}")
    ref = train(1, "mixtral-tiny", ["train.microbatches=4"], tmp, "mixtral")
    compare(ref, train(4, "mixtral-tiny", ["mesh.dp=4", "mesh.ep=2"], tmp, "dp4ep2"),
            "mixtral ep 2 inside dp 4")


def case_ep_tp(tmp):
    ref = train(1, "qwen3-moe-tiny", ["train.microbatches=2"], tmp, "ref")
    compare(ref, train(4, "qwen3-moe-tiny", ["mesh.dp=2", "mesh.ep=2", "mesh.tp=2",
                                             "parallel.sequence=true"], tmp, "ep2tp2"),
            "qwen3_moe ep 2 x tp 2 sequence-parallel")


def case_ep_pp(tmp):
    ref = train(1, "mixtral-tiny", ["train.microbatches=4", "runtime.threads=1"], tmp, "ref")
    got = train(4, "mixtral-tiny", ["train.microbatches=2", "runtime.threads=1", "mesh.dp=2",
                                    "mesh.ep=2", "mesh.pp=2", "train.schedule=1f1b"], tmp, "ep2pp2")
    compare(ref, got, "mixtral ep 2 x pp 2 1F1B")


def case_ep_zero(tmp):
    ref = train(1, "olmoe-tiny", ["train.microbatches=2"], tmp, "ref")
    ep2 = ["mesh.dp=2", "mesh.ep=2", "optim.bucket_mb=0"]
    compare(ref, train(2, "olmoe-tiny", ep2 + ["optim.zero=1"], tmp, "z1"), "olmoe ep 2 ZeRO-1")
    z2 = train(2, "olmoe-tiny", ep2 + ["optim.zero=2"], tmp, "z2")
    z3 = train(2, "olmoe-tiny", ep2 + ["optim.zero=3"], tmp, "z3")
    compare(ref, z3, "olmoe ep 2 ZeRO-3")
    same_bits(z3, z2, "olmoe ep 2 ZeRO-3", "ZeRO-2")
    ref = train(1, "olmoe-tiny", ["train.microbatches=4"], tmp, "ref4")
    compare(ref, train(4, "olmoe-tiny", ["mesh.dp=4", "mesh.ep=2", "optim.zero=3"], tmp, "dp4"),
            "olmoe ep 2 inside dp 4 ZeRO-3")


def case_ep_bf16(tmp):
    both = ["precision=bf16", "train.microbatches=2"]
    ref = train(1, "mixtral-tiny", both, tmp, "ref", steps=MP_STEPS)
    compare(ref, train(2, "mixtral-tiny", both[:1] + ["mesh.dp=2", "mesh.ep=2"], tmp, "ep2",
                       steps=MP_STEPS), "mixtral bf16 ep 2", equiv.MP_LOSS_RTOL, equiv.MP_PARAM_ATOL,
            aux_rtol=MP_AUX_RTOL)
    compare(ref, train(4, "mixtral-tiny", both[:1] + ["mesh.dp=2", "mesh.ep=2", "mesh.tp=2"], tmp,
                       "ep2tp2", steps=MP_STEPS), "mixtral bf16 ep 2 x tp 2", equiv.MP_LOSS_RTOL,
            equiv.MP_PARAM_ATOL, aux_rtol=MP_AUX_RTOL)


def skewed_model(tmp):
    """An OLMoE folder (tests/model/moe_ref.py's weights) with every embedding row equal and
    top-1: every token's router input is the same, so all choose one expert."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "model"))
    import moe_ref  # noqa: E402
    d = os.path.join(tmp, "skewed")
    os.makedirs(d)
    cfg = {"model_type": "olmoe", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96,
           "num_experts": 4, "num_experts_per_tok": 1, "max_position_embeddings": 32,
           "router_aux_loss_coef": 0.01, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    w = moe_ref.init_weights(moe_ref.Config(cfg), 3, std=0.3)
    emb = w["model.embed_tokens.weight"]
    emb[:] = emb[0]
    moe_ref.L.st_write(os.path.join(d, "model.safetensors"), w)
    return d


def case_skew(tmp):
    init = [f"model.init={skewed_model(tmp)}", "train.seq_len=32", "train.warmup=0"]
    ref = train(1, "olmoe-tiny", init + ["train.microbatches=4"], tmp, "ref", steps=SKEW_STEPS)
    got = train(4, "olmoe-tiny", init + ["mesh.dp=4", "mesh.ep=4"], tmp, "ep4", steps=SKEW_STEPS)
    for tag, run in (("one rank", ref), ("ep 4", got)):
        first = run[3][0]["expert_load"]
        if any(lo != 0 or hi != 8 * 32 for lo, hi, _ in first):
            fail(f"{tag}: step 1's expert load {first}: want one expert with all 256 tokens")
    print(f"ok: step 1 routes every token to one expert in each layer: {got[3][0]['expert_load']}")
    # Equal tokens make attention average equal values: its output does not depend on the
    # queries and keys, whose gradients (q_proj, k_proj and their norms') are then zero in
    # exact arithmetic, pure rounding noise that Adam turns into lr-sized steps (equiv.py's
    # key biases): those are left out of the parameter comparison.
    compare(ref, got, "olmoe ep 4 with every token to one expert (q and k weights aside)",
            skip=("q_proj", "k_proj", "q_norm", "k_norm"))


def case_mixed(tmp):
    both = ["precision=bf16", "train.microbatches=2", "parallel.activation_checkpointing=true"]
    ref = train(1, "qwen3-moe-tiny", both, tmp, "ref", steps=MP_STEPS)
    got = train(4, "qwen3-moe-tiny", both + ["mesh.tp=2", "mesh.pp=2"], tmp, "tp2pp2",
                steps=MP_STEPS)
    compare(ref, got, "qwen3_moe bf16 tp 2 x pp 2 recompute", equiv.MP_LOSS_RTOL,
            equiv.MP_PARAM_ATOL, aux_rtol=MP_AUX_RTOL)


CASES = {"tp": case_tp, "pp": case_pp, "dp-zero": case_dp_zero, "capacity": case_capacity,
         "mixed": case_mixed, "ep": case_ep, "ep-tp": case_ep_tp, "ep-pp": case_ep_pp,
         "ep-zero": case_ep_zero, "ep-bf16": case_ep_bf16, "skew": case_skew}

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmpdir:
        CASES[CASE](tmpdir)
