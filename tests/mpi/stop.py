#!/usr/bin/env python3
"""Stopping a job the way a user does: Ctrl-C in a real terminal (a pty) running mpirun
or the worker alone, SIGTERM and SIGINT to mpirun, a second Ctrl-C, Ctrl-C while a
checkpoint is being written, and the reader of the worker's output going away
(`worker ... | head`).

`stop.py WORKER CASE`. A graceful stop (README "Stopping") means: every rank stops after
the same step, a checkpoint of that step is written (train.checkpoint_dir is set) and is
complete (its checksums verify: --export reads it), the job file and the socket are
gone, and the job ends within STOP_BOUND_S of the request. mpirun itself exits 1 after a
signal whatever its ranks did (Open MPI's rule), so under mpirun the test checks what
the ranks did; alone, the worker exits 0 (a graceful stop) or 130 (a second Ctrl-C).
"""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "common"))
from testlib import fail, free_ports  # noqa: E402

WORKER, CASE = sys.argv[1], sys.argv[2]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
# Open MPI kills a rank 2 s after it starts ending the job (SIGCONT, SIGTERM 1 s later,
# SIGKILL 1 s after that: odls_base_sigkill_timeout=1), so a stop under mpirun is over
# by then; 10 s leaves room for mpirun's own exit on 2 loaded cores.
STOP_BOUND_S = 10.0
TINY = ["train.steps=100000", "train.eval_every=0", "model.layers=2", "train.batch_size=4"]


class Job:
    """A command on a pty (stdin, stdout and stderr: a terminal), read as it runs."""

    def __init__(self, cmd, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(cmd[0], cmd, env)
        self.out, self.t0, self.rc = b"", time.monotonic(), None

    def pump(self, timeout=0.02):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if r:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                data = b""
            self.out += data
        if self.rc is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.rc = os.waitstatus_to_exitcode(status)
        return self.rc is None

    def text(self):
        return self.out.decode(errors="replace")

    def wait_for(self, pattern, bound=120.0):
        t = time.monotonic()
        while not re.search(pattern, self.text()):
            if not self.pump() or time.monotonic() - t > bound:
                self.kill()
                fail(f"never saw {pattern!r}", self.text())

    def ctrl_c(self):
        os.write(self.fd, b"\x03")  # the terminal turns it into SIGINT for its foreground

    def finish(self, bound):
        t = time.monotonic()
        while self.pump():
            if time.monotonic() - t > bound:
                self.kill()
                fail(f"still running {bound} s after the stop request", self.text())
        for _ in range(50):  # the rest of the output
            r, _, _ = select.select([self.fd], [], [], 0.02)
            if not r:
                break
            try:
                self.out += os.read(self.fd, 65536)
            except OSError:
                break
        return time.monotonic() - t

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launch(d, np_, extra=(), port=None, env_extra=None):
    env = dict(os.environ, WEFT_JOB_DIR=os.path.join(d, "jobs"),
               MASTER_PORT=str(port or free_ports(1)[0]), OMPI_MCA_ess_singleton_isolated="1",
               **(env_extra or {}))
    args = [WORKER] + TINY + [f"train.checkpoint_dir={d}/ck", f"mesh.dp={np_}"] + list(extra)
    cmd = MPIRUN + ["-np", str(np_), "-x", "WEFT_JOB_DIR", "-x", "MASTER_PORT"] + args \
        if np_ > 1 else args
    return Job(cmd, env)


def steps_printed(text):
    # (in a terminal the worker draws a progress bar: step lines follow \r and ESC[K)
    return [int(s) for s in re.findall(r"step (\d+)/\d+ loss=", text)]


def check_graceful(job, d, took, how, out=None):
    """One stop line, after step N, nothing trained after it (when the step lines are in
    out: job's output, else the given text), checkpoint N complete and named by latest,
    no job file or socket left."""
    steps_in_out = out is None
    out = job.text() if out is None else out
    wait_for_writers(d, 60)  # none unless a step and a checkpoint outlast mpirun's grace
    stops = re.findall(r"stopping after step (\d+): (.*)", out)
    if len(stops) != 1:
        fail(f"{how}: want one 'stopping after step N' line, got {stops}", out)
    n = int(stops[0][0])
    if steps_in_out and max(steps_printed(out)) != n:
        fail(f"{how}: stopped after step {n} but printed step {max(steps_printed(out))}", out)
    latest = open(os.path.join(d, "ck", "latest")).read().strip()
    if latest != f"step-{n:06d}":
        fail(f"{how}: latest names {latest}, not the stop's step {n}", out)
    left = os.listdir(os.path.join(d, "jobs"))
    if left:
        fail(f"{how}: the job left {left} in its job directory", out)
    p = subprocess.run([WORKER, f"train.resume={d}/ck", "--export", "llmc", f"{d}/out.bin"],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OMPI_MCA_ess_singleton_isolated="1"))
    if p.returncode != 0:  # --export verifies every model file's checksum
        fail(f"{how}: the checkpoint of step {n} does not read back", p.stdout + p.stderr)
    print(f"ok: {how}: stopped after step {n} ({stops[0][1]}), {took:.2f} s after the "
          f"request; exit {job.rc if job else 0}; checkpoint step {n} complete; job file and "
          "socket removed")
    return n


