#!/usr/bin/env python3
"""bench/torch_models.py's Mixtral (the PyTorch peer bench/moe.py times against weft's MoE
layer: Hugging Face's MixtralSparseMoeBlock with its loop over experts) computes what
tests/model/moe_ref.py computes for model_type mixtral (itself checked against weft's
forward and backward by tests/model/moe_ref_check.py).

    /usr/bin/python3 tests/model/torch_mixtral_check.py

The same weights (moe_ref.init_weights, in Hugging Face's names, loaded into the bench
model's state dict as they stand) and the same tokens go through both in float64 on the
CPU: 2 layers, d_model 16, 4 query heads over 2 kv heads, 4 experts of width 12, top-2
renormalised, an untied head and router_aux_loss_coef 0.3 (large, so a wrong
load-balancing term shows in the loss). Compared: the loss (cross-entropy plus the
weighted load-balancing loss), and every parameter's gradient.

Tolerance: both are float64 computations of the same ops in other orders (the bench
model adds each expert's output with index_add_, the reference its own way): about
1e-13 after 2 layers and a backward pass; LOSS_RTOL 1e-10 and GRAD_RTOL 1e-9 of each
gradient's largest element leave three orders of margin. The mutation at the end (the
top-k weights not renormalised) must fail.
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import moe_ref  # noqa: E402
import torch_models  # noqa: E402

LOSS_RTOL, GRAD_RTOL = 1e-10, 1e-9
CFG = {"model_type": "mixtral", "vocab_size": 19, "hidden_size": 16, "intermediate_size": 12,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.3,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


def bench_model(cfg, weights):
    c = torch_models.LlamaConfig(cfg.L, cfg.NH, cfg.NKV, cfg.C, cfg.F, cfg.V, cfg.theta,
                                 cfg.eps, tied=False)
    c.E, c.K, c.aux = cfg.E, cfg.K, cfg.aux_coef
    m = torch_models.Mixtral(c).double()
    state = {n: torch.tensor(a, dtype=torch.float64) for n, a in weights.items()}
    missing, unexpected = m.load_state_dict(state, strict=False)
    if missing or unexpected:
        sys.exit(f"FAIL: the bench model's names are not Hugging Face's: missing {missing}, "
                 f"unexpected {unexpected}")
    return m


def check(name, mutate=None):
    cfg = moe_ref.Config(CFG)
    w = moe_ref.init_weights(cfg, 11, std=0.3)  # routers far from uniform
    g = np.random.default_rng(12)
    tok, tgt = g.integers(0, cfg.V, (2, 16)), g.integers(0, cfg.V, (2, 16))
    _, _, _, _, ref_loss, ref_grads = moe_ref.run(cfg, w, tok, tgt)
    m = bench_model(cfg, w)
    if mutate:
        mutate(m)
    loss = m(torch.as_tensor(tok), torch.as_tensor(tgt))
    loss.backward()
    params = dict(m.named_parameters())
    rel = abs(loss.item() - ref_loss) / abs(ref_loss)
    worst, where = 0.0, ""
    for n, ref in ref_grads.items():
        got = params[n].grad
        got = np.zeros_like(ref) if got is None else got.numpy()
        scale = np.abs(ref).max()
        d = np.abs(got - ref).max() / scale if scale > 0 else np.abs(got).max()
        if d > worst:
            worst, where = d, n
    ok = rel <= LOSS_RTOL and worst <= GRAD_RTOL
    print(f"{'ok' if ok else 'differs'}: {name}: loss {loss.item():.12f} vs moe_ref "
          f"{ref_loss:.12f} (rel {rel:.1e}, tol {LOSS_RTOL}); gradients within {worst:.1e} of "
          f"their largest element (tol {GRAD_RTOL}, worst {where})")
    return ok, rel


def no_renorm(m):  # the mutation: OLMoE's weights (the top-k probabilities as they are)
    def forward(self, h):
        b, t, c = h.shape
        x = h.view(-1, c)
        logits = self.gate(x)
        w, chosen = torch.topk(torch.softmax(logits, dim=1), self.K, dim=-1)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, num_classes=self.E).permute(2, 1, 0)
        for e in range(self.E):
            idx, top = torch.where(mask[e])
            out.index_add_(0, top, self.experts[e](x[top]) * w[top, idx, None])
        return out.view(b, t, c), logits
    for layer in m.model.layers:
        blk = layer.block_sparse_moe
        blk.forward = forward.__get__(blk)


def main():
    torch.set_num_threads(1)
    good = check("mixtral, 4 experts, top-2, untied")[0]
    ok, rel = check("mutation: top-k weights not renormalised (must differ)", no_renorm)
    if ok or rel < 1e-4:
        print(f"FAIL: dropping the renormalisation moved the loss by only {rel:.1e}: the check "
              "cannot tell it")
        return 1
    if not good:
        print("FAIL: bench/torch_models.py's Mixtral differs from moe_ref.py")
        return 1
    print("ok: bench/torch_models.py's Mixtral equals moe_ref.py (Hugging Face's "
          "MixtralForCausalLM with its load-balancing loss)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
