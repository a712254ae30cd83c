#!/usr/bin/env python3
"""Checkpoint tests (issue 8) with the real worker binary, alone or under mpirun.

`ckpt.py WORKER COORDINATOR CASE`. Every case trains gpt2-tiny on the synthetic source
for a few steps, in its own temporary directory, job directory and control port.

Why the comparisons are what they are:
* Same mesh (resume-*, kill-*, sigterm-*): the data of a step and its learning rate are
  pure functions of (seed, step) and a checkpoint restores the parameters, AdamW m, v
  and the step (AdamW's t) bit for bit, so every loss after resuming must equal the
  uninterrupted run's exactly (`==` on the floats from the metrics files).
* Another mesh (reshard-*): dp changes the summation order of the gradient all-reduce
  (and ZeRO-1 its reduce-scatter), so the continuation differs by float32 rounding.
  The bound is tests/mpi/equiv.py's: ~1.4e-6 relative per step for a 512-row sum,
  passed on by Adam's normalised update, stays below 1e-5 relative over 10 steps
  (LOSS_RTOL). A wrongly re-sliced m or v moves the loss by far more (Adam's update of
  every affected parameter changes by O(lr) = 3e-3 at once), which the first steps
  after resuming would show.
* Another tensor or pipeline layout (reshard-tp2pp2-np1, reshard-np1-tp2pp2,
  reshard-tp2seq-pp2, reshard-interleaved-dp2tp2zero): the loaded state is the saved
  one exactly (each rank's elements are copied out of the shard files); what differs is
  the arithmetic after it. Tensor parallelism
  splits the row-parallel matmuls' C- or 4C-long dot products (64 or 256 terms) over tp
  ranks and adds the partial sums in another order, error ~sqrt(256) * eps ~ 1e-6
  relative, no larger than dp's 512-row argument above; pipeline stages run the same
  ops and only re-order the tied embedding's two gradient halves and the squared norm.
  So the same LOSS_RTOL holds (equiv.py measured tp2 x pp2 and dp2 x tp2 within 1e-7
  of one rank over 20 steps). A mis-mapped tensor (a transposed qkv head block, the
  last stage's wte taken for the first's, a replicated layernorm from the wrong rank)
  puts O(1) errors into the parameters and the loss would jump at step 11.
* Resharded into ZeRO-3 (reshard-dp2pp2zero1-dp4zero3): ZeRO-3 reduces as ZeRO-2 does,
  so from the same loaded state the two train bit for bit alike; a ZeRO-3 rank maps
  only its dp range out of the files, a ZeRO-2 rank its whole copy, so any element the
  range read got wrong shows as unequal losses.
* Export from shards (export-tp2pp2): --save adds every rank's counted runs, streamed
  to rank 0, into zeros and --export adds every shard's counted runs into zeros, so the
  files are equal byte for byte.
"""
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import fail, free_ports  # noqa: E402

WORKER, CONSOLE, CASE = sys.argv[1], sys.argv[2], sys.argv[3]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
LOSS_RTOL = 1e-5
BASE = ["model.preset=gpt2-tiny", "train.batch_size=8", "train.eval_every=0",
        "train.seed=1234", "train.warmup=5"]
TMP = tempfile.mkdtemp(prefix="weft-ckpt-")


def mesh_size(args, axis):
    for a in args:
        if a.startswith(f"mesh.{axis}="):
            return int(a.split("=")[1])
    return 1


def command(n, args, env_extra):
    env = dict(os.environ, WEFT_JOB_DIR=os.path.join(TMP, "job"), MASTER_PORT=str(free_ports(1)[0]),
               OMP_WAIT_POLICY="passive")
    env.update(env_extra)
    cmd = [WORKER] + BASE + list(args)
    if n > 1:
        fwd = []
        for k in ["WEFT_JOB_DIR", "MASTER_PORT", "OMP_WAIT_POLICY"] + list(env_extra):
            fwd += ["-x", k]
        dp = n // (mesh_size(args, "tp") * mesh_size(args, "pp") * mesh_size(args, "cp"))
        cmd = MPIRUN + ["-np", str(n)] + fwd + cmd + [f"mesh.dp={dp}"]
    return cmd, env


def run_rc(n, args, env_extra=None, expect_rc=0):
    """Run to completion; returns the exit status and stdout + stderr."""
    cmd, env = command(n, args, env_extra or {})
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    if expect_rc is not None and (p.returncode == 0) != (expect_rc == 0):
        fail(f"{' '.join(cmd)} exited {p.returncode}, want {'0' if expect_rc == 0 else 'non-zero'}",
             out)
    return p.returncode, out


def run(n, args, env_extra=None, expect_rc=0):
    """Run to completion; returns stdout + stderr."""
    return run_rc(n, args, env_extra, expect_rc)[1]


def stopped_once(rc, out):
    """Every rank stopped on an error, said once for the job: a failure (exit 1) gets rank
    0's one "training failed on every rank" line; a file the user gave that is not what
    it should be (exit 2: a corrupt shard) gets none, its error said once where it was
    found, with its fix."""
    summary = out.count("training failed on every rank")
    return summary == 0 if rc == 2 else summary == 1