def case_ctrlc(np_):
    with tempfile.TemporaryDirectory() as d:
        job = launch(d, np_)
        job.wait_for(r"step 3/")
        job.ctrl_c()
        took = job.finish(STOP_BOUND_S)
        where = f"mpirun -np {np_}" if np_ > 1 else "the worker alone"
        check_graceful(job, d, took, f"Ctrl-C in the terminal running {where}")
        if np_ == 1 and job.rc != 0:
            fail(f"the worker alone exits {job.rc} after a graceful stop, not 0", job.text())
        print("\n".join(job.text().replace("\r", "\n").splitlines()[-8:]))


def case_signal_mpirun(sig):
    with tempfile.TemporaryDirectory() as d:
        job = launch(d, 2)
        job.wait_for(r"step 3/")
        os.kill(job.pid, sig)  # to mpirun itself, as `kill` or a batch system would
        took = job.finish(STOP_BOUND_S)
        check_graceful(job, d, took, f"{signal.Signals(sig).name} to mpirun")


def case_twice():
    """Ctrl-C twice: the second stops at once, exit 130, no checkpoint after the first
    request, the job file and socket removed. Step 3's data read never returns
    (WEFT_TEST_DATA_STALL), and the first Ctrl-C comes once the worker says it is in
    that read, so no step boundary can come between the two."""
    with tempfile.TemporaryDirectory() as d:
        job = launch(d, 1, env_extra={"WEFT_TEST_DATA_STALL": "0:3"})
        job.wait_for(r"step 3's read stalls here")
        job.ctrl_c()
        job.wait_for(r"SIGINT: stopping at the next step boundary")
        job.ctrl_c()
        took = job.finish(STOP_BOUND_S)
        out = job.text()
        if job.rc != 130:
            fail(f"a second Ctrl-C: exit {job.rc}, want 130 (128 + SIGINT)", out)
        if "a second SIGINT: stopping at once" not in out or "stopping after step" in out:
            fail("a second Ctrl-C must stop at once, not at a step boundary", out)
        if os.path.exists(os.path.join(d, "ck", "latest")):
            fail("a second Ctrl-C wrote a checkpoint", out)
        if os.listdir(os.path.join(d, "jobs")):
            fail(f"left {os.listdir(os.path.join(d, 'jobs'))} behind", out)
        print(f"ok: a second Ctrl-C stopped the worker at once ({took:.2f} s), exit 130, no "
              f"checkpoint, job file and socket removed")


def children(pid):
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return []
    return [int(x) for x in out.split()]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def case_twice_mpirun():
    """Ctrl-C twice to mpirun: Open MPI then exits at once, and its ranks with it (the
    kernel's SIGTERM when their launcher dies stops them at once): nothing is left
    running, no job file or socket."""
    with tempfile.TemporaryDirectory() as d:
        job = launch(d, 2, ["model.d_model=256", "model.heads=4", "train.checkpoint_every=1"])
        job.wait_for(r"step 2/")
        ranks = children(job.pid)
        job.ctrl_c()
        job.wait_for(r"the launcher is ending the job")
        job.ctrl_c()
        took = job.finish(STOP_BOUND_S)
        t = time.monotonic()
        while any(alive(p) for p in ranks) and time.monotonic() - t < STOP_BOUND_S:
            time.sleep(0.1)
        left = [p for p in ranks if alive(p)]
        if not ranks or left:
            fail(f"ranks {ranks}: {left} still running after mpirun exited", job.text())
        if os.listdir(os.path.join(d, "jobs")):
            fail(f"left {os.listdir(os.path.join(d, 'jobs'))} behind", job.text())
        print(f"ok: a second Ctrl-C ended mpirun in {took:.2f} s and its ranks "
              f"{ranks} {time.monotonic() - t:.2f} s later; job file and socket removed")


