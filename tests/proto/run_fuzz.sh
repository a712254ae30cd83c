#!/usr/bin/env bash
# run_fuzz.sh FUZZER SEEDS SECONDS - a bounded libFuzzer run from a fresh seed corpus
# (one valid frame per message type). Fails on any crash, leak or UB report; the
# failing input is left in the build directory as crash-* (or leak-*, timeout-*).
set -euo pipefail
fuzzer=$1 seeds=$2 secs=$3
corpus=$(mktemp -d /tmp/weft-fuzz-XXXXXX)
trap 'rm -rf "$corpus"' EXIT
"$seeds" "$corpus"
"$fuzzer" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
  "$corpus"
