#!/usr/bin/env python3
"""llama_generate.py - a Llama model with Llama 3's tokenizer: samples and --generate.

usage: llama_generate.py WORKER NODE NODE_MODULES LLAMA3_REF_MJS TEXT

llama3_ref.mjs (under node, from npm's llama3-tokenizer-js) writes Llama 3's
tokenizer.model and tokenizer.json. A 2-layer llama-tiny trains 20 steps on TEXT's first 64 KB
(English fortunes) encoded by weft with tokenizer.model, so model.vocab comes
from the tokenizer (128256) and the saved embedding and head have 128256 rows; the
step-20 sample starts with <|begin_of_text|>. Then --generate PROMPT from the saved
safetensors file, greedy (train.sample_top_k=1): the same text with tokenizer.model and
with tokenizer.json, and the same text as an independent greedy decoder: the prompt
encoded by llama3-tokenizer-js (with <|begin_of_text|>), the model run by
tests/model/llama_ref.py (Hugging Face's LlamaForCausalLM in PyTorch, float64), the ids
decoded by llama3-tokenizer-js. Greedy choices agree while the top two logits of each
step are further apart than weft's float32 error (~1e-5 on logits of this size,
llama_ref_check.py); the smallest gap is printed, and a gap under GAP_MIN (100x that)
fails the test as unable to tell, rather than passing or failing by chance.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "model"))
import llama_ref  # noqa: E402

WORKER, NODE, NODE_MODULES, REF_MJS, TEXT = sys.argv[1:6]
PROMPT = "The meaning of life is"
NEW = 8
GAP_MIN = 1e-3
BOS = 128000
TINY = ["model.preset=llama-tiny", "model.layers=2", "model.seq_len=32", "runtime.threads=1"]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(args, timeout=300):
    p = subprocess.run([WORKER] + args, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL,
                       env=dict(os.environ, OMPI_MCA_ess_singleton_isolated="1"))
    if p.returncode:
        fail(f"worker {' '.join(args)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def node(script, *args):
    p = subprocess.run([NODE, "--input-type=module", "-e", script] + list(args),
                       capture_output=True, text=True, timeout=120)
    if p.returncode:
        fail(f"node exited {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout


JS = """
import { pathToFileURL } from 'node:url';
import path from 'node:path';
const [mods, op, arg] = process.argv.slice(1);
const t = (await import(pathToFileURL(path.join(mods,
  'llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js')).href)).default;
if (op === 'encode') process.stdout.write(JSON.stringify(t.encode(arg, { bos: true, eos: false })));
else process.stdout.write(t.decode(JSON.parse(arg)));
"""


def reference(weights, ids):
    """Greedy continuation of ids by llama_ref's LlamaForCausalLM in float64, and the
    smallest gap between the top two logits over the steps."""
    st = llama_ref.st_read(weights)
    with open(weights, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    # weft's __metadata__: the dims under config.json's names, as strings
    cfg = llama_ref.Config({k: json.loads(v) for k, v in meta.items()
                            if k not in ("format", "producer", "weft_family")})
    W = {n: torch.tensor(st[n], dtype=torch.float64) for n, _ in llama_ref.param_shapes(cfg)}
    out, gap = list(ids), float("inf")
    for _ in range(NEW):
        tok = torch.tensor([out], dtype=torch.int64)
        logits, _ = llama_ref.forward(cfg, W, tok, tok)
        top = torch.topk(logits[0, -1], 2)
        gap = min(gap, float(top.values[0] - top.values[1]))
        out.append(int(top.indices[0]))
    return out[len(ids):], gap


def main():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([NODE, REF_MJS, NODE_MODULES, d], check=True, capture_output=True)
        model, tjson = os.path.join(d, "tokenizer.model"), os.path.join(d, "tokenizer.json")
        saved = os.path.join(d, "m.safetensors")
        # the first 64 KB of TEXT, whole lines (encoding all of it takes longer than training)
        text = os.path.join(d, "text.txt")
        with open(TEXT, "rb") as f, open(text, "wb") as g:
            g.write(f.read(1 << 16).rsplit(b"\n", 1)[0] + b"\n")
        out = run(TINY + [f"data.tokenizer={model}", f"data.path={text}", "train.steps=20",
                          "train.batch_size=4", "train.sample_every=20", "train.sample_tokens=8",
                          "--save", saved, "--save-format", "safetensors"])
        sample = [l for l in out.splitlines() if l.startswith("sample 20/20: ")]
        if len(sample) != 1 or not sample[0][14:].startswith("<|begin_of_text|>"):
            fail(f"no step-20 sample starting with <|begin_of_text|>:\n{out[-2000:]}")
        st = llama_ref.st_read(saved)
        rows = {n: st[n].shape[0] for n in ("model.embed_tokens.weight", "lm_head.weight")}
        if set(rows.values()) != {128256}:
            fail(f"model.vocab from Llama 3's tokenizer: want 128256 rows, got {rows}")
        print(f"trained on {os.path.basename(TEXT)} with tokenizer.model: vocab 128256; "
              f"{sample[0]!r}")

        gen = ["model.init=" + saved, "train.sample_top_k=1", f"train.sample_tokens={NEW}",
               "runtime.threads=1", "--generate", PROMPT]
        texts = {}
        for tag, path in (("tokenizer.model", model), ("tokenizer.json", tjson)):
            text = run([f"data.tokenizer={path}"] + gen)
            texts[tag] = text[:-1] if text.endswith("\n") else text  # print()'s newline
        if texts["tokenizer.model"] != texts["tokenizer.json"]:
            fail(f"--generate differs by tokenizer file: {texts}")
        got = texts["tokenizer.model"]
        head = "<|begin_of_text|>" + PROMPT
        if not got.startswith(head):
            fail(f"--generate printed {got!r}, not starting with {head!r}")

        ids = json.loads(node(JS, NODE_MODULES, "encode", PROMPT))
        if ids[0] != BOS:
            fail(f"llama3-tokenizer-js's prompt {ids} does not start with {BOS}")
        cont, gap = reference(saved, ids)
        want = node(JS, NODE_MODULES, "decode", json.dumps(ids[1:] + cont))
        print(f"prompt {ids}; reference continuation {cont} (smallest top-2 logit gap {gap:.2e})")
        if gap < GAP_MIN:
            fail(f"a greedy step's top two logits are {gap:.2e} apart (< {GAP_MIN}): "
                 f"float32 and float64 may pick differently; choose another prompt")
        if got != "<|begin_of_text|>" + want:
            fail(f"--generate: weft {got!r}, reference {'<|begin_of_text|>' + want!r}")
        print(f"ok: --generate {PROMPT!r}: {got!r}, the same with tokenizer.json, and the "
              f"reference's greedy ids decode to the same text")


main()
