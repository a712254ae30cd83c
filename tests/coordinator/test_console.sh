#!/usr/bin/env bash
# test_console.sh FAKE_JOB COORDINATOR - the console binary against a running (fake)
# 8-rank job on a dp 2 x tp 2 x pp 2 mesh: status, ranks, mesh in text and JSON
# checked against the mesh formula rank = tp + TP*(dp + DP*pp), job discovery, top,
# attach, and stop.
set -euo pipefail
fake=$1
con=$2
export WEFT_JOB_DIR=$(mktemp -d /tmp/weft-console-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WEFT_JOB_DIR"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
PY=/usr/bin/python3

start_job() { # start_job OUTFILE: runs a fake job for 30 s, waits for its id
  "$fake" 8 2 2 2 30 >"$1" 2>>"$WEFT_JOB_DIR/log" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done
  fail "fake job did not start"
}

start_job "$WEFT_JOB_DIR/a.out"
job=$(cat "$WEFT_JOB_DIR/a.out")
sleep 1.5 # a heartbeat and a few steps

out=$("$con" status)
echo "$out"
grep -q "job      $job (running)" <<<"$out" || fail "status: job line"
grep -q "dp 2 x tp 2 x pp 2 = 8 ranks (8 registered, 8 alive)" <<<"$out" || fail "status: mesh"
"$con" --json status | $PY -c '
import json, sys
d = json.load(sys.stdin)
assert d["world_size"] == 8 and d["mesh"] == {"dp": 2, "tp": 2, "pp": 2, "cp": 1, "ep": 1}, d
assert d["step"] >= 1 and d["loss"] is not None and d["eta_s"] > 0, d
'

out=$("$con" ranks "$job")
echo "$out"
[ "$(grep -c ' alive ' <<<"$out")" = 8 ] || fail "ranks: 8 alive rows"
"$con" --json ranks | $PY -c '
import json, sys
d = json.load(sys.stdin)
assert len(d["ranks"]) == 8
for r in d["ranks"]:
    c = r["coords"]
    assert r["rank"] == c["tp"] + 2 * (c["dp"] + 2 * c["pp"]), r
    assert r["state"] == "alive" and r["heartbeat_age_s"] < 1.5, r
    assert r["collective"]["op"] == "allreduce(dp)", r
'

out=$("$con" mesh)
echo "$out"
grep -q "pipeline stage pp=1" <<<"$out" || fail "mesh: stage 1"
"$con" --json mesh | $PY -c '
import json, sys
d = json.load(sys.stdin)
g = d["groups"]
assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]], g
assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]], g
assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]], g
assert g["emb"] == [[0, 4], [1, 5], [2, 6], [3, 7]], g
assert d["stages"][1]["grid"] == [[4, 5], [6, 7]], d
'

out=$("$con" schedule); grep -q "not available" <<<"$out" || fail "schedule"
"$con" --json schedule | $PY -c 'import json,sys; assert json.load(sys.stdin)["available"] is False'
out=$("$con" trace); grep -q "^  dp#[0-9]* allreduce" <<<"$out" || fail "trace"
# trace RANK GROUP: one rank's operations in one communicator (world ranks)
out=$("$con" trace 5 dp)
echo "$out"
[ "$(grep -c '^rank ' <<<"$out")" = 1 ] && grep -q "^rank 5:" <<<"$out" || fail "trace 5: one rank"
grep -q "^  dp#" <<<"$out" && ! grep -q "^  tp#" <<<"$out" || fail "trace dp: only dp lines"

# The README's form: options after the command; `ranks RANK` shows that rank only.
"$con" ranks --json | $PY -c 'import json,sys; assert len(json.load(sys.stdin)["ranks"]) == 8'
out=$("$con" ranks 3)
echo "$out"
[ "$(grep -c ' alive ' <<<"$out")" = 1 ] && grep -qE "^ +3 " <<<"$out" || fail "ranks 3"
grep -q "step ms" <<<"$out" && grep -q "tok/s" <<<"$out" && grep -q "cpu%" <<<"$out" \
  || fail "ranks: step ms, tok/s, rss, cpu% columns"
