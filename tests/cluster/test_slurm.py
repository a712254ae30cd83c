#!/usr/bin/env python3
"""weft under a real multi-node Slurm on the test cluster.

    test_slurm.py WORKER COORDINATOR REPO_ROOT [CASE ...]

munged and slurmctld run on the head node, one slurmd on each compute node (node0-2)
with its own NodeName, NodeAddr, spool and log (tests/cluster/slurm.conf.in); jobs are
submitted from the login node, as users do.

  srun      `srun -N 2 --ntasks-per-node=2 --mpi=pmix` from the login node: dp 4 over two
            nodes matches one rank
  sbatch    the README's `sbatch examples/slurm/multi-node.sbatch` on 2 nodes (srun
            launcher): the mesh over node0 and node1, MASTER_ADDR from the allocation,
            and training that matches one rank
  sbatch-mpirun  the same script with WEFT_LAUNCHER=mpirun (mpirun starts its daemons
            through Slurm): the same bytes as the srun launch
  requeue   the same job with a checkpoint directory; one of its nodes is killed (every
            process, slurmd too) mid-run: Slurm marks it DOWN and requeues the job, which
            starts again on the surviving node and node2, resumes from the last
            checkpoint through scripts/weft-run, and saves the same bytes as the
            uninterrupted run

Skipped (77) when slurm-wlm or munge are not installed. Every daemon is stopped by the
cluster's tear-down (it kills everything on the hosts), on success, failure or signal.
"""
import os
import random
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (BASE, Failed, Skip, check, compare, env, log, main, read)  # noqa: E402

WORKER, COORDINATOR, REPO = (os.path.abspath(a) for a in sys.argv[1:4])
HERE = os.path.dirname(os.path.abspath(__file__))
NODES = ["node0", "node1", "node2"]
STEPS, EVERY = 8, 3
LOSS_RTOL, PARAM_ATOL = 1e-5, 6e-5  # tests/mpi/equiv.py (float32 reduction order)
# A late heartbeat on a loaded machine must not end a job here (tests/cluster/test_faults.py
# measures the default window).
ARGS = BASE + [f"train.steps={STEPS}", "train.microbatches=2", "runtime.heartbeat_timeout=10"]
JOB_DEADLINE_S = 300
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE"}


def need_slurm():
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [p for p in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")
               if not shutil.which(p, path=path)]
    if missing:
        raise Skip(f"Slurm/munge not installed ({', '.join(missing)} missing): apt-get install "
                   "slurm-wlm munge (scripts/setup.sh does)")
    if not os.path.exists("/etc/munge/munge.key"):
        raise Skip("no munge key at /etc/munge/munge.key (the munge package creates one)")


