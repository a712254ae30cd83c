#!/usr/bin/env python3
"""test_prometheus.py MPIRUN WORKER COORDINATOR MODE - /metrics of a live job.

A real 2-rank job (mesh.pp=2, so the pipeline's figures are real) serves /metrics.
  MODE promtool:   `promtool check metrics` accepts a scrape (exit 0, no warning),
                   and the figures in it agree with the job's own step lines.
  MODE prometheus: a real Prometheus server scrapes the job; its query API returns
                   the job's series with job_id beside Prometheus's own `job` label.
  MODE moe:        a mixture of experts on 2 expert-parallel ranks (olmoe-tiny, mesh.ep=2):
                   promtool accepts the scrape, and its router series (weft_router_*) are
                   values the job's metrics file holds under the same names.
Skipped (77) when promtool / prometheus is not installed (Debian: prometheus).
"""
import json, os, re, shutil, subprocess, sys, tempfile, time, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlib import free_ports  # noqa: E402

mpirun, worker, coordinator, mode = sys.argv[1:5]
tool = "prometheus" if mode == "prometheus" else "promtool"
if not shutil.which(tool):
    print("SKIP: %s is not installed (apt-get install prometheus; scripts/setup.sh does)" % tool)
    sys.exit(77)

BATCH_TOKENS = 8 * 64  # train.batch_size x gpt2-tiny's seq_len 64: tokens per step


tmp = tempfile.mkdtemp(prefix="weft-prom-")
jobdir, log = os.path.join(tmp, "jobs"), os.path.join(tmp, "log")
port, mport = free_ports(2)
env = dict(os.environ, WEFT_JOB_DIR=jobdir, MASTER_PORT=str(port), MASTER_ADDR="127.0.0.1")
metrics = os.path.join(tmp, "m.jsonl")
if mode == "moe":
    shape = ["model.preset=olmoe-tiny", "mesh.ep=2", "train.metrics=" + metrics]
else:
    shape = ["mesh.pp=2", "train.microbatches=4", "train.checkpoint_every=20",
             "train.checkpoint_dir=" + os.path.join(tmp, "ck")]
job = subprocess.Popen([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                        "-np", "2", worker] + shape +
                       ["train.batch_size=8", "train.steps=100000", "train.warmup=2",
                        "train.lr=1e-3", "runtime.metrics_port=%d" % mport],
                       env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
prom = None


def text():
    with open(log, errors="replace") as f:
        return f.read()


def finish(code, msg):
    for p in (prom, job):
        if p and p.poll() is None:
            p.kill()
            p.wait()
    if code:
        print(text()[-4000:])
    shutil.rmtree(tmp, ignore_errors=True)
    print(msg)
    sys.exit(code)


def check(cond, msg):
    if not cond:
        finish(1, "FAIL: " + msg)


def wait(pred, what, timeout):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        check(job.poll() is None, "the job exited (%s) while waiting for %s" % (job.returncode, what))
        time.sleep(0.2)
    finish(1, "FAIL: timed out waiting for " + what)


def scrape():
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % mport, timeout=5) as r:
        return r.read().decode()


def samples(body):
    """{(name, frozenset(labels)): value}"""
    out = {}
    for line in body.splitlines():
        m = re.match(r'^(\w+)\{(.*)\} (\S+)$', line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(s, name, **labels):
    for (n, ls), v in s.items():
        if n == name and set(labels.items()) <= {(k, v2) for k, v2 in ls}:
            return v
    return None


wait(lambda: re.search(r"^step 25/", text(), re.M), "step 25 (after the checkpoint at 20)", 120)
body = scrape()
s = samples(body)

def moe_checks(body, s):
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                       text=True, timeout=30)
    check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
          "promtool check metrics rejected the scrape: %s%s" % (r.stdout, r.stderr))
    names = ["router/aux_loss", "router/dropped_tokens", "router/tokens_per_expert_min",
             "router/tokens_per_expert_max", "router/imbalance"]

    def in_file():  # complete lines only: the job is still writing
        with open(metrics) as f:
            lines = [json.loads(l) for l in f if l.endswith("\n")]
        return all(any(l.get(n) == value(s, "weft_" + n.replace("/", "_")) for l in lines)
                   for n in names)

    # each the same double the metrics file wrote for some step (the scrape's step is one
    # the file has, or will within a step)
    wait(in_file, "the scrape's router series among the metrics file's values", 20)
    aux = value(s, "weft_router_aux_loss")
    # transformers' load-balancing loss E sum_e f_e P_e (f_e: the share of the top-2 choices
    # expert e took, summing to K = 2; P_e: its mean probability, summing to 1) is K = 2
    # when both are uniform, and lies in (0, E] = (0, 4] (sum_e f_e P_e <= max_e f_e <= 1);
    # below 2 where the choices and the probabilities lean apart (1.997 seen)
    check(0 < aux <= 4, "weft_router_aux_loss %s outside (0, 4]" % aux)
    check(value(s, "weft_router_dropped_tokens") == 0, "a dropless run dropped tokens")
    check("weft_router_z_loss" not in body, "a z-loss series without model.router_z_loss_coef")
    print("scrape: weft_router_aux_loss %.6f, tokens per expert %g..%g, imbalance %.4f: each a "
          "value of the metrics file" % (aux, value(s, "weft_router_tokens_per_expert_min"),
                                         value(s, "weft_router_tokens_per_expert_max"),
                                         value(s, "weft_router_imbalance")))


