"""What the cluster tests share: launching weft across the test cluster's nodes with
mpirun, reading what a run wrote, and watching the processes of every node.

The launch is the README's hostfile recipe (docs/multi-node.md), run on node0 as a user
would run it on the first node: mpirun starts its daemons on the other nodes through
the remote launch agent (ssh on a cluster, tests/cluster/node-exec here), which gives
them a clean environment, so everything the ranks need travels with -x.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from cluster import Cluster, Skip, Unseen  # noqa: E402,F401

SKIP = 77
# Open MPI's daemons see a lost host from their TCP keepalive (worker/plane.c says why):
# probe after 1 s of silence, every 1 s, give up after 2 unanswered probes (at most
# 1 + 2 x 1 = 3 s). The defaults (300 s + 9 x 20 s) leave mpirun waiting for minutes.
KEEPALIVE = {"OMPI_MCA_oob_tcp_keepalive_time": "1", "OMPI_MCA_oob_tcp_keepalive_intvl": "1",
             "OMPI_MCA_oob_tcp_keepalive_probes": "2"}
MPIRUN_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMP_WAIT_POLICY": "passive"}
# The model and batch of the equivalence tests (tests/mpi/equiv.py's, fewer steps).
BASE = ["model.preset=gpt2-tiny", "train.batch_size=8", "train.eval_every=0", "train.seed=1234",
        "train.warmup=5", "runtime.threads=1"]


def log(msg=""):
    print(msg, flush=True)


class Failed(Exception):
    pass


def check(cond, what, text=""):
    if not cond:
        raise Failed(f"{what}\n--- output (tail) ---\n{text[-5000:]}" if text else what)


def env(extra=None):
    e = dict(os.environ)
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        e.pop(k, None)
    e.update(MPIRUN_ENV)
    e.update(extra or {})
    return e


def mpirun(c, worker, hostfile, n, per_node, args, master="node0", port=None, x=(), mca=()):
    """The README's launch: mpirun -np N --hostfile F --map-by ppr:K:node --bind-to none
    -x MASTER_ADDR=... worker ARGS, with this cluster's launch agent."""
    cmd = ["mpirun", "--mca", "plm_rsh_agent", c.rsh_agent(), "--hostfile", hostfile,
           "-np", str(n), "--map-by", f"ppr:{per_node}:node", "--bind-to", "none",
           "-x", "OMP_WAIT_POLICY", "-x", f"MASTER_ADDR={master}"]
    if port:
        cmd += ["-x", f"MASTER_PORT={port}"]
    for k, v in mca:
        cmd += ["--mca", k, v]
    for v in x:
        cmd += ["-x", v]
    return cmd + [worker] + list(args)


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                m = json.loads(line)
                out[m["step"]] = m["loss"]
    return out


def params(path):
    """The parameters of an llm.c checkpoint (--save): 256 int32 header, then float32."""
    with open(path, "rb") as f:
        data = f.read()
    n = (len(data) - 1024) // 4
    return struct.unpack(f"<{n}f", data[1024:])


def compare(ref_dir, got_dir, tag, loss_rtol, param_atol, steps):
    """Loss per step and final parameters of run `tag` against the one-rank run; returns
    (worst relative loss difference, worst absolute parameter difference)."""
    ref_l, got_l = losses(os.path.join(ref_dir, "ref.jsonl")), losses(os.path.join(got_dir,
                                                                                   f"{tag}.jsonl"))
    check(sorted(got_l) == list(range(1, steps + 1)), f"{tag}: steps {sorted(got_l)} logged")
    worst_l = max(abs(got_l[s] - ref_l[s]) / abs(ref_l[s]) for s in ref_l)
    check(worst_l <= loss_rtol, f"{tag}: loss differs from one rank's by {worst_l:.2e} relative "
          f"(tolerance {loss_rtol:.0e})")
    a, b = params(os.path.join(ref_dir, "ref.bin")), params(os.path.join(got_dir, f"{tag}.bin"))
    check(len(a) == len(b), f"{tag}: {len(b)} parameters, one rank has {len(a)}")
    worst_p = max(abs(x - y) for x, y in zip(a, b))
    check(worst_p <= param_atol, f"{tag}: parameters differ by {worst_p:.2e} (tolerance "
          f"{param_atol:.0e})")
    return worst_l, worst_p


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def procs(c, host, names=("worker",)):
    return [p for p in c.pids(host) if comm(p) in names]