class Slurm:
    def __init__(self, c):
        self.c = c
        self.dir = os.path.join(c.scratch, "slurm")
        for sub in ["state", "log", "munge", "out", "work"] + \
                [f"{k}/{h}" for k in ("spool", "tmp") for h in NODES]:
            os.makedirs(os.path.join(self.dir, sub))
        os.chmod(c.scratch, 0o755)  # munged (user munge) must reach its socket
        os.chmod(self.dir, 0o755)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.env = env({"SLURM_CONF": self.conf})

    def start(self):
        mdir = os.path.join(self.dir, "munge")
        shutil.chown(mdir, "munge", "munge")
        self.sock = os.path.join(mdir, "munge.sock")
        r = self.c.run("head", ["runuser", "-u", "munge", "--", shutil.which("munged") or
                                "/usr/sbin/munged", f"--socket={self.sock}",
                                f"--pid-file={mdir}/munged.pid", f"--log-file={mdir}/munged.log",
                                f"--seed-file={mdir}/munged.seed"], timeout=30)
        if r.returncode != 0:
            raise Skip(f"munged would not start: {r.stderr.strip()}")
        nodes = "\n".join(f"NodeName={h} NodeAddr={self.c.addr[h]} CPUs=4 Sockets=1 "
                          "CoresPerSocket=4 ThreadsPerCore=1 RealMemory=4000 State=UNKNOWN"
                          for h in NODES)
        text = read(os.path.join(HERE, "slurm.conf.in"))
        for k, v in (("@HEAD@", "head"), ("@HEAD_ADDR@", self.c.addr["head"]), ("@NODES@", nodes),
                     ("@DIR@", self.dir), ("@MUNGE_SOCKET@", self.sock),
                     ("@FIRST_JOB_ID@", str(random.randrange(100, 10000)))):
            text = text.replace(k, v)
        with open(self.conf, "w") as f:
            f.write(text)
        r = self.c.run("head", ["slurmctld", "-f", self.conf], env=self.env, timeout=30)
        check(r.returncode == 0, f"slurmctld would not start: {r.stderr}{self.log('slurmctld')}")
        for h in NODES:
            r = self.c.run(h, ["slurmd", "-f", self.conf, "-N", h], env=self.env, timeout=30)
            check(r.returncode == 0, f"slurmd on {h} would not start: {r.stderr}"
                  f"{self.log('slurmd-' + h)}")
        self.wait_idle(NODES, 60)
        log(f"  Slurm: slurmctld and munged on head ({self.c.addr['head']}), slurmd on "
            f"{', '.join(f'{h} ({self.c.addr[h]})' for h in NODES)}")

    def log(self, name):
        return f"\n--- {name}.log ---\n" + "".join(read(os.path.join(self.dir, "log",
                                                                     name + ".log")).splitlines(True)[-20:])

    def login(self, argv, timeout=120, extra_env=None):
        e = dict(self.env)
        e.update(extra_env or {})
        return self.c.run("login", argv, env=e, timeout=timeout, cwd=REPO)

    def states(self):
        r = self.login(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30)
        return dict(line.split()[:2] for line in r.stdout.splitlines() if line.strip())

    def wait_idle(self, nodes, deadline_s):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            st = self.states()
            if all(st.get(h) == "idle" for h in nodes):
                return
            time.sleep(0.5)
        raise Failed(f"nodes {nodes} not idle within {deadline_s} s: {self.states()}"
                     f"{self.log('slurmctld')}")

    def job(self, jobid):
        r = self.login(["scontrol", "show", "job", "-o", str(jobid)], timeout=30)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def wait_job(self, jobid, deadline_s=JOB_DEADLINE_S):
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            info = self.job(jobid)
            if info.get("JobState") in DONE:
                return info
            time.sleep(0.5)
        self.login(["scancel", str(jobid)], timeout=30)
        raise Failed(f"job {jobid} still {self.job(jobid).get('JobState')} after {deadline_s} s")

    def sbatch(self, name, args, extra_env=None, opts=()):
        """The README's multi-node script on 2 nodes without GPUs (2 ranks of 2 declared
        CPUs each), submitted from the login node in the repository root."""
        out = os.path.join(self.dir, "out", f"{name}.out")
        e = {"WEFT_WORKER": WORKER, "WEFT_COORDINATOR": COORDINATOR}
        e.update(extra_env or {})
        exports = ",".join(["ALL"] + [f"{k}={v}" for k, v in e.items()])
        cmd = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=0",
               "--cpus-per-task=2", f"--output={out}", f"--export={exports}", *opts,
               "examples/slurm/multi-node.sbatch", *args]
        r = self.login(cmd, timeout=60)
        check(r.returncode == 0, f"sbatch failed ({r.returncode}): {r.stdout}{r.stderr}")
        return int(r.stdout.strip().split(";")[0]), out


def setup(c):
    need_slurm()
    s = Slurm(c)
    s.start()
    d = os.path.join(s.dir, "work")
    r = c.run("node0", [WORKER] + ARGS + [f"train.metrics={d}/ref.jsonl", "--save", f"{d}/ref.bin"],
              env=env({"OMPI_MCA_ess_singleton_isolated": "1"}), timeout=300)
    check(r.returncode == 0, f"the one-rank run failed ({r.returncode})", r.stdout + r.stderr)
    return {"slurm": s, "dir": d}


