"""Tensor- and pipeline-parallel cases of equiv.py (`equiv.py WORKER CASE`).

The tolerances and the measured differences are in equiv.py's docstring. Besides the
loss/parameter equivalence with one rank, the cases check what the step log promises
for pipelines (the tied-embedding line, one act_mib entry per stage, 1F1B vs GPipe
activation memory), the --dump-state debug file of a tp x pp mesh, the Chrome trace of
a tp x pp run, and the refusals of configurations the engine does not run. The
mixed-precision cases (bf16-*, fp16-*) give both runs the same precision arguments and
compare within the MP_* tolerances; bf16-dump-state compares one forward and backward.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

# name: (ranks, mesh arguments, train.microbatches of both runs, pipeline stages[,
#        arguments of both runs: mixed precision])
EQUIV = {
    "tp2": (2, ["mesh.tp=2"], 1, 1),
    "tp4": (4, ["mesh.tp=4"], 1, 1),
    "tp2-seq": (2, ["mesh.tp=2", "parallel.sequence=true"], 1, 1),
    "tp4-seq": (4, ["mesh.tp=4", "parallel.sequence=true"], 1, 1),
    "pp2-1f1b": (2, ["mesh.pp=2", "train.schedule=1f1b"], 4, 2),
    "pp2-gpipe": (2, ["mesh.pp=2", "train.schedule=gpipe"], 4, 2),
    "pp4-1f1b": (4, ["mesh.pp=4", "train.schedule=1f1b"], 8, 4),
    "pp4-gpipe": (4, ["mesh.pp=4", "train.schedule=gpipe"], 8, 4),
    "pp2-uneven": (2, ["mesh.pp=2", "parallel.pp_layers=[1,3]"], 2, 2),
    "pp2-interleaved": (2, ["mesh.pp=2", "train.schedule=interleaved",
                            "parallel.virtual_stages=2"], 4, 2),
    "dp2tp2": (4, ["mesh.tp=2", "mesh.dp=2"], 1, 1),
    "dp2pp2-zero": (4, ["mesh.pp=2", "mesh.dp=2", "optim.zero=1"], 2, 2),
    # ZeRO-2 under 1F1B: every micro-batch's windows reduced as backward finishes them
    "dp2pp2-zero2": (4, ["mesh.pp=2", "mesh.dp=2", "optim.zero=2"], 2, 2),
    # the tp-partial layernorms are summed over tp before ZeRO-2's last reduction
    "dp2tp2-seq-zero2": (4, ["mesh.tp=2", "mesh.dp=2", "parallel.sequence=true",
                             "optim.zero=2"], 1, 1),
    "3d": (8, ["mesh.tp=2", "mesh.pp=2", "train.schedule=1f1b", "parallel.sequence=true"], 4,
           2),
    "bf16-dp2": (2, ["mesh.dp=2"], 1, 1, ["precision=bf16"]),
    "bf16-tp2pp2": (4, ["mesh.tp=2", "mesh.pp=2"], 2, 2, ["precision=bf16"]),
    "bf16-3d": (8, ["mesh.tp=2", "mesh.pp=2", "parallel.sequence=true"], 4, 2,
                ["precision=bf16"]),
    "bf16-pp2-interleaved-recompute": (2, ["mesh.pp=2", "train.schedule=interleaved",
                                           "parallel.virtual_stages=2",
                                           "parallel.activation_checkpointing=true"], 4, 2,
                                       ["precision=bf16"]),
    # ZeRO-3 with tp (shards of tp shards) and with pp (each stage's layers are its units,
    # gathered again for every micro-batch's forward and backward)
    "dp2tp2-zero3": (4, ["mesh.tp=2", "mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0"], 1, 1),
    "dp2pp2-zero3": (4, ["mesh.pp=2", "mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0"], 2, 2),
    # ZeRO-2/3 under the interleaved schedule: buckets end with their model chunk, a
    # window opens when a chunk's backward reaches its bucket, ZeRO-3 gathers each
    # chunk's layers in the order the schedule runs them
    "dp2pp2-interleaved-zero2": (4, ["mesh.pp=2", "mesh.dp=2", "train.schedule=interleaved",
                                     "parallel.virtual_stages=2", "optim.zero=2"], 4, 2),
    "dp2pp2-interleaved-zero3": (4, ["mesh.pp=2", "mesh.dp=2", "train.schedule=interleaved",
                                     "parallel.virtual_stages=2", "optim.zero=3",
                                     "optim.bucket_mb=0"], 4, 2),
    # the same under mixed precision (each gathered window keeps its rounded GEMM copy),
    # and HSDP (two fsdp groups of two) with interleaved chunks: 8 ranks
    "bf16-dp2pp2-interleaved-zero3": (4, ["mesh.pp=2", "mesh.dp=2",
                                          "train.schedule=interleaved",
                                          "parallel.virtual_stages=2", "optim.zero=3",
                                          "optim.bucket_mb=0"], 4, 2, ["precision=bf16"]),
    "hsdp2x2pp2-interleaved-zero2": (8, ["mesh.pp=2", "mesh.dp=4", "mesh.fsdp=2",
                                         "train.schedule=interleaved",
                                         "parallel.virtual_stages=2", "optim.zero=2"], 2, 2),
    "bf16-dp2-zero2-recompute": (2, ["mesh.dp=2", "optim.zero=2",
                                     "parallel.activation_checkpointing=true"], 1, 1,
                                 ["precision=bf16"]),
    # a first scale of 2^30 overflows: the first 8 steps are skipped on every mesh alike
    "fp16-dp2pp2-zero": (4, ["mesh.pp=2", "mesh.dp=2", "optim.zero=1"], 2, 2,
                         ["precision=fp16", "optim.loss_scale_init=1073741824"]),
}
OTHER = ["dump-state", "init-sliced", "trace", "refuse-tp-heads",
         "refuse-interleaved-pp-layers", "bf16-dump-state", "refuse-fsdp-zero0",
         "refuse-fsdp-divide"]
CASES = list(EQUIV) + OTHER

TIED = "tied embedding: the first and last stage's copies were identical after each of {} steps"
# The continuation line may start with other fields (tp_ms=.. at tp > 1).
CONT = re.compile(r"^\s+(?:\w+=\S+\s+)*bubble=([\d.]+)% theory=([\d.]+)%\s+"
                  r"act_mib=\[([^\]]*)\]\s*$")


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def pipeline_lines(out, steps, pp, what):
    """The act_mib lists of the continuation lines printed after each step line."""
    lines = out.splitlines()
    acts = []
    for i, line in enumerate(lines):
        if re.match(rf"^step \d+/{steps} ", line):
            m = CONT.match(lines[i + 1]) if i + 1 < len(lines) else None
            if not m:
                fail(f"{what}: step line not followed by 'bubble=..% theory=..% act_mib=[..]': "
                     f"{line!r} / {lines[i + 1] if i + 1 < len(lines) else '<eof>'!r}")
            act = [float(x) for x in m.group(3).split(",")]
            if len(act) != pp:
                fail(f"{what}: act_mib has {len(act)} entries, want one per stage ({pp}): "
                     f"{lines[i + 1]!r}")
            acts.append(act)
    if len(acts) != steps:
        fail(f"{what}: {len(acts)} step lines with a pipeline continuation, want {steps}")
    return acts


def check_pipeline(eq, name, got, pp, m, tmp, extra):
    out = got[2]
    if TIED.format(eq.STEPS) not in out:
        fail(f"{name}: stdout lacks the line {TIED.format(eq.STEPS)!r}")
    act = pipeline_lines(out, eq.STEPS, pp, name)[-1]
    sched = "gpipe" if "train.schedule=gpipe" in extra else \
        "interleaved" if "train.schedule=interleaved" in extra else "1f1b"
    balanced = not any(a.startswith("parallel.pp_layers") for a in extra)
    slots = got[3].get("act_slots")
    if sched != "interleaved":
        # The memory bound, held exactly: under 1F1B stage r holds
        # min(p - r, m) micro-batches at its peak, under GPipe all m.
        want = [m if sched == "gpipe" else min(pp - r, m) for r in range(pp)]
        if slots != want:
            fail(f"{name}: act_slots {slots} in the metrics, want {want} ({sched}, m={m})")
        print(f"ok: act_slots {slots} = {'m' if sched == 'gpipe' else 'min(p - r, m)'}")
    if sched == "1f1b" and balanced:
        # Stage r holds min(p - r, m) micro-batches, stage 0 min(p, m): the most.
        if any(a > act[0] for a in act[1:]):
            fail(f"{name}: 1F1B act_mib={act}: a later stage holds more than stage 0")
    if sched == "gpipe":
        # Every stage holds all m micro-batches, so stage 0 holds more than under 1F1B
        # (min(p, m) micro-batches) when m > p: a short 1F1B run of the same mesh.
        one = [a if a != "train.schedule=gpipe" else "train.schedule=1f1b" for a in extra]
        short = eq.train(pp, one + [f"train.microbatches={m}"], tmp, "short1f1b",
                         steps=2)
        act1 = pipeline_lines(short[2], 2, pp, name + " (1f1b)")[-1]
        if m > pp and not act[0] > act1[0]:
            fail(f"{name}: stage 0 act_mib {act[0]} under GPipe is not above {act1[0]} "
                 f"under 1F1B with m={m} > p={pp}")
        print(f"ok: act_mib GPipe {act} vs 1F1B {act1} (m={m}, p={pp})")
    else:
        print(f"ok: act_mib {sched} {act}")
    print(f"ok: {TIED.format(eq.STEPS)}")


def key_bias(n_params):
    """Indices of the attention key biases in an llm.c checkpoint of gpt2-tiny."""
    L, C, V, T = 4, 64, 256, 64
    if n_params != V * C + T * C + 12 * L * C * C + 13 * L * C + 2 * C:
        fail(f"checkpoint holds {n_params} parameters, not gpt2-tiny's")
    off = V * C + T * C + 2 * L * C + 3 * L * C * C  # wte wpe ln1w ln1b qkvw
    return {off + l * 3 * C + C + i for l in range(L) for i in range(C)}


def key_bias_diffs(ref, got):
    """Worst loss rel diff, max parameter diff outside the attention key biases, and max
    diff of the key biases (whose gradient is pure noise: equiv.py's docstring)."""
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref[0], got[0]))
    kb = key_bias(len(ref[1]))
    rest = max(abs(a - b) for i, (a, b) in enumerate(zip(ref[1], got[1])) if i not in kb)
    dkb = max(abs(ref[1][i] - got[1][i]) for i in kb)
    return worst, rest, dkb


