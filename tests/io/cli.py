"""cli.py - worker --tokenize and data errors, end to end through the worker binary.

usage: cli.py WORKER MPIRUN

  tokenize   the README's text-to-model path: `worker --tokenize` writes llm.c shards
             whose tokens equal gpt2_ref.py's encoding (an independent BPE) with
             <|endoftext|> first, split train/val by data.val_fraction; the worker then
             trains on them with data.val_path and evaluates on the val shard.
  errors     --tokenize without a tokenizer, with a malformed tokenizer.json, and from a
             FIFO: one clear line each, naming the file, exit 1, and no hang.
  once-np4   a bad data.path, and a FIFO, under mpirun -np 4: one error line for the
             job (before: 8 lines; the FIFO: a hang until runtime.hang_timeout).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref  # noqa: E402

WORKER, MPIRUN = sys.argv[1], sys.argv[2]
MPI_ARGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run(args, timeout=120):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def read_shard(path):
    with open(path, "rb") as f:
        head = struct.unpack("<256i", f.read(1024))
        body = f.read()
    assert head[0] == 20240520 and head[1] == 1, head[:3]
    assert len(body) == 2 * head[2], (len(body), head[2])
    return list(struct.unpack("<%dH" % head[2], body))


def error_lines(text):
    return [l for l in text.splitlines() if l.startswith("weft: error") or "[weft E" in l]


def test_tokenize(d):
    gpt2_ref.write_fixtures(d)
    corpus = os.path.join(d, "corpus.txt")
    text = (gpt2_ref.CORPUS + "<|endoftext|>") * 40
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(text)
    ref = gpt2_ref.load(d)
    want = [ref.vocab[gpt2_ref.EOT]] + ref.encode(text)
    prefix = os.path.join(d, "tiny")
    rc, out, err = run([WORKER, "--tokenize", corpus, prefix,
                        "data.tokenizer=" + os.path.join(d, "tokenizer.json"),
                        "data.val_fraction=0.1"])
    print(out + err)
    assert rc == 0, rc
    train = read_shard(prefix + "_train_000000.bin")
    val = read_shard(prefix + "_val_000000.bin")
    n_val = int(len(want) * 0.1)
    assert train + val == want, "the shards differ from the reference encoding"
    assert len(val) == n_val, (len(val), n_val)
    print(f"--tokenize: {len(train)} train + {len(val)} val tokens, equal to the reference")
    # the shards train a model whose vocabulary covers the tokenizer, evaluated on val
    vocab = len(ref.vocab)
    rc, out, err = run([WORKER, "data.path=" + prefix + "_train_*.bin",
                        "data.val_path=" + prefix + "_val_*.bin", f"model.vocab={vocab}",
                        "model.seq_len=32", "train.steps=30", "train.eval_every=30",
                        "train.eval_batches=2", "train.batch_size=4", "runtime.threads=1"],
                       timeout=300)
    print(out[-1500:] + err[-1500:])
    assert rc == 0, rc
    assert "validation (data.val_path)" in out
    assert f"(train {len(train)}, val {len(val)})" in out
    vals = [float(l.split("val_loss=")[1].split()[0]) for l in out.splitlines() if "val_loss=" in l]
    assert vals, "no evaluation ran"
    # ln(vocab) is the loss of a uniform guess: 30 steps on a repetitive corpus beat it
    import math
    assert vals[-1] < math.log(vocab), (vals, math.log(vocab))


def test_errors(d):
    gpt2_ref.write_fixtures(d)
    corpus = os.path.join(d, "c.txt")
    with open(corpus, "w") as f:
        f.write("some text\n")
    rc, out, err = run([WORKER, "--tokenize", corpus, os.path.join(d, "x")])
    print(err)
    assert rc == 2 and len(error_lines(err)) == 1 and "data.tokenizer" in err, (rc, err)
    bad = os.path.join(d, "bad_tokenizer.json")
    with open(bad, "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [}')
    rc, out, err = run([WORKER, "--tokenize", corpus, os.path.join(d, "x"), "data.tokenizer=" + bad])
    print(err)
    assert rc == 2 and len(error_lines(err)) == 1, (rc, err)
    assert "bad_tokenizer.json" in err and "not valid JSON" in err, err
    fifo = os.path.join(d, "in.fifo")
    os.mkfifo(fifo)
    rc, out, err = run([WORKER, "--tokenize", fifo, os.path.join(d, "x"),
                        "data.tokenizer=" + os.path.join(d, "tokenizer.json")], timeout=30)
    print(err)
    assert rc == 2 and "not a regular file" in err and "in.fifo" in err, (rc, err)
    assert not os.path.exists(os.path.join(d, "x_train_000000.bin"))


def test_once_np4(d):
    fifo = os.path.join(d, "data.fifo")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    bad = os.path.join(d, "bad_tokenizer.json")
    with open(bad, "w") as f:
        f.write("{ not json")
    with open(os.path.join(d, "c.txt"), "w") as f:
        f.write("some text\n")
    for extra, word in ((["data.path=" + os.path.join(d, "missing.txt")], "missing.txt"),
                        (["data.path=" + fifo], "FIFO"),
                        (["data.path=" + os.path.join(d, "c.txt"), "data.tokenizer=" + bad],
                         "bad_tokenizer.json")):
        rc, out, err = run([MPIRUN] + MPI_ARGS + ["-np", "4", WORKER, "train.steps=2"] + extra,
                           timeout=60)
        lines = error_lines(out + err)
        print("\n".join(lines))
        assert rc != 0, rc
        assert len(lines) == 1 and word in lines[0], lines


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="weft_cli_") as d:
        for name in sys.argv[3:] or ["tokenize", "errors", "once_np4"]:
            {"tokenize": test_tokenize, "errors": test_errors, "once_np4": test_once_np4}[name](d)
    print("ok")
