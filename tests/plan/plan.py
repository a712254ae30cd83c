#!/usr/bin/env python3
"""The planner's tests: `plan.py WORKER CASE`.

mem-* cases: the trainer's own memory against the planner's prediction. Each runs a mesh
under mpirun with --check-estimate: after the first step every rank prints the memory
worker --estimate predicts for its stage and dp rank, the memory the trainer reports
(the runtime's accounted allocations, the step line's mem=) and the growth of its
resident memory (VmRSS of /proc/self/status, read before the trainer's set-up and after
the first step). The same case is also asked of `worker --estimate --json` alone (a
singleton, planning the world from the mesh keys), whose per-stage totals must be the
figures the ranks printed.

Tolerances:
* predicted vs reported: the issue's 5% (MEM_RTOL). The prediction is the allocators'
  own arithmetic (wf_model_mem_plan, wf_grads_mem_plan, wf_pipe_mem_plan,
  wf_optim_mem_plan), so it is exact on the CPU device; anything else means the two
  drifted apart.
* predicted vs RSS growth: the issue's 10% (RSS_RTOL). RSS also grows by what the
  runtime does not account: OpenBLAS's per-thread buffers, Open MPI's shared-memory
  segments and the data loader's; measured about 1 MiB per rank here. The model is
  sized so a rank holds 15-60 MiB (a vocabulary of 8192 makes the embedding, its
  gradients and AdamW state, and the logits large at little compute), which keeps that
  overhead inside the tolerance.

err-* cases: a model that fits no plan, an impossible world size and a missing hardware
profile each fail with one clear error and exit non-zero.
est and plan-h100: --estimate's JSON against figures computed here from the model
dimensions, and --plan for 64 H100s and a GPT-2 XL-sized model. profile: --profile-hw
under mpirun writes a profile that --plan reads, and a profile missing a field is refused.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

MEM_RTOL = 0.05
RSS_RTOL = 0.10

# A small model with a large vocabulary: 4 layers, d_model 128, 4 heads, seq 32.
MODEL = ["model.layers=4", "model.heads=4", "model.d_model=128", "model.seq_len=32",
         "model.vocab=8192", "train.steps=1", "train.batch_size=8", "train.peak_tflops=1",
         "runtime.threads=1", "runtime.log_level=warn"]

MESHES = {
    "np1": (1, []),
    "dp2": (2, ["mesh.dp=2"]),
    "dp2-zero1": (2, ["mesh.dp=2", "optim.zero=1"]),
    "tp2": (2, ["mesh.tp=2"]),
    "tp2-sp": (2, ["mesh.tp=2", "parallel.sequence=true"]),
    "pp2-1f1b": (2, ["mesh.pp=2", "train.microbatches=4", "train.schedule=1f1b"]),
    "pp2-gpipe": (2, ["mesh.pp=2", "train.microbatches=4", "train.schedule=gpipe"]),
    "pp2-interleaved": (2, ["mesh.pp=2", "train.microbatches=4", "train.schedule=interleaved",
                            "parallel.virtual_stages=2"]),
    # the middle stages hold no embedding: 8 layers and 16-row micro-batches keep them
    # at ~15 MiB, well above the ~1 MiB RSS the runtime does not account
    "pp4-1f1b-recompute": (4, ["mesh.pp=4", "train.microbatches=4", "model.layers=8",
                               "train.batch_size=64", "parallel.activation_checkpointing=true"]),
    "np1-recompute": (1, ["parallel.activation_checkpointing=true"]),
    # many micro-batches: receive-in-place buffers (a constant number of messages)
    "pp2-1f1b-m32": (2, ["mesh.pp=2", "train.microbatches=32", "train.batch_size=32"]),
    "pp4-gpipe-m8": (4, ["mesh.pp=4", "train.microbatches=8", "model.layers=8",
                         "train.batch_size=64", "train.schedule=gpipe"]),
    # selective recompute: one layer's attention core in the shared buffer, 16-bit slots
    "tp2-sp-selective-bf16": (2, ["mesh.tp=2", "parallel.sequence=true", "precision=bf16",
                                  "parallel.activation_checkpointing=selective"]),
    "pp2-1f1b-full-fp16": (2, ["mesh.pp=2", "train.microbatches=4", "precision=fp16",
                               "parallel.activation_checkpointing=full"]),
    "np1-bf16": (1, ["precision=bf16"]),
    # ZeRO-2/3 and HSDP: the gradient path's buffers and ZeRO-3's gathered units come
    # from zero.c's plan, the one the trainer allocates by
    "dp2-zero2": (2, ["mesh.dp=2", "optim.zero=2"]),
    "cp2-zero1": (2, ["mesh.cp=2", "optim.zero=1"]),
    # one bucket per layer (bucket_mb 0): two windows of four units, or all four kept
    "dp2-zero3": (2, ["mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0"]),
    "dp2-zero3-keep": (2, ["mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0",
                           "parallel.reshard_after_forward=false"]),
    "hsdp2x2-zero3": (4, ["mesh.dp=4", "mesh.fsdp=2", "optim.zero=3"]),
    # ZeRO with tp's partial layernorms in edge, with pipeline stages, with bf16 windows
    "dp2tp2-sp-zero2": (4, ["mesh.dp=2", "mesh.tp=2", "parallel.sequence=true", "optim.zero=2"]),
    "dp2pp2-zero3": (4, ["mesh.dp=2", "mesh.pp=2", "train.microbatches=2", "optim.zero=3",
                         "optim.bucket_mb=0"]),
    "dp2-zero3-bf16": (2, ["mesh.dp=2", "optim.zero=3", "precision=bf16"]),
    # interleaved: ZeRO-2/3 buckets end with their model chunk (one layer each here)
    "pp2-interleaved-dp2-zero2": (4, ["mesh.dp=2", "mesh.pp=2", "train.microbatches=4",
                                      "train.schedule=interleaved", "parallel.virtual_stages=2",
                                      "optim.zero=2"]),
    "pp2-interleaved-dp2-zero3": (4, ["mesh.dp=2", "mesh.pp=2", "train.microbatches=4",
                                      "train.schedule=interleaved", "parallel.virtual_stages=2",
                                      "optim.zero=3"]),
    "3d-bf16": (8, ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.microbatches=2",
                    "train.schedule=interleaved", "parallel.virtual_stages=2",
                    "parallel.sequence=true", "optim.zero=1", "precision=bf16"]),
}

# The Llama family (llama-tiny's grouped-query attention, 4 heads over 2 kv heads, and
# SwiGLU) at d_model 128 and the same large vocabulary, untied: the embedding and the
# head are two (8192, 128) tensors, on the first and the last stage.
LLAMA = ["model.preset=llama-tiny", "model.d_model=128", "model.ffn=384", "model.seq_len=32",
         "model.vocab=8192", "train.steps=1", "train.batch_size=8", "train.peak_tflops=1",
         "runtime.threads=1", "runtime.log_level=warn"]
LLAMA_MESHES = {
    "np1": (1, []),
    "tp2-sp": (2, ["mesh.tp=2", "parallel.sequence=true"]),
    "pp2-interleaved": (2, ["mesh.pp=2", "train.microbatches=4", "train.schedule=interleaved",
                            "parallel.virtual_stages=2"]),
    "dp2-zero3": (2, ["mesh.dp=2", "optim.zero=3", "optim.bucket_mb=0"]),
    "cp2": (2, ["mesh.cp=2"]),
    # a vocabulary of 16384: at 8192 the last stage's 11 MiB left ~1.1 MiB of margin for
    # the ~1 MiB the runtime does not account, and 8 ranks on 2 loaded cores once went
    # past it
    "3d-bf16": (8, ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.microbatches=2",
                    "parallel.sequence=true", "optim.zero=1", "precision=bf16",
                    "parallel.activation_checkpointing=true", "model.vocab=16384"]),
}

# The mixture of experts (olmoe-tiny's 4 experts, top-2, q/k norms) at d_model 128 and the
# same large vocabulary: the experts' shards over ep, their two ZeRO ranges (the dense
# tensors over dp, the experts over dp / ep) and the routers' statistics.
MOE = ["model.preset=olmoe-tiny", "model.d_model=128", "model.ffn=192", "model.vocab=8192",
       "train.steps=1", "train.batch_size=8", "train.peak_tflops=1", "runtime.threads=1",
       "runtime.log_level=warn"]
MOE_MESHES = {
    "np1": (1, []),
    "ep2": (2, ["mesh.dp=2", "mesh.ep=2"]),
    "ep2-zero1": (2, ["mesh.dp=2", "mesh.ep=2", "optim.zero=1"]),
    "ep2-zero3": (2, ["mesh.dp=2", "mesh.ep=2", "optim.zero=3", "optim.bucket_mb=0"]),
    "dp4-ep2-zero2": (4, ["mesh.dp=4", "mesh.ep=2", "optim.zero=2"]),
    "ep2-tp2-sp-bf16": (4, ["mesh.dp=2", "mesh.ep=2", "mesh.tp=2", "parallel.sequence=true",
                            "precision=bf16"]),
}

# data.source: the loader's ring of rows (4 steps made ahead, every local lane's row and its
# document starts) is allocated through the runtime's memory layer, so predicted must equal
# reported to the byte (without wf_data_loader_bytes in the plan they differ by exactly
# that ring: 4160 bytes at dp 2 here). Text read as bytes (model.vocab 256, no tokenizer
# file needed); d_model 256 keeps a rank at ~50 MiB for RSS_RTOL.
STREAM = ["model.layers=4", "model.heads=4", "model.d_model=256", "model.seq_len=32",
          "model.vocab=256", "train.steps=1", "train.batch_size=8", "train.peak_tflops=1",
          "runtime.threads=1", "runtime.log_level=warn"]
STREAM_MESHES = {
    "dp2": (2, ["mesh.dp=2"]),
    # whole sequences on every cp rank, and every pipeline stage's loader (the middle
    # and the last stage hold one too)
    "pp2-cp2": (4, ["mesh.pp=2", "mesh.cp=2", "train.microbatches=2"]),
    # data.document_mask: every slot keeps its rows' document starts and positions, and
    # every stage's engine its batch's starts
    "pp2-docs": (2, ["mesh.pp=2", "train.microbatches=2", "data.document_mask=true"]),
}


def stream_source(tmp):
    """A JSON Lines file of 400 of Debian's fortunes, one document a line."""
    path = os.path.join(tmp, "docs.jsonl")
    text = open("/usr/share/games/fortunes/fortunes", encoding="utf-8").read()
    with open(path, "w") as f:
        for doc in [d.strip() for d in text.split("\n%\n") if d.strip()][:400]:
            f.write(json.dumps({"text": doc}) + "\n")
    return ["data.source=[%s]" % path]


