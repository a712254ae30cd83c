// view_browser.mjs MODE MPIRUN WORKER COORDINATOR ARTIFACTS - the coordinator's live
// view in a real browser (Debian's chromium, driven by playwright-core over the DevTools
// protocol) during a real job.
//
//   browser  4 ranks (pp 2 x tp 2): the page is refused without the token; with it, the
//            grid shows every rank with its coordinates (rank = tp + TP * (dp + DP * pp));
//            a SIGSTOPped rank is marked late within the hang window
//            (runtime.heartbeat_timeout, after which the watchdog would end the job) and
//            alive again after SIGCONT; the loss curve holds one point per step, each
//            equal to the metrics file's loss (the same double: both print 17 digits), and
//            the val_loss points are the evaluated steps'; the schedule is drawn and the
//            trace downloads; the stop button stops the job at a step boundary with that
//            step's checkpoint, and mpirun exits 0.
//   hostile  2 ranks (cp 2, the grid placing them by their context-parallel rank): oversized heads, a slowloris trickle and path traversals (with and
//            without the token) while the page polls; the job trains on, answers the
//            page, and stops on its button.
// Screenshots go to ARTIFACTS (refused.png, running.png, late.png, stopped.png).
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const pw = path.join(here, "node_modules", "playwright-core", "index.mjs");
if (!fs.existsSync(pw)) {
  console.log("FAIL: no playwright-core in tests/view/node_modules: run scripts/test.sh, or " +
              "npm install --prefix tests/view");
  process.exit(1);
}
const { chromium } = await import(pw);
const [MODE, MPIRUN, WORKER, COORD, ARTIFACTS] = process.argv.slice(2);
const HB_TIMEOUT_S = 15; // runtime.heartbeat_timeout: the watchdog's dead-rank window here
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "weft-view-"));
fs.mkdirSync(ARTIFACTS, { recursive: true });
let job = null, browser = null;

function fail(msg) {
  console.log("FAIL: " + msg);
  const log = path.join(tmp, "log");
  if (fs.existsSync(log)) console.log(fs.readFileSync(log, "utf8").slice(-4000));
  cleanup();
  process.exit(1);
}
function cleanup() {
  if (job && job.exitCode === null) try { process.kill(-job.pid, "SIGKILL"); } catch (e) { /* gone */ }
  if (browser) browser.close().catch(() => {});
  fs.rmSync(tmp, { recursive: true, force: true });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(pred, what, ms, jobMustRun = true) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (jobMustRun && job.exitCode !== null) fail("the job exited (" + job.exitCode + ") while waiting for " + what);
    if (Date.now() > end) fail("timed out (" + ms / 1000 + " s) waiting for " + what);
    await sleep(100);
  }
}
// n distinct free ports: every server stays listening until all are picked, so the
// kernel cannot hand out one port twice (the control and the HTTP port must differ).
async function freePorts(n) {
  const servers = await Promise.all(Array.from({ length: n }, () => new Promise((res) => {
    const s = net.createServer();
    s.listen(0, "127.0.0.1", () => res(s));
  })));
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((res) => s.close(res))));
  return ports;
}

const env = { ...process.env, WEFT_JOB_DIR: path.join(tmp, "jobs"), MASTER_ADDR: "127.0.0.1",
              OMP_WAIT_POLICY: "passive" };
