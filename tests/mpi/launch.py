#!/usr/bin/env python3
"""Multi-rank start-up tests: the real worker binary under the real mpirun.

Each case is one meson test: `launch.py WORKER CASE`. Every run has a hard timeout, so
a hang fails the test instead of stalling CI; where the issue gives a bound ("every rank
exits non-zero within a few seconds") the case asserts on the measured time.
"""
import os
import re
import subprocess
import sys
import time

WORKER = sys.argv[1]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
# "A few seconds": start-up of 8 ranks on this 2-core machine is about 1 s, so an
# error path that takes more than 10 s means something waited on a peer.
ERROR_EXIT_BOUND_S = 10.0


def run(cmd, env=None, timeout=60):
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def mpirun(n, args, env=None, mpi_env=None, timeout=60):
    xs = []
    for k, v in (mpi_env or {}).items():
        xs += ["-x", f"{k}={v}"]
    return run(MPIRUN + ["-np", str(n)] + xs + [WORKER] + args, env=env, timeout=timeout)


def check(cond, what, out="", err=""):
    if not cond:
        print(f"FAIL: {what}\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
        sys.exit(1)


def expected_groups(dp, tp, pp, r):
    """The mesh arithmetic of docs/architecture.md, written independently of coordinator/mesh.c."""
    t, d, p = r % tp, (r // tp) % dp, r // (tp * dp)
    rank = lambda p_, d_, t_: t_ + tp * (d_ + dp * p_)
    g = {
        "tp": [rank(p, d, x) for x in range(tp)],
        "dp": [rank(p, x, t) for x in range(dp)],
        "pp": [rank(x, d, t) for x in range(pp)],
    }
    if p in (0, pp - 1):
        g["emb"] = sorted({rank(0, d, t), rank(pp - 1, d, t)})
    else:
        g["emb"] = []
    return (p, d, t), g


def parse_table(out):
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+(\S+)\s+(.+?)\s+(\d+)\s+"
                     r"\((\d+),(\d+),(\d+)\)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", line)
        if m:
            g = m.groups()
            grp = lambda s: [] if s == "-" else [int(x) for x in s.split(",")]
            rows[int(g[0])] = {
                "host": g[1], "pid": int(g[2]), "local": int(g[3]), "local_size": int(g[4]),
                "device": g[5], "binding": g[6], "threads": int(g[7]),
                "coords": (int(g[8]), int(g[9]), int(g[10])),
                "tp": grp(g[11]), "dp": grp(g[12]), "pp": grp(g[13]), "emb": grp(g[14]),
            }
    return rows


def case_dryrun(n, tp, pp):
    rc, out, err, dt = mpirun(n, ["--dry-run", f"mesh.tp={tp}", f"mesh.pp={pp}"])
    check(rc == 0, f"dry-run -np {n} exit {rc}", out, err)
    rows = parse_table(out)
    check(len(rows) == n, f"{len(rows)} table rows for {n} ranks", out, err)
    dp = n // (tp * pp)
    check(f"mesh dp={dp} x tp={tp} x pp={pp}" in out, "mesh header", out, err)
    check("groups verified against MPI" in out, "MPI verification line", out, err)
    pids = {r["pid"] for r in rows.values()}
    check(len(pids) == n, "distinct pids (real processes)", out, err)
    for r, row in rows.items():
        coords, groups = expected_groups(dp, tp, pp, r)
        check(row["coords"] == coords, f"rank {r} coords {row['coords']} != {coords}", out, err)
        for axis in ("tp", "dp", "pp", "emb"):
            check(row[axis] == groups[axis], f"rank {r} {axis} group {row[axis]} != "
                  f"{groups[axis]}", out, err)
        check(row["device"] == "cpu" or row["device"].startswith("cuda:"), "device", out, err)
        check(row["local_size"] == n, "one node: local size = world", out, err)
    check(sorted(r["local"] for r in rows.values()) == list(range(n)), "local ranks", out, err)
    if n > os.cpu_count():
        check(all("shared" in r["binding"] and r["threads"] == 1 for r in rows.values()),
              "oversubscribed ranks share cores with 1 thread each", out, err)
        check("share" in err, "oversubscription is said once", out, err)
    else:
        bound = [r["binding"] for r in rows.values()]
        check(len(set(bound)) == n, f"disjoint bindings {bound}", out, err)
    print(out)


def expect_failure(rc, out, err, dt, needle, once=True):
    check(rc != 0, "exit status must be non-zero", out, err)
    check(dt < ERROR_EXIT_BOUND_S, f"took {dt:.1f} s, bound {ERROR_EXIT_BOUND_S} s", out, err)
    check(needle in err, f"message must contain {needle!r}", out, err)
    if once:
        check(err.count("weft: error:") == 1, "the error is printed exactly once", out, err)
    print(f"ok: exit {rc} after {dt:.2f} s: " +
          [l for l in err.splitlines() if "error" in l][0])


CASES = {
    "dryrun-np1": lambda: case_dryrun(1, 1, 1),
    "dryrun-np2": lambda: case_dryrun(2, 1, 2),
    "dryrun-np4": lambda: case_dryrun(4, 2, 1),
    "dryrun-np8": lambda: case_dryrun(8, 2, 2),
    "dryrun-np8-dp8": lambda: case_dryrun(8, 1, 1),
    # tp=3 cannot divide 4 ranks: every rank validates, rank 0 prints once.
    "bad-mesh-np4": lambda: expect_failure(*mpirun(4, ["--dry-run", "mesh.tp=3"]),
                                           "mesh.tp"),
    "unknown-key-np4": lambda: expect_failure(*mpirun(4, ["--dry-run", "mesh.tpp=2"]),
                                              "did you mean"),
    "bad-yaml-np2": lambda: bad_yaml(),
    # RANK=0 exported to both ranks: rank 1 sees a RANK that is not its own.
    "rank-mismatch-np2": lambda: expect_failure(
        *mpirun(2, ["--dry-run"], mpi_env={"RANK": "0", "WORLD_SIZE": "2"}),
        "disagrees with MPI rank 1"),
    "world-mismatch-np2": lambda: expect_failure(
        *mpirun(2, ["--dry-run"], mpi_env={"WORLD_SIZE": "4", "RANK": "0"}),
        "world size 4", once=False),
    "singletons": lambda: singletons(),
    "srun-mpi-none": lambda: expect_failure(
        *run([WORKER, "--dry-run"], env={"SLURM_PROCID": "2", "SLURM_NTASKS": "4",
                                          "SLURM_JOB_ID": "77"}), "srun --mpi=pmix"),
    "cpu-fallback": lambda: cpu_fallback(),
    "singleton-no-orted": lambda: singleton_no_orted(),
}


def bad_yaml():
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"weft-bad-{os.getpid()}.yaml")
    with open(path, "w") as f:
        f.write("mesh:\n  tp: 2\ntrain:\n  steps: [1, 2\n")
    try:
        rc, out, err, dt = mpirun(2, ["--dry-run", "--config", path])
        expect_failure(rc, out, err, dt, path)
        check(re.search(r":[45]:", err) is not None, "the message gives the line", out, err)
    finally:
        os.unlink(path)