CHECK = re.compile(r"estimate check: rank (\d+) stage (\d+) dp (\d+) predicted (\d+) bytes, "
                   r"reported (\d+) .*rss growth (-?\d+)")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(cmd, timeout=240, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if ok and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def mpirun(np):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
            str(np)]


def mem_case(worker, name, tmp):
    family = name.split("-")[0] if name.startswith(("llama-", "moe-", "stream-")) else ""
    meshes, base = {"llama": (LLAMA_MESHES, LLAMA), "moe": (MOE_MESHES, MOE),
                    "stream": (STREAM_MESHES, STREAM)}.get(family, (MESHES, MODEL))
    np, keys = meshes[name[len(family) + 1:] if family else name]
    args = base + keys + (stream_source(tmp) if family == "stream" else [])
    if "precision=bf16" in keys:
        # oneDNN's bf16 GEMMs (runtime.cpu_bf16_gemm) keep JIT code, a primitive cache and
        # scratchpads in library memory the planner cannot see: 2.2-3 MiB per rank here
        # (measured), growing with the shapes, which at these model sizes alone exceeds
        # RSS_RTOL. The widened-operand GEMMs allocate nothing; weft's own memory, what
        # this compares, is the same on both paths (predicted == reported either way).
        args = args + ["runtime.cpu_bf16_gemm=false"]
    est = json.loads(run([worker, "--estimate", "--json"] + args).stdout)
    predicted = {s["stage"]: s["total_bytes"] for s in est["stages"]}
    out = run(mpirun(np) + [worker, "--check-estimate"] + args).stdout
    rows = [tuple(int(x) for x in m.groups()) for m in CHECK.finditer(out)]
    if len(rows) != np:
        fail(f"{len(rows)} estimate-check lines from {np} ranks:\n{out}")
    for rank, stage, dp, pred, reported, rss in rows:
        err = abs(pred - reported) / reported
        rss_err = abs(pred - rss) / rss
        print(f"{name} rank {rank} stage {stage} dp {dp}: predicted {pred} reported {reported} "
              f"({err:.3%}) rss growth {rss} ({rss_err:.2%})")
        if err > MEM_RTOL or (family == "stream" and pred != reported):
            fail(f"rank {rank}: predicted {pred} vs reported {reported}: {err:.4%}")
        if rss_err > RSS_RTOL:
            fail(f"rank {rank}: predicted {pred} vs RSS growth {rss}: {rss_err:.2%} > 10%")
        if dp == 0 and pred != predicted[stage]:
            fail(f"--estimate says stage {stage} holds {predicted[stage]}, the rank {pred}")
    print(f"{name}: OK, {np} ranks")


