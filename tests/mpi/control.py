#!/usr/bin/env python3
"""Control-plane tests against real training jobs: the worker under mpirun, the
`coordinator` console attached to it, and faults injected into its ranks.

`control.py WORKER COORDINATOR CASE`. Each job gets its own job directory and port so
tests cannot see each other's jobs. Bounds come from issue 7: a dead worker is noticed
within 2 s and every surviving rank exits within 10 s.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

WORKER, CONSOLE, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
EXIT_BOUND_S = 10.0  # issue 7: every surviving rank exits within 10 s
START_BOUND_S = 60.0  # generous: 8 ranks start on 2 loaded cores


def fail(msg, job=None):
    print("FAIL:", msg)
    if job:
        job.kill()
        out, err = job.communicate()
        print("--- stdout ---\n" + out[-3000:] + "\n--- stderr ---\n" + err[-3000:])
    sys.exit(1)


def start(n, jobdir, port, extra=(), mesh=None, env_extra=None):
    env = dict(os.environ, WEFT_JOB_DIR=jobdir, MASTER_PORT=str(port), **(env_extra or {}))
    fwd = [a for k in (env_extra or {}) for a in ("-x", k)]
    cmd = MPIRUN + ["-np", str(n), "-x", "WEFT_JOB_DIR", "-x", "MASTER_PORT"] + fwd + [WORKER] + \
        (mesh or [f"mesh.dp={n}"]) + ["train.steps=100000", "train.eval_every=0",
                                      "runtime.hang_timeout=5"] + list(extra)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def console(jobdir, *args):
    env = dict(os.environ, WEFT_JOB_DIR=jobdir)
    p = subprocess.run([CONSOLE] + list(args), env=env, capture_output=True, text=True,
                       timeout=30)
    return p.returncode, p.stdout, p.stderr


def wait_running(job, jobdir, n):
    """Wait until all n ranks registered and training steps are being reported."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_BOUND_S:
        if job.poll() is not None:
            fail(f"job exited early with {job.returncode}", job)
        rc, out, _ = console(jobdir, "--json", "status")
        if rc == 0:
            st = json.loads(out)
            if st.get("alive") == n and st.get("step", 0) >= 2:
                return st
        time.sleep(0.3)
    fail("job did not start training in time", job)


def expect_coords(n, ranks):
    for r in ranks:
        # dp-only mesh: rank = tp + TP*(dp + DP*pp) with TP = PP = 1 gives dp = rank (and
        # cp 0: every rank's Hello carries its cp coordinate, 0 without context parallelism)
        want = {"pp": 0, "dp": r["rank"], "tp": 0, "cp": 0}
        if r["coords"] != want:
            return f"rank {r['rank']} coords {r['coords']} != {want}"
    return None


def case_console(n, port):
    with tempfile.TemporaryDirectory() as jobdir:
        job = start(n, jobdir, port)
        st = wait_running(job, jobdir, n)
        if st["world_size"] != n or st["mesh"] != {"dp": n, "tp": 1, "pp": 1, "cp": 1, "ep": 1}:
            fail(f"status mesh {st['mesh']} world {st['world_size']}", job)
        rc, out, _ = console(jobdir, "--json", "ranks")
        ranks = json.loads(out)["ranks"]
        if sorted(r["rank"] for r in ranks) != list(range(n)):
            fail(f"ranks {[r['rank'] for r in ranks]}", job)
        bad = expect_coords(n, ranks)
        if bad:
            fail(bad, job)
        for r in ranks:
            try:
                os.kill(r["pid"], 0)  # every pid shown is a live process of this job
            except OSError:
                fail(f"rank {r['rank']} pid {r['pid']} is not running", job)
            if r["state"] != "alive" or not r["collective"]["op"].startswith("allreduce"):
                fail(f"rank {r['rank']} state {r['state']} collective {r['collective']}", job)
        rc, out, _ = console(jobdir, "--json", "mesh")
        mesh = json.loads(out)
        if mesh["groups"]["dp"] != [list(range(n))]:
            fail(f"dp group {mesh['groups']['dp']}", job)
        for cmd in ("status", "ranks", "mesh"):  # the text forms render too
            rc, out, err = console(jobdir, cmd)
            if rc != 0 or not out.strip():
                fail(f"`coordinator {cmd}` exit {rc}: {err}", job)
            print(out)
        rc, out, _ = console(jobdir, "stop")
        t0 = time.monotonic()
        out, err = job.communicate(timeout=60)
        if job.returncode != 0:
            fail(f"stop: exit {job.returncode}\n{err[-2000:]}")
        print(f"ok: {n} ranks: status/ranks/mesh match the mesh; stop -> exit 0 after "
              f"{time.monotonic() - t0:.2f} s")