def singletons():
    """Two processes started by hand, each told it is one of two: each sees an MPI
    world of one and must refuse, quickly, saying how to launch."""
    procs = []
    t0 = time.monotonic()
    for r in range(2):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE="2")
        procs.append(subprocess.Popen([WORKER, "--dry-run"], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=60)
        dt = time.monotonic() - t0
        expect_failure(p.returncode, out, err, dt, "mpirun -np 2")


def cpu_fallback():
    """Without a usable GPU the worker says why, in one line, and runs on the CPU."""
    rc, out, err, dt = run([WORKER, "--dry-run"])
    check(rc == 0, "dry-run exit", out, err)
    rows = parse_table(out)
    if rows[0]["device"] != "cpu":
        print("a GPU is present: nothing to fall back from")
        sys.exit(77)
    lines = [l for l in err.splitlines() if "falling back to the CPU" in l]
    check(len(lines) == 1, "exactly one fallback line", out, err)
    check(re.search(r"no GPU: .+", lines[0]) is not None, "the line says why", out, err)
    # With the module path pointing nowhere, the reason names the missing module.
    rc, out, err, dt = run([WORKER, "--dry-run"], env={"WEFT_MODULE_PATH": "/nonexistent"})
    check(rc == 0, "dry-run exit without module", out, err)
    check("libweft_cuda.so not found" in err, "reason names the module", out, err)
    # A module whose CUDA libraries are absent (tests/gpu/absent_fake needs a library
    # that is not installed): the worker still starts and names the missing library.
    fake = os.environ.get("WEFT_TEST_ABSENT_FAKE", "")
    if fake and os.path.isdir(fake):
        rc, out, err, dt = run([WORKER, "--dry-run"], env={"WEFT_MODULE_PATH": fake})
        check(rc == 0, "dry-run exit with CUDA libraries absent", out, err)
        check("libweft_test_absent.so: cannot open" in err, "reason names the library", out,
              err)
    print(lines[0])


def fake_ompi_prefix(d):
    """An Open MPI prefix (OPAL_PREFIX) with the system's libraries, components and help
    files but no bin/orted: a singleton that forks its daemon fails in MPI_Init there."""
    prefix = os.path.join(d, "ompi")
    os.makedirs(os.path.join(prefix, "bin"))
    lib = subprocess.run(["ompi_info", "--path", "libdir", "--parsable"], capture_output=True,
                         text=True).stdout
    libdir = lib.strip().split(":")[-1] if lib.strip() else "/usr/lib/x86_64-linux-gnu/openmpi/lib"
    # Debian: prefix /usr, libdir /usr/lib/<triplet>/openmpi/lib, data in /usr/share.
    check(libdir.startswith("/usr/lib/"), f"Open MPI's libdir {libdir} is under /usr/lib")
    os.symlink("/usr/lib", os.path.join(prefix, "lib"))
    os.symlink("/usr/share", os.path.join(prefix, "share"))
    return prefix


def singleton_no_orted():
    """Started without mpirun, one rank and every tool start as an isolated singleton:
    no orted is forked. OPAL_PREFIX names a prefix without orted, so a fork would fail
    MPI_Init; the same run without the isolation is shown to fail there (the control)."""
    import tempfile
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "io"))
    import gpt2_ref
    with tempfile.TemporaryDirectory() as d:
        env = {"OPAL_PREFIX": fake_ompi_prefix(d)}
        rc, out, err, _ = run([WORKER, "--dry-run"],
                              env=dict(env, OMPI_MCA_ess_singleton_isolated="0"))
        check(rc != 0, "control: a singleton that forks orted fails without one", out, err)
        tiny = ["model.preset=gpt2-tiny", "train.batch_size=2", "model.seq_len=32",
                "runtime.threads=1", "train.eval_every=0"]
        gpt2_ref.write_fixtures(d)
        text = os.path.join(d, "text.txt")
        with open(text, "w") as f:
            f.write(gpt2_ref.CORPUS * 4)
        ck, model = os.path.join(d, "ck"), os.path.join(d, "m.bin")
        runs = [
            ("one rank", tiny + ["train.steps=2", "train.checkpoint_dir=" + ck, "--save", model]),
            ("--estimate", tiny + ["--estimate"]),
            ("--plan", tiny + ["--plan"]),
            ("--print-schedule", tiny + ["mesh.pp=2", "train.microbatches=2",
                                         "--print-schedule"]),
            ("--tokenize", ["--tokenize", text, os.path.join(d, "tok"),
                            "data.tokenizer=" + os.path.join(d, "tokenizer.json")]),
            ("--generate", tiny + ["model.init=" + model, "train.sample_tokens=4",
                                   "--generate", "ab"]),
            ("--export", tiny + ["train.resume=" + ck, "--export", "llmc",
                                 os.path.join(d, "x.bin")]),
        ]
        for what, args in runs:
            rc, out, err, dt = run([WORKER] + args, env=env, timeout=120)
            check(rc == 0, f"{what} without mpirun and without orted", out, err)
            print(f"ok: {what} ({dt:.2f} s)")


if __name__ == "__main__":
    CASES[sys.argv[2]]()