# peak-* cases: under ZeRO-2/3 set-up is shard-first (no flat parameters or gradients
# are ever allocated whole) and the late bucket is all-reduced in parts, so a rank's
# peak resident memory (the growth of VmHWM) stays within PEAK_RATIO of its steady state
# (the growth of VmRSS after the first step), the 10%. A GPT-2 of 2 layers at
# d_model 256 with the real 50257-token vocabulary: the embedding, the part ZeRO-3 keeps
# gathered and ZeRO-2/3 reduce last, is 89% of the 14.5M parameters, and a rank holds
# ~250 MiB, so the ~1 MiB the runtime does not account is noise. Before shard-first
# set-up the flat vectors (ZeRO-3) and Open MPI's staging of the embedding's whole
# all-reduce (ZeRO-2) put these ranks 1.2-1.3x above their steady state.
PEAK_RATIO = 1.10
PEAK_MODEL = ["model.layers=2", "model.heads=4", "model.d_model=256", "model.seq_len=32",
              "model.vocab=50257", "train.steps=1", "train.batch_size=8", "train.peak_tflops=1",
              "runtime.threads=1", "runtime.log_level=warn", "runtime.cpu_bf16_gemm=false"]
PEAK_MESHES = {
    "dp2-zero2": ["optim.zero=2"],
    "dp2-zero3": ["optim.zero=3"],
    "dp2-zero2-bf16": ["optim.zero=2", "precision=bf16"],
    "dp2-zero3-bf16": ["optim.zero=3", "precision=bf16"],
    # a checkpoint after step 1 (--check-estimate then reports after step 2, its peak
    # included): each dp rank streams its shard to the model file's writer in 4 MiB
    # chunks; gathering the flat parameters whole for it put a rank 1.21x above steady
    "dp2-zero3-ckpt": ["optim.zero=3", "train.steps=2", "train.checkpoint_every=1",
                       "train.checkpoint_dir={tmp}/ck"],
    "dp2-zero3-init-st": ["optim.zero=3"],
    "dp2-zero3-reshard": ["optim.zero=3"],
}
PEAK = re.compile(r"estimate check: rank (\d+) .*predicted (\d+) bytes, .*rss growth (-?\d+) "
                  r".*hwm growth (-?\d+) .*peak/steady (\d+\.\d+)")


def with_keys(base, keys):
    """base with keys set (a key in both takes the value in keys)."""
    names = {k.split("=")[0] for k in keys}
    return [k for k in base if k.split("=")[0] not in names] + keys


