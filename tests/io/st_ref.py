"""st_ref.py - an independent safetensors writer and checker (struct and json only) for
weft's codec tests (tests/io/test_safetensors.c).

Every tensor of a GPT-2 in Hugging Face's names holds value(name, i) at flat index i of
its Hugging Face layout (Conv1D weights (in, out)); the C test computes the same function
at the llm.c position it expects, so the transposition and the placement are checked, not
assumed. The values are k/64 with |k| <= 125, exact in F32, BF16 and F16.

    st_ref.py write PATH L NH C T V [--dtype F32|BF16|F16] [--bare] [--drop NAME]
              [--lm-head tied|diff] [--buffers] [--meta-heads N] [--config-heads N]
    st_ref.py check PATH L NH C T V     verify a file weft wrote

read_f32(PATH) is the reader the Llama tests share: {name: (shape, values)} of an F32
file as weft writes it.
"""
import argparse
import json
import os
import struct
import sys

LAYER = [("ln_1.weight", "v"), ("ln_1.bias", "v"), ("attn.c_attn.weight", (1, 3)),
         ("attn.c_attn.bias", 3), ("attn.c_proj.weight", (1, 1)), ("attn.c_proj.bias", 1),
         ("ln_2.weight", "v"), ("ln_2.bias", "v"), ("mlp.c_fc.weight", (1, 4)),
         ("mlp.c_fc.bias", 4), ("mlp.c_proj.weight", (4, 1)), ("mlp.c_proj.bias", 1)]


def read_f32(path):
    """{name: (shape, tuple of floats)} of an F32 safetensors file (weft writes F32)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    head.pop("__metadata__", None)
    body, out = data[8 + n:], {}
    for name, h in head.items():
        if h["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {h['dtype']}, weft writes F32")
        b, e = h["data_offsets"]
        out[name] = (h["shape"], struct.unpack(f"<{(e - b) // 4}f", body[b:e]))
    return out


def value(name, i):
    tid = sum(name.encode()) % 97
    return ((tid * 7 + i * 13) % 251 - 125) / 64.0


def tensors(L, C, T, V):
    """(name, shape) in Hugging Face's names and layout."""
    out = [("transformer.wte.weight", [V, C]), ("transformer.wpe.weight", [T, C])]
    for l in range(L):
        for suffix, kind in LAYER:
            if kind == "v":
                shape = [C]
            elif isinstance(kind, int):
                shape = [kind * C]
            else:
                shape = [kind[0] * C, kind[1] * C]
            out.append((f"transformer.h.{l}.{suffix}", shape))
    out += [("transformer.ln_f.weight", [C]), ("transformer.ln_f.bias", [C])]
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def encode(vals, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    # BF16: the top half of each float32 (the values are exact, no rounding needed)
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


def write(a):
    items = [(n, s, [value(n, i) for i in range(numel(s))]) for n, s in tensors(a.L, a.C, a.T, a.V)]
    if a.lm_head:
        wte = items[0][2]
        items.append(("lm_head.weight", [a.V, a.C],
                      wte if a.lm_head == "tied" else [x + (1.0 if i == 5 else 0.0) for i, x in enumerate(wte)]))
    if a.buffers:
        for l in range(a.L):
            items.append((f"transformer.h.{l}.attn.bias", [1, 1, a.T, a.T], [1.0] * (a.T * a.T)))
    header, blobs, at = {}, [], 0
    for name, shape, vals in items:
        if name == a.drop:
            continue
        if a.bare and name.startswith("transformer."):
            name = name[len("transformer."):]
        blob = encode(vals, a.dtype)
        header[name] = {"dtype": a.dtype, "shape": shape, "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    if a.meta_heads:
        header["__metadata__"] = {"format": "pt", "n_head": str(a.meta_heads)}
    js = json.dumps(header).encode()
    with open(a.path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(blobs))
    if a.config_heads:
        with open(os.path.join(os.path.dirname(a.path), "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "n_head": a.config_heads}, f)


def check(a):
    with open(a.path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(data[8:8 + n].decode())
    meta = header.pop("__metadata__")
    assert meta["format"] == "pt", meta
    assert [meta[k] for k in ("n_layer", "n_head", "n_embd", "n_ctx", "vocab_size")] == \
        [str(x) for x in (a.L, a.NH, a.C, a.T, a.V)], meta
    want = tensors(a.L, a.C, a.T, a.V)
    assert sorted(header) == sorted(name for name, _ in want), "tensor names differ"
    body, spans = data[8 + n:], []
    for name, shape in want:
        h = header[name]
        assert h["dtype"] == "F32" and h["shape"] == shape, (name, h, shape)
        b, e = h["data_offsets"]
        spans.append((b, e))
        vals = struct.unpack("<%df" % numel(shape), body[b:e])
        for i, x in enumerate(vals):
            assert x == value(name, i), (name, i, x, value(name, i))
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] == len(body), "data section has slack"
    assert all(p[1] == q[0] for p, q in zip(spans, spans[1:])), "holes between tensors"
    print(f"st_ref: {a.path}: {len(want)} tensors, names, shapes, metadata and values as expected")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("path")
    for k in ("L", "NH", "C", "T", "V"):
        p.add_argument(k, type=int)
    p.add_argument("--dtype", default="F32")
    p.add_argument("--bare", action="store_true")
    p.add_argument("--drop")
    p.add_argument("--lm-head", dest="lm_head")
    p.add_argument("--buffers", action="store_true")
    p.add_argument("--meta-heads", type=int, dest="meta_heads")
    p.add_argument("--config-heads", type=int, dest="config_heads")
    a = p.parse_args()
    {"write": write, "check": check}[a.mode](a)
