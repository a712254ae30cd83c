#!/usr/bin/env python3
"""Causal attention, forward and backward, on one GPU: weft's paths against PyTorch's
scaled_dot_product_attention backends, in the same run, at the same shapes.

    bench/attention_torch.py [--kernels build/bench/kernels] [-B 16] [-T 1024] [-C 768]
                             [--heads 12 --heads 6] [--reps 50] [--json FILE]

For each head count (default 12 and 6 at C 768: head sizes 64 and 128), bf16:
 - PyTorch: SDPA with is_causal on q, k, v cut from one (B, T, 3C) tensor as a GPT-2
   block makes them (strided views, no copies), under each backend that takes the shape
   (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION). The forward is timed alone;
   the backward is (forward + backward) - forward.
 - weft (with --kernels): the bench's attention_bf16_forward and _backward rows, with
   runtime.attention cudnn and flash (`kernels --attention P --only attention_bf16`).
FLOPs as bench/kernels counts them (FlashAttention's convention): 2·B·T²·C forward
(causal: half of the two (T, T) products), 2.5 times that backward. % of peak is against
the dense bf16 peak of runtime/peak.c's table, which bench/kernels prints and this reads
from its JSON; without --kernels, the H100 SXM's 989.4 TFLOP/s.
Times are CUDA events around `reps` back-to-back calls after 3 warm-up calls, the
median of 5 such runs. Without a GPU or torch it says so and exits 0: benchmarks are
never tests.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

H100_BF16_TFLOPS = 989.4


def gpu_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def timed(torch, fn, reps):
    for _ in range(3):
        fn()
    runs = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) / reps)
    return statistics.median(runs)


def torch_rows(torch, B, T, C, NH, reps):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    hs = C // NH
    qkv = torch.randn(B, T, 3, NH, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16)

    def forward():
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        qkv.grad = None
        forward().backward(dout)

    rows = []
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with sdpa_kernel(backend):
                with torch.no_grad():
                    fwd = timed(torch, forward, reps)
                total = timed(torch, both, reps)
        except RuntimeError as e:  # the backend refuses the shape or this GPU
            rows.append({"path": f"torch {name}", "error": str(e).splitlines()[0][:120]})
            continue
        rows.append({"path": f"torch {name}", "fwd_ms": fwd, "bwd_ms": total - fwd})
    return rows


def weft_rows(kernels, B, T, C, NH):
    rows = []
    for path in ("cudnn", "flash"):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [kernels, "--device", "cuda", "--precision", "bf16", "-B", str(B), "-T",
                   str(T), "-C", str(C), "--heads", str(NH), "--attention", path, "--only",
                   "attention_bf16", "--json", f.name]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                rows.append({"path": f"weft {path}", "error": f"exit {r.returncode}: "
                             + (r.stderr.strip().splitlines() or [""])[-1][:120]})
                continue
            j = json.load(open(f.name))
        ms = {row["kernel"].split()[0]: row.get("ms") for row in j["rows"]}
        rows.append({"path": f"weft {path}", "fwd_ms": ms.get("attention_bf16_forward"),
                     "bwd_ms": ms.get("attention_bf16_backward"),
                     "peak": j["peaks"]["gemm_tflops"]})
    return rows


def main():
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("--kernels", help="weft's bench/kernels binary: adds weft's rows")
    a.add_argument("-B", type=int, default=16)
    a.add_argument("-T", type=int, default=1024)
    a.add_argument("-C", type=int, default=768)
    a.add_argument("--heads", type=int, action="append")
    a.add_argument("--reps", type=int, default=50)
    a.add_argument("--json")
    o = a.parse_args()
    torch = gpu_torch()
    if torch is None:
        print("attention_torch: no GPU with torch here; nothing measured")
        return 0
    name = torch.cuda.get_device_name(0)
    out = {"gpu": name, "torch": torch.__version__, "B": o.B, "T": o.T, "C": o.C, "shapes": []}
    for NH in o.heads or [12, 6]:
        fl_f = 2.0 * o.B * o.T * o.T * o.C
        fl_b = 2.5 * fl_f
        rows = (weft_rows(o.kernels, o.B, o.T, o.C, NH) if o.kernels else []) + \
            torch_rows(torch, o.B, o.T, o.C, NH, o.reps)
        peak = next((r["peak"] for r in rows if r.get("peak")), H100_BF16_TFLOPS)
        print(f"\n{name}, bf16, causal, B {o.B} T {o.T} C {o.C} heads {NH} (head size "
              f"{o.C // NH}): {(fl_f + fl_b) / 1e9:.1f} GFLOP forward + backward, peak "
              f"{peak:.1f} TFLOP/s")
        print("| path | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | fwd+bwd TFLOP/s | % of peak |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            if "error" in r or r.get("fwd_ms") is None or r.get("bwd_ms") is None:
                print(f"| {r['path']} | {r.get('error', 'no row')} | | | | | |")
                continue
            f, b = r["fwd_ms"], r["bwd_ms"]
            tf = (fl_f + fl_b) / ((f + b) * 1e-3) / 1e12
            r.update(fwd_tflops=fl_f / (f * 1e-3) / 1e12, bwd_tflops=fl_b / (b * 1e-3) / 1e12,
                     tflops=tf, pct_peak=100 * tf / peak)
            print(f"| {r['path']} | {f:.4f} | {b:.4f} | {r['fwd_tflops']:.1f} | "
                  f"{r['bwd_tflops']:.1f} | {tf:.1f} | {r['pct_peak']:.1f} |")
        out["shapes"].append({"heads": NH, "head_size": o.C // NH, "gflop": (fl_f + fl_b) / 1e9,
                              "peak_tflops": peak, "rows": rows})
    if o.json:
        with open(o.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
