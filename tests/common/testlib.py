"""Helpers the Python tests share (tests/common is put on sys.path by each test)."""
import os
import random
import socket
import sys
import tempfile
import time

RESERVED = os.path.join(tempfile.gettempdir(), "weft-test-ports")
RESERVE_S = 600  # longer than any test holds a port


def ephemeral_low():
    """The first port of the kernel's ephemeral range (Linux: 32768 by default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def reserve(port):
    """Claim `port` for RESERVE_S seconds among the tests of this machine (a file made with
    O_EXCL; one older than that is a finished test's and is taken over)."""
    os.makedirs(RESERVED, exist_ok=True)
    path = os.path.join(RESERVED, str(port))
    try:
        if time.time() - os.path.getmtime(path) > RESERVE_S:
            os.unlink(path)
    except OSError:
        pass
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except OSError:
        return False


def bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(n):
    """n distinct free TCP ports, below the kernel's ephemeral range: the kernel's port 0
    hands out ephemeral ports, from which every outgoing connection (MPI's, the
    coordinator's clients) also takes its local end, so a port picked that way can be
    taken between the pick and the job's bind. Each is reserved among the tests running
    side by side (reserve), so two never pick the same one."""
    hi = min(ephemeral_low(), 32768)
    ports = []
    while len(ports) < n:
        p = random.randrange(10000, hi)
        if p not in ports and bindable(p) and reserve(p):
            ports.append(p)
    return ports


def fail(msg, out=""):
    """Say why the test failed (with the tail of the run's output) and exit 1."""
    print("FAIL:", msg)
    if out:
        print(out[-4000:])
    sys.exit(1)
