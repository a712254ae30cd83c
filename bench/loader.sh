#!/usr/bin/env bash
# bench/loader.sh - the data.source loader on one core against what one CPU rank trains.
#
# usage: bash bench/loader.sh [OUT]     (OUT: bench/results/loader.md)
#
# The corpus is scripts/setup.sh's data/fortunes.txt as JSON Lines, one quotation a line,
# in two sources mixed 0.7 / 0.3, the first zstd-compressed; the tokenizer GPT-2's
# (data/gpt2). The loader (build/bench/loader, held to one core by taskset) makes rows of
# 8 lanes x 1024 tokens as fast as it can; the trainer is build/worker/worker on one
# rank (its cores) training on the same stream, its tokens/s the median of steps 2-4 of
# train.metrics. The ratio is the loader's best over the trainer's: how many such ranks
# one core of tokenizing keeps fed.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/loader.md}
ninja -C build bench/loader worker/worker >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -c 'import json, sys
for line in sys.stdin: print(json.dumps({"text": line.rstrip("\n")}))' < data/fortunes.txt > "$tmp/q.jsonl"
head -n 3000 "$tmp/q.jsonl" | zstd -q -f -o "$tmp/a.jsonl.zst"
tail -n +3001 "$tmp/q.jsonl" > "$tmp/b.jsonl"
src="[$tmp/a.jsonl.zst, $tmp/b.jsonl]"
load_before=$(cut -d' ' -f1 /proc/loadavg)
loader=$(taskset -c 0 build/bench/loader --tokenizer data/gpt2 --lanes 8 --seq 1024 \
           --steps 100 --mix 0.7,0.3 "$tmp/a.jsonl.zst" "$tmp/b.jsonl")
echo "$loader"
best=$(echo "$loader" | sed -n 's/^loader tokens\/s: best \([0-9]*\), median.*/\1/p')
rows=""
for preset in gpt2-tiny gpt2-small; do
  OMPI_MCA_ess_singleton_isolated=1 build/worker/worker model.preset=$preset \
    data.source="$src" data.mix='[0.7, 0.3]' data.tokenizer=data/gpt2 \
    model.seq_len=256 train.batch_size=4 train.steps=4 train.metrics="$tmp/m.jsonl" \
    >/dev/null 2>&1
  train=$(python3 -c 'import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(round(statistics.median(x["tokens_per_s"] for x in r[1:])))' "$tmp/m.jsonl")
  ratio=$(python3 -c "print(f'{$best / $train:.0f}')")
  echo "$preset trains $train tokens/s: the loader makes ${ratio}x that"
  rows="$rows| $preset, 4 x 256 tokens a step, one rank | $train | ${ratio}x |"$'\n'
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
{
  echo "# data.source loader against training (bench/loader.sh)"
  echo
  echo "$(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')),"
  echo "load average $load_before before and $load_after after; weft $(git rev-parse --short HEAD)."
  echo
  echo "Loader: GPT-2's tokenizer, two JSON Lines sources of Debian's fortunes mixed 0.7 / 0.3"
  echo "(the first zstd), 8 lanes x 1024 tokens, 100 steps a round, one core (taskset -c 0):"
  echo
  echo '```text'
  echo "$loader"
  echo '```'
  echo
  echo "| trainer (CPU, fp32, the same stream) | tokens/s | loader best / trainer |"
  echo "|---|---|---|"
  printf "%s" "$rows"
} > "$out"
echo "wrote $out"
