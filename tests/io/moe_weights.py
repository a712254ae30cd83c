#!/usr/bin/env python3
"""moe_weights.py - the mixture-of-experts families' weights in and out, end to end through
the worker, and the bad inputs that must stop it with one clear error (exit 2).

usage: moe_weights.py WORKER

For each family (olmoe, qwen3_moe, mixtral) tests/model/moe_ref.py writes a Hugging Face
model folder: config.json (model_type, the experts, top-k, head_dim, norm_topk_prob,
router_aux_loss_coef) and model.safetensors (F32, every expert's tensors under the family's
names). Then, with model.init naming it:
  - --export to a folder writes the same tensors bit for bit (the export round trip) and a
    config.json with the same keys;
  - --export sharded (model.shard_mb 0.05) writes shards and an index whose weight_map names
    every expert tensor's file; the index read back (--export of it to one file) is bit for
    bit the original again;
  - --dump-state (logits, loss, gradients) is the same bytes from the folder, the single file
    and the sharded index;
  - --generate (greedy) prints what moe_ref.py's float64 greedy decode of the same byte
    prompt gives (the family's forward, independently), while each step's top two logits are
    GAP_MIN apart (llama_generate.py's argument).
Bad input: a model missing one expert tensor, a config.json naming a model_type weft does not
know, a config.json whose num_experts_per_tok exceeds num_experts, a Qwen3-MoE config with
dense layers (mlp_only_layers), model.experts_per_token above model.experts, and mesh.ep not
dividing the experts (under mpirun -np 3): each exits 2 with one error naming what is wrong.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import moe_ref  # noqa: E402

WORKER = sys.argv[1]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
PROMPT = b"moe"
NEW = 6
GAP_MIN = 1e-3
BASE = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "num_experts_per_tok": 2, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False}
FAMILIES = {
    "olmoe": {"model_type": "olmoe", "num_key_value_heads": 4, "intermediate_size": 96,
              "num_experts": 4, "norm_topk_prob": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "num_key_value_heads": 2, "head_dim": 32,
                  "moe_intermediate_size": 96, "intermediate_size": 96, "num_experts": 4,
                  "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "mixtral": {"model_type": "mixtral", "num_key_value_heads": 2, "intermediate_size": 96,
                "num_local_experts": 4},
}
KEYS = ("model_type", "num_experts", "num_local_experts", "num_experts_per_tok", "head_dim",
        "norm_topk_prob", "router_aux_loss_coef", "moe_intermediate_size", "intermediate_size")


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(args, np=1, timeout=180):
    cmd = (MPIRUN + ["-np", str(np)] if np > 1 else []) + [WORKER] + args
    return subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, OMPI_MCA_ess_singleton_isolated="1"))


def run_ok(args):
    p = run(args)
    if p.returncode:
        fail(f"worker {' '.join(args)} exited {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout


def hf_folder(d, name, cfg):
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    subprocess.run([sys.executable, os.path.join(HERE, "..", "model", "moe_ref.py"), "init",
                    os.path.join(d, "config.json"), os.path.join(d, "model.safetensors"),
                    "--seed", "7", "--std", "0.3"], check=True)
    return os.path.join(d, "model.safetensors")


def raw_tensors(path):
    """name -> (dtype, shape, bytes) of a safetensors file or a sharded model's index."""
    if path.endswith(".index.json"):
        with open(path) as f:
            files = set(json.load(f)["weight_map"].values())
        out = {}
        for fn in files:
            out.update(raw_tensors(os.path.join(os.path.dirname(path), fn)))
        return out
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    head = json.loads(data[8:8 + n])
    head.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items()}


def same_tensors(a, b, what):
    ta, tb = raw_tensors(a), raw_tensors(b)
    if sorted(ta) != sorted(tb):
        fail(f"{what}: tensors differ: {sorted(set(ta) ^ set(tb))[:5]}")
    bad = [k for k in ta if ta[k] != tb[k]]
    if bad:
        fail(f"{what}: {len(bad)} tensors differ, e.g. {bad[0]}")
    return len(ta)


def check_config(src, out, name):
    with open(src) as f:
        a = json.load(f)
    with open(out) as f:
        b = json.load(f)
    diff = {k: (a.get(k), b.get(k)) for k in KEYS if k in a and a.get(k) != b.get(k)}
    if diff:
        fail(f"{name}: --export's config.json differs from the source's: {diff}")


def reference(weights, cfg):
    """moe_ref.py's float64 greedy continuation of PROMPT's bytes, and the smallest gap
    between the top two logits."""
    c = moe_ref.Config(cfg)
    st = moe_ref.L.st_read(weights)
    W = {n: torch.tensor(st[n], dtype=torch.float64) for n, _ in moe_ref.param_shapes(c)}
    out, gap = list(PROMPT), float("inf")
    for _ in range(NEW):
        tok = torch.tensor([out], dtype=torch.int64)
        logits = moe_ref.forward(c, W, tok, tok)[0]
        top = torch.topk(logits[0, -1], 2)
        gap = min(gap, float(top.values[0] - top.values[1]))
        out.append(int(top.indices[0]))
    return bytes(out), gap


def escaped(b):
    """Bytes as --generate prints them without a tokenizer (sample.c's put_escaped): \\n,
    \\t and \\\\ as they are (not one line), printable ASCII itself, other bytes \\xNN."""
    out = []
    for ch in b:
        if ch in (10, 9) or 0x20 <= ch < 0x7f:
            out.append("\\\\" if ch == 0x5c else chr(ch))
        else:
            out.append(f"\\x{ch:02x}")
    return "".join(out).encode()


