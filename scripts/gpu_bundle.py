#!/usr/bin/env python3
"""Pack what a bare GPU machine lacks to run weft's GPU check (scripts/gpu-bundle.sh).

    scripts/gpu-bundle.sh DIR [--build BUILDDIR] [--no-build]

Run on a Debian 12 development machine from the repository. It builds (BUILDDIR, by
default ./build-release: a release build with -Dcuda=enabled, configured when missing;
--build build reuses the CI build's artefacts) the targets the check runs, and writes to
DIR, which it empties first:

  build/...            weft's binaries at their build-tree paths (worker, coordinator, the
                       CUDA and NCCL modules, tests/gpu/gpu_probe, test_gpu_kernels,
                       test_cudnn_graphs, tests/collectives/test_nccl_gpu, bench/kernels,
                       gemm_gpu and lt_bias16),
                       stripped; the binaries find the modules relative to themselves
                       (runtime/module.c)
  bin/                 Open MPI's mpirun (orterun) and orted
  lib/                 every Debian library those link (Open MPI, PMIx, hwloc, libevent,
                       libuv, libyaml, jansson, xxHash, PCRE2, protobuf-c, OpenBLAS,
                       libedit, libgfortran, libstdc++, ...), with lib/openmpi3 (Open MPI's
                       components), lib/pmix (PMIx's) and lib/hwloc (hwloc's PCI plugin)
  share/, etc/         Open MPI's and PMIx's help texts and default parameters
  env.sh               `. DIR/env.sh`: OPAL_*/PMIX_* relocation, PATH, the CUDA library
                       folders (LD_LIBRARY_PATH) found on the machine; unpacks lib/*.xz
  MANIFEST             every file, its size and where it came from; what was left out

Every ELF file gets an $ORIGIN-relative DT_RPATH to DIR/lib (patchelf), so the binaries
need nothing of the host but glibc (libc, libm, libdl, libpthread, librt, ld.so), the
NVIDIA driver and CUDA's libraries (cudart, cuBLASLt, NCCL, found at run time in
/usr/local/cuda or PyTorch's wheels: env.sh). Files over 8 MiB (OpenBLAS, ~36 MiB with
its kernels for every x86 CPU) are stored xz-compressed and unpacked by env.sh, which
keeps the bundle under its 48 MiB budget. Open MPI components that need a fabric library
(UCX, OFI, verbs, PSM) or OpenSHMEM are left out: one GPU machine needs shared memory and
TCP. Prints the bundle's size and contents; exits 1 when it is over 48 MiB.
"""
import argparse
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = 48 << 20
COMPRESS_OVER = 8 << 20
TARGETS = ["worker/worker", "coordinator/coordinator", "kernels/cuda/libweft_cuda.so",
           "collectives/nccl/libweft_nccl.so", "tests/gpu/gpu_probe",
           "tests/gpu/test_gpu_kernels", "tests/gpu/test_cudnn_graphs",
           "tests/gpu/test_attention_block",
           "tests/collectives/test_nccl_gpu", "bench/kernels", "bench/gemm_gpu", "bench/lt_bias16"]
# glibc's own libraries: the GPU machine's (newer) glibc provides them.
GLIBC = {"linux-vdso.so.1", "ld-linux-x86-64.so.2", "libc.so.6", "libm.so.6", "libdl.so.2",
         "libpthread.so.0", "librt.so.1", "libresolv.so.2", "libutil.so.1", "libanl.so.1",
         "libmvec.so.1", "libnsl.so.1"}
CUDA_DIRS = ("/usr/local/cuda",)
# Libraries a component may need beyond the binaries' own closure and still be shipped.
COMPONENT_EXTRAS = re.compile(r"^lib(mca_common_(sm|monitoring|ompio)|pmix|munge|pciaccess|z)\.")
OMPI_LIBDIR = "/usr/lib/x86_64-linux-gnu/openmpi/lib"
OMPI_COMPONENTS = OMPI_LIBDIR + "/openmpi3"
PMIX_ROOT = "/usr/lib/x86_64-linux-gnu/pmix2"
HWLOC_PLUGINS = ["/usr/lib/x86_64-linux-gnu/hwloc/hwloc_pci.so"]
LD_SO = "/lib64/ld-linux-x86-64.so.2"


