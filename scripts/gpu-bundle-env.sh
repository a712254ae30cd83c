# env.sh of a weft GPU bundle (scripts/gpu-bundle.sh copies this file there): source it
# with bash on the machine that runs the bundle,
#
#     . ./gpu-bundle/env.sh
#
# then the bundle's binaries run as they would from a build tree, e.g.
# `gpu-bundle/build/worker/worker runtime.device=cuda` or `mpirun -np 2 gpu-bundle/build/...`.
# It sets:
#  - OPAL_* and PMIX_*: Open MPI and PMIx relocated into the bundle (their components,
#    help texts and default parameters), PATH (the bundle's mpirun and orted first) and
#    HWLOC_PLUGINS_PATH (hwloc's PCI plugin, for binding near the GPU);
#  - LD_LIBRARY_PATH: the folders of CUDA's libraries on this machine, which the GPU
#    modules load (libcudart.so.13, libcublasLt.so.13, libnccl.so.2; cuDNN too): every
#    lib folder of the NVIDIA wheels of the python3 on PATH (PyTorch's), then
#    /usr/local/cuda's. Wheels first, so a PyTorch started from this shell loads the
#    libraries it ships with. WEFT_CUDA_LIBS (colon-separated) replaces the search.
# It also unpacks the libraries the bundle stores xz-compressed (once). The bundle's own
# libraries need no variable: every binary carries an $ORIGIN-relative rpath.

weft_bundle="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# python3 does it all (no mv, chmod: coreutils may link libraries the bundle carries).
weft_unpack() {
  python3 - "$weft_bundle"/lib/*.xz <<'PY' || { echo "env.sh: cannot unpack lib/*.xz (needs python3)" >&2; return 1; }
import lzma, os, shutil, sys
for f in sys.argv[1:]:
    dst = f[:-3]
    if not f.endswith(".xz") or not os.path.exists(f) or os.path.exists(dst):
        continue
    tmp = f"{dst}.tmp.{os.getpid()}"
    with lzma.open(f) as s, open(tmp, "wb") as d:
        shutil.copyfileobj(s, d)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dst)
PY
}

weft_cuda_libs() {
  if [ -n "${WEFT_CUDA_LIBS:-}" ]; then
    echo "$WEFT_CUDA_LIBS"
    return
  fi
  local dirs
  dirs=$(python3 - 2>/dev/null <<'PY'
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
roots = list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []
found = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "*", "*", "lib"))):
        if glob.glob(os.path.join(d, "*.so*")) and d not in found:
            found.append(d)
print(":".join(found))
PY
)
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    [ -d "$d" ] && dirs="${dirs:+$dirs:}$d"
  done
  echo "$dirs"
}

weft_unpack

export OPAL_PREFIX="$weft_bundle" OPAL_EXEC_PREFIX="$weft_bundle"
export OPAL_BINDIR="$weft_bundle/bin" OPAL_LIBDIR="$weft_bundle/lib"
export OPAL_PKGLIBDIR="$weft_bundle/lib/openmpi3" OPAL_DATAROOTDIR="$weft_bundle/share"
export OPAL_DATADIR="$weft_bundle/share" OPAL_PKGDATADIR="$weft_bundle/share/openmpi"
export OPAL_SYSCONFDIR="$weft_bundle/etc/openmpi"
export OMPI_MCA_mca_base_component_path="$weft_bundle/lib/openmpi3"
export PMIX_PREFIX="$weft_bundle" PMIX_LIBDIR="$weft_bundle/lib"
export PMIX_PKGLIBDIR="$weft_bundle/lib/pmix" PMIX_DATADIR="$weft_bundle/share"
export PMIX_PKGDATADIR="$weft_bundle/share/pmix" PMIX_SYSCONFDIR="$weft_bundle/etc"
export PMIX_MCA_mca_base_component_path="$weft_bundle/lib/pmix"
export HWLOC_PLUGINS_PATH="$weft_bundle/lib/hwloc"
export PATH="$weft_bundle/bin:$PATH"
WEFT_CUDA_LIBS="$(weft_cuda_libs)"
export WEFT_CUDA_LIBS
export LD_LIBRARY_PATH="$WEFT_CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export WEFT_BUNDLE="$weft_bundle"
