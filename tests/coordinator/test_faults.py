#!/usr/bin/env python3
"""test_faults.py MPIRUN MPI_FAULT CASE - one injected fault in a 4-rank MPI job.

Asserts the whole job ends non-zero within the bound, that the survivors were told
within the detection bound, and that the diagnosis names the right rank. Prints the
measured times (they go into the issue's closing note).
"""
import os, re, shutil, subprocess, sys, tempfile, time

mpirun, prog, case = sys.argv[1], sys.argv[2], sys.argv[3]
# case: (mode, fault rank, expected text in the abort reason, detection bound s)
CASES = {
    "none": ("none", 1, None, None),
    "kill": ("kill", 2, r"rank 2 \(host .*pid \d+, device cpu.*died at step \d+: its connection", 2.0),
    "exit": ("exit", 2, r"rank 2 \(host .*died at step", 2.0),
    "stop": ("stop", 2, r"rank 2 .*no heartbeat for 2\.\d s", 3.0),
    # rank 0 runs the coordinator: the survivors name its host, pid and the step
    "kill0": ("kill", 0, r"lost the connection to the coordinator .*rank 0 \(host \S+, pid [1-9]\d*\)"
              r".* after step -?\d+", 2.0),
    "stop0": ("stop", 0, r"coordinator .* has been silent .*rank 0 \(host \S+, pid [1-9]\d*\)", 4.5),
    # hang_timeout 3 s + up to one 1 s heartbeat, counted from the last step
    "skip": ("skip", 1, r"no progress for 3 s .*behind the others: ranks 1", 5.0),
}
mode, frank, want, bound = CASES[case]
jobdir = tempfile.mkdtemp(prefix="weft-fault-")
env = dict(os.environ, WEFT_JOB_DIR=jobdir)
cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "4",
       prog, mode, str(frank)]
t0 = time.time()
r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   text=True, timeout=60)
t_end = time.time()
shutil.rmtree(jobdir, ignore_errors=True)  # a killed coordinator leaves its job file
out = r.stdout
if case == "none":
    assert r.returncode == 0, out
    assert "ABORT" not in out, out
    print("no fault: job ended normally in %.2f s" % (t_end - t0))
    sys.exit(0)
assert r.returncode != 0, "job exited 0 after a fault:\n" + out
faults = [float(m) for m in re.findall(r"FAULT t=([\d.]+)", out)]
aborts = [(float(t), int(k), why) for t, k, why in re.findall(r"ABORT t=([\d.]+) rank=(\d+): (.*)", out)]
assert faults, out
tf = faults[0]
if case == "skip":  # the hang begins when the last step ends, not at the skip
    tf = max(float(t) for t in re.findall(r"STEP t=([\d.]+)", out))
assert aborts, "no surviving rank was told:\n" + out
first = min(t for t, _, _ in aborts) - tf
last = max(t for t, _, _ in aborts) - tf
ended = t_end - tf
for _, k, why in aborts:
    assert re.search(want, why), "rank %d: unexpected reason: %s" % (k, why)
print("%s: first survivor told after %.3f s, last after %.3f s (%d told), job ended %.2f s "
      "after the %s" % (case, first, last, len(aborts), ended,
                       "last step (the hang)" if case == "skip" else "fault"))
print("reason: " + aborts[0][2])
assert first < bound, "detection %.3f s > %.1f s" % (first, bound)
assert ended < 10.0, out
