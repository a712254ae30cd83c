"""llama_weights.py - the Llama family's weights in and out, end to end through the worker.

usage: llama_weights.py WORKER MPIRUN

A llama-tiny (2 layers, grouped-query attention, untied) trains 4 steps on a
tp 2 x pp 2 mesh with checkpoints. Its checkpoint is exported as
  - one safetensors file (--export safetensors FILE.safetensors), and
  - a Hugging Face model folder sharded at model.shard_mb=0.25 (--export safetensors
    DIR/): config.json (LlamaForCausalLM's keys), model-0000N-of-0000M.safetensors and
    model.safetensors.index.json, whose weight_map names every tensor's file;
both read back here with struct and json: Hugging Face's names and shapes (q_proj,
k_proj with 2 kv heads, v_proj, o_proj, gate_proj, up_proj, down_proj, the norms,
embed_tokens, lm_head), the same values in both, each shard at most 0.25 MB unless one
tensor is larger, every index entry in the file it names. Then --dump-state (logits,
loss, gradients, float32) is bit for bit the same from model.init = the checkpoint, the
single file, the folder and the index file, on one rank and on tp 2 x pp 2 against its
own one-rank dump; --save --save-format safetensors to an index path writes a sharded
model that reads back equal. A llama --save in llm.c's GPT-2 format is refused before
training, once under mpirun -np 4.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_ref  # noqa: E402  the safetensors reader
import weights  # noqa: E402  zero3_same_as_zero2

WORKER, MPIRUN = sys.argv[1], sys.argv[2]
MPI_ARGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
TINY = ["model.preset=llama-tiny", "model.layers=2", "model.seq_len=32", "train.batch_size=4",
        "runtime.threads=1", "train.eval_every=0"]
# llama-tiny: C 64, 4 heads of 16, 2 kv heads, ffn 192, vocabulary 256
C, Q, KV, F, V, L = 64, 64, 32, 192, 256, 2


def run(args, np=1, timeout=180):
    cmd = ([MPIRUN] + MPI_ARGS + ["-np", str(np)] if np > 1 else []) + [WORKER] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def run_ok(args, np=1):
    rc, out, err = run(args, np)
    if rc != 0:
        print(out[-3000:] + err[-3000:])
        raise AssertionError(f"{' '.join(args)} (np {np}) exited {rc}")
    return out


def expected_shapes():
    want = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C],
            "lm_head.weight": [V, C]}
    for l in range(L):
        p = f"model.layers.{l}."
        want.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                     p + "self_attn.q_proj.weight": [Q, C], p + "self_attn.k_proj.weight": [KV, C],
                     p + "self_attn.v_proj.weight": [KV, C], p + "self_attn.o_proj.weight": [C, Q],
                     p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                     p + "mlp.down_proj.weight": [C, F]})
    return want


def check_single(path):
    t = st_ref.read_f32(path)
    want = expected_shapes()
    assert {n: s for n, (s, _) in t.items()} == want, sorted(t)
    print(f"one file: {len(t)} tensors in Hugging Face's names and shapes")
    return t


def check_folder(d, single, limit):
    cfg = json.load(open(os.path.join(d, "config.json")))
    want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": C,
            "intermediate_size": F, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": L, "vocab_size": V, "tie_word_embeddings": False,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    for k, v in want.items():
        assert cfg.get(k) == v, (k, cfg.get(k), v)
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    wmap = index["weight_map"]
    assert sorted(wmap) == sorted(single), sorted(wmap)
    files = sorted(set(wmap.values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors", files
    total = 0
    for f in files:
        t = st_ref.read_f32(os.path.join(d, f))
        size = sum(4 * len(v) for _, v in t.values())
        total += size
        assert size <= limit or len(t) == 1, (f, size, limit)
        for name, (shape, vals) in t.items():
            assert wmap[name] == f, (name, wmap[name], f)
            assert (shape, vals) == single[name], name
    assert index["metadata"]["total_size"] == total, (index["metadata"], total)
    print(f"folder: config.json, {len(files)} shards of <= {limit} bytes (or one tensor), the "
          f"index names every tensor's file, values equal to the single file's")


def state(args, np, path):
    run_ok(args + ["--dump-state", path], np=np)
    with open(path, "rb") as f:
        return f.read()


def main():
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck")
        run_ok(TINY + ["train.steps=4", "mesh.tp=2", "mesh.pp=2", "train.microbatches=2",
                       "train.checkpoint_dir=" + ck, "train.checkpoint_every=4"], np=4)
        res = "train.resume=" + ck
        one = os.path.join(d, "one.safetensors")
        print(run_ok(TINY + [res, "--export", "safetensors", one]).strip())
        single = check_single(one)
        hf = os.path.join(d, "hf") + "/"
        print(run_ok(TINY + [res, "model.shard_mb=0.25", "--export", "safetensors", hf]).strip())
        check_folder(hf, single, 250000)
        ref = state(TINY + ["model.init=" + ck], 1, os.path.join(d, "ck.state"))
        for tag, init in (("one file", one), ("folder", hf),
                          ("index", hf + "model.safetensors.index.json")):
            got = state(TINY + ["model.init=" + init], 1, os.path.join(d, "x.state"))
            assert got == ref, f"--dump-state from {tag} differs from the checkpoint's"
        print("--dump-state: the checkpoint, the file, the folder and the index give the same "
              "bytes")
        # ZeRO-3 at dp 2 and 3 from the file, the folder and the checkpoint saved at
        # tp 2 x pp 2: the same --save bytes as ZeRO-2 (weights.py's check)
        weights.zero3_same_as_zero2(d, TINY, (("file", one), ("folder", hf),
                                              ("checkpoint dir", ck)),
                                    ["--save-format", "safetensors"])
        # the sharded model on a tp 2 x pp 2 mesh against one rank: equal but for float32
        # summation order (equiv.py's STATE_* tolerances, checked by llama_equiv.py
        # dump-state); here just that it loads and trains from the index
        run_ok(TINY + ["model.init=" + hf + "model.safetensors.index.json", "train.steps=2",
                       "mesh.tp=2", "mesh.pp=2", "train.microbatches=2"], np=4)
        idx = os.path.join(d, "saved", "model.safetensors.index.json")
        os.makedirs(os.path.dirname(idx))
        run_ok(TINY + ["model.init=" + one, "train.steps=1", "model.shard_mb=0.25", "--save",
                       idx, "--save-format", "safetensors"])
        saved = {}
        for f in set(json.load(open(idx))["weight_map"].values()):
            saved.update(st_ref.read_f32(os.path.join(os.path.dirname(idx), f)))
        assert sorted(saved) == sorted(single) and saved != single
        print(f"--save to an index path: {len(saved)} tensors in shards, trained one step on")
        rc, out, err = run(TINY + ["train.steps=1", "--save", os.path.join(d, "x.bin")], np=4)
        # said once (by one rank, not one per rank), before training
        lines = [l for l in (out + err).splitlines() if "--save-format safetensors" in l]
        assert rc != 0 and len(lines) == 1 and "model.family=llama" in lines[0], lines
        assert "step 1/" not in out, out[-2000:]
        print(f"refused once: {lines[0]}")


main()
