#!/usr/bin/env python3
"""weft's whole GPU path in one command, on a bare GPU machine (scripts/gpu-check.sh).

    scripts/gpu-check.sh OUTDIR [--require-gpu] [--only PART,...]

Run from the repository root with a bundle from scripts/gpu-bundle.sh at $WEFT_BUNDLE or
./gpu-bundle (gpu-check.sh sources its env.sh first). Five parts, in this order (the most
information first), each under its own time limit so that a hang costs only that part,
each run whatever the others did:

  1 environment  the GPU (name, memory, compute capability), the driver, the CUDA runtime,
                 cuBLAS(Lt), NCCL and cuDNN versions and the files they load from
                 (tests/gpu/gpu_probe); every shared library of every binary of the bundle
                 resolves, to the bundle, glibc or CUDA (ld.so --list); the bundle's
                 mpirun starts two CPU ranks that train 3 steps.
  2 kernels      every CUDA kernel against its CPU twin (test_gpu_kernels), cuDNN's
                 attention graphs (test_cudnn_graphs), then the
                 collectives on device buffers: NCCL (1 rank) and host-staged (2 ranks
                 sharing the GPU; test_nccl_gpu).
  3 training     tests/gpu/train_gpu.py: one rank GPU vs CPU (fp32, bf16, and bf16's loss
                 curve over 200 steps); 2 and 4 ranks
                 sharing the GPU (dp, tp, pp, dp x tp) vs one rank; checkpoints GPU->CPU
                 and CPU->GPU. Cases run 4 at a time.
  4 kernel table bench/kernels at GPT-2 124M shapes (B 16, T 1024), bf16 then fp32. Without
                 a GPU: the CPU at a toy shape instead (that the bench runs).
  5 vs PyTorch   bench/gpu_train.py: weft against PyTorch eager and torch.compile (GPT-2
                 124M, B 16, T 1024, bf16).

A part's status is pass, fail (with the reason) or "no GPU" (gpu_probe found no NVIDIA
driver, or one that reports no device; a GPU that is there but unusable fails every GPU
part). Writes OUTDIR/gpu-report.md (the summary and the tables), OUTDIR/gpu-report.json
and OUTDIR/logs/. Exits 1 when a part failed, and with --require-gpu also when there was
no GPU. The limits add up to 450 s; on one H100 the whole check took 125 s (2026-11-27).
"""
import argparse
import concurrent.futures
import datetime
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
LIMITS = {"environment": 45, "kernels": 75, "training": 135, "kernel table": 45,
          "vs PyTorch": 150}
TOTAL = 465  # s: the last part may use what the others left of it (8 minutes in all)
TRAIN_CASES = ["np1-fp32", "np1-bf16", "curve-bf16", "resume", "dp2", "tp2", "pp2", "dp2tp2",
               "hsdp"]
LD_SO = "/lib64/ld-linux-x86-64.so.2"
GLIBC = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|"
                   r"libanl|libmvec|libnsl)\.so")