def case_during_checkpoint():
    """Ctrl-C while a checkpoint is being written (seen as its staging directory): the
    write completes and the job stops right there, at that checkpoint's step."""
    with tempfile.TemporaryDirectory() as d:
        # d_model 256: a 38 MB checkpoint that takes 0.2-0.4 s to write and fsync here
        job = launch(d, 2, ["model.d_model=256", "model.heads=4", "train.seq_len=16",
                            "train.checkpoint_every=1"])
        job.wait_for(r"step 2/")
        ck, staged, t = os.path.join(d, "ck"), None, time.monotonic()
        while staged is None:
            staged = next((n for n in os.listdir(ck) if n.startswith(".tmp-step-")), None)
            if time.monotonic() - t > 60 or not job.pump(0.0005):
                fail("never saw a checkpoint being written", job.text())
        job.ctrl_c()
        took = job.finish(STOP_BOUND_S)
        n = check_graceful(job, d, took, f"Ctrl-C during the write of {staged}")
        if f"{n:06d}" not in staged:
            fail(f"the stop came after step {n}, not at the checkpoint being written "
                 f"({staged})", job.text())
        print(f"ok: the request during {staged}'s write stopped the job at that checkpoint")


def wait_for_writers(d, bound):
    """Until no writer of a stop holds its lock (as the next job waits); seconds taken."""
    import fcntl
    t = time.monotonic()
    path = os.path.join(d, "ck", ".stop-writers.lock")
    if not os.path.exists(path):
        return 0.0
    with open(path) as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - t
            except BlockingIOError:
                if time.monotonic() - t > bound:
                    fail(f"the stop's writers still run {bound} s after the job ended")
                time.sleep(0.05)


def case_slow_stop(extra, ctrl_c_at, how):
    """Ctrl-C to mpirun when a step and a checkpoint outlast Open MPI's 2 s before
    SIGKILL: mpirun and the ranks are gone within seconds; the checkpoint of the last
    completed step is finished afterwards by the writers that outlive the job
    (rescue.c), complete, named by latest, no job file left, and its files equal byte
    for byte the ones an uninterrupted run writes at that step. ctrl_c_at: the step line
    after which, plus a pause (seconds), the Ctrl-C comes."""
    line, pause = ctrl_c_at
    with tempfile.TemporaryDirectory() as data, tempfile.TemporaryDirectory() as d:
        extra = [a.replace("{data}", data) for a in extra]
        write_corpus(os.path.join(data, "corpus.jsonl"))
        job = launch(d, 2, extra, env_extra={"WEFT_TEST_CKPT_DELAY_MS": "2500"})
        job.wait_for(r"checkpoint: step 3 saved", bound=180)
        job.wait_for(rf"step {line}/", bound=180)
        time.sleep(pause)
        job.ctrl_c()
        took = job.finish(STOP_BOUND_S)
        ended, out = time.time(), job.text()
        print("\n".join(out.replace("\r", "\n").splitlines()[-6:]))
        m = re.search(r"the checkpoint of step (\d+) is written by processes that outlive", out)
        if not m:
            fail(f"{how}: the stop did not go to the writers that outlive the job", out)
        n = int(m.group(1))
        stops = [int(x) for x in re.findall(r"stopping after step (\d+)", out)]
        if stops not in ([], [n]) or max(steps_printed(out)) > n + 1:
            fail(f"{how}: the writers have step {n}, the job says it stopped after {stops} "
                 f"and printed step {max(steps_printed(out))}", out)
        left = os.listdir(os.path.join(d, "jobs"))
        if left:
            fail(f"{how}: the job left {left} in its job directory", out)
        waited = wait_for_writers(d, 60)
        log = open(os.path.join(d, "ck", "stop-writers.log")).read()
        if not re.search(rf"checkpoint: step {n} saved to .*by the stop's writers", log):
            fail(f"{how}: the writers' log does not say step {n} was saved", out + log)
        latest = open(os.path.join(d, "ck", "latest")).read().strip()
        step_dir = os.path.join(d, "ck", f"step-{n:06d}")
        if latest != f"step-{n:06d}":
            fail(f"{how}: latest names {latest}, not the writers' step {n}", log)
        if os.path.getmtime(os.path.join(step_dir, "manifest.json")) < ended:
            fail(f"{how}: the checkpoint was finished before mpirun exited: nothing outlived "
                 "the job", log)
        print(f"ok: {how}: mpirun gone {took:.2f} s after Ctrl-C (exit {job.rc}), stopped "
              f"after step {stops or '(killed first)'}; the writers published step {n} "
              f"{waited:.2f} s later; no job file left")
        # the same steps uninterrupted, stopped after a checkpoint at step n
        with tempfile.TemporaryDirectory() as r:
            ref = launch(r, 2, extra + [f"train.checkpoint_every={n}"])
            ref.wait_for(rf"checkpoint: step {n} saved", bound=180)
            ref.ctrl_c()
            ref.finish(STOP_BOUND_S)
            ref_dir = os.path.join(r, "ck", f"step-{n:06d}")
            names = sorted(f for f in os.listdir(ref_dir) if f.endswith(".bin"))
            if sorted(f for f in os.listdir(step_dir) if f.endswith(".bin")) != names:
                fail(f"{how}: files {os.listdir(step_dir)} against the uninterrupted {names}")
            for f in names:
                with open(os.path.join(step_dir, f), "rb") as a, \
                        open(os.path.join(ref_dir, f), "rb") as b:
                    if a.read() != b.read():
                        fail(f"{how}: {f} of step {n} differs from the uninterrupted run's")
            got, want = (json.load(open(os.path.join(x, "manifest.json")))
                         for x in (step_dir, ref_dir))
            streamed = any(a.startswith("data.source=") for a in extra)
            if streamed and "stream" not in (got.get("data") or {}):
                fail(f"{how}: no data.source position in the manifest: {got.get('data')}")
            if got.get("data") != want.get("data"):
                fail(f"{how}: the data position {got.get('data')} differs from the "
                     f"uninterrupted run's {want.get('data')}")
            print(f"ok: {', '.join(names)} of step {n} and the data position equal the "
                  "uninterrupted run's byte for byte")


