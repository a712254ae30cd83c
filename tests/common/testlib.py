"""Helpers the Python tests share (tests/common is put on sys.path by each test)."""
import fcntl
import json
import os
import socket
import subprocess
import sys
import time


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1: every socket stays bound until all are
    picked, so the kernel cannot hand out one port twice."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def fail(msg, out=""):
    """Say why the test failed (with the tail of the run's output) and exit 1."""
    print("FAIL:", msg)
    if out:
        print(out[-4000:])
    sys.exit(1)


def await_writers(ck, timeout):
    """Seconds until no checkpoint writer works in the checkpoint directory ck any more
    (each holds a shared lock on ck/.writers.lock while it writes: worker/ckpt/writer.c)."""
    fd = os.open(os.path.join(ck, ".writers.lock"), os.O_RDWR | os.O_CREAT)
    t0 = time.monotonic()
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - t0
            except BlockingIOError:
                if time.monotonic() - t0 > timeout:
                    fail(f"a checkpoint writer still works in {ck} after {timeout} s")
                time.sleep(0.05)
    finally:
        os.close(fd)


def checkpoint_whole(step_dir):
    """None when step_dir is a complete checkpoint: its manifest, and every file it lists
    of the size and XXH3-64 it says, hashed by Debian's xxhsum (not weft's code); else
    why not."""
    try:
        man = json.load(open(os.path.join(step_dir, "manifest.json")))
    except (OSError, ValueError) as e:
        return f"no readable manifest ({e})"
    for f in man["files"]:
        p = os.path.join(step_dir, f["name"])
        if not os.path.exists(p) or os.path.getsize(p) != f["bytes"]:
            return f"{f['name']} missing or not {f['bytes']} bytes"
        h = subprocess.run(["xxhsum", "-H3", p], capture_output=True, text=True).stdout
        if h.rsplit("=", 1)[-1].strip() != f["xxh3_64"]:
            return f"{f['name']}: {h.strip()}, the manifest says {f['xxh3_64']}"
    return None
