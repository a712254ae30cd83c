"""llama_ops.py - Llama's CPU kernels against the PyTorch reference of Hugging Face's
Llama (tests/model/llama_ref.py), op by op, forward and backward: RMSNorm, RoPE (its
table and its rotation), SwiGLU and grouped-query attention.

    llama_ops.py LLAMA_OPS_EXE      (the driver built from llama_ops.c)

For each op it draws float32 inputs, runs the kernel through the driver, and runs the
reference's op of the same name on the same values (backward by autograd, with the
same output gradient). Where the reference runs in float64 the comparison is
    |kernel - ref| <= rtol (|ref| + max |ref|)
with rtol from the kernel's float32 arithmetic (each bound is stated at its check).
RoPE's rotation is compared in float32, where the kernel makes Hugging Face's own
floating-point operations in the same order: bit for bit.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
import llama_ref as ref  # noqa: E402  (exits with a message when PyTorch is missing)
import torch  # noqa: E402

EXE = None
failures = 0


def run(op, inputs, *args):
    """Writes inputs (name -> float32 array), runs the driver, returns its outputs."""
    with tempfile.TemporaryDirectory() as d:
        for name, a in inputs.items():
            np.ascontiguousarray(a, dtype="<f4").tofile(os.path.join(d, name + ".f32"))
        subprocess.run([EXE, d, op] + [str(a) for a in args], check=True)
        return {f[:-4]: np.fromfile(os.path.join(d, f), dtype="<f4")
                for f in os.listdir(d) if f.endswith(".f32") and f[:-4] not in inputs}


def check(what, got, want, rtol):
    """got (float32 kernel result) against want (reference), rtol of the scale."""
    global failures
    got, want = np.asarray(got, np.float64).reshape(-1), np.asarray(want, np.float64).reshape(-1)
    scale = np.abs(want).max()
    err = np.abs(got - want)
    bad = np.nonzero(err > rtol * (np.abs(want) + scale))[0]
    worst = err.max() / (scale if scale else 1.0)
    if bad.size:
        i = bad[0]
        print(f"  FAIL {what}: [{i}] kernel {got[i]:.9g}, reference {want[i]:.9g} "
              f"(scale {scale:.3g}, {bad.size} elements beyond rtol {rtol:g})")
        failures += 1
    else:
        print(f"  ok   {what}: n={got.size} max |err| / scale {worst:.2e} (rtol {rtol:g})")


def rand(g, *shape, lo=-1.0, hi=1.0):
    return g.uniform(lo, hi, shape).astype(np.float32)


def t64(a):
    return torch.tensor(np.asarray(a, np.float64), requires_grad=True)


# float32 kernel against a float64 reference: a few roundings of 2^-24 per accumulated
# term, summed over at most a few hundred terms here (rows of C <= 64, attention over
# T <= 64 keys of hs <= 16), stays under 1e-5 of the scale; 2e-5 is check.h's FWD_RTOL.
RTOL = 2e-5


def test_rmsnorm(g):
    N, C, eps = 37, 64, 1e-5
    x, w, dout = rand(g, N, C, lo=-0.7, hi=1.3), rand(g, C, lo=0.5, hi=1.5), rand(g, N, C)
    x[0] *= 1e3  # eps negligible
    x[1] *= 1e-3  # mean(x^2) ~ 1e-6 < eps: eps dominates
    k = run("rmsnorm", {"x": x, "w": w, "dout": dout}, N, C, repr(eps))
    xt, wt = t64(x), t64(w)
    out = ref.rms_norm(xt, wt, float(np.float32(eps)))
    out.backward(torch.tensor(dout, dtype=torch.float64))
    rstd = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1) + float(np.float32(eps)))
    check("rmsnorm out", k["out"], out.detach().numpy(), RTOL)
    check("rmsnorm rstd (row by row)", k["rstd"] / rstd, np.ones(N), RTOL)
    check("rmsnorm dinp", k["dinp"], xt.grad.numpy(), RTOL)
    check("rmsnorm dweight", k["dweight"], wt.grad.numpy(), RTOL)


def test_rope_table(g):
    """weft's table against Hugging Face's float32 cos/sin. Both compute inv_freq =
    1 / theta^(2i/hs) and the angle t * inv_freq in float32, but with different powf
    (glibc's, torch's): inv_freq may differ by an ulp (2^-23 relative) and so the
    angles by |angle| 2^-23, plus a rounding of the angle (2^-24 |angle|) and of
    cos/sin (2^-24 each side): |diff| <= 2^-22 |angle| + 2^-23, checked element by
    element.

    With Llama 3.1's scaling (rope_type llama3; original context 64 so that a
    1024-long table has all three bands: wavelengths under 16 kept, over 64 divided by
    factor 32, between interpolated) the rescaling is the same float32 ops on both
    sides, so a pair of inv_freq that agree stays equal; one that differs by its ulp
    moves the interpolated frequency (1 - s) f / factor + s f, s linear in f, by at
    most 1 + factor high / (high - low) times that relative amount (d ln / d ln f at
    s = 0): the tolerance's 2^-23 |angle| term is scaled by it."""
    global failures
    scaled = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    for T, hs, theta, sc in ((1024, 128, 500000.0, None), (64, 16, 10000.0, None),
                             (1024, 128, 500000.0, scaled)):
        extra = [] if sc is None else [repr(sc["factor"]), repr(sc["low_freq_factor"]),
                                       repr(sc["high_freq_factor"]),
                                       str(sc["original_max_position_embeddings"])]
        k = run("rope_table", {}, T, hs, repr(theta), *extra)["cs"].reshape(T, hs)
        cos, sin = ref.rope_cos_sin(T, hs, theta, torch.float32, sc)
        h2 = hs // 2
        inv = 1.0 / theta ** (np.arange(0, hs, 2) / hs)
        gain = 1.0
        if sc is not None:
            old, lo, hi = (sc["original_max_position_embeddings"], sc["low_freq_factor"],
                           sc["high_freq_factor"])
            wl = 2 * np.pi / inv
            s = np.clip((old / wl - lo) / (hi - lo), 0, 1)
            bands = (int((wl < old / hi).sum()), int((wl > old / lo).sum()))
            assert bands[0] > 0 and bands[1] > 0 and bands[0] + bands[1] < h2, bands
            inv = np.where(wl > old / lo, inv / sc["factor"],
                           np.where(wl < old / hi, inv, (1 - s) * inv / sc["factor"] + s * inv))
            gain = 1 + sc["factor"] * hi / (hi - lo)
        angle = np.arange(T)[:, None] * inv[None, :]
        tol = (gain * 2.0 ** -23 + 2.0 ** -24) * angle + 2.0 ** -23
        tag = f"T={T} hs={hs} theta={theta:g}" + ("" if sc is None else " llama3 x32")
        for what, got, want in (("cos", k[:, :h2], cos.numpy()[:, :h2]),
                                ("sin", k[:, h2:], sin.numpy()[:, :h2])):
            err = np.abs(got.astype(np.float64) - want)
            n_exact = int((err == 0).sum())
            if (err > tol).any():
                t, i = np.argwhere(err > tol)[0]
                print(f"  FAIL rope table {what} {tag}: [{t},{i}] {got[t, i]:.9g} "
                      f"vs {want[t, i]:.9g}")
                failures += 1
            else:
                print(f"  ok   rope table {what} {tag}: max |err| "
                      f"{err.max():.2e}, {n_exact} of {err.size} bit for bit")
        # Hugging Face's duplicated half: columns i and i + h2 hold one angle
        assert torch.equal(cos[:, :h2], cos[:, h2:]) and torch.equal(sin[:, :h2], sin[:, h2:])