def check_pipeline_tight(eq, name, ref, got):
    """Pipeline stages run the same ops on the same micro-batches: only the sums across
    stages (tied-embedding gradient, grad norm) are added in another order, so apart
    from the key biases (zero gradient in exact arithmetic: Adam normalises rounding
    noise into lr-sized steps) parameters agree to PP_PARAM_ATOL, losses to PP_LOSS_RTOL."""
    worst, rest, dkb = key_bias_diffs(ref, got)
    if worst > eq.PP_LOSS_RTOL or rest > eq.PP_PARAM_ATOL:
        fail(f"{name}: pipeline-only mesh: loss rel diff {worst:.2e} (tol {eq.PP_LOSS_RTOL}), "
             f"params outside the key biases {rest:.2e} (tol {eq.PP_PARAM_ATOL})")
    print(f"ok: {name}: pipeline-only: loss rel diff {worst:.2e} (tol {eq.PP_LOSS_RTOL}), "
          f"params outside the key biases {rest:.2e} (tol {eq.PP_PARAM_ATOL}), key biases "
          f"{dkb:.2e}")
    eq.RESULTS.append((f"{name} (params outside the key biases)", worst, rest))


def pipeline_only(extra):
    return all(a.startswith(("mesh.pp", "train.schedule", "parallel.pp_layers",
                             "parallel.virtual_stages")) for a in extra)


