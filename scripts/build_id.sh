#!/usr/bin/env bash
# weft's build id, compiled into the binaries (meson's vcs_tag, runtime/meson.build): the
# commit checked out, with "-dirty" when a tracked file differs from it. Prints nothing
# and fails outside a git checkout, where meson writes its fallback ("unknown").
#   scripts/build_id.sh SOURCE_ROOT
set -uo pipefail
cd "$1" || exit 1
commit=$(git rev-parse --verify -q HEAD 2>/dev/null) || exit 1
if [ -n "$(git status --porcelain --untracked-files=no --ignore-submodules 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
echo "$commit"
