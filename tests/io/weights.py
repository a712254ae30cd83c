"""weights.py - model weights in and out, and samples, end to end through the worker.

usage: weights.py WORKER MPIRUN [weights|errors|samples ...]

  weights  a tiny model trained on a tp2 mesh with checkpoints; the checkpoint exported
           as llm.c (version 3), llm.c bf16 (version 5, --save-format llmc-bf16) and
           safetensors (--export safetensors); the exports read back here with struct and
           json (Conv1D transposes, bf16 rounded to nearest even); --dump-state (logits,
           loss, gradients, all float32) bit for bit the same from model.init=X.bin,
           X.safetensors and the checkpoint directory; tp2 and pp2 meshes initialised
           from the safetensors file against one rank; --save --save-format safetensors;
           a BF16 safetensors file from st_ref.py (an independent writer) and an llm.c file
           built here from the same values: the same --dump-state bytes.
  errors   model.init naming a truncated safetensors file, one with a tensor's shape
           transposed, one missing a tensor, a truncated llm.c v5 file and an llm.c file of
           version 4, under mpirun -np 4: one error line for the job, naming the file,
           exit non-zero, no hang; a sample's prompt outside the vocabulary, refused before
           the first step, once; --save-format misuse; --generate without model.init.
  samples  a tiny byte-level model memorises a sentence: the train.sample_every line and
           worker --generate (greedy) reproduce it; a random sample (top_k 0, seed 5)
           from the saved model is the same on one rank, tp2, pp2 and dp2; under
           data.tokenizer the prompt is encoded and the sample decoded by the tokenizer;
           --save is the same bytes with and without train.sample_every.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORKER, MPIRUN = sys.argv[1], sys.argv[2]
MPI_ARGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
TINY = ["model.layers=2", "model.d_model=64", "model.heads=4", "model.seq_len=32",
        "train.batch_size=4", "runtime.threads=1", "train.eval_every=0"]
SENTENCE = "the quick brown fox jumps over the lazy dog. "


def run(args, np=1, timeout=120):
    cmd = ([MPIRUN] + MPI_ARGS + ["-np", str(np)] if np > 1 else []) + [WORKER] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def run_ok(args, np=1, timeout=120):
    rc, out, err = run(args, np, timeout)
    if rc != 0:
        print(out[-3000:] + err[-3000:])
        raise AssertionError(f"{' '.join(args)} (np {np}) exited {rc}")
    return out


def error_lines(text):
    return [l for l in text.splitlines() if l.startswith("weft: error") or "[weft E" in l]


# ---- reading the files back, independently of weft -------------------------------------

def read_llmc(path):
    with open(path, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
        body = f.read()
    assert h[0] == 20240326, h[:2]
    if h[1] == 3:
        return h, list(struct.unpack("<%df" % (len(body) // 4), body))
    assert h[1] == 5, h[1]
    n = len(body) // 2
    halves = struct.unpack("<%dH" % n, body)
    return h, [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in halves]


def bf16_nearest_even(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = (t["shape"], list(struct.unpack("<%df" % ((e - b) // 4), data[b:e])))
    return head.get("__metadata__", {}), out


def llmc_tensors(h, p):
    """The llm.c array cut into (name, rows, cols, values) of the kinds checked here."""
    T, V, L, NH, C, Vp = h[2], h[3], h[4], h[5], h[6], h[7]
    sizes = [("wte", Vp * C), ("wpe", T * C), ("ln1w", L * C), ("ln1b", L * C),
             ("qkvw", L * 3 * C * C), ("qkvb", L * 3 * C), ("attprojw", L * C * C),
             ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C), ("fcw", L * 4 * C * C),
             ("fcb", L * 4 * C), ("fcprojw", L * C * 4 * C), ("fcprojb", L * C), ("lnfw", C),
             ("lnfb", C)]
    out, off = {}, 0
    for name, n in sizes:
        out[name] = p[off:off + n]
        off += n
    assert off == len(p), (off, len(p))
    return out


def check_safetensors_export(st_path, llmc_path):
    h, p = read_llmc(llmc_path)
    T, V, L, C = h[2], h[3], h[4], h[6]
    k = llmc_tensors(h, p)
    meta, t = read_safetensors(st_path)
    assert int(meta["n_layer"]) == L and int(meta["n_head"]) == h[5], meta
    assert "lm_head.weight" not in t  # tied: left out
    shape, wte = t["transformer.wte.weight"]
    assert shape == [V, C] and wte == k["wte"][:V * C]  # the padded rows are not written
    assert t["transformer.wpe.weight"][1] == k["wpe"]
    for l in range(L):
        # Conv1D: the file holds (in, out), the transpose of llm.c's (out, in)
        shape, w = t[f"transformer.h.{l}.attn.c_attn.weight"]
        assert shape == [C, 3 * C], shape
        q = k["qkvw"][l * 3 * C * C:(l + 1) * 3 * C * C]
        assert all(w[i * 3 * C + o] == q[o * C + i] for i in range(C) for o in range(3 * C))
        shape, w = t[f"transformer.h.{l}.mlp.c_proj.weight"]
        assert shape == [4 * C, C], shape
        q = k["fcprojw"][l * 4 * C * C:(l + 1) * 4 * C * C]
        assert all(w[i * C + o] == q[o * 4 * C + i] for i in range(4 * C) for o in range(C))
        assert t[f"transformer.h.{l}.ln_2.bias"][1] == k["ln2b"][l * C:(l + 1) * C]
    assert t["transformer.ln_f.weight"][1] == k["lnfw"]
    print(f"--export safetensors: {len(t)} tensors equal the llm.c export's (Conv1D transposed)")


def read_state_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def state_floats(path):
    data = read_state_bytes(path)
    h = struct.unpack_from("<256i", data)
    B, T = h[2], h[3]
    off = 1024 + 8 * B * T
    return struct.unpack_from("<%df" % ((len(data) - off) // 4), data, off), B * T


# ---- tests ---------------------------------------------------------------------------------

def write_corpus(d):
    path = os.path.join(d, "fox.txt")
    with open(path, "w") as f:
        f.write(SENTENCE * 200)
    return path


def test_weights(d):
    corpus = write_corpus(d)
    ck = os.path.join(d, "ck")
    base = TINY + ["data.path=" + corpus]
    out = run_ok(base + ["train.steps=6", "mesh.tp=2", "train.checkpoint_dir=" + ck], np=2)
    assert "read as bytes" in out, out  # the banner says a text file is bytes
    res = "train.resume=" + ck
    x_bin, x_st, x5 = (os.path.join(d, n) for n in ("x.bin", "x.safetensors", "x5.bin"))
    print(run_ok([res, "--export", "llmc", x_bin]).strip())
    print(run_ok([res, "--export", "safetensors", x_st]).strip())
    print(run_ok([res, "--save-format", "llmc-bf16", "--export", "llmc", x5]).strip())
    check_safetensors_export(x_st, x_bin)
    h3, p3 = read_llmc(x_bin)
    h5, p5 = read_llmc(x5)
    assert h5[1] == 5 and h5[2:8] == h3[2:8], (h5[:8], h3[:8])
    assert os.path.getsize(x5) == 1024 + 2 * len(p3)
    assert p5 == [bf16_nearest_even(x) for x in p3]  # nearest bf16, ties to even
    print(f"--save-format llmc-bf16: version 5, {len(p5)} parameters = nearest bf16 of v3's")

    # the same weights from every format: bit-identical logits, loss and gradients
    states = {}
    for tag, init in (("llmc", x_bin), ("safetensors", x_st), ("checkpoint dir", ck),
                      ("llmc v5", x5)):
        path = os.path.join(d, tag.replace(" ", "_") + ".state")
        run_ok(base + ["model.init=" + init, "--dump-state", path])
        states[tag] = read_state_bytes(path)
    for tag in ("safetensors", "checkpoint dir"):
        assert states[tag] == states["llmc"], f"--dump-state from {tag} differs from llm.c's"
    assert states["llmc v5"] != states["llmc"]  # the bf16 file is another model
    fl, N = state_floats(os.path.join(d, "llmc.state"))
    print(f"--dump-state: model.init=x.bin, x.safetensors and the checkpoint dir give the same "
          f"{len(read_state_bytes(os.path.join(d, 'llmc.state')))} bytes (loss {fl[N * 256]:.6f})")

    # tp2 and pp2 meshes initialised from safetensors against one rank. Tolerances are
    # tests/mpi/equiv.py's for --dump-state across meshes (the sums' order differs):
    # logits 1e-5 absolute, loss 1e-6 relative, gradients 1e-4 of the largest.
    one, N = state_floats(os.path.join(d, "safetensors.state"))
    nl = N * 256
    gmax = max(abs(g) for g in one[nl + 1:])
    for mesh in (["mesh.tp=2"], ["mesh.pp=2"]):
        path = os.path.join(d, "mesh.state")
        run_ok(base + ["model.init=" + x_st, "--dump-state", path] + mesh, np=2)
        fl, _ = state_floats(path)
        dl = max(abs(a - b) for a, b in zip(one[:nl], fl[:nl]))
        dloss = abs(fl[nl] - one[nl]) / abs(one[nl])
        dg = max(abs(a - b) for a, b in zip(one[nl + 1:], fl[nl + 1:]))
        print(f"{mesh[0]} from safetensors: logits {dl:.2e}, loss {dloss:.2e}, grads "
              f"{dg / gmax:.2e} of the largest")
        assert dl <= 1e-5 and dloss <= 1e-6 and dg <= 1e-4 * gmax, (mesh, dl, dloss, dg)

    # ZeRO-3 reads each dp rank's range of model.init alone (a safetensors file, a sharded
    # folder, a checkpoint saved at tp 2): at dp 2 and 3 it trains bit for bit as ZeRO-2,
    # whose ranks read their whole copies, from every one
    hf = os.path.join(d, "hf") + "/"
    run_ok([res, "model.shard_mb=0.1", "--export", "safetensors", hf])
    assert os.path.exists(hf + "model.safetensors.index.json")
    zero3_same_as_zero2(d, base, (("safetensors", x_st), ("sharded folder", hf),
                                  ("checkpoint dir", ck)), [])

    # --save in safetensors after training from safetensors, on pp2; read back here
    y = os.path.join(d, "y.safetensors")
    out = run_ok(base + ["model.init=" + x_st, "train.steps=2", "mesh.pp=2", "--save", y,
                         "--save-format", "safetensors"], np=2)
    meta, t = read_safetensors(y)
    assert int(meta["n_layer"]) == 2 and len(t) == 4 + 12 * 2, (meta, len(t))
    assert t["transformer.wte.weight"][1] != read_safetensors(x_st)[1]["transformer.wte.weight"][1]
    print("--save --save-format safetensors on pp2: a GPT-2 of 28 tensors, trained further")
    test_reference_file(d, base)


def zero3_same_as_zero2(d, base, inits, save_args):
    """model.init under ZeRO-3 at dp 2 and dp 3: two steps' --save bytes equal ZeRO-2's
    (ZeRO-3 reduces as ZeRO-2 does, so they train bit for bit alike; any element its
    ranged read got wrong would show)."""
    for tag, init in inits:
        for dp in (2, 3):
            saved = []
            for zero in (2, 3):
                out = os.path.join(d, f"zero{zero}.out")
                run_ok(base + ["model.init=" + init, "train.steps=2", "train.batch_size=6",
                               f"optim.zero={zero}", "--save", out] + save_args, np=dp)
                with open(out, "rb") as f:
                    saved.append(f.read())
            assert saved[0] == saved[1], f"model.init={tag} at dp {dp}: ZeRO-3 != ZeRO-2"
        print(f"model.init from the {tag} under ZeRO-3 at dp 2 and 3: the same --save bytes "
              f"as ZeRO-2")


def transpose(vals, rows, cols):
    """(rows, cols) row-major -> (cols, rows)."""
    return [vals[r * cols + c] for c in range(cols) for r in range(rows)]


def test_reference_file(d, base):
    """A safetensors file from the independent writer (st_ref.py: BF16, lm_head.weight
    tied and present, as Hugging Face saves GPT2LMHeadModel) and the llm.c file this test
    builds from the same values with its own transposes: the same --dump-state bytes."""
    import st_ref
    L, NH, C, T, V = 2, 4, 64, 32, 256
    st = os.path.join(d, "ref.safetensors")
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "st_ref.py"), "write", st, str(L), str(NH),
                    str(C), str(T), str(V), "--dtype", "BF16", "--lm-head", "tied",
                    "--meta-heads", str(NH)], check=True)
    hf = {n: [st_ref.value(n, i) for i in range(st_ref.numel(s))]
          for n, s in st_ref.tensors(L, C, T, V)}

    def layers(suffix, rows=0, cols=0):  # every layer's tensor, Conv1D (rows, cols) transposed
        out = []
        for l in range(L):
            v = hf[f"transformer.h.{l}.{suffix}"]
            out += transpose(v, rows, cols) if rows else v
        return out
    p = (hf["transformer.wte.weight"] + hf["transformer.wpe.weight"] + layers("ln_1.weight")
         + layers("ln_1.bias") + layers("attn.c_attn.weight", C, 3 * C)
         + layers("attn.c_attn.bias") + layers("attn.c_proj.weight", C, C)
         + layers("attn.c_proj.bias") + layers("ln_2.weight") + layers("ln_2.bias")
         + layers("mlp.c_fc.weight", C, 4 * C) + layers("mlp.c_fc.bias")
         + layers("mlp.c_proj.weight", 4 * C, C) + layers("mlp.c_proj.bias")
         + hf["transformer.ln_f.weight"] + hf["transformer.ln_f.bias"])
    llmc = os.path.join(d, "ref.bin")
    with open(llmc, "wb") as f:
        f.write(struct.pack("<256i", *([20240326, 3, T, V, L, NH, C, V] + [0] * 248)))
        f.write(struct.pack("<%df" % len(p), *p))
    a, b = os.path.join(d, "ref_st.state"), os.path.join(d, "ref_bin.state")
    run_ok(base + ["model.init=" + st, "--dump-state", a])
    run_ok(base + ["model.init=" + llmc, "--dump-state", b])
    assert read_state_bytes(a) == read_state_bytes(b), "reference safetensors != its llm.c twin"
    fl, N = state_floats(a)
    print(f"st_ref.py's BF16 safetensors (lm_head tied) and the llm.c file built here from the "
          f"same values: the same --dump-state bytes (loss {fl[N * V]:.4f})")


def truncate(src, dst, cut):
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(data[:len(data) - cut])


def rewrite_header(src, dst, edit):
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    edit(head)
    js = json.dumps(head).encode()
    js += b" " * (-len(js) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + data)


def test_errors(d):
    corpus = write_corpus(d)
    good_st, good_bin = os.path.join(d, "good.safetensors"), os.path.join(d, "good.bin")
    run_ok(TINY + ["data.path=" + corpus, "train.steps=1", "--save", good_st, "--save-format",
                   "safetensors"])
    run_ok(TINY + ["data.path=" + corpus, "train.steps=1", "--save", good_bin, "--save-format",
                   "llmc-bf16"])
    cases = []
    p = os.path.join(d, "cut.safetensors")
    truncate(good_st, p, 100)
    cases.append((p, "truncated"))
    p = os.path.join(d, "shape.safetensors")

    def transpose_fc(head):
        t = head["transformer.h.1.mlp.c_fc.weight"]
        t["shape"] = t["shape"][::-1]
    rewrite_header(good_st, p, transpose_fc)
    cases.append((p, "has shape [256, 64]"))
    p = os.path.join(d, "missing.safetensors")
    rewrite_header(good_st, p, lambda head: head.pop("transformer.h.0.ln_2.bias"))
    cases.append((p, "'transformer.h.0.ln_2.bias' is missing"))
    p = os.path.join(d, "cut5.bin")
    truncate(good_bin, p, 2)
    cases.append((p, "truncated llm.c checkpoint (version 5, bf16)"))
    p = os.path.join(d, "v4.bin")
    with open(good_bin, "rb") as f:
        data = bytearray(f.read())
    data[4:8] = struct.pack("<i", 4)
    with open(p, "wb") as f:
        f.write(data)
    cases.append((p, "version 4: weft reads version 3 (float32) and 5 (bf16)"))
    for path, word in cases:
        rc, out, err = run(TINY + ["data.path=" + corpus, "train.steps=2", "model.init=" + path],
                           np=4, timeout=60)
        lines = error_lines(out + err)
        print("\n".join(lines))
        assert rc != 0, rc
        assert len(lines) == 1 and word in lines[0] and path in lines[0], lines
    for args, word in ((["--save-format", "pt", "--save", "x"], "--save-format pt: unknown"),
                       (["--save-format", "llmc-bf16"], "applies to --save FILE"),
                       (["--save-format", "safetensors", "--export", "llmc", "x"],
                        "use --export safetensors")):
        rc, out, err = run(args)
        lines = error_lines(out + err)
        assert rc == 2 and len(lines) == 1 and word in lines[0], (args, rc, lines)
        print(lines[0])
    # a sample's prompt outside the vocabulary: refused before training, once
    rc, out, err = run(TINY + ["model.vocab=64", "train.steps=4", "train.sample_every=2",
                               "train.sample_prompt=zzz"], np=4, timeout=60)
    lines = error_lines(out + err)
    assert rc != 0 and len(lines) == 1 and "byte 122" in lines[0], lines
    assert "step 1/" not in out, out
    print(lines[0])
    rc, out, err = run(["--generate", "hi"])
    lines = error_lines(out + err)
    assert rc != 0 and len(lines) == 1 and "model.init" in lines[0], lines
    print("\n".join(lines))


def last_sample(out):
    lines = [l for l in out.splitlines() if l.startswith("sample ")]
    assert lines, out
    return lines[-1]


def test_samples(d):
    corpus = write_corpus(d)
    model = os.path.join(d, "fox.bin")
    out = run_ok(TINY + ["data.path=" + corpus, "train.steps=300", "train.lr=1e-2",
                         "train.sample_every=150", "train.sample_tokens=60",
                         "train.sample_top_k=1", "train.sample_prompt=the quick", "--save",
                         model], timeout=300)
    line = last_sample(out)
    print(line)
    want = (SENTENCE * 3)[:9 + 60]
    assert line == "sample 300/300: " + want, (line, want)
    gen = ["--generate", "the quick", "model.init=" + model, "runtime.threads=1",
           "train.sample_tokens=60"]
    text = run_ok(gen + ["train.sample_top_k=1"])
    assert text == want + "\n", (text, want)
    print(f"--generate greedy: {text.strip()!r}")
    rand = gen + ["train.sample_top_k=0", "train.sample_seed=5", "train.sample_temperature=2"]
    one = run_ok(rand)
    print(f"--generate top_k=0 T=2 seed 5 (np 1): {one.strip()!r}")
    assert one != text  # a hot, full-vocabulary sample strays from the memorised text
    for mesh in (["mesh.tp=2"], ["mesh.pp=2"], ["mesh.dp=2"]):
        got = run_ok(rand + mesh, np=2)
        assert got == one, (mesh, got, one)
        print(f"--generate on {mesh[0]}: the same sample")
    # a sample during training on tp2 x pp2 equals one rank's
    args = TINY + ["data.path=" + corpus, "train.steps=4", "train.sample_every=4",
                   "train.sample_tokens=20", "train.sample_top_k=0", "train.sample_prompt=fox"]
    a = last_sample(run_ok(args))
    b = last_sample(run_ok(args + ["mesh.tp=2", "mesh.pp=2"], np=4))
    assert a == b, (a, b)
    print(f"train.sample_every on tp2 x pp2: {b!r}, as one rank")
    # sampling changes nothing training computes: the same --save bytes without it
    s1, s2 = os.path.join(d, "s1.bin"), os.path.join(d, "s2.bin")
    run_ok(args + ["mesh.pp=2", "train.steps=6", "train.sample_every=2", "--save", s1], np=2)
    run_ok(args + ["mesh.pp=2", "train.steps=6", "train.sample_every=0", "--save", s2], np=2)
    with open(s1, "rb") as f1, open(s2, "rb") as f2:
        assert f1.read() == f2.read(), "train.sample_every changed the trained model"
    print("--save with and without train.sample_every: the same bytes")
    # a byte-level model with a vocabulary above 256: ids past the bytes are written <ID>
    v300 = os.path.join(d, "v300.bin")
    run_ok(TINY + ["model.vocab=300", "train.steps=1", "--save", v300])
    text = run_ok(["--generate", "hi", "model.init=" + v300, "train.sample_tokens=40",
                   "train.sample_top_k=0", "train.sample_temperature=5", "runtime.threads=1"])
    import re
    big = [int(x) for x in re.findall(r"<(\d+)>", text)]
    assert big and all(256 <= x < 300 for x in big), text
    assert all(32 <= ord(c) < 127 or c in "\n\t" for c in text), text  # the rest escaped
    print(f"--generate, vocab 300 without a tokenizer: {text.strip()!r}")
    test_tokenizer_sample(d)


def test_tokenizer_sample(d):
    import gpt2_ref
    gpt2_ref.write_fixtures(d)
    ref = gpt2_ref.load(d)
    tok = "data.tokenizer=" + os.path.join(d, "tokenizer.json")
    corpus = os.path.join(d, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write((gpt2_ref.CORPUS + "<|endoftext|>") * 40)
    prefix = os.path.join(d, "tiny")
    run_ok(["--tokenize", corpus, prefix, tok])
    model = os.path.join(d, "tok.bin")
    V = len(ref.vocab)
    run_ok(TINY + ["data.path=" + prefix + "_train_*.bin", f"model.vocab={V}", "train.steps=5",
                   "--save", model])
    prompt = gpt2_ref.CORPUS.split()[0] + " " + gpt2_ref.CORPUS.split()[1]
    text = run_ok(["--generate", prompt, "model.init=" + model, tok, "runtime.threads=1",
                   "train.sample_tokens=12", "train.sample_seed=3"])
    assert text.startswith(prompt) and "\\x" not in text, (text, prompt)  # decoded, not bytes
    # the continuation is 12 tokens of the vocabulary: the reference re-encodes the text
    # into the prompt's tokens and at least one more, and decodes it back unchanged
    ids = ref.encode(text[:-1])
    assert len(ids) >= len(ref.encode(prompt)) + 1, (text, ids)
    assert ref.decode(ids).decode("utf-8") == text[:-1], (text, ids)
    print(f"--generate under data.tokenizer: {text.strip()!r}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="weft_weights_") as d:
        for name in sys.argv[3:] or ["weights", "errors", "samples"]:
            sub = os.path.join(d, name)
            os.mkdir(sub)
            {"weights": test_weights, "errors": test_errors, "samples": test_samples}[name](sub)
    print("ok")