def check_mixed(eq, name, ref, got, tmp):
    """Mixed precision (equiv.py's docstring says why these tolerances): losses within
    MP_LOSS_RTOL, parameters outside the key biases within MP_PARAM_ATOL; under fp16 both
    runs used the same loss scale and skipped the same steps, at every step."""
    l1, out = ref[0], got[2]
    worst, rest, dkb = key_bias_diffs(ref, got)
    if worst > eq.MP_LOSS_RTOL or rest > eq.MP_PARAM_ATOL:
        fail(f"{name}: loss rel diff {worst:.2e} (tol {eq.MP_LOSS_RTOL}), params outside the "
             f"key biases {rest:.2e} (tol {eq.MP_PARAM_ATOL})")
    if not l1[-1] < l1[0] - 0.1:
        fail(f"{name}: training did not progress: {l1[0]} -> {l1[-1]}")
    rows = [[json.loads(x) for x in open(os.path.join(tmp, f"{tag}.jsonl"))]
            for tag in ("ref", name)]
    scales = [[(r.get("loss_scale"), r.get("skipped_steps")) for r in rs] for rs in rows]
    if "fp16" in name and (scales[0] != scales[1] or not scales[0][-1][1]):
        fail(f"{name}: loss scale and skipped steps per step differ from one rank's, or none "
             f"was skipped:\n one rank {scales[0]}\n mesh     {scales[1]}")
    print(f"ok: {name}: {eq.STEPS} steps, loss rel diff {worst:.2e} (tol {eq.MP_LOSS_RTOL}), "
          f"params outside the key biases {rest:.2e} (tol {eq.MP_PARAM_ATOL}), key biases "
          f"{dkb:.2e}; loss {l1[0]:.4f} -> {l1[-1]:.4f}")
    if "fp16" in name:
        print(f"ok: {name}: the same loss scale at every step ({scales[0][0][0]:.0f} -> "
              f"{scales[0][-1][0]:.0f}) and the same {scales[0][-1][1]} skipped steps")
    print(out[-1500:])
    eq.RESULTS.append((f"{name} (params outside the key biases)", worst, rest))


