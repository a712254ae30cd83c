#!/usr/bin/env python3
"""The coordinator's port when two jobs share a host.

`ports.py WORKER COORDINATOR CASE`:
  second-job    job A runs with no port given; job B, started while A trains, also with
                no port given, takes a free port (A holds the default), says so, and
                trains to the end; a job not on the default port always says it moved.
  explicit-held a port the user named (MASTER_PORT) that is taken is an error naming the
                port, at once: an explicit port is never silently replaced.
"""
import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

WORKER, CONSOLE, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
SMALL = ["model.layers=2", "model.d_model=64", "model.heads=2", "model.vocab=256",
         "model.seq_len=32", "train.batch_size=2", "train.eval_every=0",
         "runtime.threads=1"]


def fail(msg, *procs):
    print("FAIL:", msg)
    for p in procs:
        if p.poll() is None:
            p.kill()
        out, err = p.communicate()
        print("--- stdout ---\n" + out[-2000:] + "\n--- stderr ---\n" + err[-2000:])
    sys.exit(1)


def env_without_port(jobdir):
    env = dict(os.environ, WEFT_JOB_DIR=jobdir)
    env.pop("MASTER_PORT", None)
    env.pop("SLURM_JOB_ID", None)  # the default port is 29500 outside Slurm
    return env


def console_json(jobdir, *args):
    p = subprocess.run([CONSOLE, "--json"] + list(args), env=env_without_port(jobdir),
                       capture_output=True, text=True, timeout=30)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else p.stderr)


DEFAULT_PORT = 29500  # the coordinator's port outside Slurm when none is given
MOVED = "the coordinator listens on a free port"


def listening_port(stderr):
    """The port of a job's "control: coordinator for job ... listening on HOST:PORT" line."""
    m = re.search(r"listening on \S+:(\d+)", stderr)
    return int(m.group(1)) if m else None


def endpoint_port(jobdir):
    files = glob.glob(os.path.join(jobdir, "*.json"))
    if len(files) != 1:
        return None
    with open(files[0]) as f:
        return int(json.load(f)["endpoint"].rsplit(":", 1)[1])


def case_second_job():
    with tempfile.TemporaryDirectory() as dir_a, tempfile.TemporaryDirectory() as dir_b:
        a = subprocess.Popen([WORKER] + SMALL + ["train.steps=100000"],
                             env=env_without_port(dir_a), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            if a.poll() is not None:
                fail(f"job A exited early with {a.returncode}", a)
            rc, st = console_json(dir_a, "status")
            if rc == 0 and st.get("step", 0) >= 1:
                break
            time.sleep(0.3)
        else:
            fail("job A did not start training", a)
        port_a = endpoint_port(dir_a)
        b = subprocess.run([WORKER] + SMALL + ["train.steps=3"], env=env_without_port(dir_b),
                           capture_output=True, text=True, timeout=120)
        if b.returncode != 0:
            print(b.stdout[-2000:], b.stderr[-2000:])
            fail(f"job B exited {b.returncode} while job A held port {port_a}", a)
        port_b = listening_port(b.stderr)
        rc, _ = console_json(dir_a, "stop")
        out, err = a.communicate(timeout=60)
        if rc != 0 or a.returncode != 0:
            fail(f"stopping job A: console {rc}, exit {a.returncode}\n{err[-1500:]}")
        if port_b is None or port_b == port_a:
            fail(f"job B listened on port {port_b}, job A on {port_a}:\n{b.stderr[-1500:]}")
        # A job not on the default port says that it moved, and one on it does not. The
        # default may be held by a process outside this test (another job on a shared
        # host): then A moved too, and B took whatever was free.
        for name, port, text in (("A", port_a, err), ("B", port_b, b.stderr)):
            if (port != DEFAULT_PORT) != (MOVED in text):
                fail(f"job {name} on port {port} (the default {DEFAULT_PORT}) "
                     f"{'said' if MOVED in text else 'did not say'} that it moved:\n"
                     f"{text[-1500:]}")
        held = "A" if port_a == DEFAULT_PORT else "a process outside the test"
        print(f"ok: job A on port {port_a}; job B, started beside it with no port given, "
              f"took free port {port_b} ({held} held the default {DEFAULT_PORT}) and trained 3 "
              "steps")


def case_explicit_held():
    held = socket.socket()
    held.bind(("0.0.0.0", 0))
    held.listen(1)
    port = held.getsockname()[1]
    with tempfile.TemporaryDirectory() as jobdir:
        env = dict(env_without_port(jobdir), MASTER_PORT=str(port))
        t0 = time.monotonic()
        p = subprocess.run([WORKER] + SMALL + ["train.steps=3"], env=env, capture_output=True,
                           text=True, timeout=60)
        took = time.monotonic() - t0
    held.close()
    text = p.stdout + p.stderr
    if p.returncode == 0 or f"port {port}" not in text:
        print(text[-2000:])
        fail(f"an explicit MASTER_PORT={port} that is taken: exit {p.returncode}")
    print(f"ok: MASTER_PORT={port} held elsewhere -> exit {p.returncode} in {took:.1f} s, "
          "naming the port")


CASES = {"second-job": case_second_job, "explicit-held": case_explicit_held}

if __name__ == "__main__":
    CASES[CASE]()