def outputs(ctx, tag):
    d = ctx["dir"]
    return [f"train.metrics={d}/{tag}.jsonl", "--save", f"{d}/{tag}.bin"]


def case_srun(c, ctx):
    """srun -N 2 --mpi=pmix from the login node: dp 4 over two nodes matches one rank."""
    s = ctx["slurm"]
    r = s.login(["srun", "--immediate=60", "-N", "2", "--ntasks-per-node=2", "--cpus-per-task=2",
                 "--mpi=pmix", "--cpu-bind=none", WORKER] + ARGS + outputs(ctx, "srun"),
                timeout=JOB_DEADLINE_S)
    text = r.stdout + r.stderr
    check(r.returncode == 0, f"srun exited {r.returncode}", text)
    check("launch: rank/size from PMI" in text, "the ranks read PMIx's rank", text)
    check(re.search(r"4 ranks on 2 hosts: node0 ranks 0-1, node1 ranks 2-3", text),
          "ranks 0-1 on node0, 2-3 on node1", text)
    wl, wp = compare(ctx["dir"], ctx["dir"], "srun", LOSS_RTOL, PARAM_ATOL, STEPS)
    log(f"  srun over node0, node1 matches one rank: loss within {wl:.1e}, parameters {wp:.1e}")


def check_completed(info, text, what):
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          f"{what}: job {info.get('JobState')} exit {info.get('ExitCode')}, want COMPLETED 0:0",
          text)


def case_sbatch(c, ctx):
    """sbatch examples/slurm/multi-node.sbatch on 2 nodes trains and matches one rank."""
    s = ctx["slurm"]
    # with the requeue case's checkpoints (they do not change what is trained), so that
    # this run is also the uninterrupted one that case compares with
    jobid, out = s.sbatch("sbatch", ARGS + outputs(ctx, "sbatch") + [
        f"train.checkpoint_every={EVERY}", f"train.checkpoint_dir={ctx['dir']}/ck-sbatch"])
    info = s.wait_job(jobid)
    text = read(out)
    check_completed(info, text, "sbatch multi-node.sbatch")
    port = 20000 + jobid % 20000
    check(f"on 2 nodes (node[0-1]): 4 ranks via srun, control plane node0:{port}" in text,
          "the script reports its allocation and MASTER_ADDR:MASTER_PORT from it", text)
    rows = re.findall(r"^\s*(\d)\s+(node\d)\s+\d+\s+(\d/\d)\s", text, re.M)
    check(rows == [("0", "node0", "0/2"), ("1", "node0", "1/2"), ("2", "node1", "0/2"),
                   ("3", "node1", "1/2")], f"the --dry-run mesh: ranks by node {rows}", text)
    check(re.search(rf"listening on node0:{port} ", text), "rank 0 listens on node0", text)
    wl, wp = compare(ctx["dir"], ctx["dir"], "sbatch", LOSS_RTOL, PARAM_ATOL, STEPS)
    log(f"  job {jobid} on {info['NodeList']}: matches one rank (loss within {wl:.1e}, "
        f"parameters {wp:.1e})")


def case_sbatch_mpirun(c, ctx):
    """WEFT_LAUNCHER=mpirun sbatch multi-node.sbatch: the same bytes as the srun launch."""
    s = ctx["slurm"]
    jobid, out = s.sbatch("sbatch-mpirun", ARGS + outputs(ctx, "sbatch-mpirun"),
                          {"WEFT_LAUNCHER": "mpirun"})
    info = s.wait_job(jobid)
    text = read(out)
    check_completed(info, text, "WEFT_LAUNCHER=mpirun sbatch multi-node.sbatch")
    check("via mpirun" in text and "launch: rank/size from Open MPI" in text,
          "mpirun launched the ranks", text)
    check(re.search(r"4 ranks on 2 hosts: node0 ranks 0-1, node1 ranks 2-3", text),
          "ranks 0-1 on node0, 2-3 on node1", text)
    compare(ctx["dir"], ctx["dir"], "sbatch-mpirun", LOSS_RTOL, PARAM_ATOL, STEPS)
    if os.path.exists(os.path.join(ctx["dir"], "sbatch.bin")):
        same = read_bytes(ctx, "sbatch") == read_bytes(ctx, "sbatch-mpirun")
        check(same, "mpirun and srun launches of the same mesh save the same bytes")
    log(f"  job {jobid}: mpirun inside the allocation, same bytes as the srun launch")