def equiv(eq, name, tmp):
    n, extra, m, pp = EQUIV[name][:4]
    both = list(EQUIV[name][4]) if len(EQUIV[name]) > 4 else []
    mb = ([f"train.microbatches={m}"] if m > 1 else []) + both
    # The tight pipeline comparison needs both runs to split each GEMM over the same
    # number of threads (see equiv.py's docstring): one thread per rank on both sides.
    tight = pp > 1 and pipeline_only(extra) and not both
    mb += ["runtime.threads=1"] if tight else []
    ref = eq.train(1, mb, tmp, "ref")
    got = eq.train(n, extra + mb, tmp, name)
    if both:
        check_mixed(eq, name, ref, got, tmp)
    else:
        eq.compare(ref, got, f"{name} (np {n}: {' '.join(extra + mb)})")
    if pp > 1:
        if tight:
            check_pipeline_tight(eq, name, ref, got)
        check_pipeline(eq, name, got, pp, m, tmp, extra)
    if pp == 1 and "parallel.sequence=true" in extra:
        check_sequence_memory(eq, name, got, n, extra, tmp)
    if name.startswith("dp2pp2-interleaved-zero"):
        check_interleaved_zero_memory(name, got)
    if name == "dp2pp2-interleaved-zero3":
        # gathers are copies: ZeRO-3 trains bit for bit as ZeRO-2 on the same buckets
        z2 = [a if a != "optim.zero=3" else "optim.zero=2" for a in extra]
        eq.same_bits(got, eq.train(n, z2 + mb, tmp, name + "-z2"), name, "ZeRO-2")