def world_rank(pid):
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return next(int(v.split(b"=")[1]) for v in env if v.startswith(b"OMPI_COMM_WORLD_RANK="))


def case_slow_fault():
    """A rank killed (SIGKILL) while a stop would go to the writers: mpirun ends the others
    as it ends a job, their writers start, and rank 0's finds that rank 1's never will:
    it gives up, leaving latest on the previous checkpoint and its stage for the next
    job. The next job waits for the writers, removes the stage, and resumes from that
    checkpoint."""
    delay = {"WEFT_TEST_CKPT_DELAY_MS": "2500"}
    with tempfile.TemporaryDirectory() as d:
        job = launch(d, 2, ["train.checkpoint_every=3"], env_extra=delay)
        job.wait_for(r"checkpoint: step 3 saved", bound=180)
        job.wait_for(r"step 5/", bound=180)
        victim = next(p for p in children(job.pid) if world_rank(p) == 1)
        os.kill(victim, signal.SIGKILL)
        job.finish(STOP_BOUND_S)
        ck = os.path.join(d, "ck")
        again = launch(d, 2, ["train.checkpoint_every=3"])
        again.wait_for(r"waiting for the writers of the last job's stop", bound=30)
        again.wait_for(r"resumed from", bound=120)
        again.kill()
        log = open(os.path.join(ck, "stop-writers.log")).read()
        if "rank 1's writer never started" not in log:
            fail("rank 0's writer did not find that rank 1 had none", job.text() + log)
        latest = open(os.path.join(ck, "latest")).read().strip()
        stages = [n for n in os.listdir(ck) if "-stop-" in n]
        if latest != "step-000003" or stages:
            fail(f"latest {latest} (want step-000003), stages left {stages}",
                 again.text() + log)
        m = re.search(r"resumed from \S*step-(\d+) at step", again.text())
        if not m or int(m.group(1)) != 3:
            fail("the next job did not resume from step 3", again.text())
        print("ok: rank 1 killed: rank 0's writer gave up (\"rank 1's writer never started\"),"
              " latest stayed step-000003; the next job waited for the writers, removed their"
              " stage and resumed from step 3")