if mode == "moe":
    moe_checks(body, s)
elif mode == "promtool":
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                       text=True, timeout=30)
    print("promtool check metrics: exit %d %s%s" % (r.returncode, r.stdout.strip(),
                                                     r.stderr.strip()))
    check(r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(),
          "promtool check metrics rejected the scrape")
    families = re.findall(r"^# TYPE (\w+) (\w+)$", body, re.M)
    helps = re.findall(r"^# HELP (\w+) ", body, re.M)
    check(sorted(f for f, _ in families) == sorted(helps), "a family lacks HELP or TYPE")
    check(all(f.endswith("_total") == (t == "counter") for f, t in families),
          "counters and only counters end in _total: %s" % families)
    check("{job=" not in body and ',job="' not in body, "a `job` label collides with Prometheus's")
    steps = value(s, "weft_steps_total")
    tokens = value(s, "weft_tokens_total")
    check(steps and steps >= 25, "weft_steps_total %s < 25" % steps)
    # tokens are steps x the global batch, exactly (the same report carries both)
    check(tokens == steps * BATCH_TOKENS, "weft_tokens_total %s != %s x %d" % (tokens, steps,
                                                                              BATCH_TOKENS))
    check(value(s, "weft_ranks_alive") == 2, "weft_ranks_alive != 2")
    check(value(s, "weft_job_state", state="running") == 1, "job state is not running")
    check(value(s, "weft_checkpoints_total") >= 1, "no checkpoint counted after step 20")
    age = value(s, "weft_checkpoint_age_seconds")
    check(age is not None and 0 <= age < 60, "checkpoint age %s" % age)
    lr = value(s, "weft_learning_rate")
    check(lr is not None and 0 < lr <= 1e-3, "lr %s outside (0, train.lr=1e-3]" % lr)
    loss = value(s, "weft_loss")
    check(loss is not None and 0 < loss < 6.0, "loss %s (ln 256 = 5.55 at the start)" % loss)
    for rank in ("0", "1"):
        lab = dict(rank=rank, pp=rank, dp="0", tp="0")  # mesh.pp=2: rank r is stage r
        for name in ("weft_rank_step_seconds", "weft_rank_compute_seconds",
                     "weft_rank_p2p_wait_seconds", "weft_rank_bubble_ratio",
                     "weft_rank_activation_bytes", "weft_rank_optimizer_bytes",
                     "weft_rank_parameter_bytes", "weft_rank_gradient_bytes",
                     "weft_rank_resident_memory_bytes", "weft_rank_heartbeat_age_seconds",
                     "weft_rank_cpu_seconds_total"):
            check(value(s, name, **lab) is not None, "%s missing for rank %s" % (name, rank))
        step_s = value(s, "weft_rank_step_seconds", **lab)
        comp = value(s, "weft_rank_compute_seconds", **lab)
        wait_s = value(s, "weft_rank_p2p_wait_seconds", **lab)
        # compute and waiting happen inside the step: neither exceeds its wall time
        check(0 < comp <= step_s and 0 <= wait_s <= step_s,
              "rank %s: compute %s / wait %s outside (0, step %s]" % (rank, comp, wait_s, step_s))
        check(value(s, "weft_rank_resident_memory_bytes", **lab) > 10e6,
              "rank %s RSS under 10 MB" % rank)
    print("scrape: %d families, steps %d, tokens %d, rank 1 compute %.4f s of a %.4f s step" %
          (len(families), steps, tokens, comp, step_s))
else:
    pport = free_ports(1)[0]
    cfg = os.path.join(tmp, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: weft\n"
                "    static_configs:\n      - targets: ['127.0.0.1:%d']\n" % mport)
    prom = subprocess.Popen(["prometheus", "--config.file=" + cfg,
                             "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % pport],
                            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prom.log"), "w"))

    def query(q):
        try:
            url = "http://127.0.0.1:%d/api/v1/query?query=%s" % (pport, urllib.parse.quote(q))
            with urllib.request.urlopen(url, timeout=5) as r:
                res = json.load(r)["data"]["result"]
            return res or None
        except OSError:
            return None

    import urllib.parse
    up = wait(lambda: query('up{job="weft"} == 1'), "Prometheus to scrape the job", 60)
    res = wait(lambda: query("weft_steps_total"), "weft_steps_total in Prometheus", 30)
    m = res[0]["metric"]
    print("prometheus: %s" % json.dumps(m, sort_keys=True))
    check(m.get("job") == "weft" and m.get("job_id") and "exported_job" not in m,
          "labels job/job_id wrong: %s" % m)
    rate = wait(lambda: query('rate(weft_tokens_total[5s]) > 0'), "a token rate", 30)
    per_rank = wait(lambda: query('weft_rank_compute_seconds'), "per-rank series", 30)
    check(sorted(r["metric"]["rank"] for r in per_rank) == ["0", "1"], "not one series per rank")
    print("prometheus: up, rate(weft_tokens_total[5s]) = %s tokens/s, %d per-rank series" %
          (rate[0]["value"][1], len(per_rank)))

r = subprocess.run([coordinator, "--dir", jobdir, "stop"], env=env, capture_output=True,
                   text=True, timeout=30)
check(r.returncode == 0, "coordinator stop: %s%s" % (r.stdout, r.stderr))
try:
    rc = job.wait(timeout=60)
except subprocess.TimeoutExpired:
    finish(1, "FAIL: the job did not stop")
check(rc == 0, "the job exited %d" % rc)
finish(0, "PASS")
