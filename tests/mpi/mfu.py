#!/usr/bin/env python3
"""MFU on the CPU divides by a nominal peak no GEMM can beat.

`mfu.py WORKER`: a 2-rank dp job (one thread each, ZeRO-1, the shape of issue 14's
mfu=111% report, at a test-sized model), in fp32 and in bf16. The banner's peak must be
the nominal one, cores x clock x FLOP/cycle, recomputed here from /proc/cpuinfo and
cpufreq on our own: the widest FMA's in fp32, and in bf16 the bf16 dot-product units'
(AMX 1024, AVX512_BF16 twice the FMA's) when the log says oneDNN runs the bf16 GEMMs
(which the FMA figure would put above 100%), else the FMA's. Every step's mfu must lie
in (0, 100%).
"""
import os
import re
import subprocess
import sys

WORKER = sys.argv[1]


def expected_peak_tflops(cores, bf16_dots):
    flags, mhz = None, None
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key.strip() == "flags" and flags is None:
                flags = set(val.split())
            elif key.strip() == "cpu MHz" and mhz is None:
                mhz = float(val)
    ghz = (mhz or 0) / 1e3
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            ghz = max(ghz, float(f.read()) / 1e6)
    except OSError:
        pass
    if flags is None or ghz <= 0:
        return None
    fpc = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else \
        16 if "avx" in flags else 8
    if bf16_dots:
        fpc = 1024 if "amx_bf16" in flags else 2 * fpc if "avx512_bf16" in flags else fpc
    return cores * ghz * fpc * 1e-3


def check(extra, what):
    env = dict(os.environ, MASTER_PORT=os.environ.get("MASTER_PORT", "29631"))
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
           "-x", "MASTER_PORT", WORKER, "mesh.dp=2", "optim.zero=1", "runtime.threads=1",
           "model.layers=2", "model.d_model=128", "model.heads=4", "model.seq_len=64",
           "model.vocab=512", "train.batch_size=8", "train.steps=6", "train.eval_every=0"] + extra
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        print(out[-3000:])
        sys.exit(f"FAIL: {what}: exit {p.returncode}")
    dots = "bf16 GEMMs on the CPU: oneDNN" in out
    want = expected_peak_tflops(1.0, dots)
    m = re.search(r"peak ([0-9.]+) TFLOP/s per rank for MFU \((nominal (?:fp32|bf16) peak.*)\)\n",
                  out)
    if not m:
        print(out[-3000:])
        sys.exit(f"FAIL: {what}: the banner does not give a nominal CPU peak")
    got = float(m.group(1))
    # The banner prints 3 decimals: half a unit in the last place.
    if abs(got - want) > 0.0005 + 1e-9:
        sys.exit(f"FAIL: {what}: banner peak {got} TFLOP/s, recomputed {want:.4f}")
    mfus = [float(x) for x in re.findall(r"mfu=([0-9.]+)%", out)]
    if len(mfus) != 6 or not all(0 < x < 100 for x in mfus):
        sys.exit(f"FAIL: {what}: mfu per step {mfus}: each must be in (0, 100%)")
    print(f"ok: {what}: peak {got:.3f} TFLOP/s per rank ({m.group(2)}); mfu per step {mfus}")


def main():
    if expected_peak_tflops(1.0, False) is None:
        print("SKIP: this CPU's flags or clock cannot be read")
        sys.exit(77)
    check([], "fp32")
    check(["precision=bf16"], "bf16")


main()
