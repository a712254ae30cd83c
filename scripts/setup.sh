#!/usr/bin/env bash
# Installs what weft needs from Debian 12 packages (only what is missing), then
# configures and builds into ./build. Safe to run again: it only rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(gcc clang libclang-rt-14-dev clang-format pkg-config git meson ninja-build python3
      libopenmpi-dev openmpi-bin libhwloc-dev hwloc libuv1-dev libopenblas-dev
      libyaml-dev libprotobuf-c-dev protobuf-c-compiler libjansson-dev libxxhash-dev
      python3-torch # test-only: tests/model/llama_ref.py, the PyTorch reference of Llama
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

# The CUDA toolkit is optional: when /usr/local/cuda exists its nvcc builds the
# GPU modules (-Dcuda=auto); without it weft builds for the CPU only.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -f build/build.ninja ]; then
  meson setup build
fi
ninja -C build
