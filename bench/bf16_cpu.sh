#!/usr/bin/env bash
# bf16 against fp32 on the CPU, side by side: GPT-2 124M (gpt2-small), B 4 x T 64, one
# rank, the trainer itself. Each round runs fp32, bf16 (GEMMs through oneDNN on
# AVX512_BF16: runtime.cpu_bf16_gemm=true, the default) and bf16 with the GEMMs on
# widened operands (runtime.cpu_bf16_gemm=false) one after the other, so all three see
# the same machine load; a round's figure is the median step_ms of its steps after the
# first (primitive creation, first touches). The table ends with the medians over rounds
# and the ratios to fp32 (issue 27's goal: bf16 <= 0.65 x fp32). A benchmark, never a test.
#   bench/bf16_cpu.sh [BUILD_DIR (default build)] [ROUNDS (default 3)] [STEPS (default 6)]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
rounds=${2:-3}
steps=${3:-6}
export OMPI_MCA_ess_singleton_isolated=1
base=(model.preset=gpt2-small train.batch_size=4 train.seq_len=64 "train.steps=$steps"
      train.eval_every=0 train.warmup=0 train.log_every=1)
step_ms() {
  "$build/worker/worker" "${base[@]}" "$@" 2>/dev/null |
    grep -o 'step_ms=[0-9.]*' | tail -n +2 | cut -d= -f2 | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
"$build/worker/worker" "${base[@]}" train.steps=1 precision=bf16 2>/dev/null | grep 'GEMMs on the CPU'
printf '%-6s %10s %10s %14s\n' round fp32 bf16 "bf16 widened"
a=() b=() c=()
for r in $(seq 1 "$rounds"); do
  x=$(step_ms precision=no)
  y=$(step_ms precision=bf16)
  z=$(step_ms precision=bf16 runtime.cpu_bf16_gemm=false)
  a+=("$x") b+=("$y") c+=("$z")
  printf '%-6s %10s %10s %14s\n' "$r" "$x" "$y" "$z"
done
python3 - "${a[*]}" "${b[*]}" "${c[*]}" <<'PY'
import statistics, sys
f, b, w = ([float(v) for v in s.split()] for s in sys.argv[1:4])
mf, mb, mw = statistics.median(f), statistics.median(b), statistics.median(w)
print(f"{'median':<6} {mf:10.1f} {mb:10.1f} {mw:14.1f}  (step ms)")
print(f"bf16 / fp32 = {mb / mf:.3f} (oneDNN), {mw / mf:.3f} (widened operands)")
PY
