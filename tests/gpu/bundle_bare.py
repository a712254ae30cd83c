#!/usr/bin/env python3
"""The GPU bundle needs nothing of the host but glibc, the driver and CUDA's libraries.

    bundle_bare.py SOURCE_ROOT BUILD_ROOT

Makes a bundle from BUILD_ROOT's artefacts (scripts/gpu-bundle.sh --build BUILD_ROOT
--no-build: no compiling, a copy and a patch of what the build has), then runs
scripts/gpu-check.sh from it in a private mount namespace (unshare -m) where every
Debian library the bundle carries is hidden: an empty file is bind-mounted over each
one's file on the host, and empty folders over Open MPI's, PMIx's, hwloc's and
OpenBLAS's library folders, Open MPI's help texts and configuration, and over mpirun and
orted. A binary that still reached for the host's copy would find an empty file and fail
to load. Left visible are the libraries the host tools the check itself runs need (bash,
python3 and its extension modules, coreutils), which a GPU machine has of its own; every
binary of the bundle resolves to the bundle's own copies even then (gpu-check.sh's
environment part checks each one with ld.so --list and fails on a host path).

Inside, first a control: the build tree's own worker, which links the host's libraries,
must fail to start there; the bundle's must start. Then the check: its environment part
passes (libraries, the bundle's mpirun training 2 CPU ranks), the GPU parts report
"no GPU", the kernel table part runs bench/kernels on the CPU, and gpu-check.sh exits 0,
in under 8 minutes, leaving a valid results file (bench/results.py) that names the
build tree's build id and all seven parts. On a machine with a GPU the GPU parts must
pass instead.
"""
import glob
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

SRC, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
HIDE_DIRS = ["/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/x86_64-linux-gnu/pmix2",
             "/usr/lib/x86_64-linux-gnu/hwloc", "/usr/lib/x86_64-linux-gnu/openblas-pthread",
             "/usr/share/openmpi", "/etc/openmpi"]