class Runner:
    """Runs commands with a deadline, each in its own process group (killed whole on
    timeout), logging each to OUTDIR/logs."""

    def __init__(self, out):
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)

    def run(self, name, cmd, deadline, env=None):
        """(exit status or 'timeout', output). `deadline` is a time.monotonic() value."""
        log = os.path.join(self.logs, re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".log")
        left = deadline - time.monotonic()
        if left <= 1:
            return "timeout", f"not started: its part's time limit was spent\n"
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
                             env=env)
        try:
            out, _ = p.communicate(timeout=left)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    out, _ = p.communicate(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    out = ""
            rc = "timeout"
        with open(log, "w") as f:
            f.write(f"$ {' '.join(cmd)}\n# exit {rc} after {time.monotonic() - t0:.1f} s\n")
            f.write(out or "")
        return rc, out or ""


def tail(text, n=3):
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return " | ".join(lines[-n:])[:400]


def bundle_path(rel):
    return os.path.join(os.environ["WEFT_BUNDLE"], rel)


# ---- part 1 -------------------------------------------------------------------------------

def driver_version():
    try:
        with open("/proc/driver/nvidia/version") as f:
            # "... Kernel Module  580.159.04 ..." or "... Open Kernel Module for x86_64  580.159.04"
            m = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", f.read())
            return m.group(1) if m else "?"
    except OSError:
        return None


def resolve_all(r, deadline):
    """Every ELF file of the bundle: each dependency resolves, to the bundle, glibc or a
    CUDA folder (WEFT_CUDA_LIBS). Returns (problems, count); logs/libraries.log has all."""
    root = os.path.realpath(os.environ["WEFT_BUNDLE"])
    cuda = [os.path.realpath(d) for d in os.environ.get("WEFT_CUDA_LIBS", "").split(":") if d]
    files = sorted(f for f in glob.glob(os.path.join(root, "**", "*"), recursive=True)
                   if os.path.isfile(f) and is_elf(f))
    problems, log = [], []
    for f in files:
        rel = os.path.relpath(f, root)
        try:
            out = subprocess.run([LD_SO, "--list", f], capture_output=True, text=True,
                                 timeout=max(1, deadline - time.monotonic())).stdout
        except subprocess.TimeoutExpired:
            problems.append("ld.so --list ran out of time")
            break
        log.append(f"== {rel}\n{out}")
        for line in out.splitlines():
            m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s+\(0x", line)
            if "not found" in line:
                problems.append(f"{rel}: {line.strip()}")
            elif m:
                path = os.path.realpath(m.group(2))
                ok = path.startswith(root + "/") or GLIBC.match(m.group(1)) or \
                    any(path.startswith(d + "/") for d in cuda)
                if not ok:
                    problems.append(f"{rel}: {m.group(1)} comes from the host's {path}")
    with open(os.path.join(r.logs, "libraries.log"), "w") as f:
        f.write("\n".join(log))
    return problems, len(files)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def part_environment(r, deadline, res):
    rc, out = r.run("gpu_probe", [bundle_path("build/tests/gpu/gpu_probe")], deadline)
    try:
        probe = json.loads(out[out.index("{"):out.rindex("}") + 1])
    except ValueError:
        probe = {"status": "unusable", "why": f"gpu_probe exited {rc}: {tail(out)}"}
    probe["driver_version"] = driver_version()
    res["environment"] = probe
    problems, n = resolve_all(r, deadline)
    res["libraries_checked"] = n
    res["library_problems"] = problems
    worker = bundle_path("build/worker/worker")
    rc2, out2 = r.run("cpu-train-np2", MPIRUN + ["-np", "2", worker, "model.preset=gpt2-tiny",
                                                 "train.steps=3", "mesh.dp=2",
                                                 "runtime.device=cpu", "runtime.threads=1",
                                                 "train.batch_size=4"], deadline)
    res["cpu_smoke"] = tail(out2, 2)
    reasons = []
    if problems:
        reasons.append(f"{len(problems)} unresolved or host libraries: {problems[0]}")
    if rc2 != 0:
        reasons.append(f"2 CPU ranks under the bundle's mpirun exited {rc2}: {tail(out2)}")
    if probe["status"] == "unusable":
        reasons.append("a GPU is present but weft cannot use it: " + probe.get("why", "?"))
    return ("fail", "; ".join(reasons)) if reasons else ("pass", gpu_summary(probe))


def gpu_summary(p):
    libs = p.get("libraries", {})
    vers = ", ".join(f"{k} {v.get('version', 'missing')}" for k, v in libs.items())
    if p["status"] != "gpu":
        return f"no GPU ({p.get('why', '')}); CPU ranks and libraries fine; {vers}"
    d = p["devices"][0]
    return (f"{d['name']}, {d['memory_gib']:.0f} GiB, cc {d['cc']}, {d['sm_count']} SMs; driver "
            f"{p.get('driver_version')} (CUDA {p['driver']['cuda']}); {vers}")


# ---- parts 2 to 5 ------------------------------------------------------------------------

def no_gpu(res):
    return res["environment"]["status"] == "no-gpu"


def judge(rc, out, what):
    """pass / no GPU / fail from a GPU test's exit status (77 only means no GPU)."""
    if rc == 0:
        return "pass", tail(out, 1)
    if rc == 77:
        return "no GPU", tail(out, 1)
    return "fail", f"{what} exited {rc}: {tail(out)}"


def part_kernels(r, deadline, res):
    results = []
    rc, out = r.run("test_gpu_kernels", [bundle_path("build/tests/gpu/test_gpu_kernels")],
                    deadline)
    results.append(("every CUDA kernel vs its CPU twin",) + judge(rc, out, "test_gpu_kernels"))
    res["kernel_lines"] = [l for l in out.splitlines() if l.strip().startswith(("ok", "FAIL"))]
    if not no_gpu(res):  # without a GPU it builds no plan: CI's cudnn_graphs covers that
        rc, out = r.run("test_cudnn_graphs",
                        [bundle_path("build/tests/gpu/test_cudnn_graphs")], deadline)
        results.append(("cuDNN's attention graphs vs the reference",) +
                       judge(rc, out, "test_cudnn_graphs"))
    nccl = bundle_path("build/tests/collectives/test_nccl_gpu")
    for n, what in ((1, "collectives on NCCL (1 rank)"),
                    (2, "collectives host-staged (2 ranks share the GPU)")):
        rc, out = r.run(f"test_nccl_gpu-np{n}", MPIRUN + ["-np", str(n), nccl], deadline)
        results.append((what,) + judge(rc, out, f"test_nccl_gpu on {n} rank(s)"))
    res["kernel_checks"] = [{"check": w, "status": s, "detail": d} for w, s, d in results]
    return combine(results)


def combine(results):
    if any(s == "fail" for _, s, _ in results):
        return "fail", "; ".join(f"{w}: {d}" for w, s, d in results if s == "fail")
    if all(s == "no GPU" for _, s, _ in results):
        return "no GPU", results[0][2]
    return "pass", "; ".join(f"{w}: {d}" for w, s, d in results)


def part_training(r, deadline, res):
    worker, probe = bundle_path("build/worker/worker"), bundle_path("build/tests/gpu/gpu_probe")
    script = os.path.join(ROOT, "tests", "gpu", "train_gpu.py")

    def one(case):
        rc, out = r.run("train-" + case, [sys.executable, script, worker, case, probe],
                        deadline)
        oks = [l[4:] for l in out.splitlines() if l.startswith("ok: ")]
        s, d = judge(rc, out, f"train_gpu.py {case}")
        return case, s, ("; ".join(oks) if s == "pass" and oks else d)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, TRAIN_CASES))
    res["training"] = [{"case": c, "status": s, "detail": d} for c, s, d in results]
    return combine(results)