def start(n, args, env_extra=None):
    cmd, env = command(n, args, env_extra or {})
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(p, timeout=120):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        fail("job did not end in time", out)
    return p.returncode, out


def run_case(cases):
    """Run the case the command line names, in TMP, which goes afterwards."""
    try:
        cases[CASE]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print("PASS", CASE)


def path(*parts):
    return os.path.join(TMP, *parts)


def losses(metrics):
    """step -> loss; a step logged twice (re-run after a resume) keeps its last loss."""
    out = {}
    if os.path.exists(metrics):
        for line in open(metrics):
            if line.strip():
                r = json.loads(line)
                out[r["step"]] = r["loss"]
    return out


def latest(ckdir):
    with open(os.path.join(ckdir, "latest")) as f:
        return f.read().strip()


def worker_pid(rank, marker):
    """pid of the worker process of world rank `rank` whose command line holds marker."""
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmd = open(d + "/cmdline", "rb").read().split(b"\0")
            env = open(d + "/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if not cmd or os.path.basename(cmd[0].decode(errors="replace")) != "worker":
            continue
        if not any(marker.encode() in c for c in cmd):
            continue
        ranks = [e for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")]
        r = int(ranks[0].split(b"=")[1]) if ranks else 0
        if r == rank:
            return int(os.path.basename(d))
    return None


def wait_for(cond, what, p=None, timeout=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return
        if p is not None and p.poll() is not None:
            fail(f"job ended before {what}", p.communicate()[0])
        time.sleep(0.02)
    if p is not None:
        p.kill()
    fail(f"timed out waiting for {what}")


def same_losses(ref, got, first, last, what, of="the uninterrupted run"):
    for s in range(first, last + 1):
        if s not in got:
            fail(f"{what}: no loss for step {s}")
        if got[s] != ref[s]:
            fail(f"{what}: step {s} loss {got[s]!r} differs from {of}'s {ref[s]!r}: not "
                 f"bit-exact")
    print(f"{what}: steps {first}..{last} equal {of} bit for bit "
          f"(step {last}: {got[last]!r})")


def close_losses(ref, got, first, last, what):
    worst = 0.0
    for s in range(first, last + 1):
        if s not in got:
            fail(f"{what}: no loss for step {s}")
        rel = abs(got[s] - ref[s]) / abs(ref[s])
        worst = max(worst, rel)
        if rel > LOSS_RTOL:
            fail(f"{what}: step {s} loss {got[s]!r} vs {ref[s]!r}: rel {rel:.2e} > {LOSS_RTOL}")
    print(f"{what}: steps {first}..{last} within {worst:.2e} relative of the uninterrupted run")


def reference(n, extra, tag, steps=20, every=10, keep=0):
    """The uninterrupted run; it also writes checkpoints (every `every` steps)."""
    ck = path(tag)
    run(n, extra + [f"train.steps={steps}", f"train.metrics={path(tag + '.jsonl')}",
                    f"train.checkpoint_dir={ck}", f"train.checkpoint_every={every}",
                    f"train.keep_checkpoints={keep}"])
    return losses(path(tag + ".jsonl")), ck


def expect_in(text, needles, what):
    for s in needles:
        if s not in text:
            fail(f"{what}: output lacks {s!r}", text)


# ---- cases ------------------------------------------------------------------------------------


def case_resume(n, extra):
    """Train 20 steps straight; then 10 + resume 10 from the step-10 checkpoint."""
    ref, ck = reference(n, extra, "ref")
    out = run(n, extra + ["train.steps=20", f"train.metrics={path('res.jsonl')}",
                          f"train.resume={ck}/step-000010", f"train.checkpoint_dir={path('ck2')}"])
    expect_in(out, ["resumed from", "step-000010 at step 10"], "resume")
    got = losses(path("res.jsonl"))
    if sorted(got) != list(range(11, 21)):
        fail(f"the resumed run logged steps {sorted(got)}, want 11..20")
    same_losses(ref, got, 11, 20, "resume")
    # The final state is the same bytes too: parameters and AdamW m, v.
    for f in os.listdir(os.path.join(ck, "step-000020")):
        if f.endswith(".bin"):
            a = open(os.path.join(ck, "step-000020", f), "rb").read()
            b = open(path("ck2", "step-000020", f), "rb").read()
            if a != b:
                fail(f"step-000020/{f} differs between the uninterrupted and the resumed run")


def case_reshard(n_from, extra_from, n_to, extra_to, what="the optimizer state"):
    ref, ck = reference(n_from, extra_from, "ref")
    out = run(n_to, extra_to + ["train.steps=20", f"train.metrics={path('res.jsonl')}",
                                f"train.resume={ck}/step-000010"])
    expect_in(out, ["resharding " + what, "at step 10"], "reshard")
    close_losses(ref, losses(path("res.jsonl")), 11, 20,
                 f"reshard {n_from} ranks {extra_from} -> {n_to} ranks {extra_to}")


def case_reshard_zero3(n_from, extra_from, n_to, extra_to):
    """A resharded resume under ZeRO-3 (each rank maps its dp range out of the saved
    shards) trains bit for bit as one under ZeRO-2 (each rank maps its whole copy), as
    ZeRO-3 and ZeRO-2 do from any start; and both continue the saved run."""
    ref, ck = reference(n_from, extra_from, "ref")
    got = {}
    for zero in (2, 3):
        out = run(n_to, extra_to + [f"optim.zero={zero}", "train.steps=20",
                                    f"train.metrics={path(f'res{zero}.jsonl')}",
                                    f"train.resume={ck}/step-000010"])
        expect_in(out, ["resharding ", "at step 10"], "reshard")
        got[zero] = losses(path(f"res{zero}.jsonl"))
    what = f"reshard {n_from} ranks {extra_from} -> {n_to} ranks {extra_to}"
    same_losses(got[2], got[3], 11, 20, what + ", ZeRO-3", of="ZeRO-2")
    close_losses(ref, got[3], 11, 20, what + ", ZeRO-3")


TP2PP2 = ["mesh.tp=2", "mesh.pp=2", "train.microbatches=2"]
HSDP = ["mesh.fsdp=2"]  # with 4 ranks: dp 4 as 2 fsdp groups of 2 (HSDP 2x2)


def case_resume_hsdp(zero):
    """HSDP 2x2: fsdp group 0 writes a dp = 2 run's files (the manifest says dp 2 x 2
    replicas), and the same mesh resumes from them bit for bit."""
    case_resume(4, HSDP + [f"optim.zero={zero}"])
    step = path("ref", "step-000010")
    man = json.load(open(os.path.join(step, "manifest.json")))
    if (man["mesh"]["dp"], man["mesh"]["replicas"], man["optimizer"]["zero"]) != (2, 2, zero):
        fail(f"HSDP manifest: mesh {man['mesh']}, zero {man['optimizer']['zero']}; want dp 2, "
             f"replicas 2, zero {zero}")
    want = {"manifest.json", "model-pp00-tp00.bin", "optim-pp00-tp00-dp00.bin",
            "optim-pp00-tp00-dp01.bin"}
    if set(os.listdir(step)) != want:
        fail(f"HSDP step-000010 holds {sorted(os.listdir(step))}, want {sorted(want)}")
    n = man["model"]["params"]
    ranges = sorted(tuple(f["range"]) for f in man["files"] if f["kind"] == "optim")
    half = (n + 1) // 2  # ZeRO's shard over the fsdp group of 2: ceil(n / 2)
    if ranges != [(0, half), (half, n)]:
        fail(f"HSDP optimizer ranges {ranges}, want [(0, {half}), ({half}, {n})]")
    print(f"HSDP 2x2 ZeRO-{zero}: manifest dp 2 x 2 replicas, optimizer ranges {ranges}")
MODEL = "the model and optimizer state"
ILV = ["mesh.pp=2", "train.schedule=interleaved", "parallel.virtual_stages=2",
       "train.microbatches=4"]


def case_export():
    """--export from a dp 2 ZeRO-1 checkpoint equals --save of the same run, and
    loads back as model.init."""
    final = path("final.bin")
    ck = path("ck")
    run(2, ["optim.zero=1", "train.steps=6", f"train.checkpoint_dir={ck}", "--save", final])
    out = run(1, [f"train.checkpoint_dir={ck}", "--export", "llmc", path("export.bin")])
    expect_in(out, ["exported", "step-000006"], "export")
    if open(final, "rb").read() != open(path("export.bin"), "rb").read():
        fail("the exported llm.c file differs from the model the run saved with --save")
    out = run(1, [f"train.resume={ck}/step-000006", "--export", "llmc", path("e2.bin")])
    run(1, ["train.steps=1", f"model.init={path('e2.bin')}"])
    print("export: llm.c file equals --save's bytes and loads as model.init")


def case_export_sharded():
    """--export from a tp2 x pp2 checkpoint (four weft shard files) equals --save of the
    same run, and loads back as model.init."""
    final, ck = path("final.bin"), path("ck")
    run(4, TP2PP2 + ["train.steps=6", f"train.checkpoint_dir={ck}", "--save", final])
    names = sorted(f for f in os.listdir(os.path.join(ck, "step-000006")) if f.startswith("model"))
    if names != [f"model-pp0{p}-tp0{t}.bin" for p in (0, 1) for t in (0, 1)]:
        fail(f"the tp2 x pp2 checkpoint holds model files {names}")
    out = run(1, [f"train.checkpoint_dir={ck}", "--export", "llmc", path("export.bin")])
    expect_in(out, ["exported", "step-000006"], "export")
    if open(final, "rb").read() != open(path("export.bin"), "rb").read():
        fail("the llm.c file exported from the shards differs from the model --save wrote")
    out = run(1, ["train.steps=1", f"model.init={path('export.bin')}"])
    expect_in(out, ["step 1/1"], "model.init of the export")
    print(f"export tp2 x pp2: {', '.join(names)} -> one llm.c file equal to --save's bytes; "
          "loads as model.init")


def case_zero3_stream():
    """ZeRO-3 writes a checkpoint's model file and --save's model from its dp shards
    streamed to one writer in 4 MiB chunks (no rank gathers the parameters): at dp 3,
    with a 65536-token vocabulary (4.3M parameters, so every shard spans two chunks and
    no shard ends at a chunk's end), both files are byte for byte what ZeRO-2 writes
    from the whole flat vector (ZeRO-3 trains bit for bit as ZeRO-2: equiv.py), and the
    manifests record the same size and checksum."""
    args = ["mesh.dp=3", "optim.bucket_mb=0", "model.vocab=65536", "train.batch_size=6",
            "train.steps=2"]
    files = {}
    for z in (3, 2):
        ck, final = path(f"ck{z}"), path(f"final{z}.bin")
        run(3, args + [f"optim.zero={z}", f"train.checkpoint_dir={ck}", "--save", final])
        step = os.path.join(ck, "step-000002")
        man = json.load(open(os.path.join(step, "manifest.json")))
        entry = [(f["bytes"], f["xxh3_64"]) for f in man["files"]
                 if f["name"] == "model-pp00-tp00.bin"]
        files[z] = (open(os.path.join(step, "model-pp00-tp00.bin"), "rb").read(),
                    open(final, "rb").read(), entry)
    (m3, s3, e3), (m2, s2, e2) = files[3], files[2]
    if len(m3) // 3 <= 4 << 20:
        fail(f"the model file is {len(m3)} bytes: a dp shard of it fits one 4 MiB chunk")
    if m3 != m2 or e3 != e2:
        fail(f"ZeRO-3's streamed model file ({len(m3)} bytes, manifest {e3}) differs from "
             f"ZeRO-2's ({len(m2)} bytes, manifest {e2})")
    if s3 != s2 or s3 != m3:
        fail("ZeRO-3's --save differs from ZeRO-2's or from the checkpoint's llm.c file")
    print(f"zero3-stream: dp 3 model file and --save ({len(m3)} bytes, xxh3 {e3[0][1]}) equal "
          "ZeRO-2's byte for byte")


def edit_manifest(step_dir, fn):
    mf = os.path.join(step_dir, "manifest.json")
    m = json.load(open(mf))
    fn({e["name"]: e for e in m["files"]})
    json.dump(m, open(mf, "w"), indent=2)


def swap_files(step_dir, a, b):
    """Swap two files and their manifest entries' sizes and checksums: each file is
    intact, its checksum right, but it sits under the other's name."""
    def swap(f):
        for k in ("bytes", "xxh3_64"):
            f[a][k], f[b][k] = f[b][k], f[a][k]
    edit_manifest(step_dir, swap)
    pa, pb = os.path.join(step_dir, a), os.path.join(step_dir, b)
    os.rename(pa, pa + ".x")
    os.rename(pb, pa)
    os.rename(pa + ".x", pb)


def case_bad_shards():
    """A tp2 x pp2 checkpoint with a missing, a corrupt or a misplaced shard file, or a
    model of another shape, is refused naming the file (or the key); every rank exits
    non-zero, none trains."""
    _, ck = reference(4, TP2PP2, "ref", steps=4, every=4)
    step = "step-000004"

    def missing(d):
        os.remove(os.path.join(d, "model-pp01-tp01.bin"))
        return "model-pp01-tp01.bin", ["cannot open", "the checkpoint is incomplete"]

    def corrupt(d):
        with open(os.path.join(d, "optim-pp01-tp00.bin"), "r+b") as h:
            h.seek(4000)  # past the header: an AdamW value
            b = h.read(1)
            h.seek(4000)
            h.write(bytes([b[0] ^ 0x01]))
        return "optim-pp01-tp00.bin", ["checksum mismatch"]

    def misplaced(d):
        swap_files(d, "model-pp00-tp00.bin", "model-pp00-tp01.bin")
        return "model-pp00-tp00.bin", ["header does not match the manifest", "tp rank 1 of 2"]

    def unlisted(d):
        mf = os.path.join(d, "manifest.json")
        m = json.load(open(mf))
        m["files"] = [e for e in m["files"] if e["name"] != "model-pp01-tp00.bin"]
        json.dump(m, open(mf, "w"), indent=2)
        return None, ["do not hold every parameter exactly once"]

    for how in (missing, corrupt, misplaced, unlisted):
        bad = path("bad-" + how.__name__)
        shutil.copytree(ck, bad)
        name, needles = how(os.path.join(bad, step))
        for n, extra in ((4, TP2PP2), (1, [])):  # the same mesh; one rank (resharding)
            rc, out = run_rc(n, extra + ["train.steps=6", f"train.resume={bad}"], expect_rc=1)
            want = needles + ([os.path.join(bad, step, name)] if name else [])
            expect_in(out, want, f"{how.__name__} on {n} rank(s)")
            if re.search(r"^step \d+/", out, re.M):
                fail(f"{how.__name__}: trained from a bad checkpoint", out)
            if not stopped_once(rc, out):
                fail(f"{how.__name__}: not every rank stopped with the error, said once", out)
        print(f"{how.__name__} shard: refused on tp2 x pp2 and on one rank: "
              f"{[l for l in out.splitlines() if needles[0] in l][0].split('] ', 1)[-1]}")
    out = run(4, TP2PP2 + ["train.steps=6", f"train.resume={ck}", "model.layers=2"], expect_rc=1)
    expect_in(out, ["incompatible", "this run has model.layers = 2"], "model shape")
    print("another model shape: refused, naming model.layers")


def kill_mid_write(n, extra, victim_rank, tmp_glob):
    ref, _ = reference(n, extra, "ref", every=20)
    ck = path("ck")
    args = extra + ["train.steps=20", "train.checkpoint_every=5", "train.keep_checkpoints=0",
                    f"train.checkpoint_dir={ck}", f"train.metrics={path('killed.jsonl')}"]
    p = start(n, args, {"WEFT_TEST_CKPT_DELAY_MS": "1500"})
    stage = os.path.join(ck, ".tmp-step-000010")
    wait_for(lambda: glob.glob(os.path.join(stage, tmp_glob)), "the step-10 checkpoint write", p)
    pid = p.pid if n == 1 else worker_pid(victim_rank, ck)
    if pid is None:
        p.kill()
        fail(f"cannot find rank {victim_rank}'s process")
    os.kill(pid, signal.SIGKILL)
    rc, out = finish(p)
    if rc == 0:
        fail("the job exited 0 after a rank was killed", out)
    if latest(ck) != "step-000005":
        fail(f"latest is {latest(ck)!r} after the kill, want step-000005")
    if os.path.exists(os.path.join(ck, "step-000010")):
        fail("a step-000010 directory exists although its write was killed")
    print(f"killed rank {victim_rank} (pid {pid}) while {stage} held {os.listdir(stage)}; "
          f"latest = step-000005")
    killed_steps = max(losses(path("killed.jsonl")))
    # The resumed run continues the same metrics file, without the steps it redoes.
    out = run(n, args + ["train.resume=auto"])
    expect_in(out, ["resumed from", "step-000005 at step 5"], "resume after the kill")
    steps = [json.loads(l)["step"] for l in open(path("killed.jsonl")) if l.strip()]
    if steps != list(range(1, 21)):
        fail(f"the metrics file after the kill (at step {killed_steps}) and the resume logs "
             f"steps {steps}, want 1..20 once each")
    same_losses(ref, losses(path("killed.jsonl")), 1, 20, "resume after SIGKILL")
    if os.path.exists(stage) or latest(ck) != "step-000020":
        fail(f"after the resumed run: stale {stage} still there or latest {latest(ck)}")


def flip_byte(f, at):
    with open(f, "r+b") as h:
        h.seek(at)
        b = h.read(1)
        h.seek(at)
        h.write(bytes([b[0] ^ 0x01]))


def case_corrupt():
    """One flipped byte in a model or optimizer file is refused on the same mesh, naming
    the file, by every rank. Under ZeRO-3 one dp rank hashes the model file and the other
    reads its range alone: a byte in either rank's range fails both (the verdict is
    agreed), whichever of them verifies."""
    _, ck = reference(2, ["optim.zero=1"], "ref", steps=6, every=3)
    _, ck3 = reference(2, ["optim.zero=3"], "ref3", steps=6, every=3)
    model = "model-pp00-tp00.bin"
    cases = [(ck, "optim.zero=1", "optim-pp00-tp00-dp01.bin", 4000),
             (ck, "optim.zero=1", model, 4000),
             (ck3, "optim.zero=3", model, 4000),  # dp rank 0's range (past the header)
             (ck3, "optim.zero=3", model, -4000)]  # dp rank 1's
    for src, zero, name, at in cases:
        bad = path(f"bad-{zero}-{name}-{at}")
        shutil.copytree(src, bad)
        f = os.path.join(bad, "step-000006", name)
        flip_byte(f, at if at >= 0 else os.path.getsize(f) + at)
        rc, out = run_rc(2, [zero, "train.steps=8", "train.resume=auto",
                             f"train.checkpoint_dir={bad}"], expect_rc=1)
        expect_in(out, [f, "checksum mismatch"], f"corrupt {name} at {zero}")
        if re.search(r"^step \d+/", out, re.M):
            fail(f"corrupt {name} at {zero}: trained from a bad checkpoint", out)
        if rc != 2 or not stopped_once(rc, out):
            fail(f"corrupt {name} at {zero}: exit {rc} (want 2: a corrupt file), or not every "
                 "rank stopped with the error, said once", out)
        print(f"corrupt {name} (byte {at}) at dp 2 {zero}: refused by every rank, naming {f}")


def case_truncated():
    _, ck = reference(1, [], "ref", steps=4, every=4)
    f = os.path.join(ck, "step-000004", "optim-pp00-tp00.bin")
    os.truncate(f, os.path.getsize(f) - 1000)
    out = run(1, ["train.steps=6", f"train.resume={ck}"], expect_rc=1)
    expect_in(out, [f, "truncated"], "truncated shard")
    print(f"truncated shard: refused, naming {f}")


def case_incompatible():
    _, ck = reference(1, [], "ref", steps=2, every=2)
    for key, value in [("model.layers", 2), ("model.d_model", 128), ("model.heads", 8),
                       ("model.vocab", 300), ("model.seq_len", 128)]:
        out = run(1, ["train.steps=4", f"train.resume={ck}", f"{key}={value}"], expect_rc=1)
        expect_in(out, ["incompatible", f"this run has {key} = {value}"], key)
        print(f"incompatible {key}: refused, naming it")


def case_schedule():
    """A checkpoint of a run with another train.steps (so another learning-rate schedule
    before it) resumes with a warning that says so; one of the same schedule, without."""
    _, ck = reference(1, [], "ref", steps=12, every=10)
    warn = "was saved by a run of train.steps=12, this run has 20"
    out = run(1, ["train.steps=20", f"train.resume={ck}/step-000010"])
    expect_in(out, [warn, "not that run's continuation"], "another train.steps")
    out = run(1, ["train.steps=12", f"train.resume={ck}/step-000010"])
    if "was saved by a run of train.steps" in out:
        fail("the same train.steps warned of another schedule", out)
    print("another train.steps: resumed with the schedule's warning; the same: without")


def case_unwritable():
    blocker = path("a-file")
    open(blocker, "w").write("not a directory\n")
    for n in (1, 2):
        metrics = path(f"m{n}.jsonl")
        cmd, env = command(n, ["train.steps=4", f"train.checkpoint_dir={blocker}/ck",
                               f"train.metrics={metrics}"], {})
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        expect_in(out, [f"train.checkpoint_dir {blocker}/ck", "Not a directory"], "unwritable")
        if losses(metrics):
            fail("training ran steps although the checkpoint directory is unusable")
        # a path whose parent is a file is the user's to fix: exit 2, the one line
        if p.returncode != 2 or out.count("weft: error:") != 1:
            fail(f"want exit 2 and the error said once; got exit {p.returncode}", out)
        print(f"unwritable checkpoint_dir on {n} rank(s): exit 2 before the first step")


def write_fail(zero, rank, needles):
    """A write that fails on one rank (disk full, injected into world rank `rank`'s write
    of step 10) stops every rank with a message; the previous checkpoint stays `latest`."""
    ck = path("ck")
    metrics = path("m.jsonl")
    t0 = time.time()
    out = run(2, [f"optim.zero={zero}", "train.steps=12", "train.checkpoint_every=5",
                  f"train.checkpoint_dir={ck}", f"train.metrics={metrics}"],
              {"WEFT_TEST_CKPT_FAIL": f"{rank}:10"}, expect_rc=1)
    expect_in(out, ["No space left on device", "the checkpoint could not be written"] + needles,
              "write failure")
    if out.count("training failed on every rank") != 1:
        fail("not every rank stopped with the error, said once", out)
    if max(losses(metrics)) != 10:
        fail(f"training went on past the failed checkpoint (last step {max(losses(metrics))})")
    if latest(ck) != "step-000005" or os.path.exists(os.path.join(ck, "step-000010")):
        fail("the failed checkpoint replaced the previous one")
    print(f"ZeRO-{zero} write failure on rank {rank}: every rank stopped at step 10 in "
          f"{time.time() - t0:.1f} s, latest = step-000005")


def case_write_fail():
    write_fail(1, 1, ["optim-pp00-tp00-dp01.bin", "failed on rank 1"])


def case_write_fail_zero3():
    """Under ZeRO-3 the model file's writer (rank 0) fails where rank 1's streamed shard
    begins: rank 1 still sends all of it, so neither waits for the other."""
    write_fail(3, 0, ["model-pp00-tp00.bin", "injected by WEFT_TEST_CKPT_FAIL"])


def case_errors_once():
    """At np 4 a bad checkpoint (or model.init, train.metrics, train.trace, data) is one
    error line naming it, not one per rank, before the first step; the job exits non-zero
    without the coordinator having to abort a rank left waiting. A mistake in the input
    (exit 2) is that line alone, with its fix; any other failure (an I/O error, exit 1)
    adds one line saying every rank stopped."""
    _, ck = reference(1, [], "ref", steps=2, every=2)
    bad_ck = path("bad-ck")
    shutil.copytree(ck, bad_ck)
    bad_model = os.path.join(bad_ck, "step-000002", "model-pp00-tp00.bin")
    with open(bad_model, "r+b") as h:
        h.seek(4000)
        b = h.read(1)
        h.seek(4000)
        h.write(bytes([b[0] ^ 0x01]))
    blocker = path("a-file")
    open(blocker, "w").write("not a directory\n")
    shard = path("bad-token.bin")  # an llm.c shard: 256 int32 header, then uint16 tokens
    with open(shard, "wb") as h:
        h.write(struct.pack("<256i", 20240520, 1, 1000, *([0] * 253)))
        h.write(struct.pack("<1000H", *[300 if i == 500 else i % 200 for i in range(1000)]))
    cases = [
        ([f"data.path={shard}"], [shard, "token 300 at index 500"]),
        ([f"train.resume={path('nope')}"], [path("nope"), "not a checkpoint"]),
        ([f"train.checkpoint_dir={blocker}/ck"], [f"{blocker}/ck", "Not a directory"]),
        ([f"train.resume={bad_ck}"], [bad_model, "checksum mismatch"]),
        ([f"train.resume={bad_ck}"] + TP2PP2, [bad_model, "checksum mismatch"]),
        # model.init is checked whole by rank 0 before training starts: its one line is
        # the whole report (there is no training to fail on every rank)
        ([f"model.init={blocker}"], [blocker, "not model weights weft can read"]),
        ([f"train.metrics={blocker}/m.jsonl"], [f"{blocker}/m.jsonl", "cannot open"]),
        ([f"train.trace={blocker}/t.json"], [f"train.trace={blocker}/t.json", "not a directory"]),
        # (a missing parent is created: only one that cannot be is an error)
        ([f"train.trace={blocker}/sub/t.json"], [f"{blocker}/sub", "Not a directory"]),
    ]
    for args, needles in cases:
        cmd, env = command(4, ["train.steps=4"] + args, {})
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        out, rc = p.stdout + p.stderr, p.returncode
        errors = [l for l in out.splitlines() if l.startswith(("[weft E", "weft: error"))]
        named = [l for l in errors if all(n in l for n in needles)]
        summary = rc == 2 or "training failed on every rank" in errors[-1]
        if rc == 0 or len(named) != 1 or len(errors) != (1 if rc == 2 else 2) or not summary:
            fail(f"{' '.join(args)} at np 4: exit {rc}; want one error naming {needles}, and for "
                 f"a failure that is not the input's (exit 1) one 'training failed on every "
                 f"rank'; got {len(errors)} error lines", out)
        if re.search(r"^step \d+/", out, re.M):
            fail(f"{' '.join(args)} at np 4: the error came after training had started", out)
        print(f"np 4, {' '.join(args)}: exit {rc}, {len(errors)} error lines: "
              f"{named[0].split('] ', 1)[-1][:100]}")


def stop_and_resume(n, how):
    """Stop a 40-step run by SIGTERM to one rank or the console's stop; it must
    checkpoint at the agreed boundary, exit 0, and resume bit-exactly."""
    steps = 40
    ref, _ = reference(n, [], "ref", steps=steps, every=steps)
    ck = path("ck")
    metrics = path("stopped.jsonl")
    args = [f"train.steps={steps}", f"train.checkpoint_dir={ck}", f"train.metrics={metrics}"]
    p = start(n, args)
    wait_for(lambda: len(losses(metrics)) >= 3, "step 3", p)
    if how == "sigterm":
        pid = p.pid if n == 1 else worker_pid(n - 1, ck)
        os.kill(pid, signal.SIGTERM)
    else:
        env = dict(os.environ, WEFT_JOB_DIR=os.path.join(TMP, "job"))
        c = subprocess.run([CONSOLE, "checkpoint"], env=env, capture_output=True, text=True,
                           timeout=30)
        if c.returncode != 0:
            fail("coordinator checkpoint failed", c.stdout + c.stderr)
        wait_for(lambda: glob.glob(os.path.join(ck, "step-*")), "the requested checkpoint", p)
        asked = sorted(glob.glob(os.path.join(ck, "step-*")))[0]
        c = subprocess.run([CONSOLE, "stop"], env=env, capture_output=True, text=True,
                           timeout=30)
        if c.returncode != 0:
            fail("coordinator stop failed", c.stdout + c.stderr)
    rc, out = finish(p)
    if rc != 0:
        fail(f"the stopped job exited {rc}, want 0", out)
    last = max(losses(metrics))
    if last >= steps:
        fail(f"the job ran to the end (step {last}) before the stop took effect")
    if latest(ck) != f"step-{last:06d}":
        fail(f"latest is {latest(ck)}, want the stop step {last}", out)
    if how == "console":
        print(f"console checkpoint wrote {os.path.basename(asked)}")
    print(f"{how} on {n} rank(s): stopped after step {last}, checkpointed, exit 0")
    out = run(n, args[:-1] + [f"train.metrics={path('resumed.jsonl')}", "train.resume=auto"])
    same_losses(ref, losses(path("resumed.jsonl")), last + 1, steps, f"resume after {how}")


CASES = {
    "resume-np1": lambda: case_resume(1, []),
    "resume-dp2": lambda: case_resume(2, []),
    "resume-dp2-zero1": lambda: case_resume(2, ["optim.zero=1"]),
    "reshard-dp2-dp1": lambda: case_reshard(2, [], 1, []),
    # context parallelism: cp ranks hold the same parameters and ZeRO shards over dp x cp,
    # so a cp mesh saves and resumes like a dp mesh of dp x cp ranks
    "resume-cp2-zero1": lambda: case_resume(2, ["mesh.cp=2", "optim.zero=1"]),
    "reshard-cp2zero-np1": lambda: case_reshard(2, ["mesh.cp=2", "optim.zero=1"], 1, []),
    "reshard-np1-cp4": lambda: case_reshard(1, [], 4, ["mesh.cp=4"]),
    "schedule": case_schedule,
    "reshard-dp2zero-dp4zero": lambda: case_reshard(2, ["optim.zero=1"], 4, ["optim.zero=1"]),
    "reshard-dp2zero-dp2": lambda: case_reshard(2, ["optim.zero=1"], 2, []),
    "reshard-dp1-dp2zero": lambda: case_reshard(1, [], 2, ["optim.zero=1"]),
    "resume-tp2pp2": lambda: case_resume(4, TP2PP2),
    "resume-dp2pp2-zero1": lambda: case_resume(4, ["mesh.pp=2", "optim.zero=1",
                                                   "train.microbatches=2"]),
    "reshard-tp2pp2-np1": lambda: case_reshard(4, TP2PP2, 1, [], MODEL),
    # ZeRO-2 saves the same optimizer shards as ZeRO-1 (its gradients are not state)
    "resume-dp2-zero2": lambda: case_resume(2, ["optim.zero=2"]),
    "resume-dp2pp2-zero2": lambda: case_resume(4, ["mesh.pp=2", "optim.zero=2",
                                                   "train.microbatches=2"]),
    "reshard-dp2zero2-dp2zero1": lambda: case_reshard(2, ["optim.zero=2"], 2, ["optim.zero=1"]),
    "reshard-dp4zero2-np1": lambda: case_reshard(4, ["optim.zero=2"], 1, []),
    # ZeRO-3 streams its parameter shards into one model file and writes the same
    # optimizer shards
    "resume-dp2-zero3": lambda: case_resume(2, ["optim.zero=3"]),
    "resume-dp2pp2-zero3": lambda: case_resume(4, ["mesh.pp=2", "optim.zero=3",
                                                   "train.microbatches=2"]),
    "reshard-dp4zero3-np1": lambda: case_reshard(4, ["optim.zero=3"], 1, []),
    # under the interleaved schedule (buckets end with their model chunk): bit-exact too
    "resume-dp2pp2-interleaved-zero2": lambda: case_resume(4, ILV + ["optim.zero=2"]),
    "resume-dp2pp2-interleaved-zero3": lambda: case_resume(4, ILV + ["optim.zero=3"]),
    "reshard-dp2zero3-dp4zero1": lambda: case_reshard(2, ["optim.zero=3"], 4, ["optim.zero=1"]),
    "reshard-dp2pp2zero1-dp4zero3": lambda: case_reshard_zero3(
        4, ["mesh.pp=2", "train.microbatches=2", "optim.zero=1"], 4, []),
    "reshard-np1-dp2tp2zero2": lambda: case_reshard(1, [], 4, ["mesh.tp=2", "optim.zero=2"],
                                                    MODEL),
    "reshard-np1-tp2pp2": lambda: case_reshard(1, [], 4, TP2PP2, MODEL),
    "reshard-tp2seq-pp2": lambda: case_reshard(2, ["mesh.tp=2", "parallel.sequence=true"], 2,
                                               ["mesh.pp=2", "train.microbatches=2"], MODEL),
    "reshard-interleaved-dp2tp2zero": lambda: case_reshard(
        2, ["mesh.pp=2", "train.schedule=interleaved", "parallel.virtual_stages=2",
            "train.microbatches=4"], 4, ["mesh.tp=2", "optim.zero=1"], MODEL),
    # HSDP 2x2: fsdp group 0 writes a dp = 2 ZeRO run's files; others reshard them
    "resume-hsdp2x2-zero2": lambda: case_resume_hsdp(2),
    "resume-hsdp2x2-zero3": lambda: case_resume_hsdp(3),
    "reshard-hsdp2x2zero3-np1": lambda: case_reshard(4, HSDP + ["optim.zero=3"], 1, []),
    "reshard-np1-hsdp2x2zero1": lambda: case_reshard(1, [], 4, HSDP + ["optim.zero=1"]),
    "reshard-hsdp2x2zero2-dp2tp2zero3": lambda: case_reshard(
        4, HSDP + ["optim.zero=2"], 4, ["mesh.tp=2", "optim.zero=3"], MODEL),
    # HSDP with tp or pp on the saving side (8 ranks): each (pp, tp) shard's fsdp group 0
    # writes its files; the same mesh resumes bit for bit, one rank reshards them
    "resume-hsdp2x2pp2-zero3": lambda: case_resume(8, HSDP + ["mesh.pp=2", "optim.zero=3",
                                                              "train.microbatches=2"]),
    "reshard-hsdp2x2tp2zero2-np1": lambda: case_reshard(
        8, HSDP + ["mesh.tp=2", "optim.zero=2"], 1, [], MODEL),
    "export": case_export,
    "export-tp2pp2": case_export_sharded,
    "zero3-stream": case_zero3_stream,
    "bad-shards-tp2pp2": case_bad_shards,
    "kill-np1": lambda: kill_mid_write(1, [], 0, ".model-pp00-tp00.bin.tmp.*"),
    "kill-dp2-zero1": lambda: kill_mid_write(2, ["optim.zero=1"], 1,
                                             ".optim-pp00-tp00-dp01.bin.tmp.*"),
    "corrupt": case_corrupt,
    "truncated": case_truncated,
    "incompatible": case_incompatible,
    "unwritable": case_unwritable,
    "write-fail": case_write_fail,
    "write-fail-zero3": case_write_fail_zero3,
    "errors-once-np4": case_errors_once,
    "sigterm-np1": lambda: stop_and_resume(1, "sigterm"),
    "sigterm-dp2": lambda: stop_and_resume(2, "sigterm"),
    "console-dp2": lambda: stop_and_resume(2, "console"),
}

if __name__ == "__main__":
    run_case(CASES)