def peak_weights(worker, name, d):
    """The keys of a peak case whose set-up reads weights, after writing them: model.init
    from a safetensors file one rank saved (-init-st), or train.resume from a checkpoint
    saved at tp 2 (-reshard: another layout, so each rank maps its ZeRO-3 range out of
    the tp shards' files). A whole-model array (58 MB here) would show as +20%."""
    if name.endswith("-init-st"):
        st = os.path.join(d, "m.safetensors")
        run([worker, "--save", st, "--save-format", "safetensors"] + PEAK_MODEL)
        return ["model.init=" + st]
    if name.endswith("-reshard"):
        ck = os.path.join(d, "ck")
        run(mpirun(2) + [worker, "mesh.tp=2", "train.checkpoint_dir=" + ck,
                         "train.checkpoint_every=1"] + PEAK_MODEL)
        return ["train.resume=" + ck, "train.steps=2"]
    return []


def peak_case(worker, name):
    with tempfile.TemporaryDirectory() as d:
        mesh = [k.format(tmp=d) for k in PEAK_MESHES[name]]
        keys = with_keys(PEAK_MODEL, peak_weights(worker, name, d) + mesh)
        out = run(mpirun(2) + [worker, "--check-estimate", "mesh.dp=2"] + keys).stdout
        if name.endswith("-ckpt") and not os.path.isfile(f"{d}/ck/step-000001/manifest.json"):
            fail(f"no checkpoint of step 1 in {d}/ck:\n{out}")
    rows = [m.groups() for m in PEAK.finditer(out)]
    if len(rows) != 2:
        fail(f"{len(rows)} estimate-check lines from 2 ranks:\n{out}")
    for rank, pred, rss, hwm, ratio in rows:
        rss, hwm = int(rss), int(hwm)
        print(f"{name} rank {rank}: predicted {pred}, rss growth {rss}, hwm growth {hwm}, "
              f"peak/steady {ratio}")
        if hwm > PEAK_RATIO * rss:
            fail(f"rank {rank}: peak resident growth {hwm} is {hwm / rss:.3f}x the steady "
                 f"{rss}, above {PEAK_RATIO}")
        if abs(float(ratio) - hwm / rss) > 0.001:
            fail(f"rank {rank}: the line says peak/steady {ratio}, its figures {hwm / rss:.4f}")
    print(f"{name}: OK")


