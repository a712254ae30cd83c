#!/usr/bin/env python3
"""The step log with the real worker binary (issue 19): `steplog.py WORKER CASE`.

* per-gpu (np 2, dp 2): the step line has Megatron-style per-GPU throughput beside the
  job's (tok/s/gpu, tflops/gpu), the metrics file has the same figures in the same
  units (tokens_per_s_per_gpu, tflops_per_gpu, mfu_pct a percent like the line's
  mfu=...%), a wall-clock time (unix seconds and ISO 8601) and the writing rank, and
  MFU divides tflops/gpu by train.peak_tflops when it is given.
* loss-jump (np 1): a run whose learning rate warms up to 8 (far past stable for
  gpt2-tiny) blows up after a few steps; every step whose loss exceeds
  train.loss_jump_factor (3) times the running mean of the losses before it gets one
  WARN naming the step, the loss and the mean, and no other step does. The expected
  steps are recomputed here from the metrics file with the rule report.c documents;
  loss_jump_factor=0 prints none.
* banner (np 2): the mesh line names the schedule and the layers of every stage's
  chunks: interleaved with 2 chunks per stage puts virtual stage c * pp + r (of
  L / (pp * v) layers) on stage r (docs/parallelism.md, setup.c), parallel.pp_layers=[3,5] is
  [0,3) and [3,8) under 1F1B.
* host-syncs (np 4): a step waits for its device only where a value must reach the host,
  the loss and the norm: the metrics' host_syncs (the device seam's count of waits, which
  the CPU device keeps as a GPU would) is 2 at every step of rank 0, the first pipeline
  stage, with 2 micro-batches (whose tokens were each checked with a wait before), tp
  collectives and the tied embedding's check (which read the embedding back), and of a
  ZeRO-3 HSDP job.
* tied-check (np 2, pp 2): the tied embedding's check, done on the device and read with
  the next norm, still catches copies that drift apart: with the last stage's tied
  gradient halved (WEFT_TEST_TIED_UNSUMMED) the job fails at step 2's norm naming step 1.
"""
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import fail, free_ports  # noqa: E402

WORKER, CASE = sys.argv[1], sys.argv[2]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
BASE = ["model.preset=gpt2-tiny", "train.batch_size=8", "train.eval_every=0"]
STEP = re.compile(r"^step (\d+)/\d+ loss=(\S+) .*? tok/s=(\S+) tok/s/gpu=(\S+) tflops=(\S+) "
                  r"tflops/gpu=(\S+) mfu=(\S+)% ", re.M)
WARN = re.compile(r"step (\d+): loss (\S+) jumped to (\S+) times its running mean (\S+) "
                  r"\(train.loss_jump_factor=(\S+)\)")
# report.c's watch: LOSS_WARMUP steps before it starts, the mean's horizon LOSS_WINDOW.
LOSS_WARMUP, LOSS_WINDOW = 5, 10


def run(n, args, tmp):
    env = dict(os.environ, MASTER_PORT=str(free_ports(1)[0]), WEFT_JOB_DIR=os.path.join(tmp, "job"),
               OMP_WAIT_POLICY="passive")
    cmd = [WORKER] + BASE + args
    if n > 1:
        cmd = MPIRUN + ["-np", str(n), "-x", "MASTER_PORT", "-x", "WEFT_JOB_DIR",
                        "-x", "OMP_WAIT_POLICY"] + cmd
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240,
                       stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}", out)
    return out


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def close(a, b, tol):
    return abs(a - b) <= tol


def check_row_units(r, n, peak, line):
    """One metrics row against its step line; the line rounds to its printed digits."""
    step, _, tok, tok_gpu, tfl, tfl_gpu, mfu = line
    if r["rank"] != 0:
        fail(f"step {step}: the metrics line says rank {r['rank']}, but rank 0 writes it")
    # per GPU = the job's figure over the n ranks (float division: 1e-12 relative).
    if not close(r["tokens_per_s_per_gpu"] * n, r["tokens_per_s"], 1e-12 * r["tokens_per_s"]):
        fail(f"step {step}: tokens_per_s_per_gpu {r['tokens_per_s_per_gpu']} x {n} != "
             f"tokens_per_s {r['tokens_per_s']}")
    if not close(r["tflops_per_gpu"] * n, r["tflops"], 1e-12 * r["tflops"]):
        fail(f"step {step}: tflops_per_gpu x {n} != tflops")
    if not close(r["mfu_pct"], 100 * r["tflops_per_gpu"] / peak, 1e-9 * r["mfu_pct"]):
        fail(f"step {step}: mfu_pct {r['mfu_pct']} is not 100 x tflops_per_gpu / "
             f"train.peak_tflops {peak}")
    # The line prints tok/s with %.0f, tflops with %.3f, mfu with %.1f: half a unit of
    # the last digit apart at most (plus float slack).
    for name, shown, exact, half in [("tok/s", tok, r["tokens_per_s"], 0.5),
                                     ("tok/s/gpu", tok_gpu, r["tokens_per_s_per_gpu"], 0.5),
                                     ("tflops", tfl, r["tflops"], 5e-4),
                                     ("tflops/gpu", tfl_gpu, r["tflops_per_gpu"], 5e-4),
                                     ("mfu", mfu, r["mfu_pct"], 0.05)]:
        if not close(float(shown), exact, half * 1.001):
            fail(f"step {step}: the line's {name}={shown} and the metrics file's {exact} "
                 f"are not the same figure in the same unit")


