#!/usr/bin/env bash
# Builds a target of a reference commit (the tree before the worker restructure,
# 46d31cd; by default its worker) into BUILD_ROOT/ref-<commit>, once: later calls find
# it built, and print its path. Several tests call this at once, so a lock serialises
# them. Exit 77 (skipped) when the commit is not in the repository (a shallow clone, a
# tarball): there is nothing to compare with then, and the tests say so.
#   build_ref.sh SOURCE_ROOT BUILD_ROOT COMMIT [TARGET (default worker/worker)]
set -euo pipefail
src=$1 out=$2/ref-$3 commit=$3 target=${4:-worker/worker}
exec 9>"$2/ref-$3.lock"
flock 9
if [ -x "$out/build/$target" ]; then
  echo "$out/build/$target"
  exit 0
fi
if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "reference commit $commit is not in $src (shallow clone or no git): nothing to compare with" >&2
  exit 77
fi
if [ ! -f "$out/build/build.ninja" ]; then
  rm -rf "$out"
  mkdir -p "$out/src"
  git -C "$src" archive "$commit" | tar -x -C "$out/src"
  # CPU only: the comparisons are about the CPU path.
  meson setup "$out/build" "$out/src" -Dtests=false -Dcuda=disabled -Dbuildtype=debugoptimized \
    >"$out/setup.log" 2>&1 || { cat "$out/setup.log" >&2; exit 1; }
fi
ninja -C "$out/build" "$target" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log" >&2; exit 1; }
echo "$out/build/$target"
