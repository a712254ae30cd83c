#!/usr/bin/env python3
"""When checkpoints are written, which are kept, and which one a run resumes from:
train.checkpoint_minutes and train.checkpoint_every, train.keep_checkpoints, train.resume=auto
(also when `latest` lags), and the warning when mpirun's kill grace is shorter than a
stop needs.

`periodic.py WORKER COORDINATOR CASE`, with ckpt.py's helpers (each case in its own
temporary directory).
"""
import glob
import json
import os
import re
import shutil
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt import (expect_in, fail, finish, latest, losses, path,  # noqa: E402
                  reference, run, run_case, same_losses, start, wait_for,
                  worker_pid)


def case_keep():
    ck = path("ck")
    os.makedirs(os.path.join(ck, ".tmp-step-000003"))  # leftover of a killed write
    run(1, ["train.steps=10", "train.checkpoint_every=2", "train.keep_checkpoints=2",
            f"train.checkpoint_dir={ck}"])
    have = sorted(os.listdir(ck))
    if have != ["latest", "step-000008", "step-000010"] or latest(ck) != "step-000010":
        fail(f"keep=2 left {have}, latest {latest(ck)}")
    # Resume from an older checkpoint: the new one becomes `latest` and is kept although
    # step-000010 (of the first run) has a higher number; keep=1 keeps only it.
    run(1, ["train.steps=9", "train.keep_checkpoints=1", f"train.resume={ck}/step-000008",
            f"train.checkpoint_dir={ck}"])
    have = sorted(os.listdir(ck))
    if have != ["latest", "step-000009"] or latest(ck) != "step-000009":
        fail(f"keep=1 after resuming at step 8 left {have}, latest {latest(ck)}")
    print("keep: pruned to the newest checkpoints, never the one latest names")


def case_every_minutes():
    """train.checkpoint_minutes: rank 0's clock, agreed at a step boundary. With a period of
    0.3 s and steps of 10-100 ms at dp 2 (a quiet or a loaded machine), 150 steps last
    1.5-15 s, so at least 3 checkpoints come due before the last step; each comes at the
    first boundary at least a period after the previous one ended. The metrics' `time`
    is taken at the step's report, just before the boundary's check (the same step's
    agreement, milliseconds here), so consecutive checkpoints' times are at least the
    period apart less that (0.1 s is ample); and never more than the period plus the steps
    and checkpoint in between (2 s covers a loaded machine). 0 minutes: the last step's
    checkpoint alone."""
    period = 0.3
    ck, m = path("ck"), path("m.jsonl")
    out = run(2, ["train.steps=150", f"train.checkpoint_minutes={period / 60}",
                  "train.keep_checkpoints=0", f"train.checkpoint_dir={ck}",
                  f"train.metrics={m}", "train.log_every=50"])
    saved = [int(x) for x in re.findall(r"checkpoint: step (\d+) saved", out)]
    times = {}
    for line in open(m):
        r = json.loads(line)
        times[r["step"]] = r["time"]
    periodic = [s for s in saved if s < 150]
    if len(periodic) < 3 or saved[-1] != 150 or latest(ck) != "step-000150":
        fail(f"a {period} s period over 150 steps saved {saved}", out)
    for a, b in zip(periodic, periodic[1:]):
        gap = times[b] - times[a]
        if not period - 0.1 <= gap <= period + 2.0:
            fail(f"checkpoints of steps {a} and {b} came {gap:.3f} s apart, period {period} s",
                 out)
    dirs = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
    if dirs != [f"step-{s:06d}" for s in saved]:
        fail(f"saved {saved}, directories {dirs}")
    ck0 = path("ck0")
    run(1, ["train.steps=30", "train.checkpoint_minutes=0", f"train.checkpoint_dir={ck0}"])
    if sorted(os.listdir(ck0)) != ["latest", "step-000030"]:
        fail(f"train.checkpoint_minutes=0 left {sorted(os.listdir(ck0))}")
    print(f"every-minutes: {len(periodic)} periodic checkpoints at steps {periodic}, "
          f"gaps {min(times[b] - times[a] for a, b in zip(periodic, periodic[1:])):.2f}-"
          f"{max(times[b] - times[a] for a, b in zip(periodic, periodic[1:])):.2f} s")


