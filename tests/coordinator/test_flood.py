#!/usr/bin/env python3
"""test_flood.py MPIRUN WORKER COORDINATOR - rank 0's listeners under a flood.

The attack from issue 19, repeated against a real 2-rank job whose rank 0 runs under
`ulimit -n 1024` (as in the report):
  - 1,100 slow connections to the metrics port, each sending one byte a second
    (the old server reset its idle timer on every byte and kept them all);
  - a connect-only flood on the control port (connections that never say Hello),
    held open by this process;
  - an oversized request and one with a NUL byte, each refused at once (414, 400).
The job must keep training, answer a real scrape and the console once the flood is
over, checkpoint, stop on the console's request and exit 0; rank 0 must not run out
of descriptors, and the log must stay short (rejections are rate-limited).
Prints the figures for the issue's closing note.
"""
import os, re, resource, shutil, socket, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import free_ports  # noqa: E402

mpirun, worker, coordinator = sys.argv[1:4]
SLOW_CONNS = 1100   # the issue's figure: more than rank 0's 1,024 descriptors
FLOOD_S = 12.0      # long enough for two 5 s metrics deadlines and a checkpoint
CONNECT_RATE = 300  # control-port connects per second (the issue used 600 on 16 cores)
ULIMIT = 1024

# This process holds the flood's sockets: raise its own limit (the hard limit allows).
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = min(hard, 16384)
if want < SLOW_CONNS + FLOOD_S * CONNECT_RATE + 100:
    print("SKIP: this process may hold only %d descriptors" % hard)
    sys.exit(77)
resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


tmp = tempfile.mkdtemp(prefix="weft-flood-")
jobdir, ckdir, log = os.path.join(tmp, "jobs"), os.path.join(tmp, "ck"), os.path.join(tmp, "log")
port, mport = free_ports(2)
env = dict(os.environ, WEFT_JOB_DIR=jobdir, MASTER_PORT=str(port), MASTER_ADDR="127.0.0.1")
cmd = "ulimit -n %d && exec %s --allow-run-as-root --oversubscribe --bind-to none -np 2 %s " \
      "train.steps=100000 train.warmup=2 train.checkpoint_every=200 train.checkpoint_dir=%s " \
      "runtime.metrics_port=%d" % (ULIMIT, mpirun, worker, ckdir, mport)
job = subprocess.Popen(["bash", "-c", cmd], env=env, stdout=open(log, "w"),
                       stderr=subprocess.STDOUT)


def text():
    with open(log, errors="replace") as f:
        return f.read()


def fail(msg):
    if job.poll() is None:
        job.kill()
    print(text()[-6000:])
    shutil.rmtree(tmp, ignore_errors=True)
    print("FAIL: " + msg)
    sys.exit(1)


def last_step():
    steps = re.findall(r"^step (\d+)/", text(), re.M)
    return int(steps[-1]) if steps else 0


def wait(pred, what, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        if job.poll() is not None:
            fail("the job exited (%d) while waiting for %s" % (job.returncode, what))
        time.sleep(0.1)
    fail("timed out waiting for " + what)


def connect(p):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", p))
    return s


def http(req, timeout=5.0):
    """Send one request; (seconds until the answer, status line)."""
    s = socket.create_connection(("127.0.0.1", mport), timeout=timeout)
    t0 = time.time()
    s.sendall(req)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    s.close()
    return time.time() - t0, data.split(b"\r\n")[0].decode(errors="replace")


wait(lambda: last_step() >= 3, "step 3", 90)
step0 = last_step()

# Requests that cannot be a scrape are refused at once, not after a deadline: an address
# longer than the server keeps (414) and a NUL byte, which HTTP forbids (400).
t_big, st_big = http(b"GET /metrics?" + b"a" * 2048 + b" HTTP/1.0\r\n\r\n")
t_nul, st_nul = http(b"GET /metr\x00ics HTTP/1.0\r\n")
print("oversized request: %r in %.3f s; NUL request: %r in %.3f s" % (st_big, t_big, st_nul,
                                                                      t_nul))
if "414" not in st_big or "400" not in st_nul or max(t_big, t_nul) > 1.0:
    fail("oversized/NUL requests were not answered 414/400 within 1 s")

# The flood. Slow connections that the server drops are reopened, as an attacker would.
slow = [connect(mport) for _ in range(SLOW_CONNS)]
held, dropped_slow, t0 = [], 0, time.time()
next_dribble = t0
while time.time() - t0 < FLOOD_S:
    for _ in range(CONNECT_RATE // 10):
        held.append(connect(port))  # never says Hello
    if time.time() >= next_dribble:
        for i, s in enumerate(slow):
            try:
                s.send(b"G")
            except OSError:  # closed by the server (or not yet connected): reopen
                s.close()
                slow[i] = connect(mport)
                dropped_slow += 1
        next_dribble += 1.0
    if job.poll() is not None:
        fail("the job died during the flood (exit %d)" % job.returncode)
    time.sleep(0.1)
flood_steps = last_step() - step0
for s in slow + held:
    s.close()
print("flood: %d slow metrics connections (%d dropped by the server and reopened), %d "
      "control connects; the job trained %d steps meanwhile" % (SLOW_CONNS, dropped_slow,
                                                               len(held), flood_steps))
if flood_steps < 10:
    fail("the job made %d steps during %.0f s of flood" % (flood_steps, FLOOD_S))
time.sleep(1.0)  # let the server notice the closes

# After the flood: a real scrape and the console work, and the job checkpoints and stops.
t_ok, st_ok = http(b"GET /metrics HTTP/1.0\r\n\r\n")
print("scrape after the flood: %r in %.3f s" % (st_ok, t_ok))
if "200" not in st_ok:
    fail("no scrape after the flood")
r = subprocess.run([coordinator, "--dir", jobdir, "stop"], env=env, capture_output=True,
                   text=True, timeout=30)
if r.returncode != 0:
    fail("coordinator stop failed: %s%s" % (r.stdout, r.stderr))
try:
    rc = job.wait(timeout=60)
except subprocess.TimeoutExpired:
    fail("the job did not stop within 60 s of `coordinator stop`")
out = text()
saved = re.findall(r"checkpoint: step (\d+) saved", out)
warns = [l for l in out.splitlines() if " W " in l[:20] or "[weft W" in l]
caps = [l for l in out.splitlines() if "reached its cap" in l]
print("job exit %d; checkpoints saved at steps %s; %d WARN lines, %d of them the cap line" %
      (rc, ",".join(saved), len(warns), len(caps)))
if rc != 0:
    fail("the job exited %d after the flood" % rc)
if "Too many open files" in out:
    fail("rank 0 ran out of descriptors")
if not saved or int(saved[-1]) < step0 + flood_steps:
    fail("no checkpoint after the flood")
if not caps:
    fail("no log line says the cap was reached")
# Each kind of rejection prints at most one line per 10 s (WF__LOG_EVERY_MS): a 12 s
# flood gives at most 2 per kind for 4 kinds, plus the caps of 2 listeners.
if len(warns) > 16:
    fail("%d WARN lines: rejections are not rate-limited" % len(warns))
# `stop` is said once by the coordinator and once when rank 0 stops, not by every rank
stops = [l for l in out.splitlines() if "stop" in l and "console" in l]
if len(stops) != 2 or "console requested stop" not in stops[0]:
    fail("stop logged %d times: %s" % (len(stops), stops))
if os.listdir(jobdir):
    fail("the job left %s behind" % os.listdir(jobdir))
shutil.rmtree(tmp, ignore_errors=True)
print("PASS")
