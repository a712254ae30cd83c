#!/usr/bin/env bash
# Packs what a bare GPU machine lacks to run weft's GPU check into one folder.
#
#     bash scripts/gpu-bundle.sh DIR [--build BUILDDIR]
#
# Builds the GPU check's binaries (in ./build-release, a release build with the CUDA
# modules, configured when missing; --build build reuses ./build), then copies them,
# Open MPI (mpirun, orted, components) and every Debian library they link into DIR with
# $ORIGIN-relative rpaths, and prints DIR's size (at most 48 MiB) and contents. Run the
# check there with scripts/gpu-check.sh. Details: scripts/gpu_bundle.py, docs/gpu.md.
set -euo pipefail
exec python3 "$(dirname "$0")/gpu_bundle.py" "$@"
