#!/usr/bin/env python3
"""weft's mixture-of-experts families against an independent reference of Hugging Face's
OlmoeForCausalLM, Qwen3MoeForCausalLM and MixtralForCausalLM (moe_ref.py).

`moe_ref_check.py HF_DUMP`: for a tiny model of each family (2 layers, d_model 64, 4 heads;
4 experts of width 96, top-2; OLMoE with its whole-projection q/k norms, Qwen3-MoE with
32-wide heads (head_dim != d_model / heads) over 2 kv heads and per-head q/k norms and
renormalised top-k, Mixtral with block_sparse_moe's names), moe_ref.py writes random weights
in Hugging Face's names and layouts (matrices normal(0, 0.3), norm weights 1 + normal(0,
0.1)) and a config.json beside them with router_aux_loss_coef 0.3 (large, so a wrong
load-balancing gradient shows); weft (hf_dump: the safetensors codec, the family, its
kernels) runs one forward and backward of a batch; moe_ref.py runs it in float64 with
PyTorch's autograd. The logits, the cross-entropy, the load-balancing loss and every
parameter's gradient of the total loss must agree. Further cases: OLMoE with the router
z-loss (coefficient 0.05) and a capacity factor of 0.5 that drops about half of the choices;
Mixtral with its embedding tied to the head.

Tolerances: weft computes in float32 against a float64 ground truth, as llama_ref_check.py
argues (its docstring): LOGIT_ATOL = 1e-4, LOSS_RTOL = 1e-5, GRAD_RTOL = 1e-4 of each
tensor's largest |gradient|; the expert outputs add K = 2 more 96-term products per token,
no larger than the MLP's there. The load-balancing loss is E / R^2 sum_e cnt_e psum_e with
cnt_e exact counts and psum_e a float32 sum of R = 64 probabilities (relative error
~sqrt(64) eps ~ 5e-7), and the z-loss a mean of 64 squared logsumexps (the same): AUX_RTOL =
1e-5. A wrong expert choice (a top-k tie resolved differently) would move a logit by O(1),
not by these amounts; the seeds give no near ties.
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
import moe_ref  # noqa: E402

HF_DUMP = sys.argv[1]
LOGIT_ATOL = 1e-4
LOSS_RTOL = 1e-5
AUX_RTOL = 1e-5
GRAD_RTOL = 1e-4
B, T = 2, 16
BASE = {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "num_experts_per_tok": 2, "router_aux_loss_coef": 0.3, "tie_word_embeddings": False}
FAMILIES = {
    "olmoe": {"model_type": "olmoe", "architectures": ["OlmoeForCausalLM"],
              "num_key_value_heads": 4, "intermediate_size": 96, "num_experts": 4,
              "norm_topk_prob": False},
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
                  "num_key_value_heads": 2, "head_dim": 32, "moe_intermediate_size": 96,
                  "intermediate_size": 96, "num_experts": 4, "norm_topk_prob": True,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                "num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 4},
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run_pair(d, cfg, extra):
    """hf_dump and moe_ref.py on the same weights and batch; their outputs."""
    weights = os.path.join(d, "model.safetensors")
    subprocess.run([sys.executable, os.path.join(HERE, "moe_ref.py"), "init",
                    os.path.join(d, "config.json"), weights, "--seed", "3", "--std", "0.3"],
                   check=True)
    g = np.random.default_rng(11)
    for name in ("tok", "tgt"):
        g.integers(0, cfg["vocab_size"], B * T).astype("<i4").tofile(os.path.join(d, name + ".bin"))
    out = os.path.join(d, "weft")
    p = subprocess.run([HF_DUMP, weights, os.path.join(d, "tok.bin"), os.path.join(d, "tgt.bin"),
                        str(B), out, str(extra.get("z", 0)), str(extra.get("capacity", 0))],
                       capture_output=True, text=True)
    if p.returncode:
        fail(f"hf_dump exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    ref = os.path.join(d, "ref.safetensors")
    subprocess.run([sys.executable, os.path.join(HERE, "moe_ref.py"), "run",
                    os.path.join(d, "config.json"), weights, os.path.join(d, "tok.bin"),
                    os.path.join(d, "tgt.bin"), ref, "--batch", str(B), "--z",
                    str(extra.get("z", 0)), "--capacity", str(extra.get("capacity", 0))],
                   check=True, capture_output=True)
    return out, moe_ref.L.st_read(ref)


def compare_scalars(tag, out, want):
    (loss,) = struct.unpack("<f", open(out + ".loss", "rb").read())
    aux, z = struct.unpack("<2f", open(out + ".aux", "rb").read())
    rl = abs(loss - float(want["loss"][0])) / float(want["loss"][0])
    ra = abs(aux - float(want["aux"][0])) / float(want["aux"][0])
    rz = abs(z - float(want["z"][0])) / float(want["z"][0])
    if not (rl <= LOSS_RTOL and ra <= AUX_RTOL and rz <= AUX_RTOL):
        fail(f"{tag}: cross-entropy {loss} vs {want['loss'][0]} (rel {rl:.2e}), load-balancing "
             f"{aux} vs {want['aux'][0]} (rel {ra:.2e}), z {z} vs {want['z'][0]} (rel {rz:.2e})")
    return loss, aux, rl, ra


def check(name, tmp, extra):
    tag = f"{name}" + "".join(f" {k}={v}" for k, v in extra.items())
    d = os.path.join(tmp, tag.replace(" ", "_").replace("=", "-"))
    os.makedirs(d)
    cfg = dict(BASE, **FAMILIES[name])
    cfg["tie_word_embeddings"] = bool(extra.get("tied"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    out, want = run_pair(d, cfg, extra)
    V = cfg["vocab_size"]
    logits = np.fromfile(out + ".logits", dtype="<f4").reshape(B, T, V)
    dl = float(np.abs(logits - want["logits"]).max())
    if not dl <= LOGIT_ATOL:
        fail(f"{tag}: logits differ by {dl:.3e} > {LOGIT_ATOL}")
    loss, aux, rl, ra = compare_scalars(tag, out, want)
    grads = moe_ref.L.st_read(out + ".grads.safetensors")
    names = [n for n, _ in moe_ref.param_shapes(moe_ref.Config(cfg))]
    if sorted(grads) != sorted(names):
        fail(f"{tag}: weft's gradient tensors {sorted(set(grads) ^ set(names))[:4]} differ")
    worst = 0.0
    for n in names:
        r = want["grad." + n]
        scale = max(float(np.abs(r).max()), 1e-30)
        e = float(np.abs(grads[n] - r).max()) / scale
        worst = max(worst, e)
        if not e <= GRAD_RTOL:
            fail(f"{tag}: gradient of {n} differs by {e:.3e} of its largest {scale:.3e}")
    print(f"ok: {tag}: logits within {dl:.2e} (tol {LOGIT_ATOL}), cross-entropy {loss:.6f} (rel "
          f"{rl:.1e}), load-balancing loss {aux:.6f} (rel {ra:.1e}), {len(names)} gradients "
          f"within {worst:.2e} of their largest (tol {GRAD_RTOL})")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for name in FAMILIES:
            check(name, tmp, {})
        check("olmoe", tmp, {"z": 0.05, "capacity": 0.5})
        check("mixtral", tmp, {"tied": 1})


main()
