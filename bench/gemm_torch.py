#!/usr/bin/env python3
"""PyTorch's GEMMs at the shapes bench/gemm_gpu times, for the same table: the peer.

    python3 bench/gemm_torch.py [-B 16] [-T 1024] [--json FILE]

GPT-2 124M's linear layers at B x T tokens in bf16 as a trainer under bf16 autocast runs
them (cuBLAS through torch.matmul, bf16 outputs): the forward x W^T, the input gradient
dout W and the weight gradient dout^T x; the median of 10 timed runs after 3 warm-ups
(CUDA events), in TFLOP/s. Never a test; exits 77 without a GPU.
"""
import argparse
import json
import statistics
import sys


def main():
    a = argparse.ArgumentParser()
    a.add_argument("-B", type=int, default=16)
    a.add_argument("-T", type=int, default=1024)
    a.add_argument("--json")
    o = a.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit(f"gemm_torch: {sys.executable} has no PyTorch (the GPU machines' python3 has it)")
    if not torch.cuda.is_available():
        print("skip: no GPU")
        sys.exit(77)
    N, C, Vp = o.B * o.T, 768, 50304
    layers = [("qkv", C, 3 * C), ("attproj", C, C), ("fc", C, 4 * C), ("fcproj", 4 * C, C),
              ("lm head", C, Vp)]
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rows = []
    print(f"gemm_torch on {torch.cuda.get_device_name()}: PyTorch {torch.__version__}, "
          f"GPT-2 124M, B {o.B} x T {o.T} (N {N}), bf16\n")
    print("| layer | GEMM | TFLOP/s |\n|---|---|---:|")
    for name, cin, cout in layers:
        x, w, dy = (torch.randn(N, cin, **bf), torch.randn(cout, cin, **bf),
                    torch.randn(N, cout, **bf))
        for gemm, fn in (("fwd", lambda: x @ w.t()), ("dinp", lambda: dy @ w),
                         ("dw", lambda: dy.t() @ x)):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ms = []
            for i in range(13):
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                if i >= 3:
                    ms.append(e0.elapsed_time(e1))
            tf = 2.0 * N * cin * cout / (statistics.median(ms) * 1e-3) / 1e12
            rows.append({"layer": name, "gemm": gemm, "tflops": tf})
            print(f"| {name} | {gemm} | {tf:.1f} |")
        del x, w, dy
    if o.json:
        with open(o.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "B": o.B, "T": o.T, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
