#!/usr/bin/env python3
"""tensorboard.py WORKER CASE - train.tensorboard's event files, read back by an
independent reader.

The reader is not weft's: Python's protobuf runtime (python3-protobuf) decodes the
records with a schema built here from TensorBoard's published one (SCHEMA below,
written from tensorboard/compat/proto/event.proto and summary.proto of
github.com/tensorflow/tensorboard, the fields a scalar event file can hold, numbers and
types as published), and crcmod's CRC-32C (python3-crcmod) checks every record's
framing as TensorFlow's record reader does (lib/io/record_reader.cc: a masked CRC of
the 8 length bytes, then of the data). The writer is C with protobuf-c and ISA-L.

Cases (each trains gpt2-tiny on the synthetic source in its own temporary directory):
  read        2 ranks (pp 2): every step has exactly one summary event, whose scalars
              equal the metrics file's figures rounded to float32 (TensorBoard's
              scalars are float32; the metrics file holds the doubles), val_loss at the
              evaluated steps only, the pipeline's figures present; the file grows
              while the job runs (a running job can be watched).
  truncated   a record cut short (a killed writer) is skipped, the ones before it read;
              a flipped byte inside a record is a CRC error, never a value.
  roll        a small train.tensorboard_roll_mb: several files, each opening with its
              version record, which together hold every step once, in name order.
  resume      a run resumed from a checkpoint at step 6 writes SessionLog START at step
              7, which TensorBoard takes as "drop the steps >= 7 written before".
  unwritable  DIR is a file: one error naming train.tensorboard and the fix, exit 2,
              no step trained.
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import crcmod.predefined
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import fail, free_ports  # noqa: E402

WORKER, CASE = sys.argv[1], sys.argv[2]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
BASE = ["model.preset=gpt2-tiny", "train.batch_size=8", "train.seed=1234", "train.warmup=2",
        "train.eval_every=5", "train.eval_batches=1"]
TMP = tempfile.mkdtemp(prefix="weft-tb-")

# TensorBoard's Event and Summary (event.proto, summary.proto), as a descriptor: every
# field of Event and of Summary.Value that a scalar file may hold, so a record weft
# encoded under the wrong number would land in the wrong field (or in none) here.
SCHEMA = """
name: "tb_events_reader.proto" package: "tensorboard" syntax: "proto3"
message_type {
  name: "Event"
  field { name: "wall_time" number: 1 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
  field { name: "step" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 }
  field { name: "file_version" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 }
  field { name: "graph_def" number: 4 label: LABEL_OPTIONAL type: TYPE_BYTES oneof_index: 0 }
  field { name: "summary" number: 5 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorboard.Summary" oneof_index: 0 }
  field { name: "session_log" number: 7 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorboard.SessionLog" oneof_index: 0 }
  field { name: "meta_graph_def" number: 9 label: LABEL_OPTIONAL type: TYPE_BYTES oneof_index: 0 }
  field { name: "source_metadata" number: 10 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorboard.SourceMetadata" }
  oneof_decl { name: "what" }
}
message_type {
  name: "SourceMetadata"
  field { name: "writer" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
}
message_type {
  name: "SessionLog"
  field { name: "status" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".tensorboard.SessionLog.SessionStatus" }
  field { name: "checkpoint_path" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "msg" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING }
  enum_type { name: "SessionStatus"
    value { name: "STATUS_UNSPECIFIED" number: 0 } value { name: "START" number: 1 }
    value { name: "STOP" number: 2 } value { name: "CHECKPOINT" number: 3 } }
}
message_type {
  name: "SummaryMetadata"
  field { name: "plugin_data" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE
          type_name: ".tensorboard.SummaryMetadata.PluginData" }
  field { name: "display_name" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "summary_description" number: 3 label: LABEL_OPTIONAL type: TYPE_STRING }
  field { name: "data_class" number: 4 label: LABEL_OPTIONAL type: TYPE_INT32 }
  nested_type { name: "PluginData"
    field { name: "plugin_name" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "content" number: 2 label: LABEL_OPTIONAL type: TYPE_BYTES } }
}
message_type {
  name: "Summary"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE
          type_name: ".tensorboard.Summary.Value" }
  nested_type {
    name: "Value"
    field { name: "node_name" number: 7 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "tag" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "metadata" number: 9 label: LABEL_OPTIONAL type: TYPE_MESSAGE
            type_name: ".tensorboard.SummaryMetadata" }
    field { name: "simple_value" number: 2 label: LABEL_OPTIONAL type: TYPE_FLOAT oneof_index: 0 }
    field { name: "obsolete_old_style_histogram" number: 3 label: LABEL_OPTIONAL
            type: TYPE_BYTES oneof_index: 0 }
    field { name: "tensor" number: 8 label: LABEL_OPTIONAL type: TYPE_BYTES oneof_index: 0 }
    oneof_decl { name: "value" }
  }
}
"""
_fdp = text_format.Parse(SCHEMA, descriptor_pb2.FileDescriptorProto())
_pool = descriptor_pool.DescriptorPool()
_pool.Add(_fdp)
Event = message_factory.MessageFactory(_pool).GetPrototype(
    _pool.FindMessageTypeByName("tensorboard.Event"))
_crc32c = crcmod.predefined.mkCrcFun("crc-32c")


def masked(crc):
    """TensorFlow's lib/hash/crc32c.h Mask()."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class CrcError(Exception):
    pass


def records(path):
    """The events of one file. A last record cut short is skipped, as TensorBoard's
    reader waits for the rest of it; a CRC that does not match raises CrcError."""
    data = open(path, "rb").read()
    at, out = 0, []
    while at + 12 <= len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        (lcrc,) = struct.unpack_from("<I", data, at + 8)
        if masked(_crc32c(data[at:at + 8])) != lcrc:
            raise CrcError("%s: the length CRC of the record at byte %d" % (path, at))
        if at + 12 + n + 4 > len(data):
            break  # truncated: the writer died inside it
        body = data[at + 12:at + 12 + n]
        (dcrc,) = struct.unpack_from("<I", data, at + 12 + n)
        if masked(_crc32c(body)) != dcrc:
            raise CrcError("%s: the data CRC of the record at byte %d" % (path, at))
        ev = Event()
        ev.ParseFromString(body)
        out.append(ev)
        at += 12 + n + 4
    return out


def event_files(d):
    return sorted(p for p in glob.glob(os.path.join(d, "*")) if "tfevents" in os.path.basename(p))


def read_dir(d):
    """{step: {tag: value}} over every file in name order; checks each file's first
    record is the version and that no step appears twice."""
    steps, starts, descs = {}, [], {}
    for p in event_files(d):
        evs = records(p)
        if not evs or evs[0].WhichOneof("what") != "file_version" or \
                evs[0].file_version != "brain.Event:2":
            fail("%s does not open with file_version brain.Event:2" % p)
        for ev in evs[1:]:
            what = ev.WhichOneof("what")
            if what == "session_log":
                starts.append((ev.step, ev.session_log.status))
                continue
            if what != "summary":
                fail("%s: an event of kind %s" % (p, what))
            if ev.step in steps:
                fail("step %d written twice" % ev.step)
            vals = {}
            for v in ev.summary.value:
                if v.WhichOneof("value") != "simple_value":
                    fail("%s: tag %s is not a simple_value" % (p, v.tag))
                vals[v.tag] = v.simple_value
                if v.HasField("metadata"):
                    descs[v.tag] = v.metadata.summary_description
            steps[ev.step] = vals
    return steps, starts, descs


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def metrics(path):
    return {o["step"]: o for o in map(json.loads, open(path)) if o}


def run(n, extra, expect_rc=0):
    port = free_ports(1)[0]
    env = dict(os.environ, WEFT_JOB_DIR=os.path.join(TMP, "jobs"), MASTER_PORT=str(port),
               MASTER_ADDR="127.0.0.1", OMP_WAIT_POLICY="passive")
    cmd = (MPIRUN + ["-np", str(n)] if n > 1 else []) + [WORKER] + BASE + extra
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=240)
    if p.returncode != expect_rc:
        fail("exit %d, expected %d: %s" % (p.returncode, expect_rc, " ".join(cmd)), p.stdout)
    return p.stdout


# What the metrics file calls each tag (the same figure, in the same unit).
SAME = {"loss/train": "loss", "optim/lr": "lr", "optim/grad_norm": "grad_norm",
        "throughput/tokens_per_s": "tokens_per_s",
        "throughput/tokens_per_s_per_gpu": "tokens_per_s_per_gpu",
        "throughput/tflops_per_gpu": "tflops_per_gpu", "throughput/mfu_pct": "mfu_pct",
        "time/step_ms": "step_ms", "time/dp_comm_ms": "comm_ms", "memory/total_mib": "mem_mib",
        "memory/optim_mib": "optim_mib"}


def case_read():
    tb, m = os.path.join(TMP, "tb"), os.path.join(TMP, "m.jsonl")
    port = free_ports(1)[0]
    env = dict(os.environ, WEFT_JOB_DIR=os.path.join(TMP, "jobs"), MASTER_PORT=str(port),
               MASTER_ADDR="127.0.0.1", OMP_WAIT_POLICY="passive")
    steps_n = 40
    cmd = MPIRUN + ["-np", "2", WORKER] + BASE + [
        "mesh.pp=2", "train.microbatches=2", "train.steps=%d" % steps_n,
        "train.tensorboard=" + tb, "train.metrics=" + m]
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    seen_live = 0
    while job.poll() is None:  # watch the file while the job runs, as TensorBoard does
        if event_files(tb):
            live, _, _ = read_dir(tb)
            if live and job.poll() is None and not seen_live:
                seen_live = max(live)  # the first steps seen, long before the last
        time.sleep(0.2)
    out = job.stdout.read()
    if job.returncode != 0:
        fail("the job exited %d" % job.returncode, out)
    if not 0 < seen_live < steps_n:
        fail("no step could be read while the job ran (first seen %d of %d)" % (seen_live, steps_n),
             out)
    steps, starts, descs = read_dir(tb)
    ref = metrics(m)
    if sorted(steps) != list(range(1, steps_n + 1)) or sorted(ref) != sorted(steps):
        fail("steps %s in the event files, %s in the metrics file" % (sorted(steps), sorted(ref)))
    if starts:
        fail("a fresh run wrote SessionLog events: %s" % starts)
    checked = 0
    for s, vals in steps.items():
        o = ref[s]
        for tag, key in SAME.items():
            if key not in o or o[key] is None:
                if tag in vals:
                    fail("step %d: %s written, but the metrics file has no %s" % (s, tag, key))
                continue
            if tag not in vals:
                fail("step %d: no %s (metrics: %s=%r)" % (s, tag, key, o[key]))
            if vals[tag] != f32(o[key]):
                fail("step %d: %s = %r, the metrics file's %s = %r (as float32 %r)"
                     % (s, tag, vals[tag], key, o[key], f32(o[key])))
            checked += 1
        if ("val_loss" in o) != ("loss/val" in vals):
            fail("step %d: loss/val present %s, metrics val_loss present %s"
                 % (s, "loss/val" in vals, "val_loss" in o))
        if "val_loss" in o and vals["loss/val"] != f32(o["val_loss"]):
            fail("step %d: loss/val %r != %r" % (s, vals["loss/val"], o["val_loss"]))
        if vals["time/bubble_pct"] != f32(o["bubble"] * 100):
            fail("step %d: bubble %r != %r%%" % (s, vals["time/bubble_pct"], o["bubble"] * 100))
        if vals["memory/params_mib"] != f32(o["param_bytes"] / 2**20):
            fail("step %d: memory/params_mib %r != %r" % (s, vals["memory/params_mib"],
                                                          o["param_bytes"] / 2**20))
        if "time/tp_ms" in vals or "optim/loss_scale" in vals:
            fail("step %d: tp's or fp16's figures in a pp-only fp32 run: %s" % (s, sorted(vals)))
        for tag in ("time/compute_ms", "time/p2p_wait_ms", "memory/act_mib", "memory/grads_mib"):
            if not vals.get(tag, -1) >= 0:
                fail("step %d: %s missing or negative: %r" % (s, tag, vals.get(tag)))
    evals = [s for s in steps if "loss/val" in steps[s]]
    if evals != [5 * k for k in range(1, steps_n // 5 + 1)]:  # train.eval_every=5
        fail("loss/val at steps %s" % evals)
    if "loss/train" not in descs or "nats" not in descs["loss/train"]:
        fail("loss/train has no description: %r" % descs.get("loss/train"))
    print("read: %d steps, %d scalars equal the metrics file's (float32); val_loss at %s; "
          "step %d read while the job ran" % (len(steps), checked, evals, seen_live))


def case_truncated():
    tb = os.path.join(TMP, "tb")
    run(1, ["train.steps=6", "train.tensorboard=" + tb])
    (path,) = event_files(tb)
    whole = records(path)
    size = os.path.getsize(path)
    last = whole[-1].ByteSize() + 16
    for cut in (1, 5, last - 12, last - 1):  # inside the data, the CRCs, the length
        p2 = os.path.join(TMP, "cut.tfevents")
        shutil.copy(path, p2)
        os.truncate(p2, size - cut)
        evs = records(p2)
        if [e.step for e in evs] != [e.step for e in whole[:-1]]:
            fail("cut %d bytes: read steps %s" % (cut, [e.step for e in evs]))
    data = bytearray(open(path, "rb").read())
    data[size - last // 2] ^= 0x40  # a bit inside the last record's data
    p3 = os.path.join(TMP, "flip.tfevents")
    open(p3, "wb").write(bytes(data))
    try:
        records(p3)
        fail("a flipped bit went unnoticed")
    except CrcError as e:
        print("truncated: the last record cut at 4 places skipped, %d before it read; a "
              "flipped bit: %s" % (len(whole) - 1, e))


def case_roll():
    tb, m = os.path.join(TMP, "tb"), os.path.join(TMP, "m.jsonl")
    run(1, ["train.steps=30", "train.tensorboard=" + tb, "train.tensorboard_roll_mb=0.004",
            "train.metrics=" + m])
    files = event_files(tb)
    steps, _, descs = read_dir(tb)
    if len(files) < 3:
        fail("%d event files at 4 kB each for 30 steps" % len(files))
    if sorted(steps) != list(range(1, 31)):
        fail("steps across the files: %s" % sorted(steps))
    firsts = [records(p)[1].step for p in files if len(records(p)) > 1]
    if firsts != sorted(firsts):
        fail("files out of name order: their first steps %s" % firsts)
    ref = metrics(m)
    bad = [s for s in steps if steps[s]["loss/train"] != f32(ref[s]["loss"])]
    if bad:
        fail("losses differ at steps %s" % bad)
    print("roll: %d files (first steps %s) hold steps 1-30 once each" % (len(files), firsts))


def case_resume():
    tb, ck = os.path.join(TMP, "tb"), os.path.join(TMP, "ck")
    run(1, ["train.steps=10", "train.checkpoint_every=6", "train.checkpoint_dir=" + ck,
            "train.keep_checkpoints=0", "train.tensorboard=" + tb])
    first = event_files(tb)
    shutil.rmtree(os.path.join(ck, "step-000010"))
    with open(os.path.join(ck, "latest"), "w") as f:
        f.write("step-000006\n")
    time.sleep(1.1)  # a later second, as a resumed job would have
    out = run(1, ["train.steps=10", "train.checkpoint_dir=" + ck, "train.tensorboard=" + tb])
    second = [p for p in event_files(tb) if p not in first]
    if len(second) != 1:
        fail("the resumed run's event files: %s" % second, out)
    evs = records(second[0])
    if evs[1].WhichOneof("what") != "session_log" or evs[1].step != 7 or \
            evs[1].session_log.status != 1:
        fail("the resumed file's second record: %s" % evs[1], out)
    if [e.step for e in evs[2:]] != [7, 8, 9, 10]:
        fail("the resumed run wrote steps %s" % [e.step for e in evs[2:]])
    print("resume: SessionLog START at step 7, then steps 7-10")


def case_unwritable():
    blocker = os.path.join(TMP, "a-file")
    open(blocker, "w").write("not a directory\n")
    for n, d in ((1, blocker), (2, blocker), (1, os.path.join(blocker, "tb"))):
        out = run(n, ["train.steps=3", "train.tensorboard=" + d], expect_rc=2)
        errs = [line for line in out.splitlines() if "train.tensorboard" in line]
        if len(errs) != 1 or ("writable directory" not in errs[0] and "Not a directory" not in errs[0]):
            fail("not one error naming train.tensorboard and the fix", out)
        if "step 1/" in out:
            fail("a step was trained", out)
        print("unwritable (%d rank%s, %s): exit 2: %s" % (n, "s" if n > 1 else "", d, errs[0].strip()))


try:
    {"read": case_read, "truncated": case_truncated, "roll": case_roll, "resume": case_resume,
     "unwritable": case_unwritable}[CASE]()
finally:
    shutil.rmtree(TMP, ignore_errors=True)
