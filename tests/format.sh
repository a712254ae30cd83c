#!/usr/bin/env bash
# Checks that every C, header and CUDA file is formatted with the root .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "clang-format not installed"; exit 77; }
files=$(git ls-files '*.c' '*.h' '*.cu' 2>/dev/null || find . -name '*.[ch]' -o -name '*.cu')
bad=0
for f in $files; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f (run clang-format -i $f)"
    bad=1
  fi
done
exit $bad
