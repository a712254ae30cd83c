#!/usr/bin/env python3
"""weft's Llama against an independent reference of Hugging Face's LlamaForCausalLM.

`llama_ref_check.py HF_DUMP`: for a tiny Llama with grouped-query attention (4 query
heads, 2 kv heads), untied, tied, and untied with Llama 3.1's RoPE scaling (config.json's
rope_scaling, rope_type llama3, every band of frequencies): llama_ref.py writes random weights in Hugging Face's
names and layouts (matrices normal(0, 0.3), norm weights 1 + normal(0, 0.1), so every
path carries an O(1) signal) and a config.json beside them; weft (hf_dump: the
safetensors codec, the Llama family, its kernels) runs one forward and backward of a
batch; llama_ref.py runs the same batch in float64 with PyTorch's autograd. The logits,
the loss and every parameter's gradient (weft writes its gradients through the same
codec, so the mapping of q_proj / k_proj / v_proj into [q|k|v], gate_proj / up_proj into
[gate|up], the tied head and RoPE's pairing of q and k rows are all checked: a wrong one
moves logits by O(1)) must agree.

Tolerances: weft computes in float32 (eps = 2^-24 = 6e-8 per rounding) against a float64
ground truth. A logit is a 64-term dot product after 2 layers of 64- and 96-term sums,
RMSNorms and a softmax over <= 16 positions: relative errors ~sqrt(64) * eps ~ 5e-7 per
sum, a few such in sequence, on logits up to ~9 in magnitude: ~1e-5 absolute; LOGIT_ATOL = 1e-4 (measured 1.3e-5 untied, 1.6e-5 tied).
Gradients are sums over the B*T = 32 rows of such products: GRAD_RTOL = 1e-4 of each
tensor's largest |gradient| (measured 5.0e-6 and 4.6e-6). The loss is the mean of 32
such logits' cross-entropies: LOSS_RTOL = 1e-5 (measured 6e-8). A bug in a kernel, a
swapped group or a RoPE convention error gives errors of order one (swapping k_proj and
v_proj moves the logits by 13).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402

HF_DUMP = sys.argv[1]
LOGIT_ATOL = 1e-4
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4
B, T = 2, 16
CONFIG = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "model_type": "llama",
          "architectures": ["LlamaForCausalLM"]}
# Llama 3.1's rope_scaling with factor 8 and an original context (12) shorter than T, so
# that the head's 8 frequencies (theta 10000, head size 16: wavelengths 2 pi 10000^(i/8),
# 6.3 to 19869) fall in all three bands: under 12 / 1.5 = 8 kept (i = 0), between 8 and
# 12 / 0.5 = 24 interpolated (i = 1), above 24 divided by 8 (i >= 2).
SCALED = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.5, "high_freq_factor": 1.5,
          "original_max_position_embeddings": 12}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check(tied, tmp, scaling=None):
    tag = f"tied={tied}" + (" rope_scaling=llama3" if scaling else "")
    d = os.path.join(tmp, ("tied" if tied else "untied") + ("-scaled" if scaling else ""))
    os.makedirs(d)
    cfg = dict(CONFIG, tie_word_embeddings=tied, rope_scaling=scaling)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    weights = os.path.join(d, "model.safetensors")
    subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), "init",
                    os.path.join(d, "config.json"), weights, "--seed", "3", "--std", "0.3"],
                   check=True)
    g = np.random.default_rng(11)
    tok = g.integers(0, cfg["vocab_size"], B * T).astype("<i4")
    tgt = g.integers(0, cfg["vocab_size"], B * T).astype("<i4")
    tok.tofile(os.path.join(d, "tok.bin"))
    tgt.tofile(os.path.join(d, "tgt.bin"))
    out = os.path.join(d, "weft")
    p = subprocess.run([HF_DUMP, weights, os.path.join(d, "tok.bin"), os.path.join(d, "tgt.bin"),
                        str(B), out], capture_output=True, text=True)
    if p.returncode:
        fail(f"hf_dump exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    print(p.stdout.strip())
    ref = os.path.join(d, "ref.safetensors")
    subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), "run",
                    os.path.join(d, "config.json"), weights, os.path.join(d, "tok.bin"),
                    os.path.join(d, "tgt.bin"), ref, "--batch", str(B)], check=True)
    want = llama_ref.st_read(ref)
    V = cfg["vocab_size"]
    logits = np.fromfile(out + ".logits", dtype="<f4").reshape(B, T, V)
    (loss,) = struct.unpack("<f", open(out + ".loss", "rb").read())
    dl = float(np.abs(logits - want["logits"]).max())
    if not dl <= LOGIT_ATOL:
        fail(f"{tag}: logits differ by {dl:.3e} > {LOGIT_ATOL}")
    rl = abs(loss - float(want["loss"][0])) / float(want["loss"][0])
    if not rl <= LOSS_RTOL:
        fail(f"{tag}: loss {loss} vs {want['loss'][0]} (rel {rl:.2e})")
    grads = llama_ref.st_read(out + ".grads.safetensors")
    names = [n for n, _ in llama_ref.param_shapes(llama_ref.Config(cfg))]
    if sorted(grads) != sorted(names):
        fail(f"{tag}: weft's gradient tensors {sorted(grads)} vs {sorted(names)}")
    worst = 0.0
    for n in names:
        r = want["grad." + n]
        scale = float(np.abs(r).max())
        e = float(np.abs(grads[n] - r).max()) / scale
        worst = max(worst, e)
        if not e <= GRAD_RTOL:
            fail(f"{tag}: gradient of {n} differs by {e:.3e} of its largest {scale:.3e}")
    print(f"ok: {tag}: logits (largest {np.abs(want['logits']).max():.1f}) within {dl:.2e} "
          f"(tol {LOGIT_ATOL}), loss {loss:.6f} "
          f"(rel {rl:.1e}), {len(names)} gradients within {worst:.2e} of their largest "
          f"(tol {GRAD_RTOL})")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for tied in (False, True):
            check(tied, tmp)
        check(False, tmp, SCALED)


main()