class Watch:
    """Samples, every 20 ms, which weft ranks (processes named `worker`), Open MPI
    daemons (orted) and mpirun run on each host, and remembers when each disappeared:
    the times a fault test reports."""

    def __init__(self, c, hosts):
        self.c, self.hosts = c, hosts
        self.seen = {}  # pid -> (host, name)
        self.gone = {}  # pid -> time it was first missed
        self.stop = False
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop:
            now = time.monotonic()
            alive = set()
            for h in self.hosts:
                for p in self.c.pids(h):
                    name = comm(p)
                    if name in ("worker", "orted", "mpirun"):
                        alive.add(p)
                        with self.lock:
                            self.seen.setdefault(p, (h, name))
            with self.lock:
                for p in self.seen:
                    if p not in alive and p not in self.gone:
                        self.gone[p] = now
            time.sleep(0.02)

    def close(self):
        self.stop = True
        self.t.join()

    def alive(self, name=None, host=None):
        with self.lock:
            return [p for p, (h, n) in self.seen.items() if p not in self.gone and
                    (name is None or n == name) and (host is None or h == host)]

    def ended(self, since, name, pids=None):
        """{pid: seconds after `since` it ended} for the processes named `name` (of `pids`
        when given) that ran after `since` (None for those still running)."""
        with self.lock:
            return {p: (self.gone[p] - since if p in self.gone else None)
                    for p, (h, n) in self.seen.items()
                    if n == name and (pids is None or p in pids) and
                    (p not in self.gone or self.gone[p] >= since)}


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def kill_tree(p):
    """End a launch we started (and everything it started on this host)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()
        p.wait()


def start(c, host, cmd, out_path, env_extra=None):
    """Run cmd on host in its own process group, output to out_path."""
    f = open(out_path, "w")
    return c.popen(host, cmd, stdout=f, stderr=subprocess.STDOUT, env=env(env_extra),
                   start_new_session=True)


def wait_for(cond, what, deadline_s, p=None, out=None):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        if p is not None and p.poll() is not None:
            raise Failed(f"{what}: the launch ended first (status {p.returncode})\n"
                         f"{read(out)[-4000:] if out else ''}")
        time.sleep(0.05)
    raise Failed(f"{what}: not within {deadline_s} s\n{read(out)[-4000:] if out else ''}")


def main(cases, argv, hosts, extra=("login",), setup=None, see=()):
    """Run the named cases (all by default) on one cluster whose every host sees `see`
    (the test's binaries and scripts) and the source; exit 0, 1 or 77."""
    only = set(argv)
    failures = []
    try:
        with Cluster(hosts, extra=extra, see=see) as c:
            if not c.cores:
                log("note: no cpuset cgroup here: the nodes share every core, so the ranks run "
                    "one compute thread each (runtime.threads=1)")
            log(f"cluster: {', '.join(f'{h} {c.addr[h]}' for h in c.hosts)}; CPU sets: "
                f"{', '.join(f'{h} core {k}' for h, k in c.cores.items()) or 'none'}")
            ctx = setup(c) if setup else None
            for name, fn in cases:
                if only and name not in only:
                    continue
                log(f"--- {name}: {fn.__doc__.strip().splitlines()[0]}")
                t0 = time.monotonic()
                try:
                    fn(c, ctx)
                    log(f"ok   {name} ({time.monotonic() - t0:.1f} s)")
                except (Failed, subprocess.TimeoutExpired) as e:
                    failures.append(name)
                    log(f"FAIL {name}: {e}")
    except Skip as e:
        log(f"SKIP: {e}")
        return SKIP
    except Unseen as e:
        log(f"FAIL: {e}")
        return 1
    log(f"{len(failures)} failed: {' '.join(failures)}" if failures else "all cases passed")
    return 1 if failures else 0