def check_interleaved_zero_memory(name, got):
    """Under the interleaved schedule a ZeRO-2/3 bucket never spans two model chunks, so
    with gpt2-tiny's one layer per chunk the two gradient windows (and ZeRO-3's two
    parameter windows) hold one layer each, not the two a bucket over the rank's layers
    would. Rank 0 (the metrics' rank) holds wte 256x64, wpe 64x64 (the edge, no final
    layernorm: that is the last stage's) and layers 0 and 2 of 12*64^2 + 13*64 each."""
    layer, edge = 12 * 64 * 64 + 13 * 64, 256 * 64 + 64 * 64
    n0 = edge + 2 * layer
    want = 4 * ((n0 + 1) // 2 + edge + 2 * layer)
    last = got[3]
    if last["grad_bytes"] != want:
        fail(f"{name}: rank 0 reports {last['grad_bytes']} gradient bytes, want {want} = 4 x "
             f"(shard {(n0 + 1) // 2} + edge {edge} + 2 one-layer windows of {layer})")
    if name.endswith("zero3") and last["param_bytes"] != want:
        fail(f"{name}: rank 0 reports {last['param_bytes']} parameter bytes, want {want} "
             f"(shard + edge + 2 one-layer windows)")
    print(f"ok: {name}: rank 0 gradient{' and parameter' if name.endswith('zero3') else ''} "
          f"bytes {want} = 4 x (shard + edge + 2 one-layer windows)")


def check_sequence_memory(eq, name, got, n, extra, tmp):
    """Sequence parallelism keeps 1/tp of the token rows in the layernorm and residual
    regions. In gpt2-tiny (L = 4, C = 64) those regions hold 4L + 2 = 18 (N, C)
    activations (the embedding output; per layer ln1, the attention residual, ln2 and
    the MLP residual; the final layernorm) and the 18 row statistics of the 2L + 1
    layernorms (a mean and a reciprocal std each, N rows). So against the same mesh
    without it, a stage's activations must shrink by exactly (1 - 1/tp) * 18 * N *
    (C + 1) floats (N = 8 x 64 / dp tokens per rank; every size is a multiple of
    the 16-float alignment, so no padding enters), while the tensor-parallel regions
    (qkv, attention, MLP: already 1/tp) stay as they are."""
    tp = int([a for a in extra if a.startswith("mesh.tp=")][0].split("=")[1])
    plain = [a for a in extra if a != "parallel.sequence=true"]
    without = eq.train(n, plain, tmp, name + "-noseq", steps=2)
    a_seq, a_full = got[3]["act_mib"][0], without[3]["act_mib"][0]
    N, C = 8 * 64 // (n // tp), 64  # the dp ranks split the batch (pp is 1 here)
    want = (1 - 1 / tp) * 18 * N * (C + 1) * 4 / 2**20
    if abs((a_full - a_seq) - want) > 1e-9:
        fail(f"{name}: activations {a_full:.6f} MiB without sequence parallelism, "
             f"{a_seq:.6f} MiB with: a drop of {a_full - a_seq:.6f} MiB, want {want:.6f}")
    print(f"ok: {name}: activations {a_full:.4f} -> {a_seq:.4f} MiB per rank, the drop "
          f"{a_full - a_seq:.6f} MiB = (1 - 1/{tp}) x 18 (N, C+1) replicated-region tensors")


def read_state(path):
    with open(path, "rb") as f:
        data = f.read()
    h = struct.unpack_from("256i", data, 0)
    if h[0] != 20240327 or h[1] != 2:
        fail(f"{path}: header {h[:4]}, want magic 20240327 version 2")
    B, T = h[2], h[3]
    off, N = 1024, h[2] * h[3]
    ints = lambda k: struct.unpack_from(f"{k}i", data, off)  # noqa: E731
    inputs = ints(N)
    off += 4 * N
    targets = ints(N)
    off += 4 * N
    rest = (len(data) - off) // 4
    floats = struct.unpack_from(f"{rest}f", data, off)
    return (B, T), inputs, targets, floats


def run_ok(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def dump_states(eq, tmp, base, runs):
    """--dump-state of each run {tag: (ranks, extra arguments)}, read back."""
    states = {}
    for tag, (n, extra) in runs.items():
        path = os.path.join(tmp, tag.replace(" ", "_") + ".state")
        cmd = [eq.WORKER] + base + extra + ["--dump-state", path]
        run_ok((eq.MPIRUN + ["-np", str(n)] + cmd) if n > 1 else cmd)
        states[tag] = read_state(path)
    return states


def dump_state(eq, tmp, init=False):
    """One rank's --dump-state against tp x pp meshes'. init: all start from an llm.c
    checkpoint that one rank trained for 3 steps (model.init), so each shard must slice
    the file exactly as the one-rank model reads it."""
    base = ["model.preset=gpt2-tiny", "train.batch_size=8", "train.seed=1234"]
    if init:
        ckpt = os.path.join(tmp, "init.bin")
        run_ok([eq.WORKER] + base + ["train.steps=3", "train.eval_every=0", "--save", ckpt])
        base = base + [f"model.init={ckpt}"]
    runs = {"one rank": (1, []), "tp2 pp2": (4, ["mesh.tp=2", "mesh.pp=2"]),
            "tp2 seq": (2, ["mesh.tp=2", "parallel.sequence=true"])}
    if init:
        runs["tp4"] = (4, ["mesh.tp=4"])
    states = dump_states(eq, tmp, base, runs)
    (bt, inp, tgt, fl) = states["one rank"]
    V = 256
    N = bt[0] * bt[1]
    nl = N * V
    logits, loss, grads = fl[:nl], fl[nl], fl[nl + 1:]
    gmax = max(abs(g) for g in grads)
    for tag in (t for t in runs if t != "one rank"):
        bt2, inp2, tgt2, fl2 = states[tag]
        if bt2 != bt or len(fl2) != len(fl):
            fail(f"dump-state {tag}: B,T {bt2} and {len(fl2)} floats vs {bt} and {len(fl)}")
        if inp2 != inp or tgt2 != tgt:
            fail(f"dump-state {tag}: inputs/targets differ from one rank's")
        dl = max(abs(a - b) for a, b in zip(logits, fl2[:nl]))
        dloss = abs(fl2[nl] - loss) / abs(loss)
        dg = max(abs(a - b) for a, b in zip(grads, fl2[nl + 1:]))
        print(f"dump-state {tag}: max logit diff {dl:.2e}, loss rel diff {dloss:.2e}, "
              f"max grad diff {dg:.2e} ({dg / gmax:.2e} of max |grad| {gmax:.3e})")
        if dl > eq.STATE_LOGIT_ATOL:
            fail(f"dump-state {tag}: logits differ by {dl:.2e} > {eq.STATE_LOGIT_ATOL}")
        if dloss > eq.STATE_LOSS_RTOL:
            fail(f"dump-state {tag}: loss rel diff {dloss:.2e} > {eq.STATE_LOSS_RTOL}")
        if dg > eq.STATE_GRAD_RTOL * gmax:
            fail(f"dump-state {tag}: grads differ by {dg:.2e} > {eq.STATE_GRAD_RTOL} x "
                 f"{gmax:.3e}")
        eq.RESULTS.append((f"dump-state {tag}", dloss, dg))
    print(f"ok: dump-state{' from model.init' if init else ''}: B={bt[0]} T={bt[1]} "
          f"inputs/targets identical, loss {loss:.6f}")


def dump_state_bf16(eq, tmp, base=("model.preset=gpt2-tiny", "train.batch_size=8",
                                    "train.seed=1234"), what="bf16-dump-state"):
    """One forward and backward under bf16 (--dump-state): one rank against tp2 x pp2, and
    against fp32. A mesh sums in another order, and an fp32 ulp that crosses a bf16
    rounding boundary flips one operand by a bf16 ulp, so a few token rows differ
    visibly; without rounding nearly every logit would (equiv.py: MP_STATE_*). base: the
    model's arguments (a vocabulary of 256)."""
    base = list(base)
    runs = {"bf16": (1, ["precision=bf16"]), "bf16 tp2 pp2":
            (4, ["precision=bf16", "mesh.tp=2", "mesh.pp=2"]), "fp32": (1, [])}
    states = {}
    for tag, ((B, T), _, _, fl) in dump_states(eq, tmp, base, runs).items():
        nl = B * T * 256
        states[tag] = (fl[:nl], fl[nl + 1:])
    figures = {}
    for tag in ("bf16 tp2 pp2", "fp32"):
        (la, ga), (lb, gb) = states["bf16"], states[tag]
        share = sum(abs(a - b) > 1e-5 for a, b in zip(la, lb)) / len(la)
        gmean = sum(abs(a - b) for a, b in zip(ga, gb)) / len(ga)
        figures[tag] = (share, gmean)
        print(f"bf16 one rank vs {tag}: {100 * share:.1f}% of the logits differ by > 1e-5, "
              f"gradients by {gmean:.2e} on average")
    (ms, mg), (fs, fg) = figures["bf16 tp2 pp2"], figures["fp32"]
    if ms > eq.MP_STATE_SHARE or mg > eq.MP_STATE_GRAD:
        fail(f"{what}: tp2 x pp2 differs from one rank in {100 * ms:.1f}% of the "
             f"logits (tol {100 * eq.MP_STATE_SHARE:.0f}%), gradients {mg:.2e} on average "
             f"(tol {eq.MP_STATE_GRAD})")
    if fs < 0.5:
        fail(f"{what}: only {100 * fs:.1f}% of the logits differ from fp32's: were "
             f"the GEMM operands rounded?")
    print(f"ok: {what}: the mesh is within {100 * eq.MP_STATE_SHARE:.0f}% / "
          f"{eq.MP_STATE_GRAD} of one rank, fp32 is not")


def trace_layout(ev, n, tp, dp):
    """One process per world rank (pid), named "rank R (pp P, dp D, tp T)" with the mesh
    coordinates of rank = tp + TP * (dp + DP * pp) (docs/architecture.md); threads 0 "compute",
    1 "communication", 2 "optimizer step", with the F/B spans on compute, the tp
    collectives and p2p waits on communication, and the optimizer step's whole name (it
    was once cut at 31 characters: "step end (reduction, norm, Adam")."""
    threads = {0: "compute", 1: "communication", 2: "optimizer step"}
    for r in range(n):
        meta = {(e.get("name"), e.get("tid")): (e.get("args") or {})
                for e in ev if e.get("ph") == "M" and e.get("pid") == r}
        want = f"rank {r} (pp {r // (tp * dp)}, dp {r // tp % dp}, tp {r % tp})"
        got = meta.get(("process_name", None), {}).get("name")
        if got != want:
            fail(f"trace: pid {r} is named {got!r}, want {want!r}")
        for tid, name in threads.items():
            if meta.get(("thread_name", tid), {}).get("name") != name:
                fail(f"trace: rank {r} thread {tid} is not named {name!r}: {meta}")
        names = {(e.get("tid"), e.get("name")) for e in ev
                 if e.get("ph") == "X" and e.get("pid") == r}
        if (2, "step end (reduction, norm, AdamW)") not in names:
            fail(f"trace: rank {r} has no whole 'step end (reduction, norm, AdamW)' span on "
                 f"thread 2: {sorted(n for t, n in names if t == 2)}")
        comm = sorted({nm for t, nm in names if t == 1})
        if not any(nm.startswith("tp ") for nm in comm):
            fail(f"trace: rank {r} has no tp collective on the communication thread: {comm}")
        if {t for t, _ in names} - set(threads):
            fail(f"trace: rank {r} has spans on unknown threads {sorted({t for t, _ in names})}")
    pids = sorted({e.get("pid") for e in ev})
    if pids != list(range(n)):
        fail(f"trace: pids {pids}, want 0..{n - 1} (one process per world rank)")
    print(f"ok: trace: {n} processes named by rank and mesh coordinates, threads compute, "
          f"communication and optimizer step, whole span names")


def trace(eq, tmp):
    """train.trace of a tp2 x pp2 run with the most spans per micro-batch: the interleaved
    schedule (two chunks per rank), sequence parallelism and activation checkpointing
    (a tp collective per region, forward, recompute and backward), on 8 layers. The file
    must parse, hold every rank's F and B of every micro-batch and chunk for the traced
    steps, and have dropped nothing (otherData.dropped_spans: the recorder is sized up
    front, and an undersized one lost a third of the spans of steps like this)."""
    path = os.path.join(tmp, "trace.json")
    cmd = eq.MPIRUN + ["-np", "4", eq.WORKER, "model.preset=gpt2-tiny", "train.batch_size=8",
                       "train.eval_every=0", "mesh.pp=2", "mesh.tp=2", "train.microbatches=4",
                       "train.schedule=interleaved", "parallel.virtual_stages=2",
                       "parallel.sequence=true", "parallel.activation_checkpointing=true",
                       "model.layers=8", "train.steps=3", f"train.trace={path}", "train.trace_steps=[2,3]"]
    run_ok(cmd)
    try:
        doc = json.load(open(path))
    except ValueError as e:
        fail(f"{path} is not valid JSON: {e}")
    ev = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(ev, list):
        fail(f"{path}: no traceEvents list")
    trace_layout(ev, 4, tp=2, dp=1)
    spans = [e for e in ev if e.get("ph") == "X"]
    for pid in range(4):
        mine = [e for e in spans if e.get("pid") == pid]
        if not mine:
            fail(f"trace: no 'X' events for rank {pid}")
        have = set()
        for e in mine:
            a = e.get("args") or {}
            if e["name"][:1] in "FB" and "mb" in a and "step" in a:
                if not (isinstance(e.get("ts"), (int, float)) and e.get("dur", -1) >= 0):
                    fail(f"trace: span without ts/dur: {e}")
                if e.get("tid") != 0:
                    fail(f"trace: rank {pid}'s {e['name']} is on thread {e.get('tid')}, not compute")
                have.add((e["name"][0], e["name"][-1], a["step"], a["mb"]))
        want = {(k, c, s, mb) for k in "FB" for c in "ab" for s in (2, 3) for mb in range(4)}
        if not want <= have:
            fail(f"trace: rank {pid} lacks spans {sorted(want - have)}")
        if {s for _, _, s, _ in have} != {2, 3}:
            fail(f"trace: rank {pid} has spans of steps {sorted({s for _, _, s, _ in have})}")
        print(f"ok: trace rank {pid}: {len(mine)} X events, F and B of chunks a, b for mb 0..3 "
              f"of steps 2, 3")
    dropped = (doc.get("otherData") or {}).get("dropped_spans")
    if dropped != [0] * 4:
        fail(f"trace: spans were dropped: otherData.dropped_spans = {dropped}")
    print("ok: trace: no span dropped")


def refuse(eq, name, tmp):
    spec = {
        "refuse-tp-heads": (["mesh.tp=2", "model.heads=3", "model.d_model=96"],
                            ["mesh.tp=2", "model.heads=3"]),
        "refuse-interleaved-pp-layers": (["mesh.pp=2", "train.schedule=interleaved",
                                          "parallel.virtual_stages=2", "model.layers=4",
                                          "train.microbatches=4", "parallel.pp_layers=[1,3]"],
                                         ["parallel.pp_layers", "interleaved"]),
        # (mesh.fsdp alone means ZeRO-3: only an explicit optim.zero=0 is refused)
        "refuse-fsdp-zero0": (["mesh.dp=2", "mesh.fsdp=2", "optim.zero=0"],
                              ["mesh.fsdp=2", "optim.zero=0", "1, 2 or 3"]),
        "refuse-fsdp-divide": (["mesh.dp=2", "mesh.fsdp=3", "optim.zero=1"],
                               ["mesh.fsdp=3", "mesh.dp=2"]),
    }[name]
    args, needles = spec[:2]
    np = spec[2] if len(spec) > 2 else 2  # ranks
    cmd = eq.MPIRUN + ["-np", str(np), eq.WORKER, "model.preset=gpt2-tiny", "train.steps=2",
                       "train.eval_every=0"] + args
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        fail(f"{name}: {' '.join(cmd)} did not exit within 10 s")
    out = p.stdout + p.stderr
    if p.returncode == 0:
        fail(f"{name}: exited 0\n{out}")
    msgs = [l for l in out.splitlines() if all(n in l for n in needles)]
    if len(msgs) != 1:
        fail(f"{name}: want exactly one line naming {needles}, got {len(msgs)}\n{out}")
    if re.search(r"^step \d+/", out, re.M):
        fail(f"{name}: refused configuration trained\n{out}")
    print(f"ok: {name}: exit {p.returncode}: {msgs[0].strip()}")


def run_case(name, eq):
    with tempfile.TemporaryDirectory() as tmp:
        if name in EQUIV:
            equiv(eq, name, tmp)
        elif name == "dump-state":
            dump_state(eq, tmp)
        elif name == "init-sliced":
            dump_state(eq, tmp, init=True)
        elif name == "trace":
            trace(eq, tmp)
        elif name == "bf16-dump-state":
            dump_state_bf16(eq, tmp)
        else:
            refuse(eq, name, tmp)
    for what, dl, dp in eq.RESULTS:
        print(f"RESULT {what}: worst loss rel diff {dl:.2e}, max param/grad diff {dp:.2e}")