async function startJob(np, keys) {
  const [port, mport] = await freePorts(2);
  env.MASTER_PORT = String(port);
  const args = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", String(np), WORKER,
    "model.preset=gpt2-tiny", "train.steps=100000", "train.warmup=2", "train.eval_batches=1",
    "train.checkpoint_dir=" + path.join(tmp, "ck"), "train.metrics=" + path.join(tmp, "m.jsonl"),
    "runtime.metrics_port=" + mport, "runtime.heartbeat_timeout=" + HB_TIMEOUT_S].concat(keys);
  const out = fs.openSync(path.join(tmp, "log"), "w");
  job = spawn(MPIRUN, args, { env, stdio: ["ignore", out, out], detached: true });
  const url = await until(() => {
    try {
      return execFileSync(COORD, ["view"], { env, stdio: ["ignore", "pipe", "ignore"] }).toString().trim();
    } catch (e) { return null; }
  }, "the job file", 60000);
  return { url, base: "http://127.0.0.1:" + mport };
}
function metrics() {
  const f = path.join(tmp, "m.jsonl");
  if (!fs.existsSync(f)) return new Map();
  return new Map(fs.readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => {
    const o = JSON.parse(l);
    return [o.step, o];
  }));
}
async function launch() {
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
  return browser.newContext({ viewport: { width: 1400, height: 1100 }, acceptDownloads: true });
}
const shot = (page, name) => page.screenshot({ path: path.join(ARTIFACTS, name), fullPage: true });

async function stopByButton(page) {
  page.once("dialog", (d) => d.accept());
  const before = metrics().size;
  await page.click("#stop");
  await until(() => page.evaluate(() => document.getElementById("notice").textContent.includes("stop requested")),
              "the page to say the stop was requested", 10000);
  const rc = await new Promise((res) => job.exitCode !== null ? res(job.exitCode) : job.on("exit", res));
  const log = fs.readFileSync(path.join(tmp, "log"), "utf8");
  const m = log.match(/stopping after step (\d+): the console asked/);
  if (rc !== 0 || !m) fail("the stop button: mpirun exited " + rc + (m ? "" : ", no 'stopping after step N' line"));
  const step = Number(m[1]), dir = "step-" + String(step).padStart(6, "0");
  const latest = fs.readFileSync(path.join(tmp, "ck", "latest"), "utf8").trim();
  if (latest !== dir || !fs.existsSync(path.join(tmp, "ck", dir)))
    fail("the checkpoint after the stop: latest=" + latest + ", expected " + dir);
  if (metrics().size !== step || step < before) fail("the metrics file ends at step " + metrics().size + ", the stop at " + step);
  await until(() => page.evaluate(() => window.weftView.gone), "the page to see the job gone", 10000, false);
  return step;
}

// ---- browser ----------------------------------------------------------------------------

