#!/usr/bin/env python3
"""An independent GPT-2 forward, in plain Python (double precision), over weft's llm.c
files: it reads the checkpoint and the debug state written by llmc_dump, recomputes
the logits and the loss the way llm.c's train_gpt2.c / PyTorch GPT-2 define them, and
compares them with what weft stored.

This checks what the whole-model gradient check cannot: that weft computes GPT-2
(pre-LayerNorm, eps 1e-5, tanh GELU, causal attention with 1/sqrt(hs) scaling, q|k|v
packed in that order, linear layers out = in . W^T + b, tied embedding) and that its
files follow llm.c's layout (header fields, tensor order, unpadded logits).

Tolerance: 1e-4 absolute on logits and loss. weft runs in float32, so each value
carries a rounding error of a few 1e-7 relative per operation through ~20 layers of
operations on O(1) numbers, i.e. about 1e-5 at worst; 1e-4 is a 10x margin, while
any semantic difference (a missing bias, another GELU, a transposed weight) changes
the logits at the 1e-1 level.

Usage: llmc_reference.py LLMC_DUMP_EXE
"""
import math
import os
import struct
import subprocess
import sys
import tempfile


def read_ints(buf, off, n):
    return list(struct.unpack_from("<%di" % n, buf, off)), off + 4 * n


def read_floats(buf, off, n):
    return list(struct.unpack_from("<%df" % n, buf, off)), off + 4 * n


def load_checkpoint(path):
    buf = open(path, "rb").read()
    h, off = read_ints(buf, 0, 256)
    assert h[0] == 20240326 and h[1] == 3, "checkpoint header %r" % h[:2]
    maxT, V, L, NH, C, Vp = h[2:8]
    shapes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C),
              ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C), ("attprojw", L * C * C),
              ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
              ("fcw", L * 4 * C * C), ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C),
              ("fcprojb", L * C), ("lnfw", C), ("lnfb", C)]
    p = {}
    for name, n in shapes:
        p[name], off = read_floats(buf, off, n)
    assert off == len(buf), "checkpoint has %d bytes, layout needs %d" % (len(buf), off)
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp, n=sum(n for _, n in shapes)), p


def layernorm(x, w, b):
    n = len(x)
    m = sum(x) / n
    var = sum((v - m) ** 2 for v in x) / n
    s = 1.0 / math.sqrt(var + 1e-5)
    return [(x[i] - m) * s * w[i] + b[i] for i in range(n)]


def linear(x, w, b, oc):
    c = len(x)
    return [sum(x[i] * w[o * c + i] for i in range(c)) + (b[o] if b else 0.0)
            for o in range(oc)]


def gelu(x):
    k = math.sqrt(2.0 / math.pi)
    return [0.5 * v * (1.0 + math.tanh(k * (v + 0.044715 * v ** 3))) for v in x]


def attention(qkv, C, NH):
    """qkv: list over t of 3C vectors; returns list over t of C vectors (causal)."""
    T, hs = len(qkv), C // NH
    out = [[0.0] * C for _ in range(T)]
    for h in range(NH):
        for t in range(T):
            q = qkv[t][h * hs:(h + 1) * hs]
            scores = []
            for t2 in range(t + 1):
                k = qkv[t2][C + h * hs:C + (h + 1) * hs]
                scores.append(sum(a * b for a, b in zip(q, k)) / math.sqrt(hs))
            mx = max(scores)
            e = [math.exp(s - mx) for s in scores]
            z = sum(e)
            for t2 in range(t + 1):
                v = qkv[t2][2 * C + h * hs:2 * C + (h + 1) * hs]
                for i in range(hs):
                    out[t][h * hs + i] += e[t2] / z * v[i]
    return out


def forward(d, p, tokens):
    C, L, NH = d["C"], d["L"], d["NH"]
    x = [[p["wte"][tok * C + i] + p["wpe"][t * C + i] for i in range(C)]
         for t, tok in enumerate(tokens)]
    for l in range(L):
        sl = lambda name, n: p[name][l * n:(l + 1) * n]
        ln1 = [layernorm(v, sl("ln1w", C), sl("ln1b", C)) for v in x]
        qkv = [linear(v, sl("qkvw", 3 * C * C), sl("qkvb", 3 * C), 3 * C) for v in ln1]
        att = attention(qkv, C, NH)
        proj = [linear(v, sl("attprojw", C * C), sl("attprojb", C), C) for v in att]
        x = [[a + b for a, b in zip(u, v)] for u, v in zip(x, proj)]
        ln2 = [layernorm(v, sl("ln2w", C), sl("ln2b", C)) for v in x]
        fc = [gelu(linear(v, sl("fcw", 4 * C * C), sl("fcb", 4 * C), 4 * C)) for v in ln2]
        proj = [linear(v, sl("fcprojw", 4 * C * C), sl("fcprojb", C), C) for v in fc]
        x = [[a + b for a, b in zip(u, v)] for u, v in zip(x, proj)]
    lnf = [layernorm(v, p["lnfw"], p["lnfb"]) for v in x]
    return [linear(v, p["wte"], None, d["V"]) for v in lnf]  # real vocab columns only


def main():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.argv[1], tmp], check=True)
        d, p = load_checkpoint(os.path.join(tmp, "model.bin"))
        buf = open(os.path.join(tmp, "state.bin"), "rb").read()
    h, off = read_ints(buf, 0, 256)
    assert h[0] == 20240327 and h[1] == 2, "debug state header %r" % h[:2]
    B, T, V = h[2], h[3], d["V"]
    inputs, off = read_ints(buf, off, B * T)
    targets, off = read_ints(buf, off, B * T)
    logits, off = read_floats(buf, off, B * T * V)
    (loss,), off = read_floats(buf, off, 1)
    nparams = (len(buf) - off) // 4
    assert nparams == d["n"], "%d gradients for %d parameters" % (nparams, d["n"])
    worst, total = 0.0, 0.0
    for b in range(B):
        ref = forward(d, p, inputs[b * T:(b + 1) * T])
        for t in range(T):
            row = ref[t]
            got = logits[(b * T + t) * V:(b * T + t + 1) * V]
            worst = max(worst, max(abs(x - y) for x, y in zip(row, got)))
            mx = max(row)
            total += math.log(sum(math.exp(v - mx) for v in row)) + mx - row[targets[b * T + t]]
    ref_loss = total / (B * T)
    spread = max(abs(v) for v in logits)
    print("B=%d T=%d V=%d params=%d: max |logit diff| %.3g (logits up to %.3g), "
          "loss %.7f vs reference %.7f" % (B, T, V, nparams, worst, spread, loss, ref_loss))
    ok = worst < 1e-4 and abs(loss - ref_loss) < 1e-4 and spread > 0.5
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
