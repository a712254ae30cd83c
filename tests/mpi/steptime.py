#!/usr/bin/env python3
"""A step's time is its whole cycle, less evaluation (issue 18's bench measures it).

`steptime.py WORKER`: a 4-rank dp job on this machine's 2 cores, 16 steps, an
evaluation every 4 steps made long (32 validation batches) next to the step. Rank 0's
metrics lines are written right after each step's work and evaluation, so from one line
to the next the wall clock advances by the next step's step_ms plus its eval_ms, if and
only if step_ms covers everything the loop does between steps (the report, the ranks'
agreement to go on) and leaves the evaluation out.

Tolerance: summed over the run, line to line telescopes to the last line's delay after
its step's clock stopped minus the first's (the step's figures and the line itself,
0.1-0.3 ms here): 2 ms allowed. A step_ms timed from the step's own start, as before,
leaves the between-step part out of every step: 0.1-2 ms each here, 5-15 ms over 15
steps; one that kept the evaluation would miss by 20-60 ms each.
"""
import json
import os
import subprocess
import sys
import tempfile

WORKER = sys.argv[1]
TOL_MS = 2.0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        env = dict(os.environ, MASTER_PORT=os.environ.get("MASTER_PORT", "29641"))
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
               "4", "-x", "MASTER_PORT", WORKER, "mesh.dp=4", "runtime.threads=1",
               "model.layers=2", "model.d_model=64", "model.heads=4", "model.seq_len=64",
               "model.vocab=256", "train.batch_size=4", "train.steps=16", "train.eval_every=4",
               "train.eval_batches=32", f"train.metrics={metrics}"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if p.returncode != 0:
            print((p.stdout + p.stderr)[-3000:])
            sys.exit(f"FAIL: exit {p.returncode}")
        rows = [json.loads(l) for l in open(metrics) if '"step_ms"' in l]
    rows = [r for r in rows if r["rank"] == 0]
    if [r["step"] for r in rows] != list(range(1, 17)):
        sys.exit(f"FAIL: steps {[r['step'] for r in rows]}")
    evals = [r["step"] for r in rows if "eval_ms" in r]
    if evals != [4, 8, 12, 16]:
        sys.exit(f"FAIL: evaluations at steps {evals}, want 4, 8, 12, 16")
    walls = wants = 0.0
    for a, b in zip(rows, rows[1:]):
        wall = (b["time"] - a["time"]) * 1e3
        want = b["step_ms"] + b.get("eval_ms", 0.0)
        print(f"step {b['step']}: line to line {wall:.2f} ms = step_ms {b['step_ms']:.2f} + "
              f"eval_ms {b.get('eval_ms', 0.0):.2f} (off by {wall - want:+.2f})")
        walls, wants = walls + wall, wants + want
    if abs(walls - wants) > TOL_MS:
        sys.exit(f"FAIL: steps 2-16 took {walls:.2f} ms line to line; their step_ms + eval_ms "
                 f"add up to {wants:.2f}: {walls - wants:+.2f} ms, beyond {TOL_MS}")
    print(f"ok: steps 2-16 took {walls:.2f} ms line to line, step_ms + eval_ms {wants:.2f} "
          f"({walls - wants:+.2f} ms)")


main()