"$con" --json ranks 3 | $PY -c '
import json, sys
d = json.load(sys.stdin)
assert [r["rank"] for r in d["ranks"]] == [3], d
r = d["ranks"][0]
assert r["rss_bytes"] > 1 << 20, r                  # a live process holds more than 1 MiB
assert r["tokens_per_s_per_rank"] == 12345.0 / 8, r # fake_job reports 12345 tokens/s
assert r["cpu_percent"] is not None and r["cpu_percent"] >= 0, r
'
if "$con" ranks 9 2>"$WEFT_JOB_DIR/err"; then fail "ranks 9 of 8 accepted"; fi
grep -q "no rank 9" "$WEFT_JOB_DIR/err" || fail "ranks 9: message"

# checkpoint without train.checkpoint_dir is refused, naming the key
if out=$("$con" checkpoint 2>&1); then fail "checkpoint without a directory accepted"; fi
grep -q "train.checkpoint_dir" <<<"$out" || fail "checkpoint: the key is not named: $out"
out=$("$con" --count 2 top); grep -q "last collective" <<<"$out" || fail "top"
# top into a reader that exits (`| head`): said once, exit 1; not a death by SIGPIPE
# without a word (141), nor refreshes forever into the closed pipe
{ timeout 20 "$con" top 2>"$WEFT_JOB_DIR/err" && echo 0 >"$WEFT_JOB_DIR/rc" ||
  echo $? >"$WEFT_JOB_DIR/rc"; } | head -n 1 >/dev/null
[ "$(cat "$WEFT_JOB_DIR/rc")" = 1 ] || fail "top | head: exit $(cat "$WEFT_JOB_DIR/rc"), want 1"
[ "$(grep -c 'closed pipe' "$WEFT_JOB_DIR/err")" = 1 ] ||
  fail "top | head: the closed pipe not said once: $(cat "$WEFT_JOB_DIR/err")"
out=$("$con" list); grep -q "$job" <<<"$out" || fail "list"
out=$(printf 'status\nmesh\nhelp trace\nranks 2\nquit\n' | "$con" attach "$job")
grep -q "pipeline stage pp=0" <<<"$out" || fail "attach"
grep -q "^trace \[RANK\] \[GROUP\]" <<<"$out" || fail "attach: help trace"
[ "$(grep -c ' alive ' <<<"$out")" = 1 ] || fail "attach: ranks 2"
# Tab completes commands (not file names) at a terminal
$PY - "$con" "$job" <<'PYEOF' || fail "attach: tab completion"
import os, pty, sys, time, select
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], "attach", sys.argv[2]])
def read_for(t):
    out, end = b"", time.time() + t
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    return out.decode(errors="replace")
read_for(1.0)
os.write(fd, b"sched\t\n")
out = read_for(2.0)
os.write(fd, b"quit\n")
read_for(0.5)
os.waitpid(pid, 0)
assert "schedule" in out and "not available" in out, out
PYEOF

# A job directory that is a symbolic link is refused with a message saying so.
ln -s /tmp "$WEFT_JOB_DIR/link"
if WEFT_JOB_DIR="$WEFT_JOB_DIR/link" "$fake" 1 1 1 1 1 >/dev/null 2>"$WEFT_JOB_DIR/err"; then
  fail "a symlinked job directory was used"
fi
grep -q "is a symbolic link" "$WEFT_JOB_DIR/err" || fail "symlink: $(cat "$WEFT_JOB_DIR/err")"
! grep -q MASTER_PORT "$WEFT_JOB_DIR/err" || fail "symlink: the message names MASTER_PORT"

# Two jobs and no JOB: the console lists them and asks.
start_job "$WEFT_JOB_DIR/b.out"
job2=$(cat "$WEFT_JOB_DIR/b.out")
if "$con" status 2>"$WEFT_JOB_DIR/err"; then fail "ambiguous job accepted"; fi
grep -q "$job2" "$WEFT_JOB_DIR/err" || fail "ambiguous: not listed"
"$con" status "$job2" >/dev/null || fail "status JOB"

# stop: both fake jobs end cleanly and remove their job files.
out=$("$con" stop "$job"); grep -q "stop requested" <<<"$out" || fail "stop"
"$con" stop "$job2" >/dev/null
for p in "${pids[@]}"; do wait "$p" || fail "fake job exit status $?"; done
pids=()
[ -z "$(ls "$WEFT_JOB_DIR"/*.json 2>/dev/null)" ] || fail "job files left behind"
echo "console: all checks passed"