def die(msg):
    sys.exit(f"gpu-bundle: {msg}")


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return p.stdout


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def needed(path):
    """(soname, resolved path or None) of everything `path` loads, transitively: the
    dynamic loader's own answer (ldd without its shell wrapper, 10x faster)."""
    out = subprocess.run([LD_SO, "--list", os.path.abspath(path)], capture_output=True,
                         text=True).stdout
    deps = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(\S+)", line)
        if m:
            deps.append((m.group(1), None if m.group(2) == "not" else m.group(2)))
    return deps


def host_dep(soname, path):
    """Whether the bundle must carry this dependency."""
    if soname in GLIBC or soname.startswith("ld-linux"):
        return False
    return not (path and os.path.realpath(path).startswith(CUDA_DIRS))


def build(builddir):
    env = dict(os.environ, PATH="/usr/local/cuda/bin:" + os.environ.get("PATH", ""))
    if not os.path.exists(os.path.join(builddir, "build.ninja")):
        print(f"gpu-bundle: configuring {builddir} (release, CUDA modules)")
        sh(["meson", "setup", builddir, "--buildtype=release", "-Dcuda=enabled"], cwd=ROOT,
           env=env)
    config = open(os.path.join(builddir, "wf_build_config.h")).read()
    if "#define WF_HAVE_CUDA 1" not in config:
        die(f"{builddir} was configured without the CUDA modules: reconfigure it with "
            "-Dcuda=enabled (nvcc from /usr/local/cuda/bin)")
    jobs = os.environ.get("WEFT_BUNDLE_JOBS", "2")
    print(f"gpu-bundle: ninja -C {builddir} -j{jobs} (the {len(TARGETS)} targets the check runs)")
    sh(["ninja", "-C", builddir, f"-j{jobs}"] + TARGETS, cwd=ROOT, env=env)


