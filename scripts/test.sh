#!/usr/bin/env bash
# Runs weft's whole test suite (unit, multi-rank MPI, GPU-or-skip) in ./build and
# ends with one line "N passed, N failed, N skipped". Exit status is non-zero when
# any test failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

meson test -C build --print-errorlogs --num-processes 2 "$@"
rc=$?
python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for line in open(sys.argv[1]):
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