def round_trips(tmp, name):
    cfg = dict(BASE, **FAMILIES[name])
    src_dir = os.path.join(tmp, name)
    src = hf_folder(src_dir, name, cfg)
    init = [f"model.init={src_dir}", "runtime.threads=1"]
    out1 = os.path.join(tmp, name + "-export") + "/"
    run_ok(init + ["--export", "safetensors", out1])
    n = same_tensors(src, os.path.join(out1, "model.safetensors"), f"{name} --export")
    check_config(os.path.join(src_dir, "config.json"), os.path.join(out1, "config.json"), name)
    index = os.path.join(tmp, name + "-sharded", "model.safetensors.index.json")
    os.makedirs(os.path.dirname(index))
    run_ok(init + ["model.shard_mb=0.05", "--export", "safetensors", index])
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    if len(shards) < 3:
        fail(f"{name}: model.shard_mb=0.05 wrote {len(shards)} shards")
    same_tensors(src, index, f"{name} sharded --export")
    back = os.path.join(tmp, name + "-back.safetensors")
    run_ok([f"model.init={index}", "runtime.threads=1", "--export", "safetensors", back])
    same_tensors(src, back, f"{name} the index exported to one file")
    dumps = []
    for i, where in enumerate((src_dir, src, index)):
        path = os.path.join(tmp, f"{name}-dump{i}.bin")
        run_ok([f"model.init={where}", "runtime.threads=1", "train.batch_size=2", "--dump-state",
                path])
        dumps.append(open(path, "rb").read())
    if dumps[1:] != dumps[:1] * 2:
        fail(f"{name}: --dump-state differs between the folder, the file and the index")
    print(f"ok: {name}: --export of {n} tensors bit for bit (folder, {len(shards)} shards and "
          f"their index, back to one file), config.json's keys kept, --dump-state the same "
          f"from all three")
    got = run_ok(init + ["train.sample_top_k=1", f"train.sample_tokens={NEW}", "--generate",
                         PROMPT.decode()])
    want, gap = reference(src, cfg)
    if gap < GAP_MIN:
        fail(f"{name}: a greedy step's top two logits are {gap:.2e} apart (< {GAP_MIN})")
    if got.rstrip(b"\n") != escaped(want):
        fail(f"{name}: --generate printed {got!r}, the reference decodes {want!r}")
    print(f"ok: {name}: --generate {PROMPT!r} -> {got.rstrip()!r} = the reference's greedy "
          f"decode (smallest top-2 gap {gap:.2e})")


def refused(args, what, needle, np=1):
    p = run(args, np)
    err = (p.stdout + p.stderr).decode(errors="replace")
    lines = [l for l in err.splitlines() if "error" in l.lower() and needle in l]
    if p.returncode != 2 or not lines:
        fail(f"{what}: exit {p.returncode} (want 2) and no error naming {needle!r}:\n{err[-2500:]}")
    print(f"ok: {what}: exit 2: {lines[0].strip()[:200]}")


def bad_inputs(tmp):
    cfg = dict(BASE, **FAMILIES["olmoe"])
    d = os.path.join(tmp, "bad-missing")
    src = hf_folder(d, "olmoe", cfg)
    st = moe_ref.L.st_read(src)
    gone = "model.layers.1.mlp.experts.3.down_proj.weight"
    del st[gone]
    moe_ref.L.st_write(src, st)
    refused([f"model.init={d}", "train.steps=1"], "an expert tensor missing", gone)
    d = os.path.join(tmp, "bad-type")
    hf_folder(d, "olmoe", cfg)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, model_type="deepseek_v3"), f)
    refused([f"model.init={d}", "train.steps=1"], "an unknown model_type", "deepseek_v3")
    d = os.path.join(tmp, "bad-topk")
    hf_folder(d, "olmoe", cfg)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, num_experts_per_tok=5), f)
    refused([f"model.init={d}", "train.steps=1"], "config.json's top-k above its experts",
            "experts_per_token")
    d = os.path.join(tmp, "bad-dense")
    qcfg = dict(BASE, **FAMILIES["qwen3_moe"])
    hf_folder(d, "qwen3_moe", qcfg)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(qcfg, mlp_only_layers=[1]), f)
    refused([f"model.init={d}", "train.steps=1"], "qwen3_moe with dense layers", "mlp_only_layers")
    refused(["model.preset=olmoe-tiny", "model.experts_per_token=5", "train.steps=1"],
            "model.experts_per_token above model.experts", "model.experts_per_token=5")
    refused(["model.preset=mixtral-tiny", "mesh.ep=3", "train.steps=1"],
            "mesh.ep not dividing the experts", "mesh.ep=3", np=3)
    # the family comes from the file: its experts are checked once it is read
    good = os.path.join(tmp, "olmoe")
    refused([f"model.init={good}", "mesh.cp=2", "train.steps=1"],
            "model.init's mixture of experts under context parallelism", "mesh.cp=2", np=2)
    dense = os.path.join(tmp, "dense.safetensors")
    run_ok(["model.preset=llama-tiny", "model.layers=1", "train.steps=1", "--save", dense,
            "--save-format", "safetensors"])
    refused([f"model.init={dense}", "mesh.ep=2", "train.steps=1"],
            "mesh.ep with model.init's dense model", "has no experts", np=2)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for name in FAMILIES:
            round_trips(tmp, name)
        bad_inputs(tmp)


main()
