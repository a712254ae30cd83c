#!/usr/bin/env python3
"""What a new user meets first: the command line's hints, exit statuses, the end-of-run
summary, train.log_every, --export without training, model.vocab from the tokenizer,
and the warnings that save an hour.

`frontdoor.py WORKER WEFT_RUN CASE`. Each case runs the real worker (alone, or under
mpirun for the mesh cases) in a scratch folder and asserts on what it prints and writes.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from testlib import fail, free_ports  # noqa: E402

WORKER, WEFT_RUN, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
TINY = ["train.eval_every=0", "model.layers=2", "train.batch_size=4"]


def run(args, np=1, timeout=120, env_extra=None, cwd=None):
    env = dict(os.environ, OMPI_MCA_ess_singleton_isolated="1",
               MASTER_PORT=str(free_ports(1)[0]), **(env_extra or {}))
    cmd = (MPIRUN + ["-np", str(np), "-x", "MASTER_PORT"] if np > 1 else []) + [WORKER] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def errors(text):
    return [l for l in text.splitlines() if l.startswith("weft: error:")]


def case_hints():
    """Mistakes get one error line in one form, status 2 and the fix."""
    cases = [
        (["--train.steps=20"], "config keys are given as key=value without dashes, e.g. "
                               "train.steps=20"),
        (["train.step=20"], "did you mean 'train.steps'?"),
        (["--export", "llmc"], "--export needs FORMAT FILE"),
        (["--export", "onnx", "x.onnx"], "--export onnx: unknown format"),
        (["--generate", "hi", "--export", "llmc", "x"], "are two commands"),
        (["--export", "llmc", "/tmp/x.bin"], "--export needs weights to convert: model.init="),
        (["model.init=/etc/hostname", "train.steps=1"], "not model weights weft can read"),
    ]
    for args, needle in cases:
        rc, out, err = run(args)
        lines = errors(out + err)
        if rc != 2 or len(lines) != 1 or needle not in lines[0]:
            fail(f"{args}: want exit 2 and one error with {needle!r}; got {rc}, {lines}", err)
        if re.search(r"\(\S+\.c:\d+\)", lines[0]):
            fail(f"{args}: a user error shows a source location: {lines[0]}")
        print(f"ok: {' '.join(args)} -> {lines[0]}")
    rc, out, err = run(["model.init=/etc/hostname", "train.steps=1", "runtime.log_level=debug"])
    if not re.search(r"\(\.\./\S+\.c:\d+\)", err):
        fail("at debug level an error carries its source location", err)
    print("ok: runtime.log_level=debug adds the source location")


def case_plan_world():
    rc, out, err = run(["--plan", "--top", "1"], timeout=300)
    if rc != 0 or "no world size given, so this plans for 1 rank" not in err or \
            "dist.world_size=N" not in err:
        fail(f"--plan without a world size must say how to give one (exit {rc})", out + err)
    print("ok: --plan without dist.world_size says how to give one")


def case_summary():
    """train.log_every, the summary, --save's confirmation, created parent folders."""
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run(TINY + ["train.steps=7", "train.log_every=3",
                                   f"train.metrics={d}/new/dir/m.jsonl",
                                   f"train.checkpoint_dir={d}/ck", "--save",
                                   f"{d}/out/sub/model.bin"])
        if rc != 0:
            fail(f"exit {rc}", out + err)
        steps = [int(s) for s in re.findall(r"^step (\d+)/7 ", out, re.M)]
        if steps != [1, 3, 6, 7]:  # the first, every 3rd, the last
            fail(f"train.log_every=3 printed steps {steps}, want [1, 3, 6, 7]", out)
        with open(f"{d}/new/dir/m.jsonl") as f:
            metrics = [json.loads(l)["step"] for l in f]
        if metrics != list(range(1, 8)):
            fail(f"the metrics file has steps {metrics}, want every step", out)
        want = [r"^done: 7 steps in [\d.]+ s, \d+ tokens/s; loss \d+\.\d{4} \(first \d+\.\d{4}\)",
                rf"^  checkpoint: {re.escape(d)}/ck/step-000007 ",
                rf"^  metrics: {re.escape(d)}/new/dir/m.jsonl ",
                rf"^  saved: {re.escape(d)}/out/sub/model.bin \(llm.c GPT-2 checkpoint, version 3"]
        for w in want:
            if not re.search(w, out, re.M):
                fail(f"the summary lacks /{w}/", out)
        if not os.path.getsize(f"{d}/out/sub/model.bin"):
            fail("--save wrote nothing", out)
        print("ok: log_every=3 printed steps 1, 3, 6, 7; metrics has all 7; summary:")
        print("\n".join(l for l in out.splitlines() if l.startswith(("done:", "  "))))


def case_export():
    """--export converts model.init without training: llm.c v3 -> safetensors -> llm.c v5
    -> llm.c v3; float32 through safetensors is exact, so the first and last files are
    the same bytes, and bf16 rounding twice is idempotent."""
    with tempfile.TemporaryDirectory() as d:
        rc, out, err = run(TINY + ["train.steps=2", "--save", f"{d}/a.bin"])
        if rc != 0:
            fail(f"training: exit {rc}", out + err)
        chain = [("a.bin", "safetensors", "b.safetensors"), ("b.safetensors", "llmc", "c.bin"),
                 ("c.bin", "llmc-bf16", "d.bin"), ("d.bin", "llmc-bf16", "e.bin")]
        for src, fmt, dst in chain:
            rc, out, err = run([f"model.init={d}/{src}", "--export", fmt, f"{d}/{dst}"])
            if rc != 0 or f"exported {d}/{src} to {d}/{dst}" not in out or "step 1/" in out:
                fail(f"--export {fmt} from {src}: exit {rc}", out + err)
            print(f"ok: {out.strip()}")
        same = lambda x, y: open(f"{d}/{x}", "rb").read() == open(f"{d}/{y}", "rb").read()
        if not same("a.bin", "c.bin"):
            fail("llm.c v3 -> safetensors -> llm.c v3 changed the bytes")
        if not same("d.bin", "e.bin") or same("c.bin", "d.bin"):
            fail("bf16 export is not idempotent, or did not round")
        print("ok: v3 -> safetensors -> v3 is the same bytes; bf16 export is idempotent")


