// view.js - the live view of a weft job: polls /api/state once a second and draws the
// mesh (one cell per rank along its axes, as the watchdog sees it), the loss and
// throughput curves (uPlot) and the pipeline schedule. The coordinator serves this file
// and uPlot itself; nothing else is loaded, so the page works offline.
"use strict";

const POLL_MS = 1000;
const $ = (id) => document.getElementById(id);
// The page's state, also read by tests: every point the curves hold, the last answer.
const view = { since: -1, steps: [], loss: [], val: [], speed: [], state: null, charts: {},
               schedule: null, gone: false, polls: 0 };
window.weftView = view;

function fmt(v, digits) {
  return v === null || v === undefined || !isFinite(v) ? "-" : Number(v).toFixed(digits);
}
function mib(b) { return b === null || b === undefined ? "-" : (b / 1048576).toFixed(1) + " MiB"; }
function dur(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- header --------------------------------------------------------------------------

function drawHeader(s) {
  const st = s.status;
  let state = s.shutting_down ? "stopping" : st.state;
  if (s.stop_requested && state === "running") state = "stopping";
  $("job").textContent = st.job + " \u00b7 " + st.model;
  $("state").textContent = state;
  $("state").className = "badge " + state;
  const f = $("figures");
  f.replaceChildren();
  const add = (k, v) => { const x = el("span", "", k + " "); x.appendChild(el("b", "", v)); f.appendChild(x); };
  add("step", st.step + (st.total_steps > 0 ? " / " + st.total_steps : ""));
  add("loss", fmt(st.loss, 4));
  add("val_loss", fmt(s.job.val_loss, 4));
  add("tokens/s", fmt(st.tokens_per_s, 0));
  add("step", fmt(st.step_ms, 1) + " ms");
  add("MFU", s.job.mfu === null ? "-" : (100 * s.job.mfu).toFixed(1) + "%");
  add("ETA", dur(st.eta_s));
  add("up", dur(st.uptime_s));
  $("stop").disabled = state !== "running";
  $("checkpoint").disabled = state !== "running" || !s.can_checkpoint;
  $("checkpoint").title = s.can_checkpoint ? "write a checkpoint at the next step boundary"
      : "this job has no train.checkpoint_dir";
  if (st.abort_reason) notice("aborted: " + st.abort_reason);
}

function notice(text) {
  $("notice").hidden = !text;
  $("notice").textContent = text || "";
}

// ---- the mesh ------------------------------------------------------------------------

function cell(r, cp) {
  const c = el("div", "cell " + r.view_state + (r.straggler ? " straggler" : ""));
  c.dataset.rank = r.rank;
  c.dataset.state = r.view_state;
  c.dataset.straggler = r.straggler ? "1" : "0";
  const head = el("div", "head");
  head.appendChild(el("span", "", "rank " + r.rank));
  head.appendChild(el("span", "st", r.view_state));
  c.appendChild(head);
  c.appendChild(el("div", "coords", "pp " + r.coords.pp + " \u00b7 dp " + r.coords.dp +
                   (cp > 1 ? " \u00b7 cp " + r.coords.cp : "") + " \u00b7 tp " + r.coords.tp));
  if (r.straggler)
    c.appendChild(el("div", "tag", "straggler: compute " + fmt(r.compute_ms, 1) + " ms vs stage median " +
                     fmt(r.stage_median_compute_ms, 1)));
  const dl = el("dl");
  const row = (k, v) => { dl.appendChild(el("dt", "", k)); dl.appendChild(el("dd", "", v)); };
  row("step", r.step < 0 ? "-" : String(r.step));
  row("heartbeat", r.heartbeat_age_s === null ? "-" : r.heartbeat_age_s.toFixed(1) + " s ago");
  row("step time", fmt(r.step_ms, 1) + " ms");
  row("compute", fmt(r.compute_ms, 1) + " ms");
  row("memory", mib(r.mem_bytes) + (r.gpu_mem_used_bytes ? " (GPU " + mib(r.gpu_mem_used_bytes) + ")" : ""));
  row("host", r.host + " \u00b7 pid " + r.pid);
  row("phase", r.phase || "-");
  c.appendChild(dl);
  c.title = r.device + "; " + r.stage + (r.error ? "; error: " + r.error : "");
  return c;
}

// One grid per pipeline stage: dp down, and across its tp ranks (within each cp rank when
// the mesh has context parallelism), placed by each rank's own coordinates.
function drawMesh(s) {
  const m = s.mesh, cp = m.cp || 1, cols = cp * m.tp;
  $("meshdesc").textContent = "dp " + m.dp + (cp > 1 ? " \u00d7 cp " + cp : "") + " \u00d7 tp " + m.tp +
      " \u00d7 pp " + m.pp + " = " + m.world_size + " ranks";
  const out = $("mesh");
  out.replaceChildren();
  for (let pp = 0; pp < m.pp; pp++) {
    const box = el("div", "stage");
    box.appendChild(el("h3", "", "pipeline stage " + pp));
    const grid = el("div", "grid");
    grid.style.gridTemplateColumns = "auto repeat(" + cols + ", auto)";
    grid.appendChild(el("span", "axis", ""));
    for (let c = 0; c < cols; c++)
      grid.appendChild(el("span", "axis", (cp > 1 ? "cp " + Math.floor(c / m.tp) + " \u00b7 " : "") + "tp " + (c % m.tp)));
    for (let dp = 0; dp < m.dp; dp++) {
      grid.appendChild(el("span", "axis", "dp " + dp));
      for (let c = 0; c < cols; c++) {
        const r = s.ranks.find((x) => x.coords.pp === pp && x.coords.dp === dp &&
                                      (x.coords.cp || 0) === Math.floor(c / m.tp) && x.coords.tp === c % m.tp);
        grid.appendChild(r ? cell(r, cp) : el("div"));
      }
    }
    box.appendChild(grid);
    out.appendChild(box);
  }
  const w = s.watchdog;
  $("legend").textContent = "late: no heartbeat for " + w.late_after_s.toFixed(1) + " s (a beat and a half); " +
      "dead after " + w.dead_after_s.toFixed(1) + " s (runtime.heartbeat_timeout), when the watchdog " +
      "ends the job; straggler: compute above " + w.straggler_ratio + "\u00d7 its pipeline stage's median.";
}

// ---- curves --------------------------------------------------------------------------

function chart(target, series, yLabel) {
  const opts = {
    width: Math.max(360, target.clientWidth || 480), height: 240,
    scales: { x: { time: false } },
    axes: [{ label: "step" }, { label: yLabel }],
    series: [{ label: "step" }].concat(series),
    legend: { live: true },
  };
  return new uPlot(opts, [[]].concat(series.map(() => [])), target);
}

function makeCharts() {
  view.charts.loss = chart($("losschart"), [
    { label: "loss", stroke: "#4c6ef5", width: 1.5 },
    { label: "val_loss", stroke: "#e8590c", width: 1.5, spanGaps: true, points: { show: true, size: 6 } },
  ], "nats / token");
  view.charts.speed = chart($("speedchart"), [{ label: "tokens/s", stroke: "#12b886", width: 1.5 }],
                            "tokens / s");
}

function addPoints(h) {
  for (const [step, , loss, val, speed] of h.points) {
    view.steps.push(step);
    view.loss.push(loss);
    view.val.push(val);
    view.speed.push(speed);
    view.since = step;
  }
  if (!h.points.length) return;
  view.charts.loss.setData([view.steps, view.loss, view.val]);
  view.charts.speed.setData([view.steps, view.speed]);
  $("losscount").textContent = view.steps.length + " steps" +
      (h.every > 1 ? " (every " + h.every + "th kept)" : "");
}

// ---- the schedule --------------------------------------------------------------------

// The grid --print-schedule draws: "rank 0 | F0 F1 .. B0 ...", one column per tick.
function drawSchedule(text) {
  $("scheduletext").textContent = text;
  const rows = text.split("\n").filter((l) => /^rank \d+ \|/.test(l));
  const box = $("schedule");
  if (!rows.length) { box.textContent = text.split("\n")[0]; return; }
  const table = el("table");
  for (const line of rows) {
    const [name, cells] = line.split("|");
    const tr = el("tr");
    tr.appendChild(el("th", "", name.trim()));
    for (const a of cells.trim().split(/\s+/)) {
      const kind = a[0] === "F" ? "F" : a[0] === "B" ? "B" : "idle";
      tr.appendChild(el("td", kind, kind === "idle" ? "" : a));
    }
    table.appendChild(tr);
  }
  box.replaceChildren(table);
  box.classList.remove("dim");
}

async function loadSchedule() {
  const r = await fetch("/api/schedule", { cache: "no-store" });
  const j = await r.json();
  if (j.schedule) { view.schedule = j.schedule; drawSchedule(j.schedule); }
}

// ---- polling and commands ------------------------------------------------------------

async function poll() {
  try {
    const r = await fetch("/api/state?since=" + view.since, { cache: "no-store" });
    if (r.status === 401) { notice("access denied: open the address `coordinator view` prints"); return; }
    const s = await r.json();
    view.state = s;
    view.polls++;
    drawHeader(s);
    drawMesh(s);
    addPoints(s.history);
    if (!view.schedule) await loadSchedule();
    if (!s.status.abort_reason) notice(s.stop_requested ? "stop requested: the job stops at the next step boundary" : "");
  } catch (e) {
    view.gone = true;
    $("state").textContent = "ended";
    $("state").className = "badge ended";
    $("stop").disabled = $("checkpoint").disabled = true;
    notice("the job's coordinator does not answer: the job has ended (or rank 0 is frozen)");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

async function command(what) {
  const r = await fetch("/api/" + what, { method: "POST", cache: "no-store" });
  const j = await r.json();
  notice(j.message);
}

window.addEventListener("DOMContentLoaded", () => {
  makeCharts();
  $("stop").addEventListener("click", () => {
    if (confirm("Stop the job at the next step boundary (with a checkpoint when it has train.checkpoint_dir)?"))
      command("stop");
  });
  $("checkpoint").addEventListener("click", () => command("checkpoint"));
  poll();
});
