"""Helpers the Python tests share (tests/common is put on sys.path by each test)."""
import socket
import sys


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