def check_time(r, t_start, t_end, prev):
    t = r["time"]
    if not (t_start <= t <= t_end) or t < prev:
        fail(f"step {r['step']}: time {t} is outside the run [{t_start}, {t_end}] or before "
             f"the previous line's {prev}")
    iso = datetime.datetime.strptime(r["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    iso = iso.replace(tzinfo=datetime.timezone.utc).timestamp()
    if not close(iso, t, 1e-3):  # the ISO form is cut to the millisecond
        fail(f"step {r['step']}: timestamp {r['timestamp']} is not time {t}")
    return t


def case_per_gpu(tmp):
    peak = 0.5  # TFLOP/s per rank: given, so MFU does not depend on a measurement
    metrics = os.path.join(tmp, "m.jsonl")
    t_start = time.time()
    out = run(2, ["mesh.dp=2", "train.steps=4", f"train.peak_tflops={peak}",
                  f"train.metrics={metrics}"], tmp)
    t_end = time.time()
    if "peak 0.500 TFLOP/s per rank for MFU (nominal, from train.peak_tflops)" not in out:
        fail("the banner does not name train.peak_tflops as MFU's peak", out)
    lines = {int(m[0]): m for m in STEP.findall(out)}
    got = rows(metrics)
    if sorted(lines) != [1, 2, 3, 4] or [r["step"] for r in got] != [1, 2, 3, 4]:
        fail(f"want steps 1..4 on the line and in the file, got {sorted(lines)} and "
             f"{[r['step'] for r in got]}", out)
    if "mfu" in got[0]:
        fail("the metrics file still has a fractional 'mfu' beside mfu_pct")
    prev = 0
    for r in got:
        check_row_units(r, 2, peak, lines[r["step"]])
        prev = check_time(r, t_start, t_end, prev)
    r = got[-1]
    print(f"ok: per-gpu: step 4 tok/s={r['tokens_per_s']:.0f} "
          f"tok/s/gpu={r['tokens_per_s_per_gpu']:.0f} tflops/gpu={r['tflops_per_gpu']:.4f} "
          f"mfu_pct={r['mfu_pct']:.2f} at {r['timestamp']} by rank {r['rank']}")


def expected_jumps(losses, factor):
    """report.c's rule: after LOSS_WARMUP steps, loss > factor x the mean of the steps
    before (plain average over the first LOSS_WINDOW, then an EMA of weight 1/LOSS_WINDOW)."""
    mean, n, jumps = 0.0, 0, []
    for step, x in losses:
        if factor > 0 and n >= LOSS_WARMUP and x > factor * mean:
            jumps.append((step, x, mean))
        n += 1
        mean += (x - mean) / min(n, LOSS_WINDOW)
    return jumps


def case_loss_jump(tmp):
    metrics = os.path.join(tmp, "m.jsonl")
    args = ["train.steps=14", "train.lr=8", "train.warmup=25", f"train.metrics={metrics}"]
    out = run(1, args, tmp)
    losses = [(r["step"], r["loss"]) for r in rows(metrics)]
    want = expected_jumps(losses, 3.0)
    if not want:
        fail(f"the run did not blow up as it should for this test: losses {losses}")
    got = WARN.findall(out)
    if [int(g[0]) for g in got] != [w[0] for w in want]:
        fail(f"WARN for steps {[int(g[0]) for g in got]}, want {[w[0] for w in want]} "
             f"(losses {losses})", out)
    for g, (step, x, mean) in zip(got, want):
        # printed with %.4f: half a unit of the 4th decimal apart at most
        if not close(float(g[1]), x, 5e-5 * 1.001) or not close(float(g[3]), mean, 5e-5 * 1.001):
            fail(f"step {step}: WARN says loss {g[1]} mean {g[3]}, want {x:.4f} {mean:.4f}")
        if float(g[4]) != 3:
            fail(f"step {step}: the WARN names loss_jump_factor={g[4]}, want the default 3")
    for step, x, mean in want:
        print(f"ok: loss-jump: step {step}: loss {x:.4f} > 3 x running mean {mean:.4f}: one WARN")
    out = run(1, args + ["train.loss_jump_factor=0"], tmp)
    if WARN.search(out):
        fail("train.loss_jump_factor=0 still warns", out)
    print("ok: loss-jump: train.loss_jump_factor=0 prints no warning")


def case_banner(tmp):
    base = ["model.layers=8", "train.microbatches=4", "train.steps=1", "mesh.pp=2"]
    for extra, want in [
        (["train.schedule=interleaved", "parallel.virtual_stages=2"],
         "mesh dp 1 x tp 1 x pp 2, interleaved 1F1B schedule with 2 chunks per stage: layers "
         "pp 0 [0,2) [4,6), pp 1 [2,4) [6,8) of 8; rank 0 holds "),
        (["train.schedule=interleaved", "parallel.virtual_stages=4"],
         "mesh dp 1 x tp 1 x pp 2, interleaved 1F1B schedule with 4 chunks per stage: layers "
         "pp 0 [0,1) [2,3) [4,5) [6,7), pp 1 [1,2) [3,4) [5,6) [7,8) of 8; rank 0 holds "),
        (["train.schedule=1f1b", "parallel.pp_layers=[3,5]"],
         "mesh dp 1 x tp 1 x pp 2, 1F1B schedule: layers pp 0 [0,3), pp 1 [3,8) of 8; "
         "rank 0 holds "),
        (["train.schedule=gpipe", "parallel.pp_layers=[5,3]"],
         "mesh dp 1 x tp 1 x pp 2, GPipe schedule: layers pp 0 [0,5), pp 1 [5,8) of 8; "
         "rank 0 holds ")]:
        out = run(2, base + extra, tmp)
        mesh = [l for l in out.splitlines() if l.startswith("mesh ")]
        if len(mesh) != 1 or not mesh[0].startswith(want):
            fail(f"{' '.join(extra)}: banner {mesh}, want one line starting {want!r}", out)
        # Rank 0 (stage 0, the first) holds its layers and wte, wpe: with gpt2-tiny's
        # C=64, V=256, maxT=64 a layer has 12 C^2 + 13 C parameters (llm.c's layout), so
        # the count shows the layers it names are the ones it really holds.
        spans = re.findall(r"\[(\d+),(\d+)\)", mesh[0].split(", pp 1")[0])
        layers = sum(int(b) - int(a) for a, b in spans)
        held = int(re.search(r"rank 0 holds (\d+) of", mesh[0])[1])
        C, V, T = 64, 256, 64
        if held != layers * (12 * C * C + 13 * C) + V * C + T * C:
            fail(f"{' '.join(extra)}: rank 0 holds {held} parameters, not those of the "
                 f"{layers} layers the banner gives stage 0")
        print(f"ok: banner: {mesh[0]}")


def case_host_syncs(tmp):
    for extra in (["mesh.tp=2", "mesh.pp=2", "train.microbatches=2"],
                  ["mesh.dp=4", "mesh.fsdp=2", "optim.zero=3", "train.microbatches=2"]):
        metrics = os.path.join(tmp, "s.jsonl")
        if os.path.exists(metrics):
            os.unlink(metrics)
        run(4, extra + ["train.steps=3", f"train.metrics={metrics}"], tmp)
        got = [(r["step"], r["host_syncs"]) for r in rows(metrics)]
        if got != [(1, 2), (2, 2), (3, 2)]:
            fail(f"{' '.join(extra)}: (step, host_syncs) {got}, want 2 at each of 3 steps: "
                 "the loss and the norm")
        print(f"ok: host-syncs: {' '.join(extra)}: 2 per step (the loss and the norm)")


def case_tied_check(tmp):
    env = dict(os.environ, MASTER_PORT=str(free_ports(1)[0]), WEFT_JOB_DIR=os.path.join(tmp, "job"),
               OMP_WAIT_POLICY="passive", WEFT_TEST_TIED_UNSUMMED="1")
    cmd = MPIRUN + ["-np", "2", "-x", "MASTER_PORT", "-x", "WEFT_JOB_DIR", "-x", "OMP_WAIT_POLICY",
                    "-x", "WEFT_TEST_TIED_UNSUMMED", WORKER] + BASE + \
        ["mesh.pp=2", "train.microbatches=2", "train.steps=3"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240,
                       stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    want = ("step 1: the tied embedding's copies on the first and last pipeline stage differ")
    if p.returncode == 0 or want not in out:
        fail(f"exit {p.returncode}; want a failure saying {want!r}", out)
    if re.search(r"^step 2/3 ", out, re.M):
        fail("step 2 was reported although its norm found the copies different", out)
    print(f"ok: tied-check: drifted copies caught at step 2's norm (exit {p.returncode})")


CASES = {"per-gpu": case_per_gpu, "loss-jump": case_loss_jump, "banner": case_banner,
         "host-syncs": case_host_syncs, "tied-check": case_tied_check}

if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="weft-steplog-") as d:
        CASES[CASE](d)