def case_console_3d(port):
    """A dp 2 x tp 2 x pp 2 job: `ranks` shows each rank's stage (an uneven split, to
    tell the stages apart), `mesh` the groups, and `schedule` the same grid that
    `worker --print-schedule` draws for the mesh."""
    mesh = ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.microbatches=4",
            "parallel.pp_layers=[1,3]"]
    # Drawn before the job starts: a singleton's MPI_Init beside 8 busy ranks on 2 cores
    # once took over 30 s in CI.
    p = subprocess.run([WORKER, "--print-schedule"] + mesh, capture_output=True,
                       text=True, timeout=120)
    with tempfile.TemporaryDirectory() as jobdir:
        job = start(8, jobdir, port, mesh=mesh)
        st = wait_running(job, jobdir, 8)
        if st["mesh"] != {"dp": 2, "tp": 2, "pp": 2, "cp": 1, "ep": 1}:
            fail(f"status mesh {st['mesh']}", job)
        _, out, _ = console(jobdir, "--json", "ranks")
        for r in json.loads(out)["ranks"]:
            k = r["rank"]  # rank = tp + 2 * (dp + 2 * pp)
            want = {"pp": k // 4, "dp": k // 2 % 2, "tp": k % 2, "cp": 0}
            stage = "layers 0 +emb" if k < 4 else "layers 1-3 +head"
            if r["coords"] != want or r["stage"] != stage:
                fail(f"rank {k}: coords {r['coords']} stage {r['stage']!r}, want {want} "
                     f"{stage!r}", job)
        _, out, _ = console(jobdir, "--json", "mesh")
        groups = json.loads(out)["groups"]
        if groups["pp"] != [[0, 4], [1, 5], [2, 6], [3, 7]] or \
                groups["tp"] != [[0, 1], [2, 3], [4, 5], [6, 7]]:
            fail(f"mesh groups {groups}", job)
        rc, sched, err = console(jobdir, "schedule")
        if rc != 0 or p.returncode != 0 or sched.strip() != p.stdout.strip():
            fail(f"`coordinator schedule` (exit {rc}):\n{sched}{err}\nis not "
                 f"`worker --print-schedule`:\n{p.stdout}{p.stderr}", job)
        _, out, _ = console(jobdir, "ranks")
        print(out + sched)
        console(jobdir, "stop")
        out, err = job.communicate(timeout=60)
        if job.returncode != 0:
            fail(f"stop: exit {job.returncode}\n{err[-2000:]}")
        print("ok: 3-D job: stages, groups and the schedule as the console shows them")


def last_metrics(path):
    with open(path) as f:
        return json.loads([line for line in f if line.strip()][-1])


def case_console_mem(port):
    """`ranks` shows each rank's memory by kind. A 2-step one-rank ZeRO-0 run gives the
    whole AdamW state, 8 bytes (m and v, float32) per parameter; under optim.zero=1 at dp
    2 rank 0 holds its shard, ceil(n / 2) parameters' worth, exactly (zero.c's shard); and
    rank 0's four figures are its metrics file's (the same step info feeds both, and they
    do not change from step to step)."""
    base = ["model.preset=gpt2-tiny", "train.eval_every=0"]
    with tempfile.TemporaryDirectory() as jobdir:
        one = os.path.join(jobdir, "one.jsonl")
        p = subprocess.run([WORKER] + base + ["train.steps=2", f"train.metrics={one}"],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, WEFT_JOB_DIR=os.path.join(jobdir, "one"),
                                    MASTER_PORT=str(port)))
        if p.returncode != 0:
            fail(f"one-rank run exit {p.returncode}: {p.stderr[-2000:]}")
        whole = last_metrics(one)["optim_bytes"]
        if whole % 8:
            fail(f"one rank's ZeRO-0 optim_bytes {whole} is not 8 bytes per parameter")
        n = whole // 8
        metrics = os.path.join(jobdir, "z1.jsonl")
        job = start(2, jobdir, port, extra=base + ["optim.zero=1", f"train.metrics={metrics}"])
        wait_running(job, jobdir, 2)
        _, out, _ = console(jobdir, "--json", "ranks")
        ranks = sorted(json.loads(out)["ranks"], key=lambda r: r["rank"])
        keys = ("param_bytes", "grad_bytes", "optim_bytes", "act_bytes")
        for r in ranks:
            if not all(isinstance(r.get(k), int) and r[k] > 0 for k in keys):
                fail(f"rank {r['rank']}: memory by kind {[r.get(k) for k in keys]}", job)
        if ranks[0]["optim_bytes"] != 8 * ((n + 1) // 2):
            fail(f"ZeRO-1 dp 2 rank 0 optim_bytes {ranks[0]['optim_bytes']}, want 8 x "
                 f"ceil({n} / 2) = {8 * ((n + 1) // 2)} (ZeRO-0: {whole})", job)
        m = last_metrics(metrics)
        if any(ranks[0][k] != m[k] for k in keys):
            fail(f"rank 0 {[ranks[0][k] for k in keys]} != metrics {[m[k] for k in keys]}", job)
        rc, text, err = console(jobdir, "ranks")
        if rc != 0 or "mem params/grads/optim/act" not in text or " MiB" not in text:
            fail(f"`coordinator ranks` exit {rc}:\n{text}{err}", job)
        print(text)
        console(jobdir, "stop")
        job.communicate(timeout=60)
        if job.returncode != 0:
            fail(f"stop: exit {job.returncode}")
        print(f"ok: ranks shows params/grads/optim/act; ZeRO-1 rank 0 optim "
              f"{ranks[0]['optim_bytes']} = 8 x ceil({n} / 2), ZeRO-0 {whole}; rank 0 = metrics")


def case_fault(sig, victim, port, needle, mesh=None, also=()):
    """Signal one rank of a 4-rank job; every rank must exit non-zero within the bound
    with a diagnosis holding `needle` (and each of `also`)."""
    with tempfile.TemporaryDirectory() as jobdir:
        job = start(4, jobdir, port, mesh=mesh)
        wait_running(job, jobdir, 4)
        _, out, _ = console(jobdir, "--json", "ranks")
        pid = {r["rank"]: r["pid"] for r in json.loads(out)["ranks"]}[victim]
        t0 = time.monotonic()
        os.kill(pid, sig)
        try:
            out, err = job.communicate(timeout=EXIT_BOUND_S + 20)
        except subprocess.TimeoutExpired:
            fail("job still running 30 s after the fault", job)
        dt = time.monotonic() - t0
        if sig == signal.SIGSTOP:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if job.returncode == 0:
            fail(f"job exited 0 after the fault\n{err[-2000:]}")
        if dt > EXIT_BOUND_S:
            fail(f"job took {dt:.1f} s to end, bound {EXIT_BOUND_S} s\n{err[-2000:]}")
        for n in (needle,) + tuple(also):
            if n not in err:
                fail(f"diagnosis lacks {n!r}\n{err[-3000:]}")
        line = [l for l in err.splitlines() if needle in l][0]
        errors = [l for l in err.splitlines() if l.startswith("weft: error:")]
        if len(errors) != 1:
            fail(f"the fault was said {len(errors)} times, want once:\n" + "\n".join(errors) +
                 f"\n-- the job's stderr:\n{err[-3000:]}")
        left = wait_empty(jobdir)
        if left:
            fail(f"the job left {left} in its job directory")
        print(f"ok: {signal.Signals(sig).name} of rank {victim}: job ended (exit "
              f"{job.returncode}) {dt:.2f} s after the fault, said once, nothing left in the "
              f"job directory\n  {line}")


def wait_empty(jobdir, bound_s=5.0):
    """What is left of a job in its directory, once rank 0 (or its reaper, when rank 0 was
    killed) had bound_s to remove it; [] when nothing."""
    t0 = time.monotonic()
    while True:
        left = sorted(n for n in os.listdir(jobdir) if n.endswith((".json", ".sock")))
        if not left or time.monotonic() - t0 > bound_s:
            return left
        time.sleep(0.1)


def reaper_of(jobdir):
    """The pid of the job's reaper (comm weft-reaper, this job directory in its
    environment)."""
    for pid in os.listdir("/proc"):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if comm == "weft-reaper" and f"WEFT_JOB_DIR={jobdir}".encode() in env:
            return int(pid)
    return None


def case_stale(port):
    """A job whose rank 0 and reaper are both killed (as a Slurm step's cgroup kills
    everything) leaves its job file and socket: the console names them with the command
    that removes them, and a new job of the same name replaces them."""
    with tempfile.TemporaryDirectory() as jobdir:
        job = start(1, jobdir, port, extra=["runtime.job_name=stale"])
        wait_running(job, jobdir, 1)
        reaper = reaper_of(jobdir)
        if not reaper:
            fail("no weft-reaper process for the job", job)
        os.kill(reaper, signal.SIGKILL)
        _, out, _ = console(jobdir, "--json", "ranks", "stale")
        os.kill(json.loads(out)["ranks"][0]["pid"], signal.SIGKILL)
        job.communicate(timeout=60)
        left = wait_empty(jobdir, 1.0)
        if left != ["stale.json", "stale.sock"]:
            fail(f"with rank 0 and its reaper killed, the job directory holds {left}")
        rc, out, err = console(jobdir, "list")
        want = (f"coordinator: stale job file {jobdir}/stale.json (job stale: its rank 0, pid "
                f"")
        line = [l for l in err.splitlines() if "stale job file" in l]
        rm = f"remove it: rm -f {jobdir}/stale.json {jobdir}/stale.sock"
        if rc != 0 or len(line) != 1 or not line[0].startswith(want) or rm not in line[0]:
            fail(f"`coordinator list` exit {rc} does not name the stale file:\n{out}{err}")
        print(f"ok: {line[0]}")
        job = start(1, jobdir, port, extra=["runtime.job_name=stale"])
        wait_running(job, jobdir, 1)
        console(jobdir, "stop", "stale")
        out, err = job.communicate(timeout=60)
        if job.returncode != 0 or "removed the stale job file" not in err:
            fail(f"a new job named stale: exit {job.returncode}\n{err[-2000:]}")
        left = wait_empty(jobdir)
        if left:
            fail(f"the stopped job left {left}")
        print("ok: a new job of the same name replaced the stale file, and left nothing")


def case_console_wait(port):
    """The console waits for a job it is told to (--wait), by its name; with two jobs and
    no name it says so (exit 1), never silently."""
    with tempfile.TemporaryDirectory() as jobdir:
        env = dict(os.environ, WEFT_JOB_DIR=jobdir)
        waiter = subprocess.Popen([CONSOLE, "--wait", "60", "status", "first"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # the console is waiting before the job exists
        a = start(1, jobdir, port, extra=["runtime.job_name=first"])
        out, err = waiter.communicate(timeout=90)
        if waiter.returncode != 0 or "job      first" not in out:
            fail(f"--wait 60 status first: exit {waiter.returncode}\n{out}{err}", a)
        print("ok: the console waited for the job named first")
        b = start(1, jobdir, port + 1000, extra=["runtime.job_name=second"])
        rc, out, err = console(jobdir, "--wait", "60", "status", "second")
        if rc != 0:
            fail(f"status second: exit {rc}\n{out}{err}", b)
        rc, out, err = console(jobdir, "status")
        if rc != 1 or "2 running jobs; name one" not in err or "first" not in err or \
                "second" not in err:
            fail(f"two jobs, no name: want exit 1 and both listed; got {rc}\n{out}{err}")
        print("ok: " + err.splitlines()[0])
        for name, job in (("first", a), ("second", b)):
            console(jobdir, "stop", name)
            job.communicate(timeout=60)
            if job.returncode != 0:
                fail(f"stop {name}: exit {job.returncode}")
        print("ok: both stopped by name")


def case_local_error(port):
    """One rank fails alone in the middle of a pipeline schedule (an injected read error
    of its step-3 batch: WEFT_TEST_DATA_FAIL) while its peers wait for its activations.
    The hang timeout is 300 s, so only the failing rank's report can end the job
    quickly: every rank must exit non-zero, with the coordinator's message naming it."""
    with tempfile.TemporaryDirectory() as jobdir:
        t0 = time.monotonic()
        job = start(4, jobdir, port, extra=["runtime.hang_timeout=300"],
                    mesh=["mesh.pp=2", "mesh.dp=2", "train.microbatches=4"],
                    env_extra={"WEFT_TEST_DATA_FAIL": "0:3"})
        try:
            out, err = job.communicate(timeout=START_BOUND_S + EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            fail("job still running: a rank's own failure hung the others", job)
        dt = time.monotonic() - t0
        if job.returncode == 0:
            fail(f"job exited 0 after rank 0 failed\n{err[-2000:]}")
        for n in ("injected read failure of step 3", "training failed on rank 0",
                  "rank 0 (host", "it reported an error: training failed on this rank alone"):
            if n not in err:
                fail(f"output lacks {n!r}\n{err[-3000:]}")
        line = [l for l in err.splitlines() if "it reported an error" in l][0]
        print(f"ok: rank 0 failed alone at step 3: job ended (exit {job.returncode}) "
              f"{dt:.2f} s after it started\n  {line}")


def case_hang_pp(port):
    """Stage 0 of a 4-stage pipeline blocks forever in a data read at step 3
    (WEFT_TEST_DATA_STALL): alive, heartbeating, never progressing. After
    runtime.hang_timeout (5 s here) every rank exits non-zero, and the diagnosis shows the
    chain of point-to-point waits behind it: stage 1 waits for stage 0's activation."""
    with tempfile.TemporaryDirectory() as jobdir:
        t0 = time.monotonic()
        job = start(4, jobdir, port, mesh=["mesh.pp=4", "train.microbatches=8"],
                    env_extra={"WEFT_TEST_DATA_STALL": "0:3"})
        try:
            out, err = job.communicate(timeout=START_BOUND_S + 5 + EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            fail("job still running past the hang timeout", job)
        dt = time.monotonic() - t0
        if job.returncode == 0:
            fail(f"job exited 0\n{err[-2000:]}")
        for n in ("no progress for 5 s", "recv(pp from rank 0) (inside): ranks 1"):
            if n not in err:
                fail(f"diagnosis lacks {n!r}\n{err[-3000:]}")
        line = [l for l in err.splitlines() if "no progress for" in l][0]
        print(f"ok: stage 0 stalled at step 3: job ended (exit {job.returncode}) {dt:.2f} s "
              f"after it started\n  {line}")


def case_hang_hsdp(port):
    """The watchdog's abort reaches every communicator the worker made, the ones the
    gradient path splits off for HSDP included (on a GPU it aborts their NCCL
    communicators, so no rank is left in an NCCL kernel). dp 4 as 2 fsdp groups of 2
    with ZeRO-3; rank 0 stalls at step 3 (WEFT_TEST_DATA_STALL) and every rank that is
    told to abort names what it aborted."""
    with tempfile.TemporaryDirectory() as jobdir:
        job = start(4, jobdir, port, mesh=["mesh.dp=4", "mesh.fsdp=2", "optim.zero=3"],
                    env_extra={"WEFT_TEST_DATA_STALL": "0:3"})
        try:
            out, err = job.communicate(timeout=START_BOUND_S + 5 + EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            fail("job still running past the hang timeout", job)
        if job.returncode == 0:
            fail(f"job exited 0\n{err[-2000:]}")
        lines = [l for l in err.splitlines() if "weft: aborted" in l]
        if not lines:
            fail(f"no rank says what it aborted\n{err[-3000:]}")
        for l in lines:
            for name in ("world(", "dp(", "tp(", "pp(", "fsdp(", "replica("):
                if name not in l:
                    fail(f"the abort missed {name[:-1]!r}: {l}\n{err[-3000:]}")
        print(f"ok: {len(lines)} ranks aborted every communicator, e.g.\n  {lines[0]}")


def case_console_axes(port, mesh, want, groups, lines):
    """A job on the context or expert axis: `status` and `mesh` name it (the JSON and the
    text), and `mesh` lists its groups, as rank = tp + TP*(cp + CP*(dp + DP*pp)) places
    them (docs/architecture.md) and ep groups of ep consecutive dp ranks."""
    with tempfile.TemporaryDirectory() as jobdir:
        job = start(4, jobdir, port, mesh=mesh)
        st = wait_running(job, jobdir, 4)
        if st["mesh"] != want:
            fail(f"status mesh {st['mesh']}, want {want}", job)
        _, out, _ = console(jobdir, "--json", "mesh")
        got = json.loads(out)["groups"]
        for axis, g in groups.items():
            if got[axis] != g:
                fail(f"mesh {axis} groups {got[axis]}, want {g}", job)
        text = console(jobdir, "status")[1] + console(jobdir, "mesh")[1]
        for line in lines:
            if line not in text:
                fail(f"want {line!r} in the console's text:\n{text}", job)
        print(text)
        console(jobdir, "stop")
        out, err = job.communicate(timeout=60)
        if job.returncode != 0:
            fail(f"stop: exit {job.returncode}\n{err[-2000:]}")
        print(f"ok: {' '.join(mesh)}: status and mesh name the axis and its groups")


CASES = {
    "console-np4": lambda: case_console(4, 29611),
    "console-np8": lambda: case_console(8, 29612),
    "console-3d": lambda: case_console_3d(29617),
    "console-cp": lambda: case_console_axes(
        29627, ["mesh.dp=2", "mesh.cp=2"], {"dp": 2, "tp": 1, "pp": 1, "cp": 2, "ep": 1},
        {"cp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]]},
        ["mesh     dp 2 x cp 2 x tp 1 x pp 1 = 4 ranks", "rank = tp + TP*(cp + CP*(dp + DP*pp))",
         "  cp   groups: [0 1] [2 3]"]),
    "console-ep": lambda: case_console_axes(
        29628, ["mesh.dp=4", "mesh.ep=2", "model.preset=olmoe-tiny"],
        {"dp": 4, "tp": 1, "pp": 1, "cp": 1, "ep": 2},
        {"ep": [[0, 1], [2, 3]]}, ["mesh     dp 4 x tp 1 x pp 1, ep 2 inside dp = 4 ranks",
                                   "  ep   groups: [0 1] [2 3]"]),
    "console-mem-zero1": lambda: case_console_mem(29623),
    "fault-kill": lambda: case_fault(signal.SIGKILL, 2, 29613, "rank 2"),
    "fault-stop": lambda: case_fault(signal.SIGSTOP, 1, 29614, "rank 1"),
    # mpirun itself ends the job when rank 0 dies and names it.
    "fault-kill0": lambda: case_fault(signal.SIGKILL, 0, 29615, "rank 0"),
    # A frozen coordinator: the workers stop hearing its heartbeats and abort.
    "fault-stop0": lambda: case_fault(signal.SIGSTOP, 0, 29616, "has been silent"),
    "fault-local-error": lambda: case_local_error(29619),
    # A frozen middle stage of a 4-stage pipeline (where its neighbours wait depends on
    # when it froze: mid-schedule in receives, between steps in a collective; hang-pp
    # pins the point-to-point diagnosis down).
    "fault-stop-pp": lambda: case_fault(
        signal.SIGSTOP, 2, 29618, "rank 2", mesh=["mesh.pp=4", "train.microbatches=8"],
        also=("no heartbeat",)),
    "hang-pp": lambda: case_hang_pp(29620),
    "stale-job-file": lambda: case_stale(29625),
    "console-wait": lambda: case_console_wait(29626),
    "hang-hsdp": lambda: case_hang_hsdp(29624),
}

if __name__ == "__main__":
    CASES[CASE]()
