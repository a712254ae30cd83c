#!/usr/bin/env python3
"""weft under a real Slurm: a one-node cluster started in a scratch directory.

    test_slurm.py WORKER COORDINATOR EXAMPLES_DIR [CASE ...]

Starts munged (on a private socket), slurmctld and slurmd for this host with 8
declared CPUs (the recipe of the project's env README), runs the cases, and stops
every daemon it started by the pid in its pid file, on success, failure, timeout
or signal alike. Nothing is left pending: sruns use --immediate, every job has a
time limit, every wait has a deadline after which the job is cancelled.

Exit status: 0 all cases passed, 1 a case failed, 77 (meson: skipped) when Slurm or
munge is not installed or the cluster cannot start, with the reason on stdout.
"""
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

WORKER, COORDINATOR, EXAMPLES = (os.path.abspath(a) for a in sys.argv[1:4])
ONLY = set(sys.argv[4:])
SKIP = 77
NTASKS = 4
# Every wait is bounded. A 4-rank job of a few gpt2-tiny steps takes about 5 s on the
# 2-core development machine; these bounds leave room for a loaded machine.
JOB_DEADLINE_S = 120
START_DEADLINE_S = 20
# No case starts after this many seconds, so that the slowest case (about 210 s of
# bounded waits) and the clean-up still end inside meson's 900 s timeout, which would
# kill the harness before it could stop the daemons.
BUDGET_S = 540
# Ranks that fail to start must fail fast; 15 s is ten times the measured ~1.5 s.
ERROR_EXIT_BOUND_S = 15.0

scratch = None
started = []  # (name, pid file) of each daemon this run started, in start order
env = dict(os.environ)
failures = []


class Skip(Exception):
    pass


def log(msg):
    print(msg, flush=True)


def run(cmd, timeout=60, check=False, **kw):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# --- the cluster --------------------------------------------------------------------

def need_programs():
    missing = [p for p in ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "scancel",
                           "squeue", "scontrol", "sinfo")
               if not shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
    if missing:
        raise Skip(f"Slurm/munge not installed ({', '.join(missing)} missing): "
                   "apt-get install slurm-wlm munge (scripts/setup.sh does)")
    if os.geteuid() != 0:
        raise Skip("starting slurmd needs root (it runs tasks as the submitting user)")
    if not os.path.exists("/etc/munge/munge.key"):
        raise Skip("no munge key at /etc/munge/munge.key (the munge package creates one)")


def sbin(p):
    return shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def start_munge():
    """A private munged: its own socket, pid, log and seed under the scratch folder,
    so a system munged (or another test run) is neither needed nor touched."""
    mdir = os.path.join(scratch, "munge")
    os.mkdir(mdir)
    shutil.chown(mdir, "munge", "munge")
    os.chmod(mdir, 0o755)  # munged wants the socket's folder traversable by all
    sock, pid = os.path.join(mdir, "munge.sock"), os.path.join(mdir, "munged.pid")
    p = run(["runuser", "-u", "munge", "--", sbin("munged"), f"--socket={sock}",
             f"--pid-file={pid}", f"--log-file={mdir}/munged.log",
             f"--seed-file={mdir}/munged.seed"], timeout=20)
    if p.returncode != 0:
        raise Skip(f"munged would not start: {p.stderr.strip() or p.stdout.strip()}")
    started.append(("munged", pid))
    if run(["sh", "-c", f"munge -n -S {sock} | unmunge -S {sock}"], timeout=10).returncode:
        raise Skip("munged started but cannot encode/decode a credential")
    return sock


def write_conf(munge_sock):
    host = run(["hostname", "-s"], check=True).stdout.strip()
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm.conf.in")) as f:
        text = f.read()
    text = (text.replace("@HOST@", host).replace("@SLURM_DIR@", scratch)
            .replace("@MUNGE_SOCKET@", munge_sock)
            .replace("@CTLD_PORT@", str(free_port())).replace("@SLURMD_PORT@", str(free_port()))
            .replace("@FIRST_JOB_ID@", str(random.randrange(100, 10000))))
    conf = os.path.join(scratch, "slurm.conf")
    with open(conf, "w") as f:
        f.write(text)
    return conf, host