def part_kernel_table(r, deadline, res):
    bench = bundle_path("build/bench/kernels")
    if no_gpu(res):
        path = os.path.join(r.logs, "kernels-cpu.json")
        rc, out = r.run("kernels-cpu", [bench, "--device", "cpu", "-B", "2", "-T", "64", "-C",
                                        "128", "--heads", "4", "-V", "1024", "--layers", "2",
                                        "--json", path], deadline)
        res["kernel_tables"] = {"cpu (toy shape)": load(path)}
        if rc != 0:
            return "fail", f"bench/kernels on the CPU exited {rc}: {tail(out)}"
        return "no GPU", "no GPU: the bench ran on the CPU at a toy shape instead"
    tables, results = {}, []
    for prec in ("bf16", "fp32"):
        path = os.path.join(r.logs, f"kernels-{prec}.json")
        rc, out = r.run("kernels-" + prec, [bench, "--device", "cuda", "--precision", prec,
                                            "--json", path], deadline)
        tables[prec] = load(path)
        results.append((prec,) + judge(rc, out, f"bench/kernels --precision {prec}"))
    res["kernel_tables"] = tables
    return combine(results)


def part_vs_torch(r, deadline, res):
    if no_gpu(res):
        return "no GPU", "no GPU"
    path = os.path.join(r.logs, "gpu_train.json")
    left = max(10, deadline - time.monotonic() - 5)  # for its three runs together
    rc, out = r.run("gpu_train", [sys.executable, os.path.join(ROOT, "bench", "gpu_train.py"),
                                  bundle_path("build/worker/worker"), "--batch", "16", "--eager",
                                  "--steps", "20", "--warmup", "5", "--precision", "bf16",
                                  "--json", path, "--timeout", str(int(left))], deadline)
    res["vs_torch"] = load(path)
    res["vs_torch_text"] = [l for l in out.splitlines() if l.startswith(("|", "GPT-2"))]
    if rc != 0 or not res["vs_torch"]:
        return "fail", f"bench/gpu_train.py exited {rc}: {tail(out)}"
    errors = [x for x in res["vs_torch"]["rows"] if "error" in x]
    if errors:
        return "fail", "; ".join(f"{x['name']}: {x['error']}" for x in errors)
    w = res["vs_torch"]["rows"][0]
    return "pass", f"weft {w['tokens_per_s']:.0f} tokens/s, MFU {100 * w.get('mfu', 0):.1f}%"


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