async function caseBrowser() {
  const { url, base } = await startJob(4, ["mesh.pp=2", "mesh.tp=2", "train.microbatches=4", "train.eval_every=10"]);
  const ctx = await launch();
  const page = await ctx.newPage();
  // refused without the token, whatever is asked for
  for (const p of ["/", "/api/state", "/view.js", "/?token=" + "0".repeat(64)]) {
    const r = await page.goto(base + p);
    if (r.status() !== 401) fail("GET " + p + " without the token: " + r.status());
  }
  if (!(await page.textContent("h1")).includes("Access denied")) fail("the refusal page says no reason");
  await shot(page, "refused.png");
  // with it: the address's token becomes a cookie and the page loads
  const r = await page.goto(url);
  if (r.status() !== 200 || new URL(page.url()).search !== "") fail("the token's address: " + r.status() + " " + page.url());
  await until(() => page.evaluate(() => document.querySelectorAll(".cell").length === 4), "4 rank cells", 30000);
  const cells = await page.$$eval(".cell", (cs) => cs.map((c) => ({ rank: Number(c.dataset.rank), text: c.innerText })));
  for (let rank = 0; rank < 4; rank++) {
    const c = cells.find((x) => x.rank === rank);
    const tp = rank % 2, dp = 0, pp = Math.floor(rank / 2); // rank = tp + 2 * (dp + 1 * pp)
    if (!c || !c.text.includes("rank " + rank) || !c.text.includes("pp " + pp + " \u00b7 dp " + dp + " \u00b7 tp " + tp))
      fail("rank " + rank + "'s cell: " + (c ? c.text : "missing"));
  }
  // the curves: one point per step, the metrics file's losses
  await until(() => page.evaluate(() => window.weftView.steps.length >= 21), "21 steps on the loss curve", 180000);
  const v = await page.evaluate(() => ({ steps: window.weftView.steps, loss: window.weftView.loss,
    val: window.weftView.val, chart: window.weftView.charts.loss.data.map((s) => s.length) }));
  const ref = metrics();
  const want = Array.from({ length: v.steps.length }, (_, i) => i + 1);
  if (JSON.stringify(v.steps) !== JSON.stringify(want)) fail("the curve's steps: " + v.steps);
  if (v.chart.some((n) => n !== v.steps.length)) fail("uPlot holds " + v.chart + " points, the page " + v.steps.length);
  v.steps.forEach((s, i) => {
    const o = ref.get(s);
    if (!o || o.loss !== v.loss[i]) fail("step " + s + ": the curve's loss " + v.loss[i] + ", the metrics file's " + (o && o.loss));
    const val = o.val_loss === undefined ? null : o.val_loss;
    if (val !== v.val[i]) fail("step " + s + ": the curve's val_loss " + v.val[i] + ", the metrics file's " + val);
  });
  const evals = v.steps.filter((_, i) => v.val[i] !== null);
  if (JSON.stringify(evals) !== JSON.stringify(evals.filter((s) => s % 10 === 0)) || evals.length < 2)
    fail("val_loss points at " + evals);
  // the schedule: the 1F1B grid of 2 stages and 4 micro-batches; the trace downloads
  const sched = await page.$$eval("#schedule tr", (rows) => rows.map((r) => r.innerText.replace(/\s+/g, " ").trim()));
  if (sched.length !== 2 || !sched[0].startsWith("rank 0 F0 F1") || !sched[1].includes("B3"))
    fail("the schedule drawn: " + JSON.stringify(sched));
  const [dl] = await Promise.all([page.waitForEvent("download"), page.click("#trace")]);
  const trace = JSON.parse(fs.readFileSync(await dl.path(), "utf8"));
  if (trace.ranks.length !== 4 || trace.ranks.some((x) => !x.answered || !x.lines.length))
    fail("the trace download: " + JSON.stringify(trace).slice(0, 400));
  await shot(page, "running.png");
  // a frozen rank: late within the hang window, alive again after SIGCONT
  const pid = await page.evaluate(() => window.weftView.state.ranks[3].pid);
  const t0 = Date.now();
  process.kill(pid, "SIGSTOP");
  await until(() => page.$eval('.cell[data-rank="3"]', (c) => c.dataset.state === "late"),
              "rank 3 marked late", HB_TIMEOUT_S * 1000);
  const lateAfter = (Date.now() - t0) / 1000;
  const others = await page.$$eval(".cell", (cs) => cs.filter((c) => c.dataset.rank !== "3").map((c) => c.dataset.state));
  await shot(page, "late.png");
  process.kill(pid, "SIGCONT");
  if (lateAfter >= HB_TIMEOUT_S || others.some((s) => s !== "alive"))
    fail("late after " + lateAfter + " s (window " + HB_TIMEOUT_S + " s), the others " + others);
  const stepNow = await page.evaluate(() => window.weftView.state.status.step);
  await until(() => page.evaluate((s) => window.weftView.state.status.step > s + 1 &&
                                   window.weftView.state.ranks[3].view_state === "alive", stepNow),
              "training to go on after SIGCONT", 60000);
  const stopped = await stopByButton(page);
  await shot(page, "stopped.png");
  console.log("browser: refused without the token (4 paths, 401); 4 cells with their coordinates; " +
              v.steps.length + " curve points equal to the metrics file's losses, val_loss at " + evals +
              "; schedule " + JSON.stringify(sched[0]) + "; trace of 4 ranks downloaded; rank 3 (pid " + pid +
              ") late " + lateAfter.toFixed(1) + " s after SIGSTOP (window " + HB_TIMEOUT_S +
              " s); stop button: stopped after step " + stopped + " with its checkpoint, exit 0");
}

// ---- hostile ----------------------------------------------------------------------------