def start_slurm():
    for d in ("state", "spool", "log", "jobs", "out"):
        os.mkdir(os.path.join(scratch, d))
    os.chmod(os.path.join(scratch, "jobs"), 0o700)
    conf, host = write_conf(start_munge())
    env["SLURM_CONF"] = conf
    for daemon in ("slurmctld", "slurmd"):
        p = run([sbin(daemon), "-f", conf], timeout=20)
        started.append((daemon, os.path.join(scratch, f"{daemon}.pid")))
        if p.returncode != 0:
            raise Skip(f"{daemon} would not start (exit {p.returncode}): {p.stderr.strip()}"
                       f"{daemon_log(daemon)}")
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        p = run(["sinfo", "-h", "-o", "%t %c"], timeout=10)
        if p.returncode == 0 and p.stdout.split()[:1] == ["idle"]:
            log(f"cluster up: node {host}, {p.stdout.split()[1]} CPUs, scratch {scratch}")
            return
        time.sleep(0.3)
    raise Skip(f"the node did not become idle in {START_DEADLINE_S} s: "
               f"{run(['sinfo'], timeout=10).stdout}{daemon_log('slurmctld')}{daemon_log('slurmd')}")


def daemon_log(name):
    path = os.path.join(scratch, "log", f"{name}.log")
    try:
        with open(path) as f:
            return f"\n--- tail of {path} ---\n" + "".join(f.readlines()[-15:])
    except OSError:
        return ""


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def stop_all():
    """Cancel every job (slurmd leaves its steps running when it stops), then stop the
    daemons this run started, newest first, by the pids in their pid files."""
    if env.get("SLURM_CONF") and started:
        try:
            jobs = run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.split()
            if jobs:
                run(["scancel", "--full"] + jobs, timeout=10)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and run(
                        ["squeue", "-h", "-o", "%i"], timeout=10).stdout.split():
                    time.sleep(0.5)
        except (subprocess.SubprocessError, OSError) as e:
            log(f"cleanup: could not cancel jobs: {e}")
    for name, pidfile in reversed(started):
        pid = read_pid(pidfile)
        if pid is None or not alive(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            log(f"cleanup: {name} (pid {pid}) ignored SIGTERM; killing it")
            os.kill(pid, signal.SIGKILL)
    started.clear()


# --- jobs -------------------------------------------------------------------------------

def job_info(jobid):
    p = run(["scontrol", "show", "job", "-o", str(jobid)], timeout=10)
    return dict(re.findall(r"(\w+)=(\S*)", p.stdout))


DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE"}


def wait_job(jobid, deadline_s=JOB_DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        info = job_info(jobid)
        if info.get("JobState") in DONE:
            return info
        time.sleep(0.5)
    run(["scancel", "--full", str(jobid)], timeout=10)
    raise AssertionError(f"job {jobid} still {job_info(jobid).get('JobState')} after "
                         f"{deadline_s} s; cancelled")


def wait_drained():
    """The next case gets the whole node: wait until the last job has left it."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not run(["squeue", "-h", "-o", "%i"], timeout=10).stdout.split() and \
                run(["sinfo", "-h", "-o", "%t"], timeout=10).stdout.strip() == "idle":
            return
        time.sleep(0.3)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def sbatch(script, name, args, opts=(), extra_env=None):
    """Submit an example script with the overrides this cluster needs: no GPUs, 2 of
    the 8 declared CPUs per task, a time limit that ends anything left behind, and the
    stop signal moved inside that limit. Returns (job id, output path)."""
    out = os.path.join(scratch, "out", f"{name}.out")
    e = dict(extra_env or {})
    e.update(WEFT_WORKER=WORKER, WEFT_COORDINATOR=COORDINATOR,
             WEFT_RUN=os.path.join(EXAMPLES, "..", "..", "scripts", "weft-run"))
    exports = ",".join(["ALL"] + [f"{k}={v}" for k, v in e.items()])
    cmd = ["sbatch", "--parsable", f"--job-name=weft-{name}", "--cpus-per-task=2", "--time=5",
           "--signal=B:USR1@30", f"--output={out}", f"--export={exports}", *opts,
           os.path.join(EXAMPLES, script), *args]
    p = run(cmd, timeout=30)
    if p.returncode != 0:
        raise AssertionError(f"sbatch failed ({p.returncode}): {p.stderr}")
    return int(p.stdout.strip().split(";")[0]), out


def wait_for(pattern, path, deadline_s=60, jobid=None):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        m = re.search(pattern, read(path), re.M)
        if m:
            return m
        if jobid and job_info(jobid).get("JobState") in DONE:
            break
        time.sleep(0.2)
    raise AssertionError(f"no /{pattern}/ in {path} within {deadline_s} s:\n{read(path)[-3000:]}")


def check(cond, what, text=""):
    if not cond:
        raise AssertionError(f"{what}\n--- output ---\n{text[-4000:]}")


MESH_ROW = re.compile(r"^\s*(\d+)\s+\S+\s+\d+\s+(\d+)/(\d+)\s+\S+\s+.+?\s+\d+\s+\((\d+),(\d+),(\d+)\)",
                      re.M)


def check_mesh(text, n):
    rows = {int(m.group(1)): m for m in MESH_ROW.finditer(text)}
    check(sorted(rows) == list(range(n)), f"a mesh table with one row per rank 0..{n - 1}", text)
    for r, m in rows.items():
        check((int(m.group(4)), int(m.group(5)), int(m.group(6))) == (0, r, 0),
              f"rank {r} at (pp,dp,tp)=(0,{r},0) on a dp={n} mesh", text)
    check(f"mesh dp={n} x tp=1 x pp=1" in text, f"the mesh header names dp={n}", text)
    check("groups verified against MPI" in text, "the communicators were verified", text)


def check_trained(text, steps, n):
    check(re.search(rf"launch: rank/size from .*; {n} ranks", text) is not None,
          f"rank 0 reports {n} ranks", text)
    check(re.search(rf"^step {steps}/{steps} loss=\d", text, re.M) is not None,
          f"the last step {steps}/{steps} was logged", text)
    check(re.search(rf"dp {n} x", text) is not None, f"the trainer ran data parallel over {n}", text)


def check_completed(info, text, what):
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          f"{what}: job state {info.get('JobState')} exit {info.get('ExitCode')}, want COMPLETED 0:0",
          text)


# --- cases ------------------------------------------------------------------------------

def case_sbatch():
    """The single-node example (srun launcher) trains gpt2-tiny on 4 ranks, showing the mesh."""
    jobid, out = sbatch("single-node.sbatch", "sbatch", ["train.steps=5"],
                        ["--gpus-per-task=0", f"--ntasks-per-node={NTASKS}"])
    info = wait_job(jobid)
    text = read(out)
    check_completed(info, text, "sbatch single-node.sbatch")
    check_mesh(text, NTASKS)
    check_trained(text, 5, NTASKS)
    check(f"control plane {info['NodeList']}:{20000 + jobid % 20000}" in text,
          "MASTER_ADDR/MASTER_PORT derived from the allocation", text)
    check(re.search(rf"coordinator for job slurm-{jobid} listening on {info['NodeList']}:"
                    rf"{20000 + jobid % 20000}", text) is not None,
          "the coordinator listens on the script's MASTER_ADDR:MASTER_PORT", text)
    return text


def case_sbatch_mpirun():
    """The same script with mpirun inside the allocation instead of srun."""
    jobid, out = sbatch("single-node.sbatch", "sbatch-mpirun", ["train.steps=3"],
                        ["--gpus-per-task=0", f"--ntasks-per-node={NTASKS}"],
                        {"WEFT_LAUNCHER": "mpirun"})
    info = wait_job(jobid)
    text = read(out)
    check_completed(info, text, "WEFT_LAUNCHER=mpirun sbatch single-node.sbatch")
    check_mesh(text, NTASKS)
    check_trained(text, 3, NTASKS)
    check("launch: rank/size from Open MPI" in text, "mpirun's ranks read OMPI_*", text)


def case_multinode_script():
    """The multi-node example, on the one node there is: its launch lines work."""
    jobid, out = sbatch("multi-node.sbatch", "multi-node", ["train.steps=2"],
                        ["--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0"])
    info = wait_job(jobid)
    text = read(out)
    check_completed(info, text, "sbatch --nodes=1 multi-node.sbatch")
    check_mesh(text, 2)
    check_trained(text, 2, 2)


def srun(mpi, n, args, timeout=90):
    t0 = time.monotonic()
    p = run(["srun", "--immediate=30", "--time=3", f"--mpi={mpi}", "-n", str(n),
             "--cpus-per-task=2", WORKER] + args, timeout=timeout)
    return p, time.monotonic() - t0


def case_srun_pmix():
    """`srun --mpi=pmix -n 4 ./worker` trains."""
    p, _ = srun("pmix", NTASKS, ["train.steps=3"])
    text = p.stdout + p.stderr
    check(p.returncode == 0, f"srun --mpi=pmix exit {p.returncode}", text)
    check_trained(text, 3, NTASKS)
    check("launch: rank/size from PMI" in text, "ranks read PMIx's PMIX_RANK", text)


def refused(mpi, needle):
    p, dt = srun(mpi, NTASKS, ["train.steps=3"])
    text = p.stdout + p.stderr
    check(p.returncode != 0, f"srun --mpi={mpi} must fail; exit {p.returncode}", text)
    check(dt < ERROR_EXIT_BOUND_S, f"srun --mpi={mpi} failed after {dt:.1f} s, over "
          f"{ERROR_EXIT_BOUND_S} s", text)
    msgs = [l for l in text.splitlines() if l.startswith("weft: error:")]
    check(len(msgs) == 1, f"one weft error line (printed by task 0), got {len(msgs)}", text)
    check("srun --mpi=pmix" in msgs[0] and needle in msgs[0] and f"{NTASKS} tasks" in msgs[0],
          f"the message names --mpi=pmix, {needle!r} and the task count", text)
    check("MPI_Init" not in text.replace("abort in MPI_Init", ""),
          "refused before Open MPI's own MPI_Init failure", text)
    return msgs[0]


def case_srun_none():
    """`srun --mpi=none -n 4` is refused with the clear message."""
    log("  " + refused("none", "--mpi=none"))


def case_srun_pmi2():
    """`srun --mpi=pmi2 -n 4` (Debian's Open MPI has no PMI-2) is refused too."""
    if "pmi2" not in run(["srun", "--mpi=list"], timeout=10).stdout + \
            run(["srun", "--mpi=list"], timeout=10).stderr:
        log("  (this Slurm has no pmi2 plugin; nothing to refuse)")
        return
    log("  " + refused("pmi2", "PMI-2"))


def ckpt_args(name):
    return [f"train.checkpoint_dir={os.path.join(scratch, 'ckpt-' + name)}", "train.resume=auto"]


def start_long(name, launcher="srun"):
    jobid, out = sbatch("single-node.sbatch", name,
                        ["train.steps=100000", "train.warmup=2"] + ckpt_args(name),
                        ["--gpus-per-task=0", f"--ntasks-per-node={NTASKS}"],
                        {"WEFT_LAUNCHER": launcher})
    wait_for(r"^step 3/100000 ", out, jobid=jobid)
    return jobid, out


def check_checkpoint(name, text):
    """The stop wrote a checkpoint of the step it stopped after, and `latest` names it.
    Returns that step."""
    m = re.search(r"stopping after step (\d+):", text)
    check(m is not None, "rank 0 says after which step it stops", text)
    step = int(m.group(1))
    root = os.path.join(scratch, "ckpt-" + name)
    check(re.search(rf"checkpoint: step {step} saved to {re.escape(root)}/step-{step:06d}", text)
          is not None, f"the checkpoint of step {step} was saved at the stop", text)
    latest = read(os.path.join(root, "latest")).strip()
    check(latest == f"step-{step:06d}", f"latest names step-{step:06d} (it says {latest!r})", text)
    check(os.path.exists(os.path.join(root, latest, "manifest.json")), "the manifest exists", text)
    return step


def check_resume(name, step):
    """Resubmitting the same script with the same checkpoint_dir and train.resume=auto
    (what a requeued job does) continues from the saved step."""
    jobid, out = sbatch("single-node.sbatch", name + "-resume",
                        [f"train.steps={step + 2}", "train.warmup=2"] + ckpt_args(name),
                        ["--gpus-per-task=0", f"--ntasks-per-node={NTASKS}"])
    info = wait_job(jobid)
    text = read(out)
    check_completed(info, text, "the resumed job")
    check(re.search(rf"checkpoint: resumed from \S+step-{step:06d} at step {step}", text) is not None,
          f"resumed from the step-{step:06d} checkpoint", text)
    steps = [int(x) for x in re.findall(rf"^step (\d+)/{step + 2} ", text, re.M)]
    check(steps == [step + 1, step + 2], f"trained steps {step + 1} and {step + 2} only, got {steps}",
          text)
    log(f"  resumed: {next(l for l in text.splitlines() if 'resumed from' in l)}")


def console(cmd, jobid):
    p = run([COORDINATOR, cmd, f"slurm-{jobid}"], timeout=30)
    return p.returncode, p.stdout + p.stderr


def login_node_console(jobid):
    """What README's "Multi-node" tells an operator on a login node: (1) a copy of the
    job file, whose Unix socket is not on this host, reaches the coordinator over TCP
    at MASTER_ADDR:MASTER_PORT with the token in the file; (2) `srun --overlap` runs
    the console inside the running allocation."""
    import json
    src = os.path.join(env["WEFT_JOB_DIR"], f"slurm-{jobid}.json")
    with open(src) as f:
        job = json.load(f)
    check(job.get("endpoint") == f"{job_info(jobid)['NodeList']}:{20000 + jobid % 20000}",
          f"the job file's endpoint is MASTER_ADDR:MASTER_PORT ({job.get('endpoint')})", str(job))
    check(os.stat(src).st_mode & 0o077 == 0, "the job file (it holds the token) is private")
    job["unix"] = os.path.join(scratch, "elsewhere", "no.sock")  # another host's socket
    copy = os.path.join(scratch, "login-node-copy.json")
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(job, f)
    p = run([COORDINATOR, "status", copy], timeout=30)
    check(p.returncode == 0 and f"slurm-{jobid}" in p.stdout,
          f"coordinator status <copied job file> over TCP (exit {p.returncode})", p.stdout + p.stderr)
    bad = dict(job, token="0" * len(job["token"]))
    with open(copy, "w") as f:
        json.dump(bad, f)
    p = run([COORDINATOR, "status", copy], timeout=30)
    check(p.returncode != 0 and "step" not in p.stdout,
          "a wrong token gets nothing", p.stdout + p.stderr)
    os.unlink(copy)
    p = run(["srun", f"--jobid={jobid}", "--overlap", "-N", "1", "-n", "1",
             f"-w{job_info(jobid)['NodeList']}", "--immediate=30", "--mpi=none", COORDINATOR,
             "ranks"], timeout=60)
    rows = [l for l in p.stdout.splitlines() if re.match(r"\s*[0-3]\s", l)]
    check(p.returncode == 0 and len(rows) == NTASKS,
          f"srun --jobid={jobid} --overlap coordinator ranks (exit {p.returncode})",
          p.stdout + p.stderr)
    log("  login node: copied job file over TCP ok, wrong token refused, srun --overlap ok")


def case_console_and_preempt():
    """The console attaches to a job running under Slurm (status, ranks, from a "login
    node" too); then `scancel --signal=TERM` stops it at a step boundary with exit
    status 0, leaving a checkpoint that a resubmitted job resumes from."""
    jobid, out = start_long("preempt")
    rc, text = console("status", jobid)
    check(rc == 0 and f"slurm-{jobid}" in text and re.search(r"\b4 ranks?\b|ranks\s*4|4/4", text),
          f"coordinator status slurm-{jobid} (exit {rc})", text)
    log("  coordinator status:\n" + "\n".join("    " + l for l in text.splitlines()))
    rc, text = console("ranks", jobid)
    rows = [l for l in text.splitlines() if re.match(r"\s*[0-3]\s", l)]
    check(rc == 0 and len(rows) == NTASKS, f"coordinator ranks: {len(rows)} rank rows, exit {rc}",
          text)
    log("  coordinator ranks:\n" + "\n".join("    " + l for l in text.splitlines()))

    login_node_console(jobid)

    run(["scancel", "--signal=TERM", str(jobid)], timeout=10, check=True)
    info = wait_job(jobid, 60)
    text = read(out)
    check_completed(info, text, "scancel --signal=TERM")
    m = re.search(r"stopping after step (\d+): SIGTERM", text)
    check(m is not None, "rank 0 says it stops because of SIGTERM", text)
    last = re.findall(r"^step (\d+)/100000 ", text, re.M)
    check(last and last[-1] == m.group(1),
          f"the last logged step ({last[-1] if last else None}) is the one it stopped after", text)
    check("training exited with status 0" in text, "the launch exited 0", text)
    # (slurmstepd prints "STEP n.1 ... CANCELLED" for any SIGTERM it delivers; what
    # matters is that no task was killed and the step exited 0.)
    check("Killed" not in text and "Exited with exit code" not in text, "no task was killed",
          text)
    log("  ...\n" + "\n".join("  " + l for l in text.splitlines()[-7:]))
    step = check_checkpoint("preempt", text)
    wait_drained()
    check_resume("preempt", step)


def case_preempt_mpirun():
    """mpirun inside the allocation: a stop signal to the batch script (what
    --signal=B:USR1@300 sends before the time limit) becomes `coordinator stop`."""
    jobid, out = start_long("preempt-mpirun", "mpirun")
    run(["scancel", "--batch", "--signal=USR1", str(jobid)], timeout=10, check=True)
    info = wait_job(jobid, 60)
    text = read(out)
    check_completed(info, text, "scancel --batch --signal=USR1 (mpirun)")
    check("stop requested" in text, "the script's trap ran", text)
    check(re.search(r"stopping after step \d+: the console asked", text) is not None,
          "weft stopped at a step boundary on the console's request", text)
    check("training exited with status 0" in text, "mpirun exited 0", text)
    check_checkpoint("preempt-mpirun", text)


def case_scancel():
    """A plain `scancel JOB` (Slurm's SIGCONT and SIGTERM to every task, SIGKILL after
    KillWait) is a graceful stop: every rank stops after the same step and writes its
    checkpoint before Slurm's KillWait runs out."""
    jobid, out = start_long("scancel")
    run(["scancel", str(jobid)], timeout=10, check=True)
    info = wait_job(jobid, 60)
    text = read(out)
    check(info.get("JobState") == "CANCELLED", f"job state {info.get('JobState')}, want CANCELLED",
          text)
    check(re.search(r"stopping after step \d+: (the launcher is ending the job|SIGTERM)", text)
          is not None, "the ranks took Slurm's signals for a stop request", text)
    check("stopping at once" not in text, "Slurm's repeated signals did not stop it at once", text)
    check_checkpoint("scancel", text)
    log("  ...\n" + "\n".join("  " + l for l in text.splitlines()[-6:]))


def case_config_error():
    """A config error fails the job in its first seconds with status 2, said once, and
    neither weft-run nor the script runs it again."""
    jobid, out = sbatch("single-node.sbatch", "config-error",
                        ["train.step=5", "train.checkpoint_dir=" + os.path.join(scratch, "ck-ce")],
                        ["--gpus-per-task=0", f"--ntasks-per-node={NTASKS}"])
    info = wait_job(jobid, 60)
    text = read(out)
    check(info.get("JobState") == "FAILED" and info.get("ExitCode") == "2:0",
          f"job state {info.get('JobState')} exit {info.get('ExitCode')}, want FAILED 2:0", text)
    errors = [l for l in text.splitlines() if l.startswith("weft: error:")]
    check(len(errors) == 1 and "did you mean 'train.steps'" in errors[0],
          f"one error line naming the fix, got {errors}", text)
    check("restart" not in text and "step 1/" not in text, "nothing retried, nothing trained",
          text)
    log(f"  {errors[0]}")


def case_restart():
    """A rank killed with SIGKILL mid-run: the batch script's weft-run relaunches the
    job inside the allocation from the last checkpoint; it completes every step,
    redoes at most checkpoint_every of them, and saves the same bytes as a run that
    was never interrupted."""
    steps, every = 120, 20
    def args(name):
        return [f"train.steps={steps}", "train.warmup=2", f"train.checkpoint_every={every}",
                f"train.checkpoint_dir={os.path.join(scratch, 'ckpt-' + name)}",
                "--save", os.path.join(scratch, name + ".bin")]
    opts = ["--gpus-per-task=0", f"--ntasks-per-node={NTASKS}"]
    jobid, out = sbatch("single-node.sbatch", "restart-ref", args("restart-ref"), opts)
    check_completed(wait_job(jobid), read(out), "the uninterrupted run")
    wait_drained()
    jobid, out = sbatch("single-node.sbatch", "restart", args("restart"), opts,
                        {"WEFT_MAX_RESTARTS": "2", "WEFT_RESTART_BACKOFF": "1"})
    wait_for(rf"^step 30/{steps} ", out, jobid=jobid)
    p = run([COORDINATOR, "--json", "ranks", f"slurm-{jobid}"], timeout=30)
    check(p.returncode == 0, "coordinator --json ranks", p.stdout + p.stderr)
    import json
    victim = json.loads(p.stdout)["ranks"][2]
    os.kill(victim["pid"], signal.SIGKILL)
    info = wait_job(jobid)
    text = read(out)
    check_completed(info, text, "the job with a rank killed")
    check(re.search(r"weft-run: .* restart 1 of 2 in 1 s", text) is not None,
          "weft-run announced restart 1 of 2", text)
    m = re.search(r"checkpoint: resumed from \S+ at step (\d+)", text)
    check(m is not None, "the relaunch resumed from a checkpoint", text)
    redone = victim["step"] - int(m.group(1))
    check(0 <= redone <= every, f"redid {redone} steps (at most {every})", text)
    check(re.search(rf"^step {steps}/{steps} ", text, re.M) is not None, "all steps done", text)
    ref = open(os.path.join(scratch, "restart-ref.bin"), "rb").read()
    got = open(os.path.join(scratch, "restart.bin"), "rb").read()
    check(ref == got, "--save after the restart equals the uninterrupted run's", text)
    log(f"  rank 2 (pid {victim['pid']}) killed at step {victim['step']}; resumed at step "
        f"{m.group(1)} ({redone} redone); --save identical ({len(ref)} bytes)")


CASES = [("sbatch", case_sbatch), ("srun-pmix", case_srun_pmix), ("srun-none", case_srun_none),
         ("srun-pmi2", case_srun_pmi2), ("console-preempt", case_console_and_preempt),
         ("sbatch-mpirun", case_sbatch_mpirun), ("preempt-mpirun", case_preempt_mpirun),
         ("multi-node-script", case_multinode_script), ("restart", case_restart),
         ("scancel", case_scancel), ("config-error", case_config_error)]


def on_signal(sig, frame):
    raise SystemExit(f"test_slurm: got signal {sig}; cleaning up")


def main():
    global scratch
    for p in (WORKER, COORDINATOR, os.path.join(EXAMPLES, "single-node.sbatch")):
        if not os.path.exists(p):
            log(f"test_slurm: {p} does not exist")
            return 1
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    scratch = tempfile.mkdtemp(prefix="weft-slurm-")
    os.chmod(scratch, 0o755)  # munged (user munge) must reach its socket folder
    # Tasks share the 2 cores: OpenMP threads must not spin; root may run mpirun.
    env.update(WEFT_JOB_DIR=os.path.join(scratch, "jobs"), OMP_WAIT_POLICY="passive",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    keep = False
    try:
        need_programs()
        start_slurm()
        t_start = time.monotonic()
        for name, fn in CASES:
            if ONLY and name not in ONLY:
                continue
            if time.monotonic() - t_start > BUDGET_S:
                failures.append(name)
                log(f"FAIL {name}: not run, the harness used up its {BUDGET_S} s")
                continue
            wait_drained()
            log(f"--- {name}: {fn.__doc__.strip().splitlines()[0]}")
            t0 = time.monotonic()
            try:
                fn()
                log(f"ok   {name} ({time.monotonic() - t0:.1f} s)")
            except (AssertionError, RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append(name)
                log(f"FAIL {name}: {e}")
        if failures:
            keep = True
            log(daemon_log("slurmctld") + daemon_log("slurmd"))
        log(f"{len(failures)} failed: {' '.join(failures)}" if failures else "all cases passed")
        return 1 if failures else 0
    except Skip as e:
        log(f"SKIP: {e}")
        return SKIP
    finally:
        stop_all()
        if keep or os.environ.get("WEFT_TEST_SLURM_KEEP"):
            log(f"scratch kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
