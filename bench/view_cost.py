#!/usr/bin/env python3
"""view_cost.py [--steps N] [--rounds R] [--build DIR] [--out FILE] - what the live view costs training.

The same 4-rank job (gpt2-tiny, pp 2 x tp 2, 4 micro-batches) runs N steps in each of:
  off     no HTTP listener (runtime.metrics_port=0)
  page    the listener, and the page open in Debian's headless chromium, polling
          /api/state once a second as it does for a person (the browser runs on the same
          2 cores as the ranks: its rendering counts against the job too)
  poll10  the listener and no browser, but /api/state fetched 10 times a second with the
          token: ten times the page's load on the coordinator's thread, alone
The modes alternate within each round, each round starting with the next mode, so a
drift in the machine's load (other jobs starting or ending) favours none of them; each
mode is also compared with the `off` run of its own round. A run's figure is the median step_ms from its metrics file of the steps that began
SETTLE_S after the job published its address (the browser started and loaded the page by
then; `off` waits alike), so start-up is in no mode's figure; the table gives each round's figure, their median,
and the change against `off`, beside `off`'s own spread between rounds (the noise).
The round trip of poll10's requests bounds the coordinator's work per poll from above
(it includes the client and the scheduler's delays). Prints the table; --out FILE also
writes it there.
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--build", default="build")
ap.add_argument("--out")
args = ap.parse_args()
WORKER = os.path.join(args.build, "worker", "worker")
COORD = os.path.join(args.build, "coordinator", "coordinator")
TMP = tempfile.mkdtemp(prefix="weft-viewcost-")
MODES = ["off", "page", "poll10"]
SETTLE_S = 10


def free_ports(n):
    """n distinct free ports (every socket stays bound until all are picked)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def job_url(env, deadline, cmd="view"):
    """The view's address (`coordinator view`), or for cmd="status" that the job is up."""
    while time.time() < deadline:
        p = subprocess.run([COORD, cmd], env=env, capture_output=True, text=True)
        if p.returncode == 0:
            return p.stdout.strip()
        time.sleep(0.2)
    raise SystemExit("view_cost: the job never published its view")


LATENCY = []  # seconds per /api/state answer (poll10), and its size in bytes


def poller(url, stop):
    base, token = url.split("?token=")
    req = urllib.request.Request(base + "api/state", headers={"Authorization": "Bearer " + token})
    while not stop.is_set():
        t = time.perf_counter()
        try:
            n = len(urllib.request.urlopen(req, timeout=2).read())
            LATENCY.append((time.perf_counter() - t, n))
        except OSError:
            pass
        stop.wait(0.1)


def run(mode, i):
    d = os.path.join(TMP, "%s-%d" % (mode, i))
    os.makedirs(d)
    m = os.path.join(d, "m.jsonl")
    port, mport = free_ports(2)
    mport = mport if mode != "off" else 0
    env = dict(os.environ, WEFT_JOB_DIR=os.path.join(d, "jobs"), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), OMP_WAIT_POLICY="passive",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpirun", "--bind-to", "none", "-np", "4", WORKER, "model.preset=gpt2-tiny",
           "mesh.pp=2", "mesh.tp=2", "train.microbatches=4", "train.steps=%d" % args.steps,
           "train.eval_every=0", "train.metrics=" + m, "runtime.metrics_port=%d" % mport]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    side, stop, th = None, threading.Event(), None
    url = job_url(env, time.time() + 60, "view" if mode != "off" else "status")
    if mode != "off":
        if mode == "page":
            side = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                                     "--disable-quic", "--no-first-run",
                                     "--disable-background-networking", "--disable-component-update",
                                     "--disable-sync", "--user-data-dir=" + os.path.join(d, "chr"),
                                     "--window-size=1400,1100", url],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            th = threading.Thread(target=poller, args=(url, stop))
            th.start()
    time.sleep(SETTLE_S)
    first = len(open(m).readlines()) + 2 if os.path.exists(m) else 2  # the step now running ends first
    rc = job.wait(timeout=600)
    stop.set()
    if th:
        th.join()
    if side:
        side.kill()
        side.wait()
    if rc != 0:
        raise SystemExit("view_cost: the %s run exited %d" % (mode, rc))
    steps = [json.loads(line) for line in open(m)]
    kept = [o["step_ms"] for o in steps if o["step"] > first]
    if len(kept) < 10:
        raise SystemExit("view_cost: only %d steps after the settling time: raise --steps" % len(kept))
    return statistics.median(kept)


LOAD = os.getloadavg()[0]
try:
    res = {k: [] for k in MODES}
    for r in range(args.rounds):
        for k in MODES[r % 3:] + MODES[:r % 3]:
            res[k].append(run(k, r))
            print("round %d %-6s %.1f ms" % (r + 1, k, res[k][-1]), flush=True)
    off = statistics.median(res["off"])
    noise = (max(res["off"]) - min(res["off"])) / off * 100
    ratio = {k: statistics.median(v / o for v, o in zip(res[k], res["off"])) for k in MODES}
    lines = ["weft live view: its cost to training (bench/view_cost.py --steps %d --rounds %d)"
             % (args.steps, args.rounds),
             "4 ranks on this machine's 2 cores, gpt2-tiny, pp 2 x tp 2, 4 micro-batches; median "
             "step_ms per run of the steps after %d s of settling; load average at the start %.1f"
             % (SETTLE_S, LOAD),
             "%-7s %s %9s %9s %15s" % ("mode", " ".join("round%-3d" % (i + 1) for i in range(args.rounds)),
                                       "median", "vs off", "vs round's off")]
    for k in MODES:
        med = statistics.median(res[k])
        lines.append("%-7s %s %9.1f %+8.1f%% %+14.1f%%" % (k, " ".join("%8.1f" % v for v in res[k]),
                                                            med, (med / off - 1) * 100,
                                                            (ratio[k] - 1) * 100))
    lines.append("noise: off's rounds spread %.1f%% of its median" % noise)
    if LATENCY:
        lat = sorted(t for t, _ in LATENCY)
        lines.append("poll10: %d answers of /api/state, %.0f bytes each; round trip (connect, "
                     "request, the coordinator's JSON, close) median %.2f ms, 90th percentile "
                     "%.2f ms: at the page's one poll a second, under %.2f%% of one core"
                     % (len(lat), statistics.median(n for _, n in LATENCY),
                        statistics.median(lat) * 1e3, lat[int(0.9 * (len(lat) - 1))] * 1e3,
                        statistics.median(lat) * 100))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        open(args.out, "w").write(text)
finally:
    shutil.rmtree(TMP, ignore_errors=True)
