#!/usr/bin/env bash
# Runs weft's whole test suite and ends with one line "N passed, N failed, N skipped".
# First it installs what only the tests need (scripts/deps.sh's TESTS: cmocka, clang,
# Slurm, Prometheus, ...; its test_setup), runs scripts/setup.sh (the build and data/:
# quick when they are there), and turns the tests on in ./build. Then:
#  1. ./build (gcc, the configuration users build): unit, multi-rank MPI, control-plane,
#     equivalence, checkpoint, Slurm, README-command and GPU-or-skip tests;
#  2. ./build-san (clang with AddressSanitizer and UndefinedBehaviorSanitizer, any UB
#     fatal): the unit tests again, and a bounded libFuzzer run of the frame decoder.
# Exit status is non-zero when any test failed or timed out. Extra arguments go to the
# first `meson test` (e.g. --suite unit).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

source scripts/deps.sh
install_missing "${TESTS[@]}" || exit 1
bash scripts/setup.sh >/dev/null || exit 1 # the build and data/ (quick when they are there)
test_setup || exit 1
if ! meson configure build | grep -qE '^\s*tests\s+true'; then
  meson configure build -Dtests=true >/dev/null || exit 1
fi
ninja -C build >/dev/null || { echo "the build failed (ninja -C build says why)"; exit 1; }

meson test -C build --print-errorlogs --num-processes 2 "$@"
rc=$?
logs=(build/meson-logs/testlog.json)

if [ $# -eq 0 ]; then
  if [ ! -f build-san/build.ninja ]; then
    CC=clang meson setup build-san -Dcuda=disabled -Dfuzz=true \
      -Db_sanitize=address,undefined -Db_lundef=false \
      -Dc_args=-fno-sanitize-recover=undefined >/dev/null || rc=1
  fi
  if ninja -C build-san >/dev/null; then
    # Open MPI's own allocations at exit are not weft's leaks (tests/lsan.supp).
    ASAN_OPTIONS=fast_unwind_on_malloc=0:detect_leaks=1 \
    LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp \
      meson test -C build-san --print-errorlogs --num-processes 2 --suite unit --suite fuzz \
      || rc=1
    logs+=(build-san/meson-logs/testlog.json)
  else
    echo "sanitizer build failed"
    rc=1
  fi
fi

python3 - "${logs[@]}" <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif r == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
print(f'{counts["passed"]} passed, {counts["failed"]} failed, {counts["skipped"]} skipped')
PY
exit $rc