HIDE_FILES = ["/usr/bin/orterun", "/usr/bin/orted"]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def ldd_paths(files):
    paths = set()
    for f in files:
        out = subprocess.run(["ldd", f], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                paths.add(os.path.realpath(parts[1].split("(")[0].strip()))
    return paths


def host_tools():
    """What the check's own tools load: they come with the GPU machine, not the bundle.
    (mount(8) is not among them: the mounts are made by system call.)"""
    tools = [os.path.realpath(sys.executable)]
    tools += [os.path.realpath(p) for p in ("/bin/bash", "/bin/sh", "/usr/bin/timeout",
                                            "/usr/bin/env", "/usr/bin/dirname")]
    tools += glob.glob(os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload", "*.so"))
    return ldd_paths(tools)


def hidden_files(bundle):
    """The host files the bundle's lib/ was copied from, less what host tools need."""
    carried = set()
    with open(os.path.join(bundle, "MANIFEST")) as f:
        for line in f:
            if line.startswith("lib/"):
                src = line.rstrip("\n").split("\t")[2].split(" (xz")[0]
                carried.add(os.path.realpath(src))
    visible = carried & host_tools()
    return sorted(carried - visible), sorted(visible)


def main():
    for tool in ("unshare", "mount", "patchelf"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            fail(f"{tool} is needed (scripts/setup.sh installs patchelf)")
    with tempfile.TemporaryDirectory() as tmp:
        bundle, out = os.path.join(tmp, "bundle"), os.path.join(tmp, "out")
        t0 = time.monotonic()
        p = subprocess.run(["bash", os.path.join(SRC, "scripts", "gpu-bundle.sh"), bundle,
                            "--build", BUILD, "--no-build"], capture_output=True, text=True)
        print(p.stdout.splitlines()[-1] if p.stdout else "", p.stderr[-2000:])
        if p.returncode != 0:
            fail("gpu-bundle.sh failed")
        print(f"bundle made in {time.monotonic() - t0:.0f} s")
        files, visible = hidden_files(bundle)
        empty_dir, empty_file = os.path.join(tmp, "empty"), os.path.join(tmp, "empty.so")
        os.mkdir(empty_dir)
        open(empty_file, "w").close()
        # Files first: some lie in the folders hidden after them.
        mounts = [(empty_file, f) for f in files + HIDE_FILES if os.path.exists(f)]
        mounts += [(empty_dir, d) for d in HIDE_DIRS if os.path.isdir(d)]
        print(f"hidden: {len(mounts)} host files and folders; left visible for the host tools: "
              f"{', '.join(os.path.basename(v) for v in visible) or 'none'}")
        spec = os.path.join(tmp, "inside.json")
        with open(spec, "w") as f:
            json.dump({"mounts": mounts, "bundle": bundle, "out": out}, f)
        t0 = time.monotonic()
        p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable,
                            os.path.abspath(__file__), SRC, BUILD, "--inside", spec],
                           capture_output=True, text=True, timeout=560)
        wall = time.monotonic() - t0
        print(p.stdout[-6000:], p.stderr[-3000:])
        if p.returncode in (3, 4, 5):
            fail("setting up the namespace or its control failed (see above)")
        path = os.path.join(out, "gpu-report.json")
        if not os.path.exists(path):
            fail(f"no report: the namespace's script exited {p.returncode}")
        report = json.load(open(path))
        check(report, p.returncode, wall, out)


def inside(spec):
    """In the namespace: the bind mounts (by the mount system call: mount(8) itself links
    libraries being hidden), the control, then gpu-check.sh in place of this process."""
    import ctypes
    with open(spec) as f:
        s = json.load(f)
    libc = ctypes.CDLL(None, use_errno=True)
    for src, dst in s["mounts"]:
        if libc.mount(src.encode(), dst.encode(), None, 4096, None) != 0:  # MS_BIND
            print(f"mount --bind {src} {dst}: {os.strerror(ctypes.get_errno())}")
            sys.exit(5)
    rc = subprocess.run([os.path.join(BUILD, "worker", "worker"), "--version"],
                        capture_output=True).returncode
    if rc == 0:
        print("CONTROL FAILED: the build tree's worker starts with the host libraries hidden")
        sys.exit(3)
    b = s["bundle"]  # env.sh unpacks the libraries stored compressed
    if subprocess.run(["bash", "-c", f"set -e; . '{b}/env.sh'; '{b}/build/worker/worker' "
                       "--version"]).returncode != 0:
        sys.exit(4)
    print(f"control: the build tree's worker does not start here (exit {rc}); the bundle's does")
    sys.stdout.flush()
    os.chdir(SRC)
    os.environ["WEFT_BUNDLE"] = s["bundle"]
    os.execvp("bash", ["bash", "scripts/gpu-check.sh", s["out"]])


def check_results(folder):
    """The check's results file (bench/results.py's): valid, naming the build the bundle
    was made from (the build tree's own `worker --version`) and every part."""
    sys.path.insert(0, os.path.join(SRC, "bench"))
    import results
    files = sorted(glob.glob(os.path.join(folder, "*-gpu-check.json")))
    if len(files) != 1:
        fail(f"{folder}: {len(files)} gpu-check results files, want 1")
    rec = json.load(open(files[0]))
    try:
        results.validate(rec, files[0])
    except ValueError as e:
        fail(str(e))
    want = results.build_id(os.path.join(BUILD, "worker", "worker"))
    if rec["weft"] != want:
        fail(f"the results file names weft {rec['weft']}, the build is {want}")
    if not want["commit"] and os.path.exists(os.path.join(SRC, ".git")):
        fail(f"a git checkout's build has no build id: {want}")
    parts = [p["part"] for p in rec["figures"]["parts"]]
    if len(parts) != 7 or rec["figures"]["result"] != "pass":
        fail(f"the results file has parts {parts}, result {rec['figures']['result']}")
    print(f"ok: {os.path.basename(files[0])}: weft {want['commit']}"
          f"{'-dirty' if want['dirty'] else ''}, {len(parts)} parts, "
          f"machine {rec['machine']['gpu']}")


def check(report, rc, wall, out):
    parts = {x["part"]: x for x in report["parts"]}
    gpu = report["environment"]["status"] == "gpu"
    want = "pass" if gpu else "no GPU"
    for name, x in parts.items():
        print(f"  {name}: {x['status']} ({x['seconds']:.0f} s): {x['reason'][:200]}")
    if rc != 0:
        fail(f"gpu-check.sh exited {rc}")
    if parts["environment"]["status"] != "pass" or report["library_problems"]:
        fail("the environment part did not pass: " + parts["environment"]["reason"])
    for name in ("kernels", "training", "GPT-2 vs PyTorch", "Llama vs PyTorch", "kernel table",
                 "max-autotune"):
        if parts[name]["status"] != want:
            fail(f"{name}: {parts[name]['status']}, expected {want}")
    if not gpu and not report.get("kernel_tables", {}).get("cpu (toy shape)"):
        fail("bench/kernels did not run on the CPU")
    check_results(os.path.join(out, "results"))
    if wall > 480:
        fail(f"the check took {wall:.0f} s, over 8 minutes")
    print(f"ok: gpu-check.sh from the bundle with the host's Debian libraries hidden: "
          f"{'all parts pass' if gpu else 'GPU parts: no GPU, CPU parts pass'}, {wall:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[3] == "--inside":
        inside(sys.argv[4])
    main()