def num_params(L, C, V, T):
    """GPT-2's parameter count (llm.c's layout, V padded to a multiple of 128)."""
    Vp = (V + 127) // 128 * 128
    return Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def est_case(worker):
    """One rank, fp32: parameters and gradients are 4 bytes per parameter, AdamW 8, and
    the token batches 5 x B*T int32 (the pipeline engine's inputs, targets and document
    starts, and the trainer's inputs and targets)."""
    est = json.loads(run([worker, "--estimate", "--json"] + MODEL).stdout)
    n = num_params(4, 128, 8192, 32)
    b = est["stages"][0]["bytes"]
    want = {"params": 4 * n, "grads": 4 * n, "optim": 8 * n, "other": 5 * 8 * 32 * 4}
    for k, v in want.items():
        if b[k] != v:
            fail(f"--estimate {k} = {b[k]}, want {v}")
    # A GPU rank also holds the CUDA kernels' workspace (cuBLASLt's 32 MiB and 4 MiB of
    # partial sums: WF_KREG_GPU_WORKSPACE), allocated and counted when the device is
    # selected; nothing else of theirs is allocated per call.
    gpu = json.loads(run([worker, "--estimate", "--json", "--hw", "h100-sxm"] + MODEL).stdout)
    if gpu["stages"][0]["bytes"]["other"] != want["other"] + (36 << 20):
        fail(f"--estimate on h100-sxm: other = {gpu['stages'][0]['bytes']['other']}, want "
             f"{want['other']} + the kernels' 36 MiB workspace")
    # ZeRO-1 over 4 ranks: dp rank 0 keeps ceil(n/4) elements of AdamW state
    est = json.loads(run([worker, "--estimate", "--json", "mesh.dp=4", "optim.zero=1"] +
                         MODEL).stdout)
    if est["stages"][0]["bytes"]["optim"] != 8 * ((n + 3) // 4):
        fail(f"ZeRO-1 dp 4 optimizer bytes {est['stages'][0]['bytes']['optim']}")
    t = est["time"]
    if not (t["step_ms"] > 0 and t["tokens_per_s"] > 0 and t["dp_comm_ms"] > 0):
        fail(f"time breakdown {t}")
    print(f"est: OK ({n} parameters)")


def pipe_comm(worker):
    """A stage's communication memory does not grow with the pipeline depth or the
    micro-batches (issue 27): --estimate's comm bytes of stage 0 are the same under 1F1B
    at pp 2 and pp 8 with m = 32, and under GPipe at pp 4 with m = 8 and m = 32 (one-row
    micro-batches throughout, so a message is the same size), and every stage holds at
    most 4 messages (wf_schedule_buffers: one activation and one gradient received, two
    gradients sent). A message is a (rows, C) activation, io = 1*32*128*4 bytes at fp32;
    the engine's gradient buffers keep 64 bytes more each. Stage 0 under 1F1B receives
    gradients only: one buffer on top of what one stage holds (the gradient path's
    scalars, comm at pp 1)."""
    io = 32 * 128 * 4
    def comm(pp, m, kind):
        keys = [f"mesh.pp={pp}", f"train.microbatches={m}", f"train.batch_size={m}",
                f"train.schedule={kind}", "model.layers=8"]
        est = json.loads(run([worker, "--estimate", "--json"] + MODEL + keys).stdout)
        return [s["bytes"]["comm"] for s in est["stages"]]
    alone = comm(1, 8, "1f1b")[0]
    for a, b, what in [(comm(2, 32, "1f1b"), comm(8, 32, "1f1b"), "1f1b pp 2 vs pp 8, m 32"),
                       (comm(4, 8, "gpipe"), comm(4, 32, "gpipe"), "gpipe pp 4, m 8 vs m 32")]:
        print(f"pipe-comm {what}: stage 0 comm {a[0]} and {b[0]} bytes; all stages {a} {b}")
        for s, c in enumerate(a + b):
            if c - alone > 4 * (io + 64):
                fail(f"{what}: a stage holds {c - alone} bytes of messages, more than 4")
        if a[0] != b[0]:
            fail(f"{what}: stage 0's communication memory changed: {a[0]} vs {b[0]}")
        if a[0] - alone != io + 64:
            fail(f"{what}: stage 0 holds {a[0] - alone} bytes of messages, want one gradient "
                 f"buffer of {io + 64}")
    print("pipe-comm: OK")


def plan_llama_1b(worker):
    """Llama 3.2 1B (the llama-1b preset) on 8 H100s (one node), global batch 64 x 2048:
    --estimate of the default mesh (dp 8) gives its figures and --plan picks a plan that
    fits 80 GB, keeps tp inside the node and ranks the others; the parameter count is
    Llama 3.2 1B's published 1.24B (1,235,814,400 with the tied embedding). Then
    llama-8b's --estimate on this machine."""
    args = ["model.preset=llama-1b", "dist.world_size=8", "train.batch_size=64",
            "train.seq_len=2048", "--hw", "h100-sxm"]
    est = json.loads(run([worker, "--estimate", "--json", "mesh.dp=8"] + args).stdout)
    n = est["stages"][0]["params"]
    if n != 1235814400:
        fail(f"llama-1b holds {n} parameters, Llama 3.2 1B has 1,235,814,400")
    out = json.loads(run([worker, "--plan", "--json"] + args, timeout=600).stdout)
    best = out["plans"][0]
    if best["peak_bytes"] > 80e9 or not out["best"]:
        fail(f"best plan {best}")
    speeds = [p["tokens_per_s"] for p in out["plans"]]
    if speeds != sorted(speeds, reverse=True):
        fail("plans are not ranked by tokens/s")
    # Llama 3 8B (llama-8b): its published 8,030,261,248 parameters, and --estimate on
    # this machine's profile, whose measurement runs the kernels at d_model 4096 and
    # the 8192-token context
    est8 = json.loads(run([worker, "--estimate", "--json", "model.preset=llama-8b",
                           "dist.world_size=8", "mesh.dp=8"]).stdout)
    n8 = est8["stages"][0]["params"]
    if n8 != 8030261248:
        fail(f"llama-8b holds {n8} parameters, Llama 3 8B has 8,030,261,248")
    print(f"plan-llama-1b: OK, {n} parameters (llama-8b {n8}); best {best['plan']} at "
          f"{best['tokens_per_s']:.0f} tokens/s, peak {best['peak_bytes'] / 2**30:.1f} GiB, "
          f"{len(out['plans'])} ranked, {len(out['left_out'])} left out")


def plan_h100(worker):
    """64 H100s (8 per node), a GPT-2 XL-sized model (1.56B with the GPT-2 vocabulary),
    global batch 512 x 1024: a plan exists, fits 80 GB, keeps tp inside a node, and the
    left-out plans say why."""
    args = ["model.preset=gpt2-xl", "dist.world_size=64", "train.batch_size=512",
            "train.seq_len=1024", "--hw", "h100-sxm"]
    out = json.loads(run([worker, "--plan", "--json"] + args, timeout=600).stdout)
    best = out["plans"][0]
    if best["peak_bytes"] > 80e9 or "mesh.tp=" not in out["best"]:
        fail(f"best plan {best}")
    tp = int(re.search(r"mesh.tp=(\d+)", out["best"]).group(1))
    if tp > 8:
        fail(f"tp {tp} leaves the node")
    speeds = [p["tokens_per_s"] for p in out["plans"]]
    if speeds != sorted(speeds, reverse=True):
        fail("plans are not ranked by tokens/s")
    mem = [p for p in out["left_out"] if re.match(r"\d+\.\d\d GiB > 74\.51 GiB on stage \d+$",
                                                   p["left_out"])]
    if not mem:
        fail("no plan left out for memory, or its reason is not 'X GiB > 74.51 GiB on stage N'")
    print(f"plan-h100: OK, best {best['plan']} at {best['tokens_per_s']:.0f} tokens/s, "
          f"{len(out['plans'])} ranked, {len(out['left_out'])} left out")


def profile_case(worker):
    """--profile-hw under mpirun -np 2 writes a profile --plan reads: GEMMs at the
    model's shapes (qkv of the tiny model: (T=32 rows, 3C=384, C=128)), the attention
    kernel, an all-reduce fit for 2 ranks; a profile missing a field is refused naming it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hw.json")
        run(mpirun(2) + [worker, "--profile-hw", path] + MODEL)
        hw = json.load(open(path))
        shapes = {(g["op"], g["m"], g["n"], g["k"]) for g in hw["gemm"]}
        if ("matmul", 32, 384, 128) not in shapes or not any(g["op"] == "attention"
                                                              for g in hw["gemm"]):
            fail(f"profile shapes {sorted(shapes)}")
        coll = [c for c in hw["allreduce"] if c["size"] == 2]
        if len(coll) != 1 or coll[0]["bw_gbs"] <= 0 or coll[0]["alpha_us"] < 0 or \
                coll[0].get("allgather_gbs", 0) <= 0 or coll[0].get("dp_allreduce_gbs", 0) <= 0:
            fail(f"collective fits {hw['allreduce']}")
        run([worker, "--plan", "--hw", path, "dist.world_size=2"] + MODEL)
        zero1_rates(worker, hw, tmp)
        del hw["mem_bw_gbs"]
        json.dump(hw, open(path, "w"))
        p = run([worker, "--plan", "--hw", path, "dist.world_size=2"] + MODEL, ok=False)
        if p.returncode == 0 or '"mem_bw_gbs"' not in p.stderr:
            fail(f"a profile without mem_bw_gbs: exit {p.returncode}, {p.stderr}")
    print("profile: OK")


def zero1_rates(worker, hw, tmp):
    """ZeRO-1's dp time is an all-reduce of the gradients (in place, as plain dp's, at the
    gradient path's rate) and an all-gather of the parameters at the profile's all-gather
    rate: at 1 MB/s each it is 2 x n x 4 bytes / 1e6 s for n parameters, whatever the
    blocking all-reduce's rate (tp's); without those two rates (older profiles) the
    gradients take the blocking rate and the all-gather is half an all-reduce: 1.5 x.
    Within 1%: the latency terms (alpha_us per bucket, under a millisecond here) against
    ~1.8 s of bytes."""
    slow = dict(hw, allreduce=[dict(c, bw_gbs=1e3, allgather_gbs=1e-3, dp_allreduce_gbs=1e-3)
                               for c in hw["allreduce"]])
    old = dict(hw, allreduce=[{k: c[k] for k in ("size", "alpha_us")} | {"bw_gbs": 1e-3}
                              for c in hw["allreduce"]])
    for prof, factor in ((slow, 2), (old, 1.5)):
        path = os.path.join(tmp, f"hw-{factor}.json")
        json.dump(prof, open(path, "w"))
        est = json.loads(run([worker, "--estimate", "--json", "--hw", path, "mesh.dp=2",
                              "optim.zero=1"] + MODEL).stdout)
        want = factor * est["stages"][0]["params"] * 4 / 1e6 * 1e3
        got = est["time"]["dp_comm_ms"]
        if abs(got - want) > 0.01 * want:
            fail(f"ZeRO-1 dp time {got:.1f} ms, want {want:.1f} ms ({factor} x n x 4 B at 1 MB/s)")


def keyval(keys, k):
    return re.search(rf"(?:^| ){re.escape(k)}=(\S+)", keys).group(1)


def plan_zero(worker):
    """--plan over 4 ranks of an H100 profile enumerates ZeRO 0-3 (3 also kept gathered)
    and HSDP (mesh.fsdp=2 of dp 4): ZeRO-2/3 with the interleaved schedule are ranked like
    any other schedule, and HSDP stays ranked with train.checkpoint_dir set (HSDP has
    checkpoints). Each ranked plan's peak is what --estimate says of its keys (the search and
    the estimate add up the same functions). With the device memory between the smallest
    ZeRO-3 peak and the smallest plain-dp (ZeRO-0) peak at dp 4 (tp 1, pp 1: the whole
    model on each rank), ZeRO-3 plans of dp 4 are ranked and plain dp ones are not. (ZeRO-1
    may peak below ZeRO-3 here: this model is mostly its embedding, which ZeRO-3 keeps
    gathered whole, parameters and gradients, while ZeRO-1 shards only the optimizer.)"""
    base = [worker, "--plan", "--json", "dist.world_size=4", "--hw", "h100-sxm"] + MODEL
    out = json.loads(run(base + ["--device-mem", "80"]).stdout)
    plans = out["plans"]
    got = {(int(keyval(p["keys"], "optim.zero")), keyval(p["keys"], "parallel.reshard_after_forward"),
            int(keyval(p["keys"], "mesh.fsdp"))) for p in plans}
    for want in [(0, "true", 0), (1, "true", 0), (2, "true", 0), (3, "true", 0), (3, "false", 0),
                 (1, "true", 2), (2, "true", 2), (3, "true", 2)]:
        if want not in got:
            fail(f"no ranked plan with (optim.zero, reshard_after_forward, mesh.fsdp) = {want}")
    ilv = {int(keyval(p["keys"], "optim.zero")) for p in plans
           if keyval(p["keys"], "train.schedule") == "interleaved"}
    if not {2, 3} <= ilv:
        fail(f"ZeRO-2 and 3 with the interleaved schedule not both ranked: zero {sorted(ilv)}")
    refused = [p for p in out["left_out"] if "does not apply to train.schedule=interleaved"
               in p["left_out"]]
    if refused:
        fail(f"an interleaved ZeRO plan still left out: {refused[0]}")
    # the search's peak is --estimate's, for a few plans of each kind
    picks = {}
    for p in plans:
        picks.setdefault((keyval(p["keys"], "optim.zero"), keyval(p["keys"], "mesh.fsdp"),
                          keyval(p["keys"], "train.schedule") == "interleaved"), p)
    for p in picks.values():
        est = json.loads(run([worker, "--estimate", "--json", "--hw", "h100-sxm"] + MODEL +
                             p["keys"].split()).stdout)
        peak = max(s["total_bytes"] for s in est["stages"])
        if peak != p["peak_bytes"]:
            fail(f"{p['plan']}: --plan peak {p['peak_bytes']}, --estimate {peak}")
    dp4 = [p for p in plans if keyval(p["keys"], "mesh.dp") == "4"]  # the same shard
    low = min(p["peak_bytes"] for p in dp4 if int(keyval(p["keys"], "optim.zero")) == 0)
    z3 = min(p["peak_bytes"] for p in dp4 if int(keyval(p["keys"], "optim.zero")) == 3)
    if z3 >= low:
        fail(f"ZeRO-3's smallest peak {z3} is not below plain dp's {low}")
    mid = (z3 + low) / 2 / 2**30
    tight = json.loads(run(base + ["--device-mem", f"{mid:.6f}"]).stdout)
    zs = {int(keyval(p["keys"], "optim.zero")) for p in tight["plans"]
          if keyval(p["keys"], "mesh.dp") == "4"}
    if 3 not in zs or 0 in zs:
        fail(f"at {mid:.6f} GiB the ranked plans have ZeRO stages {sorted(zs)}")
    # HSDP checkpoints exist (fsdp group 0 writes a dp = F run's files): the same plans rank
    ck = json.loads(run(base + ["--device-mem", "80", "train.checkpoint_dir=/tmp/x"]).stdout)
    hsdp = [p for p in ck["plans"] if int(keyval(p["keys"], "mesh.fsdp"))]
    if not hsdp or any("checkpoint" in p["left_out"] for p in ck["left_out"]):
        fail("HSDP left out of the plans with train.checkpoint_dir set")
    print(f"plan-zero: OK, {len(plans)} ranked ({sorted(got)}); ZeRO-3 {z3} < plain dp {low} "
          f"bytes; at {mid:.4f} GiB ZeRO stages {sorted(zs)}")


def plan_cp(worker):
    """--plan over 4 ranks of this machine's CPU profile tries context parallelism when the
    sequence is long (4096 tokens: mesh.cp 1, 2 and 4 all ranked) and not when it is short
    (2048: no plan has mesh.cp), never with data.document_mask; a cp plan's peak is --estimate's for its keys; and with
    the memory per rank between the smallest peak of the plans without cp and the smallest
    with cp 4 (one rank keeps attention's (T, T) probabilities per head, a cp rank T / cp
    rows and their log-sum-exp), only cp plans are ranked."""
    with tempfile.TemporaryDirectory() as tmp:
        hw = os.path.join(tmp, "hw.json")
        run([worker, "--profile-hw", hw] + ["runtime.threads=1"], timeout=600)
        keys = ["model.preset=llama-tiny", "model.layers=2", "train.batch_size=4",
                "runtime.threads=1"]
        base = [worker, "--plan", "--json", "dist.world_size=4", "--hw", hw] + keys

        def cp_of(p):  # plans without cp leave the key out
            m = re.search(r"(?:^| )mesh\.cp=(\d+)", p["keys"])
            return int(m.group(1)) if m else 1

        def cps(plans):
            return {cp_of(p) for p in plans}

        short = json.loads(run(base + ["model.seq_len=2048"]).stdout)["plans"]
        if cps(short) != {1}:
            fail(f"at 2048 tokens --plan tried mesh.cp {sorted(cps(short))}")
        long = keys + ["model.seq_len=4096"]
        plans = json.loads(run(base + ["model.seq_len=4096"]).stdout)["plans"]
        if cps(plans) != {1, 2, 4}:
            fail(f"at 4096 tokens the ranked plans have mesh.cp {sorted(cps(plans))}, want 1, 2, 4")
        # data.document_mask refuses mesh.cp, so --plan never proposes it
        docs = ["model.seq_len=4096", "data.source=[%s]" % os.path.join(tmp, "docs.jsonl"),
                "data.document_mask=true", "model.vocab=256"]
        masked = json.loads(run(base + docs).stdout)["plans"]
        if not masked or cps(masked) != {1}:
            fail(f"with data.document_mask --plan ranked mesh.cp {sorted(cps(masked))}, want 1")
        for c in (2, 4):
            p = next(p for p in plans if cp_of(p) == c)
            est = json.loads(run([worker, "--estimate", "--json", "--hw", hw] + long +
                                 p["keys"].split()).stdout)
            if max(s["total_bytes"] for s in est["stages"]) != p["peak_bytes"]:
                fail(f"{p['plan']}: --plan peak {p['peak_bytes']} is not --estimate's")
        no_cp = min(p["peak_bytes"] for p in plans if cp_of(p) == 1)
        cp4 = min(p["peak_bytes"] for p in plans if cp_of(p) == 4)
        if cp4 >= no_cp:
            fail(f"cp 4's smallest peak {cp4} is not below the plans without cp ({no_cp})")
        mid = (cp4 + no_cp) / 2 / 2**30
        tight = json.loads(run(base + ["model.seq_len=4096", "--device-mem", f"{mid:.6f}"])
                           .stdout)["plans"]
        if not tight or 1 in cps(tight):
            fail(f"at {mid:.6f} GiB the ranked plans have mesh.cp {sorted(cps(tight))}")
    print(f"plan-cp: OK, {len(plans)} ranked at 4096 tokens (mesh.cp {sorted(cps(plans))}), "
          f"none with cp at 2048; peaks: cp 4 {cp4}, without cp {no_cp} bytes; at {mid:.4f} GiB "
          f"only cp {sorted(cps(tight))}")


def plan_moe(worker):
    """Expert parallelism in the planner, for Qwen3-30B-A3B (48 layers, 128 experts of
    3 x 2048 x 768, top-8) on 16 H100s: --estimate's parameters of a rank are the dense
    ones plus 1/ep of the experts', to the element, at ep 1, 2, 8 and 16; the all-to-all
    time grows with ep (more of the rows leave the rank) and is 0 at ep 1; --plan ranks
    plans of several ep, and its peak of an ep plan is --estimate's for its keys."""
    base = ["model.preset=qwen3-30b-a3b", "dist.world_size=16", "--hw", "h100-sxm",
            "train.batch_size=32"]
    L, E, C, F = 48, 128, 2048, 768  # the preset's (config_keys.c)
    n_exp = L * E * 3 * C * F
    params, ep_ms = {}, {}
    for ep in (1, 2, 8, 16):
        est = json.loads(run([worker, "--estimate", "--json"] + base +
                             [f"mesh.ep={ep}", "mesh.dp=16", "optim.zero=1"]).stdout)
        params[ep] = est["stages"][0]["params"]
        ep_ms[ep] = est["time"]["ep_comm_ms"]
    dense = params[1] - n_exp
    for ep in (2, 8, 16):
        if params[ep] != dense + n_exp // ep:
            fail(f"ep {ep}: a rank holds {params[ep]} parameters, not {dense} dense + "
                 f"{n_exp // ep} of the experts")
    if not (ep_ms[1] == 0 < ep_ms[2] < ep_ms[8] < ep_ms[16]):
        fail(f"all-to-all ms by ep {ep_ms}: not 0 at ep 1 and growing with ep")
    out = json.loads(run([worker, "--plan", "--json"] + base).stdout)
    plans = out["plans"]

    def ep_of(p):
        m = re.search(r"mesh\.ep=(\d+)", p["keys"])
        return int(m.group(1)) if m else 1
    eps = {ep_of(p) for p in plans}
    if len([e for e in eps if e > 1]) < 2:
        fail(f"--plan ranked plans with ep {sorted(eps)} only")
    p = next(p for p in plans if ep_of(p) > 1)
    est = json.loads(run([worker, "--estimate", "--json"] + base + p["keys"].split()).stdout)
    if est["peak_bytes"] != p["peak_bytes"] or not p["ep_comm_ms"] > 0:
        fail(f"{p['plan']}: --plan peak {p['peak_bytes']} vs --estimate {est['peak_bytes']}, "
             f"ep comm {p['ep_comm_ms']} ms")
    print(f"plan-moe: OK, parameters per rank {params} (dense {dense}); all-to-all ms {ep_ms}; "
          f"{len(plans)} ranked with ep {sorted(eps)}; best {out['best']}")


