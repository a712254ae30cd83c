"""stream.py - data.source end to end through the worker under mpirun.

usage: stream.py WORKER MPIRUN ZSTD CASE...

Fixtures: Debian's fortunes as JSON Lines, three sources mixed 0.5 / 0.3 / 0.2: a plain
file, a zstd file (the zstd command), and a zstd file of 9 documents (many epochs).
Text is read as bytes (a byte-level gpt2-tiny: seconds a run); tests/io/test_stream.c
covers GPT-2's tokenizer.

  resume   one run at dp 2 trains 12 steps and writes a checkpoint after step 5; the
           checkpoint is resumed at dp 2, at dp 4, at dp 2 x pp 2 and at dp 1. Every row
           of steps 6-12 (WEFT_TEST_DATA_TRACE: each rank's rows, merged) equals the
           uninterrupted run's, token for token, and at dp 2 the losses of steps 6-12
           equal its losses bit for bit (the model's state and the data's both resumed).
  docmask  data.document_mask on every kind of mesh: one rank against dp 2 with ZeRO-3,
           tp 2 with sequence parallelism, pp 4 (1F1B: the middle stages read each
           micro-batch's document starts too) and, for Llama, tp 2 (kv heads split with
           their queries); every step's loss within 1e-5 relative of the one-rank run
           (tests/mpi/equiv.py's LOSS_RTOL and its derivation: the meshes add the same
           products in other orders), and the one-rank run without masks more than 10x
           that apart; full recompute gives the same losses bit for bit. At dp 2 a
           resume from step 4 reads the same rows and document starts and computes the
           same losses bit for bit. mesh.cp=2 with the masks is refused: exit 2, one line.
  errors   a line that is not JSON at line 60 of a source, found while training by one
           rank's loader: every rank stops at that step, one error line for the job
           naming the file and the line, exit 2; a missing source and a data.mix of the
           wrong length: one line, exit 2.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

WORKER, MPIRUN, ZSTD = sys.argv[1], sys.argv[2], sys.argv[3]
MPI_ARGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
FORTUNES = "/usr/share/games/fortunes"
BASE = ["model.preset=gpt2-tiny", "model.seq_len=32", "train.batch_size=8", "train.seed=7",
        "train.warmup=2", "runtime.hang_timeout=60"]


def fortunes(name, limit=None):
    docs, cur = [], []
    with open(os.path.join(FORTUNES, name), encoding="utf-8") as f:
        for line in f:
            if line.strip() == "%":
                if cur:
                    docs.append("".join(cur))
                cur = []
            else:
                cur.append(line)
    if cur:
        docs.append("".join(cur))
    return docs[:limit]


def write_jsonl(path, docs, bad_line=None):
    with open(path, "w") as f:
        for i, t in enumerate(docs):
            if bad_line is not None and i + 1 == bad_line:
                f.write('{"text": "unterminated}\n')
            else:
                f.write(json.dumps({"id": i, "text": t}) + "\n")


def fixtures(d):
    write_jsonl(os.path.join(d, "a.jsonl"), fortunes("fortunes"))
    write_jsonl(os.path.join(d, "b.jsonl"), fortunes("wisdom"))
    write_jsonl(os.path.join(d, "c.jsonl"), fortunes("literature", 9))
    for name in ("b", "c"):
        src = os.path.join(d, name + ".jsonl")
        subprocess.run([ZSTD, "-q", "-f", "--rm", src, "-o", src + ".zst"], check=True)
    return ["data.source=[%s]" % ", ".join(os.path.join(d, n) for n in
                                           ("a.jsonl", "b.jsonl.zst", "c.jsonl.zst")),
            "data.mix=[0.5, 0.3, 0.2]"]


def run(np, args, env=None, timeout=300):
    """np 0: the worker alone (one rank, no mpirun)."""
    cmd = ([MPIRUN] + MPI_ARGS + ["-np", str(np)] if np else []) + [WORKER] + BASE + args
    e = dict(os.environ, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    return p.returncode, p.stdout, p.stderr


def rows(trace_dir):
    """{(step, lane): row} over every rank's trace; ranks that read the same lane agree."""
    out = {}
    for path in glob.glob(os.path.join(trace_dir, "rank-*.txt")):
        for line in open(path):
            head, row = line.split(":", 1)
            step, lane = (int(x) for x in head.split())
            if (step, lane) in out:
                assert out[(step, lane)] == row, f"ranks disagree on step {step} lane {lane}"
            out[(step, lane)] = row
    return out


