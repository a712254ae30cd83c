#!/usr/bin/env python3
"""bench/torch_models.py's Llama (the PyTorch peer bench/gpu_train.py times against weft's
llama-1b) computes what tests/model/llama_ref.py computes: Hugging Face's
LlamaForCausalLM, written independently (llama_ref is itself checked against weft's CPU
forward and backward, tests/model/llama_ref_check.py).

    /usr/bin/python3 tests/model/torch_llama_check.py

The same weights (llama_ref.init_weights, in Hugging Face's names, loaded into the
bench model's state dict as they stand: the bench model keeps Hugging Face's module
names) and the same tokens go through both, in float64 on the CPU, at tiny shapes that
exercise every piece the 1B model has: grouped-query attention (4 query heads over 2 kv
heads), RoPE with Llama 3's llama3 frequency scaling (factor 8, low 1, high 4, an
original context of 16, so of the head's four wavelengths, 6.3, 63, 628 and 6283
positions, one is interpolated and three are divided by the factor), the tied head (as
Llama 3.2 1B) and an untied one, and without scaling. Compared: the loss, and every
parameter's gradient.

Tolerance: both are float64 computations of the same ops, differing only in the order
of some sums (the bench model adds the repeated kv heads through SDPA or its explicit
softmax, RMSNorm promotes to float64 rather than float32): a relative difference of
order 1e-15 per op, about 1e-13 after 2 layers and a backward pass; LOSS_RTOL 1e-10 and
GRAD_RTOL 1e-9 of each gradient's largest element leave three orders of margin, while
a wrong piece (a missing scaling, a kv head served to the wrong query heads, a norm
weight misplaced) moves the loss by more than 1e-4 (the mutation at the end checks
that one such change fails).
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import llama_ref  # noqa: E402
import torch_models  # noqa: E402

LOSS_RTOL, GRAD_RTOL = 1e-10, 1e-9
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def bench_model(cfg, weights):
    c = torch_models.LlamaConfig(cfg.L, cfg.NH, cfg.NKV, cfg.C, cfg.F, cfg.V, cfg.theta,
                                 cfg.eps, cfg.tied, cfg.scaling)
    m = torch_models.Llama(c).double()
    state = {n: torch.tensor(a, dtype=torch.float64) for n, a in weights.items()}
    if cfg.tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = m.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"FAIL: the bench model's names are not Hugging Face's: missing {missing}, "
                 f"unexpected {unexpected}")
    return m


def check(name, cfg_dict, mutate=None):
    cfg = llama_ref.Config(cfg_dict)
    w = llama_ref.init_weights(cfg, 11, std=0.3)  # far from uniform attention
    g = np.random.default_rng(12)
    tok, tgt = g.integers(0, cfg.V, (2, 32)), g.integers(0, cfg.V, (2, 32))
    _, ref_loss, ref_grads = llama_ref.run(cfg, w, tok, tgt)
    m = bench_model(cfg, w)
    if mutate:
        mutate(m)
    loss = m(torch.as_tensor(tok), torch.as_tensor(tgt))
    loss.backward()
    params = dict(m.named_parameters())  # a tied head appears once, as the embedding
    rel = abs(loss.item() - ref_loss) / abs(ref_loss)
    worst, where = 0.0, ""
    for n, ref in ref_grads.items():
        got = params[n].grad.numpy()
        d = np.abs(got - ref).max() / np.abs(ref).max()
        if d > worst:
            worst, where = d, n
    ok = rel <= LOSS_RTOL and worst <= GRAD_RTOL
    print(f"{'ok' if ok else 'differs'}: {name}: loss {loss.item():.12f} vs llama_ref "
          f"{ref_loss:.12f} (rel {rel:.1e}, tol {LOSS_RTOL}); gradients within {worst:.1e} of "
          f"their largest element (tol {GRAD_RTOL}, worst {where})")
    return ok, rel


def main():
    torch.set_num_threads(1)
    base = {"vocab_size": 37, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0}
    cases = [("GQA, llama3 RoPE scaling, tied head", dict(base, tie_word_embeddings=True,
                                                          rope_scaling=SCALING)),
             ("GQA, llama3 RoPE scaling, untied head", dict(base, tie_word_embeddings=False,
                                                            rope_scaling=SCALING)),
             ("multi-head, no scaling, untied", dict(base, num_key_value_heads=4,
                                                     tie_word_embeddings=False))]
    good = all(check(n, c)[0] for n, c in cases)

    def drop_scaling(m):  # the mutation: the frequencies without llama3's scaling
        rot = m.model.rotary_emb
        hs = rot.inv_freq.numel() * 2
        rot.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2).double() / hs))
    ok, rel = check("mutation: RoPE scaling dropped (must differ)", cases[0][1], drop_scaling)
    if ok or rel < 1e-4:
        print(f"FAIL: dropping the llama3 scaling moved the loss by only {rel:.1e}: the check "
              "cannot tell it")
        return 1
    if not good:
        print("FAIL: bench/torch_models.py's Llama differs from llama_ref.py")
        return 1
    print("ok: bench/torch_models.py's Llama equals llama_ref.py (Hugging Face's "
          "LlamaForCausalLM)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
