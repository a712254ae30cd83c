#!/usr/bin/env bash
# bench/train against the same benchmark of a reference commit (by default 46d31cd:
# before the worker was split into modules over the device seam; 00b5f37: before the
# model-family interface), in one run: the two binaries alternate, ROUNDS times each, so
# both see the same machine load; the table gives each round's best step of one of
# bench/train's rows (gpt2-small, B 4 x T 64, one rank, by default) and the best and
# median over rounds. A benchmark, never a test.
#   bench/train_vs_ref.sh [BUILD_DIR (default build)] [ROUNDS (default 5)] [THREADS]
#                         [REF (default 46d31cd)] [ROW (default gpt2-small)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
rounds=${2:-5}
threads=${3:-$(nproc)}
commit=${4:-46d31cd}
row=${5:-gpt2-small}
ref=$("$root/tests/bitident/build_ref.sh" "$root" "$build" "$commit" bench/train)
new=$build/bench/train
# The row's "best" line of one run of bench/train: its step_ms column (the row's name
# may hold spaces: the step is the 5th field from the end of the name's words).
best_ms() { "$1" "$threads" 5 | awk -v row="$row" 'index($0, row " ") == 1 && / best / {
  for (i = 1; i <= NF; i++) if ($i == "best") { print $(i + 3); exit } }'; }
printf '%-6s %12s %12s\n' round "this tree" "$commit"
declare -a a b
for r in $(seq 1 "$rounds"); do
  x=$(best_ms "$new"); y=$(best_ms "$ref")
  a+=("$x"); b+=("$y")
  printf '%-6s %12s %12s\n' "$r" "$x" "$y"
done
python3 - "${a[*]}" "${b[*]}" "$commit" "$row" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
print(f"{'best':6s} {min(a):12.1f} {min(b):12.1f}")
print(f"{'median':6s} {statistics.median(a):12.1f} {statistics.median(b):12.1f}")
print(f"{sys.argv[4]} step (ms, one rank): this tree / {sys.argv[3]} = "
      f"{statistics.median(a) / statistics.median(b):.3f} (median), {min(a) / min(b):.3f} (best)")
PY