def losses(path):
    return {r["step"]: r["loss"] for r in map(json.loads, open(path))}


def case_resume(d):
    src = fixtures(d)
    ck, ref_tr = os.path.join(d, "ck"), os.path.join(d, "tr-ref")
    os.makedirs(ref_tr)
    rc, out, err = run(2, src + ["train.steps=12", "train.checkpoint_every=5",
                                 "train.checkpoint_dir=" + ck,
                                 "train.metrics=" + os.path.join(d, "ref.jsonl")],
                       env={"WEFT_TEST_DATA_TRACE": ref_tr})
    assert rc == 0, err[-3000:]
    with open(os.path.join(ck, "step-000005", "manifest.json")) as f:
        stream = json.load(f)["data"]["stream"]
    assert stream["step"] == 5 and stream["lanes"] == 8, stream
    ref = rows(ref_tr)
    assert len(ref) == 12 * 8, len(ref)
    ref_loss = losses(os.path.join(d, "ref.jsonl"))
    for np, mesh in ((2, []), (4, []), (4, ["mesh.pp=2"]), (1, [])):
        tr = os.path.join(d, "tr-%d-%s" % (np, "pp2" if mesh else "dp"))
        os.makedirs(tr)
        metrics = os.path.join(d, os.path.basename(tr) + ".jsonl")
        rc, out, err = run(np, src + mesh + ["train.steps=12", "train.checkpoint_dir=" + ck,
                                             "train.resume=" + os.path.join(ck, "step-000005"),
                                             "train.metrics=" + metrics],
                           env={"WEFT_TEST_DATA_TRACE": tr})
        assert rc == 0, err[-3000:]
        assert "resumed from" in err and "at step 5" in err, err[-3000:]
        got = rows(tr)
        assert sorted(got) == [(s, l) for s in range(6, 13) for l in range(8)], sorted(got)[:10]
        for key, row in got.items():
            assert row == ref[key], f"step {key[0]} lane {key[1]} differs after the resume"
        what = "dp %d" % (np // 2 if mesh else np) + (" x pp 2" if mesh else "")
        if np == 2 and not mesh:
            mine = losses(metrics)
            assert all(mine[s] == ref_loss[s] for s in range(6, 13)), (mine, ref_loss)
            print("resumed at %s: steps 6-12, %d rows equal the uninterrupted run's token for "
                  "token; losses equal bit for bit (step 12: %.6f)" % (what, len(got),
                                                                        mine[12]))
        else:
            print("resumed at %s: steps 6-12, %d rows equal the uninterrupted run's token for "
                  "token" % (what, len(got)))


LOSS_RTOL = 1e-5  # tests/mpi/equiv.py says where it comes from


def case_docmask(d):
    src = fixtures(d) + ["data.document_mask=true", "train.steps=8"]
    ck = os.path.join(d, "ck")
    for preset, meshes in (("gpt2-tiny", ((2, ["mesh.dp=2", "optim.zero=3"]),
                                          (2, ["mesh.tp=2", "parallel.sequence=true"]),
                                          (4, ["mesh.pp=4", "train.microbatches=4"]))),
                           ("llama-tiny", ((2, ["mesh.tp=2"]),))):
        base = src + ["model.preset=" + preset]
        ref_m = os.path.join(d, preset + "-ref.jsonl")
        micro = ["train.microbatches=4", "runtime.threads=1"]  # as every mesh's stages
        single = {"OMPI_MCA_ess_singleton_isolated": "1"}
        rc, out, err = run(0, base + micro + ["train.metrics=" + ref_m], env=single)
        assert rc == 0, err[-3000:]
        ref = losses(ref_m)
        # the masks change the computation: the same rows without them train otherwise
        # (step 1's rows hold no boundary, fortunes being longer than 32 bytes, but from
        # step 2 on the losses move by ~7e-4 relative: measured)
        plain_m = os.path.join(d, preset + "-plain.jsonl")
        rc, out, err = run(0, base + micro + ["data.document_mask=false",
                                              "train.metrics=" + plain_m], env=single)
        assert rc == 0, err[-3000:]
        plain = losses(plain_m)
        apart = max(abs(plain[s] - ref[s]) / abs(ref[s]) for s in ref)
        assert apart > 10 * LOSS_RTOL, (plain, ref)
        # full recompute runs each layer's forward again from the slot's documents: the
        # same floats in the same order, so the same losses bit for bit
        re_m = os.path.join(d, preset + "-recompute.jsonl")
        rc, out, err = run(0, base + micro + ["parallel.activation_checkpointing=full",
                                              "train.metrics=" + re_m], env=single)
        assert rc == 0 and losses(re_m) == ref, err[-3000:]
        for np, mesh in meshes:
            got_m = os.path.join(d, "%s-%s.jsonl" % (preset, "-".join(mesh)))
            resume = preset == "gpt2-tiny" and "mesh.dp=2" in mesh
            keep = ["train.checkpoint_every=4", "train.checkpoint_dir=" + ck] if resume else []
            tr = os.path.join(d, "tr-%s-%d" % (preset, len(os.listdir(d))))
            os.makedirs(tr)
            rc, out, err = run(np, base + mesh + keep + ["runtime.threads=1",
                                                         "train.metrics=" + got_m],
                               env={"WEFT_TEST_DATA_TRACE": tr})
            assert rc == 0, err[-3000:]
            got = losses(got_m)
            worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
            print("%s %s: 8 steps with document masks, losses within %.1e of one rank's "
                  "(bound %.0e; without masks %.1e apart)" % (preset, " ".join(mesh), worst,
                                                              LOSS_RTOL, apart))
            assert worst <= LOSS_RTOL, (got, ref)
            if not resume:
                continue
            # a resume mid-stream reads the same rows and their document starts (the
            # trace holds both) and, at the same mesh, computes the same losses bit for bit
            tr2, res_m = tr + "-resumed", got_m + ".resumed"
            os.makedirs(tr2)
            rc, out, err = run(np, base + mesh + ["runtime.threads=1", "train.metrics=" + res_m,
                                                  "train.checkpoint_dir=" + ck,
                                                  "train.resume=" + os.path.join(ck, "step-000004")],
                               env={"WEFT_TEST_DATA_TRACE": tr2})
            assert rc == 0 and "at step 4" in err, err[-3000:]
            before, after = rows(tr), rows(tr2)
            assert sorted(after) == [(s, l) for s in range(5, 9) for l in range(8)], sorted(after)
            assert all(after[k] == before[k] for k in after), "rows or starts differ after resume"
            res = losses(res_m)
            assert all(res[s] == got[s] for s in range(5, 9)), (res, got)
            print("%s %s: resumed at step 4, steps 5-8: %d rows and their document starts equal "
                  "the uninterrupted run's, losses bit for bit" % (preset, " ".join(mesh),
                                                                   len(after)))
    # context parallelism's ring attention does not take document starts: refused, once
    rc, out, err = run(2, src + ["mesh.cp=2"])
    lines = error_lines(out + err)
    assert rc == 2 and len(lines) == 1 and "data.document_mask" in lines[0], (rc, lines)
    print("mesh.cp=2 with data.document_mask: exit 2, one line: %s" % lines[0])


def error_lines(text):
    return [l for l in text.splitlines() if "[weft E" in l or l.startswith("weft: error")]


def case_errors(d):
    src = fixtures(d)
    bad = os.path.join(d, "bad.jsonl")
    write_jsonl(bad, fortunes("fortunes"), bad_line=60)
    # lane 3 of 8 takes line 60 (document 59); its rank meets it a few steps in
    rc, out, err = run(2, ["data.source=" + bad, "train.steps=200"])
    lines = error_lines(out + err)
    print("\n".join(lines))
    assert rc == 2, (rc, err[-3000:])
    assert any("bad.jsonl:60: not JSON" in l for l in lines), lines
    # a user's mistake is said once, where it was found (worker/job.c adds no second line)
    assert len(lines) == 1, lines
    for args, word in ((["data.source=" + os.path.join(d, "nope.jsonl")], "nope.jsonl"),
                       (src[:1] + ["data.mix=[1, 2]"], "data.mix has 2 weights")):
        rc, out, err = run(2, args + ["train.steps=2"], timeout=120)
        lines = error_lines(out + err)
        print("\n".join(lines))
        assert rc == 2, (rc, err[-3000:])
        assert len(lines) == 1 and word in lines[0], lines


if __name__ == "__main__":
    for name in sys.argv[4:]:
        with tempfile.TemporaryDirectory(prefix="weft_stream_") as d:
            {"resume": case_resume, "errors": case_errors, "docmask": case_docmask}[name](d)
    print("ok")
