#!/usr/bin/env bash
# weft's whole GPU check on a GPU machine, in one command (at most 8 minutes; about 7.5
# estimated on an H100 or H200, scripts/gpu_check.py says from what):
#
#     scripts/gpu-check.sh OUTDIR [--require-gpu] [--only PART,...]
#
# Run from the repository root, with the bundle scripts/gpu-bundle.sh made at
# $WEFT_BUNDLE, or else ./gpu-bundle. Writes OUTDIR/gpu-report.md, OUTDIR/gpu-report.json,
# OUTDIR/logs/ and OUTDIR/results/ (the results files for bench/results/); exits 1 when a
# part failed (--require-gpu: or found no GPU). The parts and their limits:
# scripts/gpu_check.py; how to use both scripts: docs/gpu.md.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bundle="${WEFT_BUNDLE:-$root/gpu-bundle}"
if [ ! -f "$bundle/env.sh" ]; then
  echo "gpu-check: no bundle at $bundle: make one on a Debian 12 machine with" \
    "'bash scripts/gpu-bundle.sh gpu-bundle', or point WEFT_BUNDLE at one" >&2
  exit 2
fi
# shellcheck source=gpu-bundle-env.sh
. "$bundle/env.sh" || exit 2
exec python3 "$root/scripts/gpu_check.py" "$@"