def read_bytes(ctx, tag):
    with open(os.path.join(ctx["dir"], tag + ".bin"), "rb") as f:
        return f.read()


def case_requeue(c, ctx):
    """A node of a running job is lost: Slurm requeues it, weft-run resumes, same bytes."""
    s = ctx["slurm"]
    ck = os.path.join(ctx["dir"], "ck-requeue")
    # the uninterrupted run of the same job: case sbatch's, or the same job run now
    ref = "sbatch"
    if not os.path.exists(os.path.join(ctx["dir"], "sbatch.bin")):
        case_sbatch(c, ctx)
    s.wait_idle(NODES, 60)
    jobid, out = s.sbatch("requeue", ARGS + outputs(ctx, "requeue") + [
        f"train.checkpoint_every={EVERY}", f"train.checkpoint_dir={ck}"],
        {"WEFT_RESTART_BACKOFF": "2"})
    end = time.monotonic() + JOB_DEADLINE_S
    polls = 0
    while not os.path.exists(os.path.join(ck, "latest")):  # the first checkpoint
        polls += 1
        check(time.monotonic() < end and (polls % 20 or s.job(jobid).get("JobState") not in DONE),
              "the job reaches its first checkpoint", read(out))
        time.sleep(0.05)
    victim = "node1"  # the job's second node (the first runs the batch script)
    t0 = time.monotonic()
    c.kill_host(victim)
    down = requeued = None
    while time.monotonic() < end:
        info = s.job(jobid)
        if down is None and s.states().get(victim, "").startswith("down"):
            down = time.monotonic() - t0
        if int(info.get("Restarts", "0")) >= 1 and info.get("JobState") == "PENDING" and \
                requeued is None:
            # Slurm holds a requeued job for about two minutes (its BeginTime); an
            # operator who wants it back at once says so (docs/multi-node.md).
            requeued = time.monotonic() - t0
            r = s.login(["scontrol", "update", f"JobId={jobid}", "StartTime=now"], timeout=30)
            check(r.returncode == 0, f"scontrol update StartTime=now: {r.stderr}")
        if int(info.get("Restarts", "0")) >= 1 and info.get("JobState") == "RUNNING":
            break
        time.sleep(0.3)
    restarted = time.monotonic() - t0
    info = s.wait_job(jobid)
    text = read(out)
    check_completed(info, text, "the requeued job")
    check(info.get("Restarts") == "1", f"Slurm requeued the job once ({info.get('Restarts')})", text)
    check(victim not in info.get("NodeList", ""), f"the requeued job ran without {victim} "
          f"({info.get('NodeList')})", text)
    m = re.search(r"checkpoint: resumed from \S+step-(\d+) at step (\d+)", text)
    check("Slurm requeued this job (SLURM_RESTART_COUNT=1)" in text and m is not None,
          "weft-run resumed the requeued job from the last checkpoint", text)
    same = read_bytes(ctx, ref) == read_bytes(ctx, "requeue")
    check(same, "--save after the requeue equals the uninterrupted run's", text)
    log(f"FAULT requeue: {victim} killed (slurmd, steps and ranks) after step {m.group(2)}; "
        f"Slurm marked it DOWN after {fmt(down)} s and requeued the job after {fmt(requeued)} s; "
        f"it ran again on {info['NodeList']} {restarted:.1f} s after the kill, resumed from step "
        f"{m.group(2)}; --save identical")


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


CASES = [("srun", case_srun), ("sbatch", case_sbatch), ("sbatch-mpirun", case_sbatch_mpirun),
         ("requeue", case_requeue)]

if __name__ == "__main__":
    sys.exit(main(CASES, sys.argv[4:], NODES, extra=("login", "head"), setup=setup,
                  see=[WORKER, COORDINATOR, REPO]))