def split_heads(qkv, B, T, NH, NKV, hs, dtype=None):
    """Packed (B, T, (NH + 2 NKV) hs) -> q (B, NH, T, hs), k, v (B, NKV, T, hs)."""
    x = qkv.reshape(B, T, NH + 2 * NKV, hs).transpose(1, 2)
    return x[:, :NH], x[:, NH:NH + NKV], x[:, NH + NKV:]


def test_rope(g):
    """The rotation with Hugging Face's own float32 table, against Hugging Face's float32
    apply_rotary_pos_emb: the kernel computes x1 c + (-x2) s and x2 c + x1 s, each
    product rounded and then the sum, exactly as the reference's separate tensor ops do,
    so forward and backward (autograd: d1 c + d2 s, d2 c - d1 s) agree bit for bit."""
    for B, T, NH, NKV, hs, theta in ((2, 64, 4, 2, 16, 500000.0), (1, 33, 3, 3, 8, 10000.0)):
        W = (NH + 2 * NKV) * hs
        qkv, dout = rand(g, B, T, W, lo=-2, hi=2), rand(g, B, T, W)
        cos, sin = ref.rope_cos_sin(T, hs, theta, torch.float32)
        cs = np.concatenate([cos.numpy()[:, :hs // 2], sin.numpy()[:, :hs // 2]], axis=1)
        k = run("rope", {"qkv": qkv, "cs": cs, "dout": dout}, B, T, NH, NKV, hs)
        x = torch.tensor(qkv, requires_grad=True)
        q, kk, v = split_heads(x, B, T, NH, NKV, hs)
        y = torch.cat([ref.apply_rope(q, cos, sin), ref.apply_rope(kk, cos, sin), v], dim=1)
        y = y.transpose(1, 2).reshape(B, T, W)
        y.backward(torch.tensor(dout))
        tag = f"B={B} T={T} NH={NH} NKV={NKV} hs={hs}"
        check(f"rope out {tag} (bit for bit)", k["out"], y.detach().numpy(), 0.0)
        check(f"rope dinp {tag} (bit for bit)", k["dinp"], x.grad.numpy(), 0.0)


def test_swiglu(g):
    N, F = 37, 96
    x, dout = rand(g, N, 2 * F, lo=-6, hi=6), rand(g, N, F)
    x[0, :4] = (-30.0, 30.0, -95.0, 0.0)  # tails: exp under/overflow, and the origin
    k = run("swiglu", {"x": x, "dout": dout}, N, F)
    xt = t64(x)
    out = ref.swiglu(xt[:, :F], xt[:, F:])
    out.backward(torch.tensor(dout, dtype=torch.float64))
    check("swiglu out", k["out"], out.detach().numpy(), RTOL)
    check("swiglu dinp", k["dinp"], xt.grad.numpy(), RTOL)


def test_gqa(g):
    for B, T, NH, NKV, hs in ((2, 64, 4, 2, 16), (1, 33, 6, 1, 8), (2, 20, 3, 3, 8)):
        W, C = (NH + 2 * NKV) * hs, NH * hs
        qkv, dout = rand(g, B, T, W, lo=-1.5, hi=1.5), rand(g, B, T, C)
        k = run("gqa", {"qkv": qkv, "dout": dout}, B, T, NH, NKV, hs)
        x = t64(qkv)
        q, kk, v = split_heads(x, B, T, NH, NKV, hs)
        out = ref.attention(q, kk, v).transpose(1, 2).reshape(B, T, C)
        out.backward(torch.tensor(dout, dtype=torch.float64))
        tag = f"B={B} T={T} NH={NH} NKV={NKV} hs={hs}"
        check(f"gqa out {tag}", k["out"], out.detach().numpy(), RTOL)
        check(f"gqa dqkv {tag}", k["dqkv"], x.grad.numpy(), RTOL)


def main():
    global EXE
    if len(sys.argv) != 2:
        sys.exit("usage: llama_ops.py LLAMA_OPS_EXE")
    EXE = sys.argv[1]
    torch.set_num_threads(1)
    g = np.random.default_rng(20261127)
    for t in (test_rmsnorm, test_rope_table, test_rope, test_swiglu, test_gqa):
        print(t.__name__)
        t(g)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
