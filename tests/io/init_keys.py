"""init_keys.py - model.init decides the model, and the config's model keys meet it as a
user expects; a Hugging Face folder without max_position_embeddings takes transformers'
default, as from_pretrained does.

usage: init_keys.py WORKER

A llama-tiny (grouped-query attention with 2 kv heads, theta 10000, untied, context 64:
the preset's) trains one step and is exported as a Hugging Face folder. Then:
  - keys that agree with the file are accepted, though the default family is GPT-2's
    (model.kv_heads=2, model.rope_theta=10000, model.tie_embeddings=false): one step trains;
  - --print-config shows the file's shape as the config's (model.family llama, derived);
  - model.seq_len=16, shorter than the file's context, trains on 16-token rows;
  - the folder with max_position_embeddings taken out of config.json and out of the
    weights' __metadata__ loads with a context of 2048 (LlamaConfig's default): one step
    trains, and model.seq_len=4096 is refused naming 2048.
The refusals of keys that contradict the file are tests/mpi/badinput.py's.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

WORKER = os.path.abspath(sys.argv[1])
STEP = ["train.steps=1", "train.eval_every=0", "train.batch_size=2", "runtime.threads=1"]


def run(args, cwd):
    env = dict(os.environ, OMPI_MCA_ess_singleton_isolated="1", WEFT_JOB_DIR=os.path.join(cwd, "j"))
    p = subprocess.run([WORKER] + args, capture_output=True, text=True, timeout=180, cwd=cwd,
                       env=env, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


def run_ok(args, cwd):
    rc, out = run(args, cwd)
    if rc != 0:
        print(out[-3000:])
        raise SystemExit(f"FAIL: {' '.join(args)} exited {rc}")
    return out


def strip_max_positions(src, dst):
    """A copy of the Hugging Face folder src without max_position_embeddings anywhere:
    config.json's key and the weights' __metadata__ entry (weft writes both; a folder
    made by transformers' save_pretrained has no __metadata__ of weft's)."""
    shutil.copytree(src, dst)
    cfg_path = os.path.join(dst, "config.json")
    cfg = json.load(open(cfg_path))
    if cfg.pop("max_position_embeddings", None) is None:
        raise SystemExit("FAIL: the exported config.json has no max_position_embeddings")
    json.dump(cfg, open(cfg_path, "w"))
    st = os.path.join(dst, "model.safetensors")
    data = open(st, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.get("__metadata__", {}).pop("max_position_embeddings", None)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the data stays 8-byte aligned
    open(st, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])


def main():
    with tempfile.TemporaryDirectory(prefix="weft-init-keys-") as d:
        run_ok(["model.preset=llama-tiny"] + STEP + ["--save", "hf/model.safetensors",
                                                     "--save-format", "safetensors"], d)
        run_ok(["model.init=hf/model.safetensors", "--export", "safetensors", "hf2/"], d)
        agree = ["model.kv_heads=2", "model.rope_theta=10000", "model.tie_embeddings=false"]
        out = run_ok(["model.init=hf2/"] + agree + STEP, d)
        if not re.search(r"^done: 1 steps", out, re.M):
            raise SystemExit(f"FAIL: no step trained with keys that agree:\n{out[-2000:]}")
        print(f"ok: {' '.join(agree)} agree with the file: accepted, one step trained")
        out = run_ok(["--print-config", "model.init=hf2/"], d)
        fam = [l for l in out.splitlines() if l.startswith("model.family ")]
        kv = [l for l in out.splitlines() if l.startswith("model.kv_heads ")]
        if not fam or "llama" not in fam[0] or "(derived)" not in fam[0] or \
                not kv or not re.search(r"= 2\s", kv[0]):
            raise SystemExit(f"FAIL: --print-config does not show the file's model:\n{out}")
        print(f"ok: {fam[0].split()[0]} = llama (derived), model.kv_heads = 2")
        out = run_ok(["model.init=hf2/", "model.seq_len=16"] + STEP, d)
        if not re.search(r"^training 1 steps of 2 x 16 tokens", out, re.M):
            raise SystemExit(f"FAIL: model.seq_len=16 under a 64-position file:\n{out[-2000:]}")
        print("ok: model.seq_len=16 under the file's 64 positions trains on 16-token rows")
        strip_max_positions(os.path.join(d, "hf2"), os.path.join(d, "hf3"))
        out = run_ok(["model.init=hf3/"] + STEP, d)
        print("ok: a config.json without max_position_embeddings loads")
        rc, out = run(["model.init=hf3/", "model.seq_len=4096"] + STEP, d)
        if rc != 2 or "has a context of 2048 positions" not in out:
            raise SystemExit(f"FAIL: want the default context 2048 named (exit {rc}):\n{out}")
        print("ok: its context is transformers' default, 2048: "
              + [l for l in out.splitlines() if "weft: error" in l][0])


if __name__ == "__main__":
    main()
