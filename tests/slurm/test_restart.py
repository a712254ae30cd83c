#!/usr/bin/env python3
"""test_restart.py MPIRUN WORKER COORDINATOR WEFT_RUN - automatic restart with mpirun.

A 2-rank job runs under scripts/weft-run. Mid-run, between two checkpoints, rank 1 is
killed with SIGKILL. weft-run must relaunch it from the last checkpoint; the job must
finish all its steps, redoing at most train.checkpoint_every of them, and its final
parameters (worker --save) must equal, byte for byte, those of the same job run
without interruption (resume on the same mesh is bit-exact). Also: WEFT_MAX_RESTARTS=0
gives up at the first failure, with the job's status. Prints the figures.
"""
import json, os, re, shutil, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import free_ports  # noqa: E402

mpirun, worker, coordinator, weft_run = (os.path.abspath(a) for a in sys.argv[1:5])
STEPS, EVERY = 160, 20
KILL_AT = 50  # mid-way between the checkpoints at 40 and 60

tmp = tempfile.mkdtemp(prefix="weft-restart-")


def job_env(name):
    return dict(os.environ, WEFT_JOB_DIR=os.path.join(tmp, "jobs-" + name),
                MASTER_PORT=str(free_ports(1)[0]), MASTER_ADDR="127.0.0.1",
                WEFT_RESTART_BACKOFF="1")


def launch(name):
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
            worker, "train.steps=%d" % STEPS, "train.checkpoint_every=%d" % EVERY,
            "train.checkpoint_dir=" + os.path.join(tmp, "ck-" + name),
            "--save", os.path.join(tmp, name + ".bin")]


def fail(msg, log=None):
    if log and os.path.exists(log):
        print(open(log, errors="replace").read()[-5000:])
    shutil.rmtree(tmp, ignore_errors=True)
    print("FAIL: " + msg)
    sys.exit(1)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


# 1. The reference: the same job, never interrupted.
r = subprocess.run(launch("ref"), env=job_env("ref"), capture_output=True, text=True,
                   timeout=300)
if r.returncode != 0:
    print(r.stdout[-3000:], r.stderr[-3000:])
    fail("the uninterrupted run failed")

# 2. Under weft-run, with rank 1 killed at step KILL_AT.
env = job_env("wrapped")
env["WEFT_MAX_RESTARTS"] = "2"
log = os.path.join(tmp, "wrapped.log")
t0 = time.time()
job = subprocess.Popen([weft_run] + launch("wrapped"), env=env, stdout=open(log, "w"),
                       stderr=subprocess.STDOUT)
killed_pid, killed_step = None, None
while time.time() - t0 < 240 and job.poll() is None and killed_pid is None:
    steps = [int(s) for s in re.findall(r"^step (\d+)/", read(log), re.M)]
    if steps and steps[-1] >= KILL_AT:
        q = subprocess.run([coordinator, "--json", "--dir", env["WEFT_JOB_DIR"], "ranks"],
                           env=env, capture_output=True, text=True, timeout=30)
        if q.returncode == 0:
            rank1 = json.loads(q.stdout)["ranks"][1]
            killed_pid, killed_step = rank1["pid"], rank1["step"]
            os.kill(killed_pid, signal.SIGKILL)
            t_kill = time.time()
            break
    time.sleep(0.02)
if killed_pid is None:
    job.kill()
    fail("never saw step %d to kill rank 1 at" % KILL_AT, log)
if killed_step >= STEPS or killed_step % EVERY == 0:
    job.kill()
    fail("rank 1 was at step %d: not between two checkpoints; the test needs a slower step"
         % killed_step, log)
try:
    rc = job.wait(timeout=300)
except subprocess.TimeoutExpired:
    job.kill()
    fail("weft-run did not finish within 300 s", log)
out = read(log)
resumed = [int(s) for s in re.findall(r"checkpoint: resumed from \S+ at step (\d+)", out)]
restarts = re.findall(r"weft-run: .* restart (\d+) of 2 in", out)
print("rank 1 (pid %d) killed at step %d; weft-run restarted %d time(s); resumed at step %s; "
      "exit %d after %.1f s" % (killed_pid, killed_step, len(restarts), resumed, rc,
                                time.time() - t0))
if rc != 0:
    fail("weft-run exited %d" % rc, log)
if restarts != ["1"] or len(resumed) != 1:
    fail("expected exactly one restart and one resume", log)
redone = killed_step - resumed[0]
print("redone steps: %d (train.checkpoint_every=%d)" % (redone, EVERY))
if not 0 <= redone <= EVERY:
    fail("redid %d steps, more than checkpoint_every=%d" % (redone, EVERY), log)
