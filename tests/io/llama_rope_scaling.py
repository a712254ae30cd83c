"""llama_rope_scaling.py - Llama 3.1's RoPE scaling (rope_type llama3) through weft's files.

usage: llama_rope_scaling.py WORKER

A 2-layer llama-tiny with model.rope_scaling.* set (factor 8, original context 12 below
its 32-token sequences) trains 2 steps into a checkpoint; then:
  - the checkpoint's manifest records rope_scaling;
  - --export writes it into config.json (a Hugging Face folder, the object transformers
    reads) and into a single file's __metadata__; --dump-state (logits, loss, gradients)
    from the checkpoint, the folder, the file and the folder as Hugging Face writes it
    (no weft __metadata__: config.json alone) are the same bytes, and differ from the
    last with `"rope_scaling": null` (so the scaling is read, not defaulted);
  - a manifest without rope_scaling (as written before it existed) loads as no scaling:
    its dump equals the unscaled folder's;
  - resuming with another factor is refused, naming model.rope_scaling.factor;
  - a config.json with a rope_type weft does not implement (yarn) is refused with exit
    status 2 and a message naming it.
Standard library only (st_ref.py reads the safetensors).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_ref  # noqa: E402  the safetensors reader

WORKER = sys.argv[1]
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.5,
           "high_freq_factor": 1.5, "original_max_position_embeddings": 12}
TINY = ["model.preset=llama-tiny", "model.layers=2", "model.seq_len=32", "train.batch_size=2",
        "runtime.threads=1", "train.eval_every=0"]
SCALED = TINY + [f"model.rope_scaling.{k}={v}" for k, v in SCALING.items()]


def run(args, timeout=120):
    p = subprocess.run([WORKER] + args, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


def run_ok(args):
    rc, out = run(args)
    if rc != 0:
        raise AssertionError(f"{' '.join(args)} exited {rc}:\n{out[-3000:]}")
    return out


def dump(args, path):
    run_ok(args + ["--dump-state", path])
    with open(path, "rb") as f:
        return f.read()


def metadata(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]


def with_config(src, dst, **changes):
    """A copy of weft's Hugging Face folder src as Hugging Face writes one: its
    model.safetensors' __metadata__ only {"format": "pt"} (weft's own dims there win over
    config.json), and config.json's keys changed."""
    shutil.copytree(src, dst)
    st = os.path.join(dst, "model.safetensors")
    with open(st, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head, body = json.loads(f.read(n)), f.read()
    head["__metadata__"] = {"format": "pt"}
    text = json.dumps(head).encode()
    with open(st, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + body)
    path = os.path.join(dst, "config.json")
    cfg = json.load(open(path))
    cfg.update(changes)
    json.dump(cfg, open(path, "w"))
    return dst + "/"


def main():
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck")
        run_ok(SCALED + ["train.steps=2", "train.checkpoint_dir=" + ck,
                         "train.checkpoint_every=2"])
        step = os.path.join(ck, sorted(x for x in os.listdir(ck) if x.startswith("step"))[-1])
        manifest = os.path.join(step, "manifest.json")
        m = json.load(open(manifest))
        assert m["model"]["rope_scaling"] == SCALING, m["model"]
        print(f"manifest: rope_scaling {m['model']['rope_scaling']}")

        hf = os.path.join(d, "hf") + "/"
        one = os.path.join(d, "one.safetensors")
        run_ok(TINY + ["train.resume=" + ck, "--export", "safetensors", hf])
        run_ok(TINY + ["train.resume=" + ck, "--export", "safetensors", one])
        cfg = json.load(open(hf + "config.json"))
        assert cfg["rope_scaling"] == SCALING, cfg.get("rope_scaling")
        meta = json.loads(metadata(one)["rope_scaling"])
        assert meta == SCALING, meta
        print(f"export: config.json and __metadata__ hold rope_scaling {cfg['rope_scaling']}")

        ref = dump(TINY + ["model.init=" + ck], os.path.join(d, "ck.state"))
        for tag, init in (("folder", hf), ("file", one)):
            got = dump(TINY + ["model.init=" + init], os.path.join(d, "x.state"))
            assert got == ref, f"--dump-state from the {tag} differs from the checkpoint's"
        same = with_config(hf, os.path.join(d, "same"))
        got = dump(TINY + ["model.init=" + same], os.path.join(d, "x.state"))
        assert got == ref, "--dump-state from config.json's rope_scaling alone differs"
        plain = with_config(hf, os.path.join(d, "plain"), rope_scaling=None)
        unscaled = dump(TINY + ["model.init=" + plain], os.path.join(d, "plain.state"))
        assert unscaled != ref, "rope_scaling null dumps what llama3 does: the scaling is unread"
        print("--dump-state: the checkpoint, the folder, the file and a folder with only "
              "config.json's rope_scaling agree byte for byte; with rope_scaling null differ")

        del m["model"]["rope_scaling"]  # a manifest written before rope_scaling
        json.dump(m, open(manifest, "w"), indent=2)
        old = dump(TINY + ["model.init=" + ck], os.path.join(d, "old.state"))
        assert old == unscaled, "a manifest without rope_scaling is not read as no scaling"
        m["model"]["rope_scaling"] = SCALING
        json.dump(m, open(manifest, "w"), indent=2)
        print("a manifest without rope_scaling loads as none (the unscaled dump, byte for byte)")

        other = [a if "factor=" not in a or "_freq_" in a else "model.rope_scaling.factor=4"
                 for a in SCALED]
        rc, out = run(other + ["train.steps=3", "train.resume=" + ck])
        assert rc != 0 and "model.rope_scaling.factor" in out, (rc, out[-2000:])
        line = next(l for l in out.splitlines() if "model.rope_scaling.factor" in l)
        print(f"resume with factor 4 refused (exit {rc}): {line.strip()}")

        yarn = with_config(hf, os.path.join(d, "yarn"),
                           rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 32768})
        rc, out = run(TINY + ["model.init=" + yarn, "train.steps=1"])
        assert rc == 2 and "rope_type 'yarn' is not one weft implements" in out, (rc, out[-2000:])
        line = next(l for l in out.splitlines() if "yarn" in l)
        print(f"rope_type yarn refused (exit {rc}): {line.strip()}")


main()