// A raw request; resolves to the status line, or "" when the server closed without one.
function raw(base, chunks, gapMs) {
  const { hostname, port } = new URL(base);
  return new Promise((res) => {
    const s = net.connect(Number(port), hostname);
    let data = "", t0 = Date.now();
    s.on("data", (d) => { data += d; });
    s.on("close", () => res({ line: data.split("\r\n")[0], ms: Date.now() - t0, data }));
    s.on("error", () => {});
    let i = 0;
    const next = () => { if (i < chunks.length && !s.destroyed) { s.write(chunks[i++]); setTimeout(next, gapMs); } };
    next();
  });
}

async function caseHostile() {
  const { url, base } = await startJob(2, ["mesh.cp=2", "train.eval_every=0"]);
  const token = url.split("token=")[1];
  const ctx = await launch();
  const page = await ctx.newPage();
  await page.goto(url);
  await until(() => page.evaluate(() => window.weftView.steps.length >= 3), "3 steps", 120000);
  // context parallelism: both ranks in stage 0's one row, rank = cp (tp 1, dp 1, pp 1)
  const cpCells = await page.$$eval(".cell", (cs) => cs.map((c) => c.innerText));
  for (let r = 0; r < 2; r++)
    if (!cpCells[r] || !cpCells[r].includes("rank " + r) || !cpCells[r].includes("pp 0 \u00b7 dp 0 \u00b7 cp " + r + " \u00b7 tp 0"))
      fail("cp 2: cell " + r + ": " + cpCells[r]);
  const stepBefore = await page.evaluate(() => window.weftView.state.status.step);
  const bearer = "Authorization: Bearer " + token + "\r\n";
  const big = "GET /api/state HTTP/1.1\r\n" + bearer + "X-Big: " + "a".repeat(16384) + "\r\n\r\n";
  const results = {
    oversized: await raw(base, [big], 0),
    many: await raw(base, ["GET / HTTP/1.1\r\n" + Array.from({ length: 1500 }, (_, i) => "X-" + i + ": v\r\n").join("") + "\r\n"], 0),
    traversal: await raw(base, ["GET /../../../../etc/passwd HTTP/1.1\r\n" + bearer + "\r\n"], 0),
    encoded: await raw(base, ["GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n" + bearer + "\r\n"], 0),
    noToken: await raw(base, ["GET /../../etc/passwd HTTP/1.1\r\n\r\n"], 0),
    nul: await raw(base, ["GET /api/st\0ate HTTP/1.1\r\n\r\n"], 0),
  };
  // slowloris: 8 connections trickling a byte every 500 ms; each is closed at 5 s
  const slow = await Promise.all(Array.from({ length: 8 }, () =>
    raw(base, Array.from({ length: 30 }, (_, i) => "GET / HTTP/1.1\r\nX: ".concat("a".repeat(200))[i] || "a"), 500)));
  const expect = { oversized: "431", many: "431", traversal: "404", encoded: "404", noToken: "401", nul: "400" };
  for (const [k, code] of Object.entries(expect))
    if (!results[k].line.includes(code) || results[k].data.includes("root:"))
      fail(k + ": " + JSON.stringify(results[k].line) + ", expected " + code);
  if (slow.some((s) => s.ms > 7000 || s.line)) fail("slowloris connections held " + slow.map((s) => s.ms) + " ms");
  const stepAfter = await until(async () => {
    const s = await page.evaluate(() => window.weftView.state.status.step);
    return s > stepBefore + 2 ? s : 0;
  }, "training to go on", 60000);
  const stopped = await stopByButton(page);
  console.log("hostile: " + Object.entries(results).map(([k, r]) => k + " " + r.line.split(" ")[1]).join(", ") +
              "; 8 slowloris connections closed after " + Math.min(...slow.map((s) => s.ms)) + "-" +
              Math.max(...slow.map((s) => s.ms)) + " ms; the job went from step " + stepBefore + " to " + stepAfter +
              " meanwhile and stopped on the button after step " + stopped + " (exit 0)");
}

try {
  await (MODE === "browser" ? caseBrowser() : caseHostile());
} catch (e) {
  fail(e.stack || String(e));
}
cleanup();