if not re.search(r"^step %d/%d " % (STEPS, STEPS), out, re.M):
    fail("the restarted job did not reach step %d" % STEPS, log)
# The aborted attempt's rank 0 removed its job file (it holds the token) and socket, as
# the finished attempt did.
left = os.listdir(env["WEFT_JOB_DIR"])
print("job directory after an aborted and a finished attempt: %s" % (left or "empty"))
if left:
    fail("left behind in the job directory: %s" % left, log)
ref = open(os.path.join(tmp, "ref.bin"), "rb").read()
got = open(os.path.join(tmp, "wrapped.bin"), "rb").read()
print("--save files: %d bytes each, %s" % (len(ref), "identical" if ref == got else "DIFFERENT"))
if ref != got:
    fail("the restarted job's parameters differ from the uninterrupted run's", log)

# 3. WEFT_MAX_RESTARTS=0: the first failure is final, with the job's own status. The
# failure is one a restart could cure (status 1: an injected read error of step 1's batch,
# WEFT_TEST_DATA_FAIL), not a configuration error (status 2), which weft-run never retries.
env = job_env("norestart")
env.update(WEFT_MAX_RESTARTS="0", WEFT_TEST_DATA_FAIL="0:1")
r = subprocess.run([weft_run, mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "1",
                    "-x", "WEFT_TEST_DATA_FAIL", worker, "train.steps=2"], env=env,
                   capture_output=True, text=True, timeout=120)
if r.returncode == 0 or "0 of WEFT_MAX_RESTARTS=0 restarts are spent; giving up" not in r.stderr:
    print(r.stdout[-2000:], r.stderr[-2000:])
    fail("WEFT_MAX_RESTARTS=0 did not give up at once")
print("WEFT_MAX_RESTARTS=0: gave up at once with status %d" % r.returncode)

# 4. A job Slurm requeued (SLURM_RESTART_COUNT=1) resumes from its checkpoints at once,
# and that requeue counts against WEFT_MAX_RESTARTS=1: the next failure is final.
env = job_env("requeued")
env.update(WEFT_MAX_RESTARTS="1", SLURM_RESTART_COUNT="1", WEFT_TEST_DATA_FAIL="0:1")
r = subprocess.run([weft_run, mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "1",
                    "-x", "WEFT_TEST_DATA_FAIL", worker, "train.steps=2",
                    "train.checkpoint_dir=" + os.path.join(tmp, "ck-requeued")],
                   env=env, capture_output=True, text=True, timeout=120)
if r.returncode == 0 or "SLURM_RESTART_COUNT=1): resuming from the last checkpoint" not in \
        r.stderr or "1 of WEFT_MAX_RESTARTS=1 restarts are spent; giving up" not in r.stderr:
    print(r.stdout[-2000:], r.stderr[-2000:])
    fail("a requeued job did not resume, or did not count its requeue")
print("SLURM_RESTART_COUNT=1, WEFT_MAX_RESTARTS=1: resumed, then gave up at the failure")

# 5. A rank frozen with SIGSTOP: the watchdog aborts the job and rank 0 leaves through
# its abort handler, which must still remove the job file (it holds the token) and
# the socket. WEFT_MAX_RESTARTS=0, so the failure stands.
env = job_env("frozen")
env["WEFT_MAX_RESTARTS"] = "0"
log = os.path.join(tmp, "frozen.log")
job = subprocess.Popen([weft_run] + launch("frozen"), env=env, stdout=open(log, "w"),
                       stderr=subprocess.STDOUT)
t0 = time.time()
while time.time() - t0 < 120 and job.poll() is None:
    if re.search(r"^step 5/", read(log), re.M):
        break
    time.sleep(0.05)
q = subprocess.run([coordinator, "--json", "--dir", env["WEFT_JOB_DIR"], "ranks"], env=env,
                   capture_output=True, text=True, timeout=30)
if q.returncode != 0:
    job.kill()
    fail("coordinator ranks: %s%s" % (q.stdout, q.stderr), log)
frozen = json.loads(q.stdout)["ranks"][1]["pid"]
os.kill(frozen, signal.SIGSTOP)
try:
    rc = job.wait(timeout=60)
finally:
    try:
        os.kill(frozen, signal.SIGKILL)
    except ProcessLookupError:
        pass
left = os.listdir(env["WEFT_JOB_DIR"])
print("rank 1 frozen: the job ended with status %d; job directory: %s" % (rc, left or "empty"))
if rc == 0 or "no heartbeat" not in read(log):
    fail("the frozen rank was not diagnosed", log)
if left:
    fail("an aborted job left %s behind" % left, log)
shutil.rmtree(tmp, ignore_errors=True)
print("PASS")
