#!/usr/bin/env bash
# bench/train against the same benchmark of a reference commit (46d31cd: before the
# worker was split into modules over the device seam), in one run: the two binaries
# alternate, ROUNDS times each, so both see the same machine load; the table gives
# each round's best gpt2-small step (B 4 x T 64, one rank) and the best and median over
# rounds. A benchmark, never a test.
#   bench/train_vs_ref.sh [BUILD_DIR (default build)] [ROUNDS (default 5)] [THREADS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
rounds=${2:-5}
threads=${3:-$(nproc)}
ref=$("$root/tests/bitident/build_ref.sh" "$root" "$build" 46d31cd bench/train)
new=$build/bench/train
# The gpt2-small "best" row of one run of bench/train: its step_ms column.
best_ms() { "$1" "$threads" 5 | awk '$1 == "gpt2-small" && $2 == "best" { print $5 }'; }
printf '%-6s %12s %12s\n' round "this tree" 46d31cd
declare -a a b
for r in $(seq 1 "$rounds"); do
  x=$(best_ms "$new"); y=$(best_ms "$ref")
  a+=("$x"); b+=("$y")
  printf '%-6s %12s %12s\n' "$r" "$x" "$y"
done
python3 - "${a[*]}" "${b[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
print(f"{'best':6s} {min(a):12.1f} {min(b):12.1f}")
print(f"{'median':6s} {statistics.median(a):12.1f} {statistics.median(b):12.1f}")
print(f"gpt2-small step (ms, B 4 x T 64, one rank): this tree / 46d31cd = "
      f"{statistics.median(a) / statistics.median(b):.3f} (median), {min(a) / min(b):.3f} (best)")
PY
