#!/usr/bin/env python3
"""The GPU tests skip only where there is no GPU; where a GPU is and weft cannot use it
they fail, saying why.

    no_skip.py --probe GPU_PROBE --kernels TEST_GPU_KERNELS --nccl TEST_NCCL_GPU
               --train TRAIN_GPU_PY --worker WORKER --fake-driver DIR
               --absent-module DIR --module LIBWEFT_CUDA_SO

The GPU tests are gpu_probe (train_gpu.py's and gpu-check.sh's judge), test_gpu_kernels,
test_nccl_gpu (under mpirun) and train_gpu.py. Each runs in three settings:

  no driver      this machine as it is, when it has no NVIDIA driver: each exits 77.
                 (Where a real GPU is present this setting shows nothing and is left out.)
  absent module  a stand-in driver that reports one GPU (fake_driver/libcuda.so.1 on
                 LD_LIBRARY_PATH) and a GPU module whose library the loader cannot find
                 (absent_fake/): each fails (exit status neither 0 nor 77), naming
                 libweft_test_absent.so.
  hidden library the stand-in driver and the real libweft_cuda.so, with the CUDA library
                 it needs (libcublasLt.so.13) hidden by an empty file bind-mounted over it
                 in a private mount namespace (unshare -m): each fails, naming it.
                 Needs unshare -m (root, as in CI); where it is refused the script says
                 so and fails, rather than passing without the check.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def commands(o):
    return {
        "gpu_probe": [o.probe],
        "test_gpu_kernels": [o.kernels],
        "test_nccl_gpu (mpirun -np 2)": MPIRUN + ["-np", "2", o.nccl],
        "train_gpu.py np1-fp32": [sys.executable, o.train, o.worker, "np1-fp32", o.probe],
    }


def run(cmd, env, wrap=None):
    full = (wrap or []) + cmd
    p = subprocess.run(full, env=env, capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


def env_with(ld_path=None, module_path=None):
    e = dict(os.environ)
    e.pop("WEFT_MODULE_PATH", None)
    keep = [d for d in e.get("LD_LIBRARY_PATH", "").split(":") if d]
    e["LD_LIBRARY_PATH"] = ":".join(([ld_path] if ld_path else []) + keep)
    if module_path:
        e["WEFT_MODULE_PATH"] = module_path
    return e


def expect(name, setting, rc, out, want_rc, needle=None):
    ok = (rc == want_rc) if want_rc is not None else rc not in (0, 77)
    ok = ok and (needle is None or needle in out)
    last = [l for l in out.splitlines() if l.strip()][-3:]
    print(f"{'ok  ' if ok else 'FAIL'} {setting:15} {name:30} exit {rc}: {' | '.join(last)[:300]}")
    return ok


def hidden_library_wrap(module, soname, empty):
    """unshare -m, an empty file over the library's real file, then the command."""
    ldd = subprocess.run(["ldd", module], capture_output=True, text=True).stdout
    path = next((l.split("=>")[1].split("(")[0].strip() for l in ldd.splitlines()
                 if l.strip().startswith(soname) and "=>" in l), "")
    if not path or not os.path.exists(path):
        return None, f"{module} does not resolve {soname} here"
    real = os.path.realpath(path)
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, empty, real], real


def main():
    a = argparse.ArgumentParser()
    for k in ("probe", "kernels", "nccl", "train", "worker", "fake_driver", "absent_module",
              "module"):
        a.add_argument("--" + k.replace("_", "-"), required=True)
    o = a.parse_args()
    cmds, good = commands(o), True

    rc, out = run([o.probe], env_with())
    if rc == 0:
        print("this machine has a usable GPU: the 'no driver' setting is left out")
    else:
        facts = json.loads(out[:out.rfind("}") + 1]) if "{" in out else {}
        print(f"this machine: {facts.get('status')}: {facts.get('why')}")
        for name, cmd in cmds.items():
            rc, out = run(cmd, env_with())
            good &= expect(name, "no driver", rc, out, 77)

    fake = env_with(o.fake_driver, o.absent_module)
    for name, cmd in cmds.items():
        rc, out = run(cmd, fake)
        good &= expect(name, "absent module", rc, out, None, "libweft_test_absent.so")

    with tempfile.NamedTemporaryFile() as empty:
        wrap, real = hidden_library_wrap(o.module, "libcublasLt.so.13", empty.name)
        probe = run(["true"], env_with(), wrap) if wrap else (1, real)
        if wrap is None or probe[0] != 0 or not shutil.which("unshare"):
            print(f"FAIL hidden library: cannot hide a library here ({probe[1].strip()})")
            good = False
        else:
            print(f"hidden: {real}")
            env = env_with(o.fake_driver, os.path.dirname(os.path.abspath(o.module)))
            for name, cmd in cmds.items():
                rc, out = run(cmd, env, wrap)
                good &= expect(name, "hidden library", rc, out, None, "libcublasLt.so.13")
    print("all GPU tests fail, not skip, where a GPU is present but unusable" if good else
          "FAILED")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