def case_kill_grace():
    """Under mpirun, rank 0 says once, after the first checkpoint, when a step and a
    checkpoint take longer than mpirun waits before SIGKILL (2 x odls_base_sigkill_timeout,
    read from the OMPI_MCA_* variable mpirun passes on). A grace of 0 s is shorter than any
    step; Open MPI's default (1 s, so 2 s) is far longer than gpt2-tiny's (milliseconds)."""
    args = ["train.steps=6", "train.checkpoint_every=2", f"train.checkpoint_dir={path('ckg')}",
            "train.resume=never"]
    out = run(2, args, {"OMPI_MCA_odls_base_sigkill_timeout": "0"})
    said = out.count("a Ctrl-C to mpirun would end the job without its last checkpoint")
    if said != 1 or "coordinator stop" not in out:
        fail(f"a 0 s kill grace: the warning said {said} times, want once", out)
    env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_odls_base_sigkill_timeout"}
    os.environ.clear()
    os.environ.update(env)
    out = run(2, args)
    if "would end the job without its last checkpoint" in out:
        fail("Open MPI's default kill grace (2 s) warned for millisecond steps", out)
    print("kill-grace: said once at a 0 s grace, not at the default")


def data_files(step_dir):
    """name -> bytes of a checkpoint's model and optimizer files."""
    return {f: open(os.path.join(step_dir, f), "rb").read() for f in sorted(os.listdir(step_dir))
            if f.endswith(".bin")}


ASYNC = ["optim.zero=1", "train.checkpoint_async=true"]


def case_async():
    """train.checkpoint_async: the checkpoint of step 10 is held 1.5 s per file while it is
    written (a test hook), and training goes on meanwhile: step 11 follows step 10 by far
    less than the write takes (a step is ~10 ms here; a synchronous write would put 1.5 s
    or more between them). The checkpoint of step 15 comes due while that write is under
    way on rank 0 and is deferred, never written over it; the last step's is written at
    once after it. Training is not changed by it (the same losses, bit for bit, as the
    synchronous run), and every file of every checkpoint equals the synchronous run's byte
    for byte: the snapshot is the step's state."""
    extra = ["optim.zero=1"]
    ref, ref_ck = reference(2, extra, "sync", steps=20, every=5)
    ck, m = path("async"), path("async.jsonl")
    out = run(2, ASYNC + ["train.steps=20", "train.checkpoint_every=5",
                          "train.keep_checkpoints=0", f"train.checkpoint_dir={ck}",
                          f"train.metrics={m}"], {"WEFT_TEST_CKPT_DELAY_MS": "1500:10"})
    saved = [int(x) for x in re.findall(r"checkpoint: step (\d+) saved", out)]
    times = {}
    for line in open(m):
        r = json.loads(line)
        times[r["step"]] = r["time"]
    gap = times[11] - times[10]
    if gap >= 1.0:
        fail(f"step 11 came {gap:.2f} s after step 10: training waited for the write", out)
    if sorted(saved) != [5, 10, 20] or "in the background" not in out:
        fail(f"saved {saved}, want 5, 10 (in the background) and 20 (15 deferred)", out)
    same_losses(ref, losses(m), 1, 20, "background checkpoints")
    for step in (5, 10, 20):
        name = f"step-{step:06d}"
        a, b = data_files(os.path.join(ck, name)), data_files(os.path.join(ref_ck, name))
        if a != b or not a:
            fail(f"{name}: the background checkpoint's files {sorted(a)} differ from the "
                 f"synchronous run's {sorted(b)}")
    print(f"async: step 11 {gap * 1e3:.0f} ms after step 10 while its checkpoint was written "
          f"(held 2 x 1.5 s); saved {sorted(saved)}; files equal the synchronous run's")


def case_async_kill():
    """A rank killed while its part of a background checkpoint is being written (its
    optimizer file held half-written): the job ends, `latest` stays on the checkpoint
    before, no step directory of the killed write exists, and the relaunch resumes from
    `latest` and trains what the uninterrupted run trained, bit for bit."""
    ref, _ = reference(2, ["optim.zero=1"], "ref", steps=20, every=5)
    ck = path("ck")
    args = ASYNC + ["train.steps=20", "train.checkpoint_every=5", "train.keep_checkpoints=0",
                    f"train.checkpoint_dir={ck}", f"train.metrics={path('killed.jsonl')}"]
    p = start(2, args, {"WEFT_TEST_CKPT_DELAY_MS": "1500:10"})
    stage = os.path.join(ck, ".tmp-step-000010")
    wait_for(lambda: glob.glob(os.path.join(stage, ".optim-pp00-tp00-dp01.bin.tmp.*")),
             "rank 1's background write of step 10", p)
    pid = worker_pid(1, ck)
    if pid is None:
        p.kill()
        fail("cannot find rank 1's process")
    os.kill(pid, signal.SIGKILL)
    rc, out = finish(p)
    if rc == 0 or latest(ck) != "step-000005" or os.path.exists(os.path.join(ck, "step-000010")):
        fail(f"after the kill: exit {rc}, latest {latest(ck)}, step-000010 "
             f"{'exists' if os.path.exists(os.path.join(ck, 'step-000010')) else 'absent'}", out)
    out = run(2, args + ["train.resume=auto"])
    expect_in(out, ["resumed from", "step-000005 at step 5"], "resume after the kill")
    same_losses(ref, losses(path("killed.jsonl")), 1, 20, "resume after a killed background write")
    print("async-kill: rank 1 killed mid-write of step 10: latest step-000005, resumed, "
          "steps 1-20 equal the uninterrupted run's")


