#!/usr/bin/env python3
"""Ctrl-C to mpirun when a step and a checkpoint outlast Open MPI's 2 s before SIGKILL.

    python3 bench/stop_writers.py [--worker build/worker/worker] [--dir /tmp] [--out FILE]
                                  [--after 4] [--pause 1.5] [key=value ...]

GPT-2 124M (model.preset=gpt2-small, 2 x 256 tokens a step) at dp 2 under plain mpirun,
in a pseudo-terminal: after the step line --after, Ctrl-C (SIGINT to mpirun's process
group, as a terminal sends it) --pause seconds later, inside the next step. It reports when mpirun exited, what rank 0 said, whether
a job file was left, and when the writers that outlive the job published which step
(their log). Then the same command resumes from that checkpoint, and a run that was
never stopped goes one step further: the first step after the resume must print the
uninterrupted run's loss, digit for digit. Extra key=value arguments go to every run.
"""
import argparse
import os
import platform
import pty
import re
import select
import shutil
import signal
import sys
import tempfile
import time

from bench_env import emit

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
          "-x", "WEFT_JOB_DIR"]
MODEL = ["model.preset=gpt2-small", "model.seq_len=256", "train.batch_size=2",
         "train.steps=100000", "train.eval_every=0", "mesh.dp=2"]


class Job:
    """mpirun on a pseudo-terminal, read as it runs."""

    def __init__(self, cmd, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvpe(cmd[0], cmd, env)
        self.out, self.rc = b"", None

    def pump(self, timeout=0.02):
        if select.select([self.fd], [], [], timeout)[0]:
            try:
                self.out += os.read(self.fd, 65536)
            except OSError:
                pass
        if self.rc is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.rc = os.waitstatus_to_exitcode(status)
        return self.rc is None

    def text(self):
        return self.out.decode(errors="replace").replace("\r", "\n")

    def until(self, pattern, bound=900):
        t = time.monotonic()
        while not re.search(pattern, self.text()):
            if not self.pump() or time.monotonic() - t > bound:
                sys.exit(f"never saw {pattern!r}:\n{self.text()[-3000:]}")

    def stop(self):
        """Ctrl-C; seconds until mpirun exited."""
        t = time.monotonic()
        os.write(self.fd, b"\x03")
        while self.pump():
            pass
        return time.monotonic() - t


def losses(text):
    return dict((int(s), l) for s, l in re.findall(r"step (\d+)/\d+ loss=(\S+)", text))


def launch(worker, args, jobs):
    env = dict(os.environ, WEFT_JOB_DIR=jobs)
    return Job(MPIRUN + [worker] + MODEL + args, env)


def writers_done(ck, bound=600):
    """Seconds until the writers release their lock (as the next job waits for them)."""
    import fcntl
    t = time.monotonic()
    with open(os.path.join(ck, ".stop-writers.lock")) as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - t
            except BlockingIOError:
                if time.monotonic() - t > bound:
                    sys.exit("the writers never finished")
                time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="build/worker/worker")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out")
    ap.add_argument("--after", type=int, default=4)
    ap.add_argument("--pause", type=float, default=1.5)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(dir=a.dir)
    ck, jobs = os.path.join(tmp, "ck"), os.path.join(tmp, "jobs")
    lines = [f"# bench/stop_writers.py on {platform.node()} ({os.cpu_count()} CPUs), "
             f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
             f"# {' '.join(MPIRUN + ['worker'] + MODEL + a.extra)} train.checkpoint_dir=ck",
             f"# Ctrl-C {a.pause} s after step {a.after}'s line"]
    try:
        job = launch(a.worker, [f"train.checkpoint_dir={ck}"] + a.extra, jobs)
        job.until(rf"step {a.after}/")
        time.sleep(a.pause)
        took, ended = job.stop(), time.time()
        out = job.text()
        said = [l.strip() for l in out.splitlines()
                if "stopping" in l or "launcher is ending" in l]
        m = re.search(r"the checkpoint of step (\d+) is written by processes", out)
        if not m:
            sys.exit(f"the stop did not go to the writers:\n{out[-3000:]}")
        n = int(m.group(1))
        ms = [float(x) for x in re.findall(r"step_ms=([0-9.]+)", out)]
        waited = writers_done(ck)
        log = open(os.path.join(ck, "stop-writers.log")).read().strip()
        latest = open(os.path.join(ck, "latest")).read().strip()
        size = sum(os.path.getsize(os.path.join(ck, latest, f))
                   for f in os.listdir(os.path.join(ck, latest)))
        lines += [f"step time: {ms[-1] / 1e3:.2f} s (the last before the stop)",
                  f"mpirun exited {took:.2f} s after the Ctrl-C, status {job.rc}",
                  "rank 0 said:"] + [f"  {l}" for l in said] + [
                  f"job files left: {os.listdir(jobs) if os.path.isdir(jobs) else []}",
                  f"the writers released their lock {waited:.2f} s after mpirun exited; "
                  f"their log:", f"  {log}",
                  f"latest: {latest} ({size / 1e9:.2f} GB), step {n}; published after "
                  f"mpirun exited: "
                  f"{os.path.getmtime(os.path.join(ck, latest, 'manifest.json')) > ended}"]
        job = launch(a.worker, [f"train.checkpoint_dir={ck}"] + a.extra, jobs)
        job.until(rf"step {n + 1}/")
        job.stop()
        resumed = losses(job.text())
        ref = launch(a.worker, [f"train.checkpoint_dir={os.path.join(tmp, 'ref')}"] + a.extra,
                     jobs)
        ref.until(rf"step {n + 1}/")
        ref.stop()
        want = losses(ref.text())
        same = resumed.get(n + 1) == want.get(n + 1)
        lines += [f"resumed: step {n + 1} loss={resumed.get(n + 1)}; never stopped: step "
                  f"{n + 1} loss={want.get(n + 1)}: {'equal' if same else 'DIFFERENT'}"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    emit(lines, a.out)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