def write_corpus(path):
    """A JSON Lines corpus: one document per fortune."""
    docs = open("/usr/share/games/fortunes/fortunes", encoding="utf-8").read().split("\n%\n")
    with open(path, "w") as f:
        for i, t in enumerate(docs):
            f.write(json.dumps({"id": i, "text": t}) + "\n")


def case_closed_pipe():
    """`worker ... | head`: the reader of the worker's standard output reads two step
    lines and exits. The worker must not die of SIGPIPE (silently, with its job file
    left and no checkpoint): it says once that its output is a closed pipe, stops at the
    step boundary with a checkpoint, removes its job file and socket, and exits 0."""
    with tempfile.TemporaryDirectory() as d:
        # no MASTER_PORT: a port found free here may be taken by another test before the
        # worker binds it (exit 1 before any step); alone, the worker takes a free one
        env = dict(os.environ, WEFT_JOB_DIR=os.path.join(d, "jobs"),
                   OMPI_MCA_ess_singleton_isolated="1")
        env.pop("MASTER_PORT", None)
        with open(os.path.join(d, "stderr"), "w+") as err:
            # (Popen gives the child SIGPIPE's default action back, as a shell does)
            p = subprocess.Popen([WORKER] + TINY + [f"train.checkpoint_dir={d}/ck"],
                                 stdout=subprocess.PIPE, stderr=err, env=env)
            lines = []
            while not lines or not lines[-1].startswith(b"step 2/"):
                lines.append(p.stdout.readline())
                if not lines[-1]:
                    p.kill()
                    err.seek(0)
                    fail(f"the worker's output ended before step 2 (exit {p.wait()})",
                         b"".join(lines).decode(errors="replace") + err.read())
            p.stdout.close()  # as `head -n N` does once it has its lines
            t = time.monotonic()
            try:
                rc = p.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                p.kill()
                fail(f"still running {STOP_BOUND_S} s after its reader went away")
            took = time.monotonic() - t
            err.seek(0)
            out = err.read()
        if rc != 0:
            fail(f"exit {rc} after its reader went away, want 0"
                 f"{' (killed by SIGPIPE)' if rc == -signal.SIGPIPE else ''}", out)
        if out.count("closed pipe") != 1:
            fail("the closed pipe must be said once", out)
        check_graceful(None, d, took, "the reader of its output gone", out)


CASES = {
    "ctrlc-mpirun": lambda: case_ctrlc(2),
    "ctrlc-np1": lambda: case_ctrlc(1),
    "sigterm-mpirun": lambda: case_signal_mpirun(signal.SIGTERM),
    "sigint-mpirun": lambda: case_signal_mpirun(signal.SIGINT),
    "ctrlc-twice": case_twice,
    "ctrlc-twice-mpirun": case_twice_mpirun,
    "ctrlc-during-checkpoint": case_during_checkpoint,
    "closed-pipe": case_closed_pipe,
    # a checkpoint of 2 x 2.5 s: Ctrl-C between two 50 ms steps
    "slow-checkpoint-mpirun": lambda: case_slow_stop(
        ["train.checkpoint_every=3"], (6, 0.0), "a 5 s checkpoint"),
    # ZeRO-1 (a file per rank) on a JSON Lines stream (its position in the manifest)
    "slow-checkpoint-zero1-stream": lambda: case_slow_stop(
        ["train.checkpoint_every=3", "optim.zero=1", "data.source={data}/corpus.jsonl"],
        (6, 0.0), "a 5 s checkpoint, ZeRO-1, data.source"),
    # two pipeline stages, each its own files
    "slow-checkpoint-pp": lambda: case_slow_stop(
        ["train.checkpoint_every=3", "mesh.dp=1", "mesh.pp=2", "train.microbatches=2"],
        (6, 0.0), "a 5 s checkpoint, pp 2"),
    # a rank killed instead: no writer of its own, so no checkpoint; the next job waits
    "slow-checkpoint-fault": case_slow_fault,
    # and steps of about 0.5 s: Ctrl-C in the middle of one
    "slow-step-mpirun": lambda: case_slow_stop(
        ["train.checkpoint_every=3", "model.d_model=512", "model.heads=8", "model.seq_len=256",
         "train.batch_size=8"], (4, 0.2), "a 5 s checkpoint, 0.5 s steps"),
}

if __name__ == "__main__":
    CASES[CASE]()
