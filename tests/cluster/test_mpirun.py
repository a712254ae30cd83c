#!/usr/bin/env python3
"""weft across hosts with mpirun: the README's hostfile launch on the test cluster.

    test_mpirun.py WORKER COORDINATOR [CASE ...]

mpirun runs on node0 with a hostfile of node names; Open MPI starts its daemons on the
other nodes through the cluster's remote launch agent and wires the ranks up over TCP
between nodes and shared memory inside one.

  dp          dp 4 on 2 nodes x 2 ranks (MASTER_ADDR=node0, a host name) matches one rank;
              which host runs which ranks, local ranks, the per-node lines
  tp2pp2      tp 2 x pp 2 on 2 nodes x 2 ranks (MASTER_ADDR=10.77.0.11, an address):
              matches one rank, and each tp group stays inside one node
  3d          dp 2 x tp 2 x pp 2 on 4 nodes x 2 ranks matches one rank
  placement   tp 2 with one rank per node: the tp groups span nodes, and weft says so
  console     the coordinator listens on MASTER_ADDR's address (reachable from node1
              and from the login node, not on node0's loopback); `coordinator status,
              ranks, mesh` from the login node with a copy of the job file (its token),
              refused without the token; `coordinator stop` from there ends the job, 0

Tolerances are tests/mpi/equiv.py's (float32 reduction order, argued there for 20 steps;
these runs take 8): loss 1e-5 relative, parameters 6e-5 absolute.
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BASE, check, compare, env, kill_tree, log, main, mpirun, read, start,  # noqa: E402
                    wait_for)

WORKER, COORDINATOR = (os.path.abspath(a) for a in sys.argv[1:3])
STEPS = 8
LOSS_RTOL, PARAM_ATOL = 1e-5, 6e-5  # tests/mpi/equiv.py
# 8 ranks on 2 cores beside a test suite starve the control threads now and then: a
# wider heartbeat window than the default 2 s keeps a late heartbeat from ending the job
# (the fault tests measure the default).
ARGS = BASE + [f"train.steps={STEPS}", "train.microbatches=2", "runtime.heartbeat_timeout=10"]
PORT = 29520


def setup(c):
    """The one-rank run every mesh is compared with (on node0, no mpirun)."""
    d = os.path.join(c.scratch, "mpirun")
    os.makedirs(d)
    r = c.run("node0", [WORKER] + ARGS + [f"train.metrics={d}/ref.jsonl", "--save", f"{d}/ref.bin"],
              env=env({"OMPI_MCA_ess_singleton_isolated": "1"}), timeout=300)
    check(r.returncode == 0, f"the one-rank run failed ({r.returncode})", r.stdout + r.stderr)
    return {"dir": d}


def train(c, ctx, tag, nodes, per_node, extra, master="node0"):
    d = ctx["dir"]
    hf = c.hostfile(nodes, per_node, f"hosts-{tag}")
    cmd = mpirun(c, WORKER, hf, len(nodes) * per_node, per_node,
                 ARGS + extra + [f"train.metrics={d}/{tag}.jsonl", "--save", f"{d}/{tag}.bin"],
                 master=master, port=PORT, x=[f"WEFT_JOB_DIR={c.node_tmp()}/jobs"])
    r = c.run("node0", cmd, env=env(), timeout=600)
    text = r.stdout + r.stderr
    check(r.returncode == 0, f"{tag}: mpirun exited {r.returncode}", text)
    wl, wp = compare(d, d, tag, LOSS_RTOL, PARAM_ATOL, STEPS)
    log(f"  {tag}: {len(nodes)} nodes x {per_node} ranks match one rank: loss within {wl:.1e} "
        f"relative, parameters within {wp:.1e}")
    return text


def hosts_line(text, n, layout):
    want = ", ".join(f"{h} ranks {r}" for h, r in layout)
    check(re.search(rf"\d+ ranks on {n} hosts: {re.escape(want)}$", text, re.M),
          f"rank 0 says which host runs which ranks: '{want}'", text)


def per_node_lines(c, text, nodes, per_node):
    """Said once per node, by its local rank 0, naming the node."""
    for h in nodes:
        k = c.cores.get(h)
        if k is not None:
            lines = re.findall(rf"\[weft I {h}:\d+:r\d+\] {per_node} ranks share 1 cores on {h}: "
                               r"one compute thread each", text)
            check(len(lines) == 1, f"one 'ranks share' line from {h}, got {len(lines)}", text)


def case_dp(c, ctx):
    """dp 4 over 2 nodes (2 ranks each) matches one rank; hosts, local ranks, node lines;
    the start-up line about mpirun's keepalive, which this plain launch leaves at Open MPI's
    defaults."""
    text = train(c, ctx, "dp", ["node0", "node1"], 2, [], master="node0")
    hosts_line(text, 2, [("node0", "0-1"), ("node1", "2-3")])
    per_node_lines(c, text, ["node0", "node1"], 2)
    # Open MPI's defaults: 300 s + 9 x 20 s of keepalive; said once, by rank 0
    warn = re.findall(r"mpirun would stay up for 480 s after a host is lost or cut off", text)
    check(len(warn) == 1, f"one start-up line about the missing keepalive, got {len(warn)}", text)
    check(re.search(rf"coordinator for job \S+ listening on node0:{PORT} ", text),
          "the coordinator listens on MASTER_ADDR=node0", text)
    r = c.run("node0", mpirun(c, WORKER, c.hostfile(["node0", "node1"], 2, "hosts-dp"), 4, 2,
                              ARGS + ["--dry-run"], port=PORT), env=env(), timeout=300)
    rows = {int(m.group(1)): (m.group(2), m.group(3))
            for m in re.finditer(r"^\s*(\d+)\s+(\S+)\s+\d+\s+(\d+/\d+)\s", r.stdout, re.M)}
    want = {0: ("node0", "0/2"), 1: ("node0", "1/2"), 2: ("node1", "0/2"), 3: ("node1", "1/2")}
    check(rows == want, f"--dry-run: host and local rank/local size of each rank {rows}", r.stdout)
    log("  --dry-run: ranks 0-1 on node0 (local 0/2, 1/2), ranks 2-3 on node1 (local 0/2, 1/2)")


def tp_groups_inside(text, c):
    rows = {int(m.group(1)): (m.group(2), m.group(3))
            for m in re.finditer(r"^\s*(\d+)\s+(\S+)\s+\d+\s+\d+/\d+\s+.*?\(\d+,\d+,\d+\)\s+(\S+)",
                                 text, re.M)}
    return rows


def case_tp2pp2(c, ctx):
    """tp 2 x pp 2 over 2 nodes matches one rank, each tp group inside a node."""
    text = train(c, ctx, "tp2pp2", ["node0", "node1"], 2, ["mesh.tp=2", "mesh.pp=2"],
                 master=c.addr["node0"])
    check(re.search(rf"listening on {re.escape(c.addr['node0'])}:{PORT} ", text),
          "the coordinator listens on MASTER_ADDR=10.77.0.11", text)
    check("spans hosts" not in text, "no tp group spans hosts", text)
    r = c.run("node0", mpirun(c, WORKER, c.hostfile(["node0", "node1"], 2, "hosts-tp2pp2"), 4, 2,
                              ARGS + ["mesh.tp=2", "mesh.pp=2", "--dry-run"], port=PORT),
              env=env(), timeout=300)
    rows = tp_groups_inside(r.stdout, c)
    check(len(rows) == 4, "--dry-run lists 4 ranks", r.stdout)
    for rank, (host, tp) in rows.items():
        hosts = {rows[int(m)][0] for m in tp.split(",")}
        check(hosts == {host}, f"rank {rank}'s tp group {tp} is on {sorted(hosts)}", r.stdout)
    log("  tp groups 0,1 (node0) and 2,3 (node1): each inside one node")


def case_3d(c, ctx):
    """dp 2 x tp 2 x pp 2 over 4 nodes (2 ranks each) matches one rank."""
    nodes = ["node0", "node1", "node2", "node3"]
    text = train(c, ctx, "3d", nodes, 2, ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2"])
    hosts_line(text, 4, [("node0", "0-1"), ("node1", "2-3"), ("node2", "4-5"), ("node3", "6-7")])
    check("spans hosts" not in text, "no tp group spans hosts", text)


def case_placement(c, ctx):
    """tp 2 with one rank per node: weft warns that each tp group spans two nodes."""
    r = c.run("node0", mpirun(c, WORKER, c.hostfile(["node0", "node1"], 1, "hosts-place"), 2, 1,
                              ARGS + ["mesh.tp=2", "--dry-run"], port=PORT),
              env=env(), timeout=300)
    text = r.stdout + r.stderr
    check(r.returncode == 0, "the dry run succeeds", text)
    m = re.search(r"tensor-parallel group of ranks 0-1 spans hosts node0 and node1: .*", text)
    check(m is not None, "weft warns that the tp group spans node0 and node1", text)
    log(f"  {m.group(0)[:160]}")


def connect(c, host, addr, port):
    code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"
            "\n print('connected')\nexcept OSError as e:\n print(e)")
    return c.run(host, [sys.executable, "-c", code, addr, str(port)], timeout=30).stdout.strip()


def login_console(c, data, *cmd):
    """The console on the login node with `data` as its job file (what scp would give:
    a private copy in the login node's own /tmp)."""
    script = 'umask 077; cat > /tmp/job.json; exec "$0" "$@" /tmp/job.json'
    return c.run("login", ["sh", "-c", script, COORDINATOR] + list(cmd), input=data, timeout=60)


def case_console(c, ctx):
    """Listeners on MASTER_ADDR, reachable from other nodes; the console from the login node."""
    d = ctx["dir"]
    hf = c.hostfile(["node0", "node1"], 2, "hosts-console")
    cmd = mpirun(c, WORKER, hf, 4, 2, BASE + ["train.steps=100000", "runtime.heartbeat_timeout=10"],
                 master="node0", port=PORT, x=[f"WEFT_JOB_DIR={c.node_tmp()}/jobs-console"])
    out = os.path.join(d, "console.out")
    p = start(c, "node0", cmd, out)
    try:
        wait_for(lambda: re.search(r"^step 2/", read(out), re.M), "step 2", 300, p, out)
        job = wait_for(lambda: glob.glob(f"{c.node_tmp()}/jobs-console/*.json"), "the job file",
                       30)[0]
        data = read(job)
        j = json.loads(data)
        check(j["endpoint"] == f"node0:{PORT}", f"the job file's endpoint is node0:{PORT}", data)
        got = {h: connect(c, h, c.addr["node0"], PORT) for h in ("node1", "login")}
        got["node0 loopback"] = connect(c, "node0", "127.0.0.1", PORT)
        log(f"  TCP to the control port: {got}")
        check(got["node1"] == "connected" and got["login"] == "connected",
              "the control port is reachable from node1 and from the login node")
        check("refused" in got["node0 loopback"], "nothing listens on node0's loopback (it "
              "listens on MASTER_ADDR's address only)")
        for what in ("status", "ranks", "mesh"):
            r = login_console(c, data, what)
            check(r.returncode == 0, f"coordinator {what} from the login node (exit {r.returncode})",
                  r.stdout + r.stderr)
            log(f"  login$ coordinator {what} /tmp/job.json\n" +
                "\n".join("    " + l[:140] for l in r.stdout.splitlines()[:8]))
        rows = [l for l in login_console(c, data, "ranks").stdout.splitlines()
                if re.match(r"\s*\d+\s+node[01]\s", l)]
        check(len(rows) == 4, f"`ranks` lists the 4 ranks on node0 and node1 ({len(rows)})")
        for bad, why in ((dict(j, token="0" * 64), "a wrong token"), (dict(j, token=""), "no token")):
            r = login_console(c, json.dumps(bad), "status")
            check(r.returncode != 0 and "step" not in r.stdout,
                  f"{why} from the login node gets nothing", r.stdout + r.stderr)
            log(f"  {why}: refused: {(r.stderr or r.stdout).strip().splitlines()[-1][:150]}")
        r = login_console(c, data, "stop")
        check(r.returncode == 0, "coordinator stop from the login node", r.stdout + r.stderr)
        p.wait(timeout=120)
        check(p.returncode == 0, f"the job stops at a step boundary and exits 0 ({p.returncode})",
              read(out))
        check("the console asked" in read(out), "weft says the console asked it to stop", read(out))
    finally:
        kill_tree(p)


CASES = [("dp", case_dp), ("tp2pp2", case_tp2pp2), ("3d", case_3d), ("placement", case_placement),
         ("console", case_console)]

if __name__ == "__main__":
    sys.exit(main(CASES, sys.argv[3:], ["node0", "node1", "node2", "node3"], setup=setup,
                  see=[WORKER, COORDINATOR]))
