"""The environment every trainer a bench compares runs in, weft and PyTorch alike (and
PyTorch's own CUDA libraries on a GPU machine a weft bundle set up).

glibc returns large freed blocks to the kernel (and trims the heap) after every step
unless told not to, and PyTorch's per-step gradient tensors then page-fault afresh every
step, which can make its steps several times slower (issue 41). So every bench that
times PyTorch on a CPU runs every trainer with it: blocks up to 4 GiB come from the heap,
and the heap is trimmed only past 16 GiB free. weft's worker sets its own mmap threshold
at start (mallopt in worker/main.c, for --check-estimate's RSS accounting), which takes
precedence over the tunable; the trim threshold applies to it as to PyTorch.
docs/benchmarks.md says so.
"""
import os

GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=17179869184"


def alike(env=None, **extra):
    """A copy of env (default os.environ) with GLIBC_TUNABLES set, and `extra`."""
    out = dict(os.environ if env is None else env, GLIBC_TUNABLES=GLIBC_TUNABLES)
    out.update(extra)
    return out


def for_torch(env):
    """env without the CUDA folders a weft bundle's env.sh put on LD_LIBRARY_PATH
    (WEFT_CUDA_LIBS) for weft's modules: PyTorch loads the CUDA libraries of its own
    wheels."""
    out = dict(env)
    cuda = set(filter(None, out.get("WEFT_CUDA_LIBS", "").split(":")))
    out["LD_LIBRARY_PATH"] = ":".join(d for d in out.get("LD_LIBRARY_PATH", "").split(":")
                                      if d and d not in cuda)
    return out


def emit(lines, out=None):
    """A bench's report: printed, and written to out (a results file) when given."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out:
        with open(out, "w") as f:
            f.write(text)
