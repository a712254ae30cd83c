#!/usr/bin/env python3
"""Every command block of the README (and of docs/) runs as written.

`run_blocks.py SOURCE_ROOT BUILD_DIR FILE.md [--expect PATTERN=REGEX ...]`

A command block is a fenced ```sh block; ```text blocks are output and are not run. A
block right after the line `<!-- not run by tests/docs: REASON -->` is skipped, and the
reason is printed (the README's `bash scripts/test.sh` is the suite itself). Each block
runs with `bash -e -o pipefail` in a scratch copy of the repository's layout: the source
folders are links, `build` is the build under test, and `data` is a fresh folder holding
what scripts/setup.sh put in the real one (the text, GPT-2's and Llama 3's tokenizers), so nothing
the commands write lands in the checkout. The environment is the user's, without the
test harness's Open MPI settings: a command that needs --allow-run-as-root or
--oversubscribe must say so, as the README's do. Blocks of one file run in order, so a
later block may use what an earlier one wrote.

The file's own checks follow each run: the README's quick start must print a sample of
real words, and the README must stay a front page (at most 160 lines, no tables). The test also checks that every relative link of the file names a page
that exists, and (for docs/configuration.md) that every config key is documented.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SRC, BUILD, PAGE = (os.path.abspath(a) for a in sys.argv[1:4])
SKIP_MARK = re.compile(r"<!-- not run by tests/docs: (.*?) -->")
# The quick start's training is the longest block: about 2 minutes on an idle 2-core
# machine, 15 under a loaded one's full test run; the bound is for a hang, not for speed.
BLOCK_BOUND_S = 2400


def fail(msg, out=""):
    print("FAIL:", msg)
    if out:
        print(out[-6000:])
    sys.exit(1)


def blocks(text):
    """(line, kind, body, skip reason) of each fenced block."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, kind, start = len(m.group(1)), m.group(2), i
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP_MARK.search(prev)
        i += 1
        body = []
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][indent:])
            i += 1
        out.append((start + 1, kind, "\n".join(body), skip.group(1) if skip else None))
        i += 1
    return out


def scratch_repo(d):
    for name in os.listdir(SRC):
        if name in ("build", "data") or name.startswith(".") or name.startswith("build"):
            continue
        os.symlink(os.path.join(SRC, name), os.path.join(d, name))
    os.symlink(BUILD, os.path.join(d, "build"))
    data = os.path.join(d, "data")
    os.mkdir(data)
    real = os.path.join(SRC, "data")
    for need in ("fortunes.txt", os.path.join("gpt2", "vocab.json"), os.path.join("gpt2", "merges.txt"),
                 os.path.join("llama3", "tokenizer.model")):
        if not os.path.exists(os.path.join(real, need)):
            fail(f"{os.path.join(real, need)} is missing: run scripts/setup.sh first")
    shutil.copy(os.path.join(real, "fortunes.txt"), data)
    shutil.copytree(os.path.join(real, "gpt2"), os.path.join(data, "gpt2"))
    shutil.copytree(os.path.join(real, "llama3"), os.path.join(data, "llama3"))


def user_env(d):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "WEFT_", "MESON_", "MALLOC_"))}
    env["WEFT_JOB_DIR"] = os.path.join(d, "jobs")  # this test's jobs only
    env["TMPDIR"] = os.path.join(d, "tmp")
    os.mkdir(env["TMPDIR"])
    return env


def check_links(text):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(PAGE), target))
        if not os.path.exists(path):
            fail(f"{os.path.relpath(PAGE, SRC)} links to {target}, which does not exist")


def check_keys(text, env, d):
    p = subprocess.run([os.path.join(d, "build", "worker", "worker"), "--print-config"],
                       capture_output=True, text=True, env=env, cwd=d, timeout=60)
    keys = [l.split()[0] for l in p.stdout.splitlines() if " = " in l]
    missing = [k for k in keys if f"`{k}`" not in text]
    if not keys or missing:
        fail(f"docs/configuration.md does not document {missing or 'any key'}")
    print(f"ok: all {len(keys)} config keys documented")


def check_quick_start(out):
    """The README's quick start samples text: words of English, not ids or bytes."""
    gen = out.split("--generate", 1)[-1] if "--generate" in out else out
    # the worker's own lines ("[weft I host:pid:r0] ...", "weft: ...") are not the sample
    text = [l for l in gen.strip().splitlines()
            if l.strip() and not l.startswith("[weft ") and not l.startswith("weft:")]
    sample = text[-1] if text else ""
    words = re.findall(r"[A-Za-z]+", sample)
    common = {"the", "a", "and", "of", "to", "is", "in", "you", "it", "that", "i", "for",
              "be", "not", "are", "your", "with", "as", "on", "have", "all", "but"}
    if "<" in sample and re.search(r"<\d+>", sample) or len(words) < 8 or \
            not common & {w.lower() for w in words}:
        fail(f"the quick start's sample is not English words: {sample!r}", out)
    print(f"ok: the quick start's sample reads: {sample!r}")


# The README is a front page (what weft is, set-up, the quick start, the main commands,
# where to read on): about 150 lines, with room for a line or two more; reference tables
# belong in docs/.
README_MAX_LINES = 160
README_MAX_TABLE_ROWS = 0


def check_front_page(text):
    lines = text.count("\n")
    rows = sum(1 for l in text.splitlines() if l.startswith("|"))
    if lines > README_MAX_LINES or rows > README_MAX_TABLE_ROWS:
        fail(f"the README has {lines} lines and {rows} table rows; a front page has at most "
             f"{README_MAX_LINES} lines and no reference tables (move them to docs/)")
    print(f"ok: the README is a front page: {lines} lines, no tables")


def main():
    text = open(PAGE).read()
    check_links(text)
    if os.path.basename(PAGE) == "README.md":
        check_front_page(text)
    with tempfile.TemporaryDirectory(prefix="weft-docs-") as d:
        scratch_repo(d)
        env = user_env(d)
        if PAGE.endswith(os.path.join("docs", "configuration.md")):
            check_keys(text, env, d)
        ran = 0
        for line, kind, body, skip in blocks(text):
            if kind != "sh":
                continue
            name = f"{os.path.relpath(PAGE, SRC)}:{line}"
            if skip:
                print(f"skip {name}: {skip}")
                continue
            t0 = time.monotonic()
            try:
                p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=d, env=env,
                                   capture_output=True, text=True, timeout=BLOCK_BOUND_S,
                                   stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as e:
                fail(f"{name} ran past {BLOCK_BOUND_S} s:\n{body}", (e.stdout or b"").decode())
            out = p.stdout + p.stderr
            if p.returncode != 0:
                fail(f"{name} exited {p.returncode}:\n{body}", out)
            ran += 1
            print(f"ok: {name} ({time.monotonic() - t0:.1f} s): {body.splitlines()[0][:90]}")
            if "--generate" in body and PAGE.endswith("README.md"):
                check_quick_start(out)
        print(f"{ran} command blocks of {os.path.relpath(PAGE, SRC)} ran as written")
        if ran == 0 and PAGE.endswith("README.md"):
            fail("no command block found")


if __name__ == "__main__":
    main()