PARTS = [("environment", part_environment), ("kernels", part_kernels),
         ("training", part_training), ("kernel table", part_kernel_table),
         ("vs PyTorch", part_vs_torch)]


# ---- the report ------------------------------------------------------------------------

def md_kernel_table(name, t):
    if not t:
        return [f"### Kernel table, {name}: not produced", ""]
    pk = t["peaks"]
    s = t["shape"]
    lines = [f"### Kernel table, {name}: {t['device']}",
             f"B {s['B']}, T {s['T']}, C {s['C']}, heads {s['NH']}, V {s['V']}, "
             f"{s['layers']} layers. Peaks: GEMMs {pk['gemm_tflops']:.1f} TFLOP/s, the rest "
             f"{pk['fp32_tflops']:.1f} TFLOP/s, memory {pk['mem_gbs']:.0f} GB/s ({pk['source']}).",
             "", "| kernel | ms | GFLOP | MB | TFLOP/s | GB/s | % peak FLOP/s | % peak GB/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    pct = lambda v: "-" if v is None else f"{v:.1f}"
    for x in t["rows"]:
        if "error" in x:
            lines.append(f"| {x['kernel']} | failed: {x['error']} | | | | | | |")
            continue
        lines.append(f"| {x['kernel']} | {x['ms']:.4f} | {x['flops'] / 1e9:.3f} | "
                     f"{x['bytes'] / 1e6:.1f} | {x['tflops']:.2f} | {x['gbs']:.1f} | "
                     f"{pct(x['pct_peak_flops'])} | {pct(x['pct_peak_bw'])} |")
    return lines + [""]


def write_report(out, res, parts, wall, failed):
    res["parts"] = parts
    res["wall_s"] = wall
    res["result"] = "fail" if failed else "pass"
    with open(os.path.join(out, "gpu-report.json"), "w") as f:
        json.dump(res, f, indent=1)
    L = [f"# weft GPU check: {'FAILED' if failed else 'passed'}", "",
         f"{res['started']}, {wall:.0f} s, bundle {os.environ['WEFT_BUNDLE']}", "",
         "| part | status | seconds (limit) | reason / summary |", "|---|---|---:|---|"]
    for p in parts:
        L.append(f"| {p['part']} | {p['status']} | {p['seconds']:.0f} ({p['limit']}) | "
                 f"{p['reason'].replace('|', '/')} |")
    env = res.get("environment", {})
    L += ["", "## 1. Environment", "", f"- status: {env.get('status')} {env.get('why', '')}",
          f"- driver {env.get('driver_version')}, CUDA {env.get('driver', {}).get('cuda')} "
          f"({env.get('driver', {}).get('detail')})"]
    for d in env.get("devices", []):
        L.append(f"- GPU {d['index']}: {d['name']}, PCI {d['pci']}, {d['memory_gib']:.1f} GiB "
                 f"({d['free_gib']:.1f} free), cc {d['cc']}, {d['sm_count']} SMs")
    for k, v in env.get("libraries", {}).items():
        L.append(f"- {k}: {v.get('version', '')} {v.get('path', v.get('error', ''))}")
    L.append(f"- {res.get('libraries_checked', 0)} ELF files checked with ld.so --list: "
             f"{len(res.get('library_problems', []))} problem(s)")
    L += [f"  - {x}" for x in res.get("library_problems", [])[:20]]
    L.append(f"- 2 CPU ranks under the bundle's mpirun: {res.get('cpu_smoke', '')}")
    L += ["", "## 2. Kernels and collectives", ""]
    L += [f"- {c['check']}: {c['status']}: {c['detail']}" for c in res.get("kernel_checks", [])]
    L += ["", "```"] + res.get("kernel_lines", []) + ["```"] if res.get("kernel_lines") else []
    L += ["", "## 3. Training", ""]
    L += [f"- {c['case']}: {c['status']}: {c['detail']}" for c in res.get("training", [])]
    L += ["", "## 4. Kernel tables", ""]
    for name, t in (res.get("kernel_tables") or {}).items():
        L += md_kernel_table(name, t)
    L += ["## 5. weft vs PyTorch", ""] + (res.get("vs_torch_text") or ["(not run)"])
    with open(os.path.join(out, "gpu-report.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("out")
    a.add_argument("--require-gpu", action="store_true",
                   help="a machine without a GPU fails the check")
    a.add_argument("--only", help="comma-separated part names (default: all five)")
    o = a.parse_args()
    if not os.environ.get("WEFT_BUNDLE"):
        sys.exit("gpu-check: WEFT_BUNDLE is not set: run scripts/gpu-check.sh")
    # Root in a container, more ranks than GPUs, one node: shared memory (vader) without
    # its cross-memory-attach copy, which containers often forbid (ptrace scope).
    for k, v in (("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                 ("OMPI_MCA_rmaps_base_oversubscribe", "1"), ("OMPI_MCA_btl", "self,vader"),
                 ("OMPI_MCA_btl_vader_single_copy_mechanism", "none")):
        os.environ.setdefault(k, v)
    out = os.path.abspath(o.out)
    os.makedirs(out, exist_ok=True)
    r, res, parts = Runner(out), {"started": datetime.datetime.now().isoformat(" ", "seconds")}, []
    t_start = time.monotonic()
    only = set(o.only.split(",")) if o.only else None
    failed = False
    for name, fn in PARTS:
        if only and name not in only and name != "environment":
            continue
        t0 = time.monotonic()
        limit = LIMITS[name]
        if name == PARTS[-1][0]:
            limit = max(limit, int(TOTAL - (t0 - t_start)))
        try:
            status, reason = fn(r, t0 + limit, res)
        except Exception as e:  # a bug here must not cost the other parts
            status, reason = "fail", f"the check itself failed: {type(e).__name__}: {e}"
        if time.monotonic() - t0 > limit - 1 and status != "pass":
            reason = f"ran out of its {limit} s: " + reason
        parts.append({"part": name, "status": status, "reason": reason,
                      "seconds": time.monotonic() - t0, "limit": limit})
        print(f"gpu-check: {name}: {status}: {reason}", flush=True)
        failed = any(p["status"] == "fail" for p in parts) or \
            (o.require_gpu and any(p["status"] == "no GPU" for p in parts))
        # after every part: a check stopped from outside still leaves a report
        write_report(out, res, parts, time.monotonic() - t_start, failed)
    with open(os.path.join(out, "gpu-report.md")) as f:  # all but the tables, for a log
        print(f.read().split("## 4.")[0].rstrip())
    print(f"gpu-check: {'FAILED' if failed else 'passed'} in {time.monotonic() - t_start:.0f} s; "
          f"report: {out}/gpu-report.md")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
