#!/usr/bin/env python3
"""A refactor keeps --save bit-identical: the worker's trained model, byte for byte,
equals what the worker of the reference commit (46d31cd, the tree before the worker
was split into modules over a device seam) writes for the same run.

`bitident.py WORKER BUILD_REF_SH SOURCE_ROOT BUILD_ROOT CASE`. Both binaries run the
same command on the same machine, one after the other, so the comparison holds on any
CPU: OpenBLAS's kernels (which round differently on AVX2 and AVX-512, and with the
number of threads, hence runtime.threads=1) are the same for both. The losses each
run prints are compared too (the step lines, not their timings).

Nothing is tolerated: any changed byte fails, and the test prints the first parameter
that differs. The reference is built once per build directory (build_ref.sh).

The mixed-precision cases compare with the last commit that changed their arithmetic
by design, from which a refactor must keep them bit for bit as the fp32 cases keep
theirs: 4e05021, which stores the gradients between a GEMM and an activation in 16 bits
(attproj's and fcproj's input gradients, which attention's and GELU's backward read).
Before it, in order: 5a9b249 stored activations and pipeline messages in 16 bits (where
46d31cd kept fp32 and rounded only the GEMM operands), 0736e71 ran bf16 GEMMs through
oneDNN where the CPU has AVX512_BF16 (the same exact products, summed in oneDNN's
order), and a0e49c2 added a 16-bit GEMM output's bias rounded to the format. In
fp16-skips the 2^30 loss scale overflows the first 7 steps, which are skipped, and the
8th updates the model. Both binaries run on the same CPU, so both take the same GEMM
path.

The Llama cases compare with 322efd3, the tree before the kernels became ops in a
registry keyed by (op, element type, device): Llama's RMSNorm, RoPE, SwiGLU and grouped-
query attention, fp32 on one rank and bf16 on the 3-D mesh with sequence parallelism,
saved as safetensors.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import free_ports  # noqa: E402

WORKER, BUILD_REF, SRC, BUILD_ROOT, CASE = sys.argv[1:6]
REF_COMMIT = "46d31cd"  # the fp32 cases'
REF_16 = "4e05021"  # the 16-bit cases' (see above)
REF_LLAMA = "322efd3"  # the Llama cases' (see above)
LLAMA = ["model.family=llama", "model.preset=llama-tiny"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
# Small but covering: 4 layers (2 per stage, 1 per interleaved chunk), 8 steps with
# warm-up and decay, every schedule's code path.
BASE = ["train.steps=8", "train.warmup=2", "runtime.threads=1", "train.batch_size=8",
        "model.layers=4", "train.eval_every=4"]
CASES = {
    "np1": (1, []),
    "dp2-zero1": (2, ["mesh.dp=2", "optim.zero=1"]),
    "tp2pp2-1f1b": (4, ["mesh.tp=2", "mesh.pp=2", "train.microbatches=4",
                        "train.schedule=1f1b"]),
    "pp2-interleaved-recompute": (2, ["mesh.pp=2", "train.schedule=interleaved",
                                      "parallel.virtual_stages=2", "train.microbatches=4",
                                      "parallel.activation_checkpointing=true"]),
    "bf16-3d": (8, ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.microbatches=2",
                    "parallel.sequence=true", "precision=bf16"], REF_16),
    # a 2^30 start overflows fp16: the first steps are skipped and the scale halves
    "fp16-skips": (2, ["mesh.dp=2", "precision=fp16", "optim.loss_scale_init=1073741824"],
                   REF_16),
    "llama-np1": (1, LLAMA, REF_LLAMA),
    "llama-bf16-3d": (8, LLAMA + ["mesh.dp=2", "mesh.tp=2", "mesh.pp=2", "train.microbatches=2",
                                  "parallel.sequence=true", "precision=bf16"], REF_LLAMA),
}
STEP = re.compile(r"^step (\d+)/\d+ loss=(\S+) .*?grad_norm=(\S+)")


def run(worker, n, args, save):
    fmt = ["--save-format", "safetensors"] if "model.family=llama" in args else []
    cmd = MPIRUN + ["-np", str(n), worker] + args + ["--save", save] + fmt
    # a free port each: another job on the default 29500 is not this test's failure
    env = dict(os.environ, MASTER_PORT=str(free_ports(1)[0]))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
        sys.exit(1)
    return [m.groups() for m in map(STEP.match, p.stdout.splitlines()) if m]


def first_difference(a, b):
    """(index, a value, b value) of the first differing float after the 1 KiB header
    (llm.c's; a safetensors file's header is longer, so there the index is approximate)."""
    n = min(len(a), len(b))
    for off in range(1024, n, 4):
        if a[off:off + 4] != b[off:off + 4]:
            return (off - 1024) // 4, struct.unpack_from("<f", a, off)[0], \
                struct.unpack_from("<f", b, off)[0]
    return None


def main():
    n, extra, *ref_commit = CASES[CASE]
    commit = ref_commit[0] if ref_commit else REF_COMMIT
    p = subprocess.run([BUILD_REF, SRC, BUILD_ROOT, commit], capture_output=True, text=True)
    if p.returncode == 77:
        print(p.stderr.strip())
        sys.exit(77)
    if p.returncode != 0:
        print(f"FAIL: cannot build the reference worker:\n{p.stderr}")
        sys.exit(1)
    ref = p.stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        new_f, ref_f = os.path.join(tmp, "new.bin"), os.path.join(tmp, "ref.bin")
        new_steps = run(WORKER, n, BASE + extra, new_f)
        ref_steps = run(ref, n, BASE + extra, ref_f)
        a, b = open(new_f, "rb").read(), open(ref_f, "rb").read()
    if len(new_steps) != 8 or new_steps != ref_steps:
        print(f"FAIL: step lines differ\n this tree: {new_steps}\n {commit}: {ref_steps}")
        sys.exit(1)
    if a != b:
        where = first_difference(a, b)
        print(f"FAIL: --save differs from {commit}'s ({len(a)} vs {len(b)} bytes); "
              f"first differing parameter {where}")
        sys.exit(1)
    print(f"{CASE}: --save identical to {commit}'s, {len(a)} bytes; "
          f"losses {[s[1] for s in new_steps]}")


main()