def err_case(worker, name):
    if name == "err-fits-nothing":  # gpt2-xl on 2 ranks of 1 GiB
        p = run([worker, "--plan", "model.preset=gpt2-xl", "dist.world_size=2", "--hw",
                 "h100-sxm", "--device-mem", "1"], ok=False)
        want = "fits no plan on 2 ranks of 1.0 GiB"
    elif name == "err-world":  # 7 ranks, 4 heads, 4 layers, batch 8: no dp x tp x pp
        p = run([worker, "--plan", "dist.world_size=7", "--hw", "h100-sxm"], ok=False)
        want = "no mesh of world size 7 works"
    else:  # a profile that is not there
        p = run([worker, "--plan", "--hw", "/nonexistent/hw.json"], ok=False)
        want = "cannot read the hardware profile /nonexistent/hw.json"
    if p.returncode == 0 or want not in p.stderr or p.stderr.count("weft: error:") != 1:
        fail(f"{name}: exit {p.returncode}, want one error with '{want}':\n{p.stderr}")
    print(f"{name}: OK ({p.stderr.strip().splitlines()[-1]})")


def main():
    worker, case = sys.argv[1], sys.argv[2]
    if case.startswith("mem-"):
        with tempfile.TemporaryDirectory(prefix="weft_plan_") as tmp:
            mem_case(worker, case[4:], tmp)
    elif case.startswith("peak-"):
        peak_case(worker, case[5:])
    elif case == "est":
        est_case(worker)
    elif case == "pipe-comm":
        pipe_comm(worker)
    elif case == "plan-h100":
        plan_h100(worker)
    elif case == "plan-llama-1b":
        plan_llama_1b(worker)
    elif case == "profile":
        profile_case(worker)
    elif case == "plan-zero":
        plan_zero(worker)
    elif case == "plan-cp":
        plan_cp(worker)
    elif case == "plan-moe":
        plan_moe(worker)
    else:
        err_case(worker, case)


if __name__ == "__main__":
    main()