def case_vocab_from_tokenizer():
    """model.vocab comes from data.tokenizer; --generate without one warns."""
    sys.path.insert(0, os.path.join(SRC, "tests", "io"))
    import gpt2_ref  # noqa: E402  (writes a small BPE tokenizer: 553 tokens)
    with tempfile.TemporaryDirectory() as d:
        gpt2_ref.write_fixtures(d)
        corpus = os.path.join(d, "c.txt")
        with open(corpus, "w") as f:
            f.write(open(os.path.join(SRC, "README.md")).read() * 2)
        rc, out, err = run(TINY + ["train.steps=2", f"data.path={corpus}",
                                   f"data.tokenizer={d}/tokenizer.json", "--save", f"{d}/m.bin"])
        if rc != 0 or not re.search(r"^model \S+: L=2 NH=4 C=64 V=553 ", out, re.M):
            fail(f"model.vocab is not the tokenizer's 553 (exit {rc})", out + err)
        print("ok: data.tokenizer set model.vocab=553")
        rc, out, err = run(["--generate", "hello", f"model.init={d}/m.bin",
                            "train.sample_tokens=4"])
        if rc != 0 or "--generate without data.tokenizer" not in err:
            fail(f"--generate without a tokenizer must warn (exit {rc})", out + err)
        print("ok: --generate without data.tokenizer warns")


def case_mesh_warnings():
    """pp 4 with one micro-batch idles 75% of each step: one warning; /metrics is logged
    once with its URL."""
    port = free_ports(1)[0]
    rc, out, err = run(["train.steps=2", "mesh.pp=4", "train.microbatches=1",
                        f"runtime.metrics_port={port}"], np=4)
    warn = [l for l in err.splitlines() if "idles" in l]
    if rc != 0 or len(warn) != 1 or "75%" not in warn[0] or "train.microbatches=16" not in warn[0]:
        fail(f"want one idle-pipeline warning naming 75% and microbatches=16 (exit {rc})",
             out + err)
    urls = re.findall(rf"Prometheus metrics at http://\S+:{port}/metrics", err)
    if len(urls) != 1:
        fail(f"want the /metrics URL logged once, got {len(urls)}", err)
    print(f"ok: {warn[0].split('] ', 1)[-1]}")
    print(f"ok: {urls[0]}")


def case_weft_run_no_retry():
    """weft-run does not rerun a status-2 job (it would fail the same way)."""
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, WEFT_RESTART_BACKOFF="1", OMPI_MCA_ess_singleton_isolated="1")
        p = subprocess.run([WEFT_RUN, WORKER, "train.step=5", f"train.checkpoint_dir={d}"],
                           capture_output=True, text=True, timeout=60, env=env)
        if p.returncode != 2 or "not restarting" not in p.stderr or "restart 1" in p.stderr:
            fail(f"weft-run on a config error: exit {p.returncode}", p.stdout + p.stderr)
        print("ok: " + [l for l in p.stderr.splitlines() if "weft-run" in l][0])


def case_checkpoint_dir():
    """A checkpoint_dir holding the same run is resumed by the same command; one holding
    another model or data is refused naming both values; train.resume=never starts
    over, removing the old steps."""
    with tempfile.TemporaryDirectory() as d:
        ck = [f"train.checkpoint_dir={d}/ck", "train.checkpoint_every=2"]
        rc, out, err = run(TINY + ["train.steps=4"] + ck, np=2)
        if rc != 0:
            fail(f"first run: exit {rc}", out + err)
        rc, out, err = run(TINY + ["train.steps=6"] + ck, np=2)
        steps = re.findall(r"^step (\d+)/6 ", out, re.M)
        if rc != 0 or steps != ["5", "6"] or "holds this run" not in err:
            fail(f"the same command did not resume the run (exit {rc}, steps {steps})", out + err)
        print("ok: the same run resumed at step 5")
        for other, key in ((["model.layers=3"], "model.layers"),
                           ([f"data.path={SRC}/README.md"], "data.path")):
            rc, out, err = run(TINY + other + ["train.steps=8"] + ck, np=2)
            lines = errors(out + err)
            if rc != 2 or not lines or "holds another run" not in lines[0] or \
                    key not in lines[0] or "train.resume=never" not in lines[0]:
                fail(f"{other}: want the other run refused with status 2 (exit {rc})", out + err)
            print(f"ok: {lines[0]}")
        rc, out, err = run(TINY + ["model.layers=3", "train.steps=2", "train.resume=never"] + ck,
                           np=2)
        left = sorted(n for n in os.listdir(f"{d}/ck") if n.startswith("step-"))
        if rc != 0 or left != ["step-000002"] or "removed the previous run's" not in err:
            fail(f"train.resume=never: exit {rc}, left {left}", out + err)
        print(f"ok: train.resume=never started over: {left}")


CASES = {"checkpoint-dir": case_checkpoint_dir, "hints": case_hints, "plan-world": case_plan_world, "summary": case_summary,
         "export": case_export, "vocab-from-tokenizer": case_vocab_from_tokenizer,
         "mesh-warnings": case_mesh_warnings, "weft-run-no-retry": case_weft_run_no_retry}

if __name__ == "__main__":
    CASES[CASE]()