class Bundle:
    def __init__(self, out):
        self.out = out
        self.files = {}  # bundle path -> host source
        self.left_out = []

    def put(self, src, rel, mode=None):
        dst = os.path.join(self.out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.realpath(src), dst)
        st = os.stat(os.path.realpath(src))
        os.chmod(dst, mode if mode is not None else stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
        self.files[rel] = src
        return dst

    def elf_files(self):
        return [r for r in self.files if is_elf(os.path.join(self.out, r))]


def add_weft(b, builddir):
    for t in TARGETS:
        dst = b.put(os.path.join(builddir, t), os.path.join("build", t))
        sh(["strip", "--strip-debug" if t.endswith(".so") else "--strip-unneeded", dst])


def add_ompi(b):
    """mpirun, orted, the components whose libraries the bundle carries, help texts."""
    b.put(shutil.which("orterun") or "/usr/bin/orterun", "bin/mpirun")
    b.put("/usr/bin/orted", "bin/orted")
    for d, sub in ((OMPI_COMPONENTS, "lib/openmpi3"), (PMIX_ROOT + "/lib/pmix", "lib/pmix")):
        for f in sorted(os.listdir(d)):
            if f.endswith(".so"):
                b.put(os.path.join(d, f), os.path.join(sub, f))
    for p in HWLOC_PLUGINS:
        if os.path.exists(p):
            b.put(p, "lib/hwloc/" + os.path.basename(p))
    for d, sub in (("/usr/share/openmpi", "share/openmpi"),
                   (PMIX_ROOT + "/share/pmix", "share/pmix")):
        for f in sorted(os.listdir(d)):
            if f.startswith("help-") or f == "amca-param-sets":
                src = os.path.join(d, f)
                if os.path.isfile(src):
                    b.put(src, os.path.join(sub, f), 0o644)
    for f in ("openmpi-mca-params.conf", "openmpi-default-hostfile"):
        b.put(os.path.join("/etc/openmpi", f), "etc/openmpi/" + f, 0o644)


def prune_components(b, base):
    """Drop components (lib/openmpi3, lib/pmix, lib/hwloc) needing what the binaries do
    not, beyond COMPONENT_EXTRAS; returns the extra libraries the kept ones need."""
    extra = {}
    for rel in [r for r in b.files if r.startswith(("lib/openmpi3/", "lib/pmix/", "lib/hwloc/"))]:
        deps = [(s, p) for s, p in needed(os.path.join(b.out, rel)) if host_dep(s, p)]
        more = {s: p for s, p in deps if s not in base}
        bad = sorted(s for s in more if not COMPONENT_EXTRAS.match(s) or not more[s])
        if bad:
            os.unlink(os.path.join(b.out, rel))
            del b.files[rel]
            b.left_out.append(f"{rel}: needs {', '.join(bad)}")
        else:
            extra.update(more)
    return extra


def add_libraries(b):
    """Every library the ELF files load that the host's glibc and CUDA do not give."""
    libs, missing = {}, []
    for rel in b.elf_files():
        for s, p in needed(os.path.join(b.out, rel)):
            if not host_dep(s, p):
                continue
            if p is None:
                missing.append(f"{rel} needs {s}, which does not resolve here")
            else:
                libs[s] = p
    if missing:
        die("\n".join(missing))
    return libs


def rpath_for(rel):
    depth = rel.count("/")
    up = "/".join([".."] * (depth - 1)) if rel.startswith("lib/") else "/".join([".."] * depth)
    if rel.startswith("lib/"):
        return "$ORIGIN" if depth == 1 else "$ORIGIN/" + up
    return "$ORIGIN/" + up + "/lib"


def patch_rpaths(b):
    """An $ORIGIN-relative DT_RPATH (not DT_RUNPATH, which would not cover the
    dependencies of dependencies) on every ELF file, libraries included: each resolves
    inside the bundle however it is loaded, which gpu-check.sh verifies file by file."""
    for rel in b.elf_files():
        sh(["patchelf", "--force-rpath", "--set-rpath", rpath_for(rel),
            os.path.join(b.out, rel)])


def compress_large(b):
    for rel in sorted(b.files):
        path = os.path.join(b.out, rel)
        if os.path.getsize(path) > COMPRESS_OVER:
            # preset 1: OpenBLAS 36 -> 8 MiB in a few seconds (6 saves 4 MiB more, 4x slower)
            with open(path, "rb") as f, lzma.open(path + ".xz", "wb", preset=1) as g:
                shutil.copyfileobj(f, g)
            shutil.copymode(path, path + ".xz")
            os.unlink(path)
            b.files[rel + ".xz"] = b.files.pop(rel) + " (xz; env.sh unpacks it)"


def write_env(b):
    src = os.path.join(ROOT, "scripts", "gpu-bundle-env.sh")
    b.put(src, "env.sh", 0o644)


def write_manifest(b):
    total = 0
    lines = ["# weft GPU bundle: path, bytes, source on the machine that made it"]
    for rel in sorted(b.files):
        size = os.path.getsize(os.path.join(b.out, rel))
        total += size
        lines.append(f"{rel}\t{size}\t{b.files[rel]}")
    lines.append("# left out (a fabric or OpenSHMEM library the bundle does not carry):")
    lines += ["#   " + l for l in b.left_out]
    with open(os.path.join(b.out, "MANIFEST"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return total + os.path.getsize(os.path.join(b.out, "MANIFEST"))


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("dir")
    a.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    a.add_argument("--no-build", action="store_true",
                   help="take the targets as they are in BUILDDIR (a test's build tree)")
    o = a.parse_args()
    for tool in ("patchelf", "strip", "meson", "ninja"):
        if not shutil.which(tool):
            die(f"{tool} is not installed (apt-get install patchelf binutils meson ninja-build)")
    builddir = os.path.abspath(o.build)
    if not o.no_build:
        build(builddir)
    for t in TARGETS:
        if not os.path.exists(os.path.join(builddir, t)):
            die(f"{builddir} has no {t}: build it (with -Dcuda=enabled)")
    out = os.path.abspath(o.dir)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    b = Bundle(out)
    add_weft(b, builddir)
    add_ompi(b)
    base = {s for rel in b.elf_files() if not rel.startswith(("lib/",))
            for s, p in needed(os.path.join(out, rel)) if host_dep(s, p)}
    prune_components(b, base)
    for soname, path in sorted(add_libraries(b).items()):
        b.put(path, "lib/" + soname)
    patch_rpaths(b)
    compress_large(b)
    write_env(b)
    total = write_manifest(b)
    for rel in sorted(b.files):
        print(f"  {os.path.getsize(os.path.join(out, rel)):>10}  {rel}")
    print(f"gpu-bundle: {out}: {len(b.files)} files, {total / 2**20:.1f} MiB "
          f"(budget {BUDGET >> 20} MiB); left out: {len(b.left_out)} Open MPI/PMIx component(s) "
          "needing fabric or OpenSHMEM libraries (MANIFEST)")
    if total > BUDGET:
        die(f"the bundle is {total / 2**20:.1f} MiB, over its {BUDGET >> 20} MiB budget")


if __name__ == "__main__":
    main()
