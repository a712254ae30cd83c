#!/usr/bin/env python3
"""weft's whole GPU path in one command, on a bare GPU machine (scripts/gpu-check.sh).

    scripts/gpu-check.sh OUTDIR [--require-gpu] [--only PART,...]

Run from the repository root with a bundle from scripts/gpu-bundle.sh at $WEFT_BUNDLE or
./gpu-bundle (gpu-check.sh sources its env.sh first). Seven parts, in this order (the
most information first), each under its own time limit so that a hang costs only that
part, each run whatever the others did, all within TOTAL (8 minutes):

  1 environment  the GPU (name, memory, compute capability), the driver, the CUDA runtime,
                 cuBLAS(Lt), NCCL and cuDNN versions and the files they load from
                 (tests/gpu/gpu_probe), PyTorch's version, weft's build id (`worker
                 --version`); every shared library of every binary of the bundle
                 resolves, to the bundle, glibc or CUDA (ld.so --list); the bundle's
                 mpirun starts two CPU ranks that train 3 steps.
  2 kernels      every CUDA kernel against its CPU twin (test_gpu_kernels, and context
                 parallelism's block attention: test_attention_block), cuDNN's
                 attention graphs (test_cudnn_graphs), then the collectives on device
                 buffers: NCCL (1 rank) and host-staged (2 ranks sharing the GPU;
                 test_nccl_gpu).
  3 training     every case of tests/gpu/train_gpu.py (`--list`), 6 at a time: one rank
                 on the GPU against the CPU (fp32, bf16, fp16; head sizes 64 and 128 on
                 cuDNN and on the flash kernels; Llama with GQA and RoPE scaling; the
                 200-step bf16 curve), ranks sharing the GPU against one rank (dp, tp,
                 pp, dp x tp, HSDP, ZeRO-1/2/3, GPipe, 1F1B and interleaved at pp 4), and
                 fp32 and bf16 checkpoints from the GPU resumed on the CPU and back.
  4 GPT-2 vs PyTorch   bench/gpu_train.py: GPT-2 124M, B 16, T 1024, bf16: weft, PyTorch
                 torch.compile (default mode, compiled optimizer, every SDPA backend
                 allowed) and eager.
  5 Llama vs PyTorch   bench/gpu_train.py --model llama-1b: T 2048, B 8, bf16: weft and
                 torch.compile (Hugging Face's architecture, bench/torch_models.py).
  6 kernel table bench/kernels at GPT-2 124M shapes (B 16, T 1024), bf16 then fp32. Without
                 a GPU: the CPU at a toy shape instead (that the bench runs).
  7 max-autotune  bench/gpu_train.py: GPT-2 124M B 16 against torch.compile in its
                 max-autotune mode, then with SDPA's cuDNN backend first (their
                 compilation is the longest; this part takes what the others left).

A part's status is pass, fail (with the reason) or "no GPU" (gpu_probe found no NVIDIA
driver, or one that reports no device; a GPU that is there but unusable fails every GPU
part). Writes OUTDIR/gpu-report.md (the summary and the tables), OUTDIR/gpu-report.json,
OUTDIR/logs/ and OUTDIR/results/ (bench/results.py's files: the check's, and one for each
comparison and kernel table; copy them to bench/results/). Exits 1 when a part failed,
and with --require-gpu also when there was no GPU.

Time. The five parts of 2026-11 took 121 s on an H100 and 122 s on an H200 (their results
files); from that session's other calls, its comparison (weft, torch.compile and eager,
25 steps each) took about 60 s, a torch.compile run of GPT-2 with its compilation about
45 s and weft's about 8 s, which leaves about 60 s for the environment, the kernels, nine
training cases and the kernel table. Estimated for these seven parts: environment 10 s,
kernels 20, training 60 (24 cases, 6 at a time: the GPU side of each a few seconds, most
of it CUDA's start-up, the CPU side of the larger cases 1-3 s), GPT-2 65 (weft 8,
torch.compile 45 with the optimizer's compilation, eager 12), Llama 115 (weft 25: its
start-up and 25 steps of about 0.35 s, `worker --estimate`'s figure; torch.compile 90:
16 layers and the optimizer compiled, 25 steps), kernel table 15, max-autotune 170 (its
GEMM template search, then the default mode again with cuDNN's attention first, on a warm
compilation cache): about 455 s. The limits bound a part that runs longer; the last part
gets what is left of TOTAL, and a PyTorch row that does not finish in it says so without
failing the check.
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
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_env  # noqa: E402  PyTorch's environment
import results  # noqa: E402  bench/results.py: the results files

LIMITS = {"environment": 40, "kernels": 60, "training": 150, "GPT-2 vs PyTorch": 130,
          "Llama vs PyTorch": 150, "kernel table": 40, "max-autotune": 200}
TOTAL = 475  # s: every part ends by then; the last one takes what the others left
TRAIN_PARALLEL = 6
LD_SO = "/lib64/ld-linux-x86-64.so.2"
GLIBC = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|"
                   r"libanl|libmvec|libnsl)\.so")


class Runner:
    """Runs commands with a deadline, each in its own process group (killed whole on
    timeout), logging each to OUTDIR/logs."""

    def __init__(self, out):
        self.logs, self.results = os.path.join(out, "logs"), os.path.join(out, "results")
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
    probe["driver_version"] = results.driver_version()
    res["environment"] = probe
    res["weft"] = results.build_id(bundle_path("build/worker/worker"))
    res["pytorch"] = torch_version(r, deadline)
    res["machine"] = results.machine(probe, res["pytorch"].split()[0]
                                     if not res["pytorch"].startswith("none") else None)
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


def torch_version(r, deadline):
    """The PyTorch the comparisons run (with the CUDA libraries of its own wheels), or
    what kept it from importing."""
    rc, out = r.run("pytorch", [sys.executable, "-c", "import torch; print(torch.__version__, "
                                "torch.version.cuda, torch.backends.cudnn.version())"],
                    deadline, env=bench_env.for_torch(os.environ))
    return out.strip().splitlines()[-1] if rc == 0 and out.strip() else f"none ({tail(out, 1)})"


def gpu_summary(p):
    libs = p.get("libraries", {})
    vers = ", ".join(f"{k} {v.get('version', 'missing')}" for k, v in libs.items())
    if p["status"] != "gpu":
        return f"no GPU ({p.get('why', '')}); CPU ranks and libraries fine; {vers}"
    d = p["devices"][0]
    return (f"{d['name']}, {d['memory_gib']:.0f} GiB, cc {d['cc']}, {d['sm_count']} SMs; driver "
            f"{p.get('driver_version')} (CUDA {p['driver']['cuda']}); {vers}; weft "
            f"{p.get('weft_build')}")


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
    rc, out = r.run("test_attention_block",
                    [bundle_path("build/tests/gpu/test_attention_block")], deadline)
    results.append(("context parallelism's block attention vs its CPU twin",) +
                   judge(rc, out, "test_attention_block"))
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
    cases = subprocess.run([sys.executable, script, "--list"], capture_output=True,
                           text=True).stdout.split()

    def one(case):
        rc, out = r.run("train-" + case, [sys.executable, script, worker, case, probe],
                        deadline)
        oks = [l[4:] for l in out.splitlines() if l.startswith("ok: ")]
        figures = [json.loads(l[8:]) for l in out.splitlines() if l.startswith("result: ")]
        s, d = judge(rc, out, f"train_gpu.py {case}")
        return {"case": case, "status": s, "detail": "; ".join(oks) if s == "pass" and oks
                else d, "results": figures}

    with concurrent.futures.ThreadPoolExecutor(TRAIN_PARALLEL) as pool:
        res["training"] = list(pool.map(one, cases))
    return combine([(c["case"], c["status"], c["detail"]) for c in res["training"]])


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
    tables, verdicts = {}, []
    for prec in ("bf16", "fp32"):
        path = os.path.join(r.logs, f"kernels-{prec}.json")
        rc, out = r.run("kernels-" + prec, [bench, "--device", "cuda", "--precision", prec,
                                            "--json", path], deadline)
        tables[prec] = load(path)
        verdicts.append((prec,) + judge(rc, out, f"bench/kernels --precision {prec}"))
        if tables[prec]:
            results.write(r.results, results.record("kernel-table", dict(
                tables[prec], tool=f"build/bench/kernels --precision {prec}"), res["machine"],
                res["weft"]))
    res["kernel_tables"] = tables
    return combine(verdicts)


def vs_torch(r, deadline, res, key, args):
    """bench/gpu_train.py with `args`; its results record goes to OUTDIR/results."""
    if no_gpu(res):
        return "no GPU", "no GPU"
    path = os.path.join(r.logs, key + ".json")
    left = max(10, deadline - time.monotonic() - 5)  # for all its runs together
    rc, out = r.run(key, [sys.executable, os.path.join(ROOT, "bench", "gpu_train.py"),
                          bundle_path("build/worker/worker"), "--probe",
                          bundle_path("build/tests/gpu/gpu_probe"), "--results", r.results,
                          "--json", path, "--timeout", str(int(left))] + args, deadline)
    rec = load(path)
    res[key] = rec
    if rec:
        res["machine"]["pytorch"] = rec["machine"].get("pytorch") or res["machine"]["pytorch"]
    res[key + "_text"] = [l for l in out.splitlines() if l.startswith("|") or " T=" in l]
    if rc != 0 or not rec:
        return "fail", f"bench/gpu_train.py exited {rc}: {tail(out)}"
    rows = [x for run in rec["figures"]["runs"] for x in run["rows"]]
    errors = [x for x in rows if "error" in x]
    summary = ", ".join(f"{x['name']} {x['tokens_per_s']:,.0f} tokens/s"
                        + (f" ({100 * x['mfu']:.1f}%)" if "mfu" in x else "")
                        for x in rows if "error" not in x)
    said = "; ".join(f"{x['name']}: {x['error']}" for x in errors)
    # a PyTorch row out of time is a figure the check could not wait for, not a failure
    if any(x["name"] == "weft" or not x["error"].startswith("did not finish") for x in errors):
        return "fail", said + "; " + summary
    return "pass", summary + (f"; incomplete: {said}" if errors else "")


def part_gpt2(r, deadline, res):
    return vs_torch(r, deadline, res, "gpt2", ["--batch", "16", "--steps", "20", "--warmup", "5",
                                               "--peers", "compile,eager"])


def part_llama(r, deadline, res):
    return vs_torch(r, deadline, res, "llama", ["--model", "llama-1b", "--batch", "8", "--steps",
                                                "20", "--warmup", "5", "--peers", "compile"])


def part_autotune(r, deadline, res):
    return vs_torch(r, deadline, res, "autotune", ["--batch", "16", "--steps", "20", "--warmup",
                                                   "5", "--peers", "max-autotune,compile-cudnn"])


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check_record(res, parts, wall, failed, started):
    """The check as a results file (bench/results.py's "gpu-check")."""
    lines = res.get("kernel_lines", [])
    by = {c["check"]: c["status"] for c in res.get("kernel_checks", [])}
    figures = {
        "result": "fail" if failed else "pass", "wall_s": round(wall, 1),
        "parts": [{k: p[k] for k in ("part", "status", "limit", "reason")} |
                  {"seconds": round(p["seconds"], 1)} for p in parts],
        "kernel_checks": sum(1 for l in lines if l.strip().startswith("ok")),
        "kernel_checks_failed": sum(1 for l in lines if l.strip().startswith("FAIL")),
        "cudnn_graphs": by.get("cuDNN's attention graphs vs the reference", "not run"),
        "collectives": "pass" if [v for k, v in by.items() if k.startswith("collectives")] ==
        ["pass", "pass"] else "not all pass",
        "training": res.get("training", []), "pytorch": res.get("pytorch"),
        "libraries_checked": res.get("libraries_checked"),
        "library_problems": res.get("library_problems", [])}
    if failed:
        figures["failed"] = ", ".join(p["part"] for p in parts if p["status"] != "pass")
    rec = results.record("gpu-check", figures, res.get("machine") or {"gpu": "?"},
                         res.get("weft") or {"commit": None, "dirty": None})
    rec["time"] = started
    return rec


PARTS = [("environment", part_environment), ("kernels", part_kernels),
         ("training", part_training), ("GPT-2 vs PyTorch", part_gpt2),
         ("Llama vs PyTorch", part_llama), ("kernel table", part_kernel_table),
         ("max-autotune", part_autotune)]


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
    L += ["", "Results files (copy them to bench/results/): "
          + ", ".join(sorted(os.listdir(os.path.join(out, "results"))))
          if os.path.isdir(os.path.join(out, "results")) else ""]
    for n, (key, title) in enumerate((("gpt2", "GPT-2 124M"), ("llama", "llama-1b"),
                                      ("autotune", "GPT-2 124M, max-autotune")), 4):
        L += ["", f"## {n}. weft vs PyTorch: {title}", ""] + (res.get(key + "_text")
                                                             or ["(not run)"])
    L += ["", "## 7. Kernel tables", ""]
    for name, t in (res.get("kernel_tables") or {}).items():
        L += md_kernel_table(name, t)
    with open(os.path.join(out, "gpu-report.md"), "w") as f:
        f.write("\n".join(L) + "\n")


def main():
    a = argparse.ArgumentParser()
    a.add_argument("out")
    a.add_argument("--require-gpu", action="store_true",
                   help="a machine without a GPU fails the check")
    a.add_argument("--only", help="comma-separated part names (default: all seven)")
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
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    t_start = time.monotonic()
    only = set(o.only.split(",")) if o.only else None
    failed = False
    for name, fn in PARTS:
        if only and name not in only and name != "environment":
            continue
        t0 = time.monotonic()
        left = int(TOTAL - (t0 - t_start))  # the last part takes all that is left
        limit = left if name == PARTS[-1][0] else min(LIMITS[name], left)
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
        if "machine" in res:
            results.write(r.results, check_record(res, parts, time.monotonic() - t_start,
                                                  failed, started))
    with open(os.path.join(out, "gpu-report.md")) as f:  # all but the tables, for a log
        print(f.read().split("## 7.")[0].rstrip())
    print(f"gpu-check: {'FAILED' if failed else 'passed'} in {time.monotonic() - t_start:.0f} s; "
          f"report: {out}/gpu-report.md")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