def case_auto():
    """train.resume=auto: an empty directory is a fresh start, said once (by rank 0);
    without a `latest` (a crash after publishing a step, before the pointer) the newest
    complete step directory is used."""
    ck = path("ck")
    out = run(2, ["train.steps=4", "train.checkpoint_every=2", "train.keep_checkpoints=0",
                  "train.resume=auto", f"train.checkpoint_dir={ck}"])
    if out.count("starting fresh") != 1:
        fail("a fresh start under train.resume=auto is not said exactly once", out)
    os.remove(os.path.join(ck, "latest"))
    os.makedirs(os.path.join(ck, "step-000009"))  # no manifest: not a checkpoint
    out = run(2, ["train.steps=6", "train.resume=auto", f"train.checkpoint_dir={ck}"])
    expect_in(out, ["no `latest` pointer", "resumed from", "step-000004 at step 4"], "no latest")
    if latest(ck) != "step-000006":
        fail(f"latest is {latest(ck)} after the resumed run, want step-000006")
    print("resume=auto: fresh start said once; without latest, the newest complete checkpoint")


def lag_latest(ck, name, ref_step):
    """Make `latest` name `name` as if it had last been written when step-`ref_step` was
    published: a job that died between publishing newer steps and updating `latest`."""
    f = os.path.join(ck, "latest")
    with open(f, "w") as h:
        h.write(name + "\n")
    ns = os.stat(os.path.join(ck, f"step-{ref_step:06d}", "manifest.json")).st_mtime_ns
    os.utime(f, ns=(ns, ns))


def case_auto_lag():
    """train.resume=auto when `latest` lags a newer complete checkpoint: it resumes from
    the newest one that verifies and says so in one line, bit-exact with an uninterrupted
    run; a newer one with a corrupt file is passed over (named) for the next; a `latest`
    written after the newer steps (a run resumed from an earlier step since) is obeyed."""
    ck = path("ck")
    metrics = path("m.jsonl")
    common = ["train.checkpoint_every=2", "train.keep_checkpoints=0", f"train.checkpoint_dir={ck}",
              f"train.metrics={metrics}", "train.resume=auto", "train.steps=8"]
    run(2, common)
    ref = losses(metrics)
    shutil.rmtree(os.path.join(ck, "step-000008"))  # as if it died after step 6 ...
    lag_latest(ck, "step-000002", 2)  # ... with `latest` last written at step 2
    out = run(2, common)
    lines = [l for l in out.splitlines() if "is newer, complete and verified" in l]
    if len(lines) != 1 or "step-000002" not in lines[0] or "step-000006" not in lines[0]:
        fail("a lagging `latest` (step-000002 under step-000006) is not said in exactly one "
             "line naming both", out)
    expect_in(out, ["resumed from", "step-000006 at step 6"], "latest lags")
    same_losses(ref, losses(metrics), 1, 8, "resume=auto past a lagging latest")
    print(f"latest lags: {lines[0].split('] ')[-1]}")

    lag_latest(ck, "step-000004", 4)
    bad = os.path.join(ck, "step-000008", "model-pp00-tp00.bin")
    with open(bad, "r+b") as h:
        h.seek(4000)  # past the header: a parameter
        b = h.read(1)
        h.seek(4000)
        h.write(bytes([b[0] ^ 0x01]))
    out = run(2, common)
    expect_in(out, [bad, "checksum mismatch", "step-000008 is newer than `latest` but does "
                    "not verify", "resumed from", "step-000006 at step 6"], "corrupt newer")
    if out.count("checksum mismatch") != 1:
        fail("the corrupt newer checkpoint's error is not said once", out)
    print("latest lags, newest corrupt: step-000008 named and passed over for step-000006")

    with open(os.path.join(ck, "latest"), "w") as h:  # written now: after every manifest
        h.write("step-000004\n")
    out = run(2, common)
    expect_in(out, ["resumed from", "step-000004 at step 4"], "latest written after")
    if "is newer, complete and verified" in out:
        fail("a `latest` written after the newer steps was overridden", out)
    print("latest written after the newer steps: obeyed (resumed at step 4)")


CASES = {
    "keep": case_keep,
    "every-minutes": case_every_minutes,
    "kill-grace": case_kill_grace,
    "async": case_async,
    "async-kill": case_async_kill,
    "auto": case_auto,
    "auto-lag": case_auto_lag,
}

if __name__ == "__main__":
    run_case(CASES)
