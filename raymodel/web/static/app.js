// The raymodel dashboard: one page, five views, drawn from /api/*; charts are SVG drawn here.
"use strict";

const params = new URLSearchParams(location.search);
if (params.get("token")) sessionStorage.setItem("raymodel-token", params.get("token"));
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#6e7781"];
const DONE = ["SUCCEEDED", "FAILED", "STOPPED", "REJECTED", "ROLLED_BACK"];
const view = document.getElementById("view");
let busy = false;

const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = (v, d = 4) => (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(d)) : (v ?? "–"));
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
const secs = (s) => (s == null ? "–" : s < 60 ? `${s.toFixed(1)} s` : s < 3600 ? `${Math.floor(s / 60)} m ${Math.round(s % 60)} s` : `${(s / 3600).toFixed(1)} h`);
const held = (r) => Object.entries(r || {}).map(([k, v]) => `${num(v, 3)} ${esc(k)}`).join(", ") || "–";
const badge = (s) => `<span class="status ${esc(s)}">${esc(s)}</span>`;

async function get(path) {
  const response = await fetch(path, {cache: "no-store"});
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// ------------------------------------------------------------------ charts
function chart(title, series, {width = 560, height = 260, xLabel = "epoch"} = {}) {
  const pad = {l: 56, r: 14, t: 10, b: 34};
  const all = series.flatMap((s) => s.points).filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  if (!all.length) return `<div class="chart"><h3>${esc(title)}</h3><p class="muted">no points yet</p></div>`;
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const X = (x) => pad.l + ((x - x0) / (x1 - x0)) * (width - pad.l - pad.r);
  const Y = (y) => height - pad.b - ((y - y0) / (y1 - y0)) * (height - pad.t - pad.b);
  const ticks = (a, b, n) => Array.from({length: n + 1}, (_, i) => a + ((b - a) * i) / n);
  let svg = `<svg width="${width}" height="${height}" role="img" aria-label="${esc(title)}">`;
  for (const t of ticks(y0, y1, 4)) {
    svg += `<line x1="${pad.l}" x2="${width - pad.r}" y1="${Y(t)}" y2="${Y(t)}" stroke="#eaeef2"/>`;
    svg += `<text x="${pad.l - 6}" y="${Y(t) + 4}" font-size="11" text-anchor="end" fill="#656d76">${esc(num(t, 3))}</text>`;
  }
  const step = Math.max(1, Math.ceil((x1 - x0) / 6));  // epochs: whole numbers
  for (let t = Math.ceil(x0); t <= x1; t += step) {
    svg += `<text x="${X(t)}" y="${height - pad.b + 16}" font-size="11" text-anchor="middle" fill="#656d76">${t}</text>`;
  }
  svg += `<text x="${(pad.l + width - pad.r) / 2}" y="${height - 4}" font-size="11" text-anchor="middle" fill="#656d76">${esc(xLabel)}</text>`;
  series.forEach((s, i) => {
    const pts = s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    if (!pts.length) return;
    const color = s.color || COLORS[i % COLORS.length];
    const d = pts.map(([x, y], j) => `${j ? "L" : "M"}${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join("");
    svg += `<path class="curve" data-series="${esc(s.name)}" data-points="${pts.length}" d="${d}" fill="none" stroke="${color}" stroke-width="${s.bold ? 3 : 1.6}"/>`;
    if (pts.length < 60) for (const [x, y] of pts) svg += `<circle cx="${X(x).toFixed(1)}" cy="${Y(y).toFixed(1)}" r="${s.bold ? 3 : 2}" fill="${color}"/>`;
  });
  svg += "</svg>";
  const legend = series.map((s, i) => `<span${s.bold ? ' class="best"' : ""}><i style="background:${s.color || COLORS[i % COLORS.length]}"></i>${esc(s.name)}</span>`).join("");
  return `<div class="chart"><h3>${esc(title)}</h3>${svg}<div class="legend">${legend}</div></div>`;
}

// ------------------------------------------------------------------- views
const views = {
  async jobs() {
    const jobs = await get("/api/jobs");
    if (!jobs.length) return `<h1>Jobs</h1><p class="muted">No jobs yet. <code>model.train(settings, data=data, wait=False)</code> submits one.</p>`;
    const rows = jobs.map((j) => `<tr data-job="${esc(j.id)}">
      <td><a href="#/jobs/${encodeURIComponent(j.id)}">${esc(j.id)}</a></td><td>${esc(j.kind)}</td>
      <td class="num">${j.priority || 0}</td>
      <td>${badge(j.status)}${j.reason ? `<div class="muted">${esc(j.reason)}</div>` : ""}${j.status === "FAILED" && j.error ? `<div class="error">${esc(j.error.split("\n")[0].slice(0, 120))}</div>` : ""}</td>
      <td>${esc(j.model_class.split(".").pop())}</td><td>${when(j.started)}</td><td class="num">${secs(j.duration_s)}</td>
      <td>${esc(j.progress)}</td><td class="eta">${eta(j)}</td><td>${held(j.resources)}</td>
      <td>${DONE.includes(j.status) ? "" : `<button data-stop="${esc(j.id)}">stop</button>`}</td></tr>`).join("");
    return `<h1>Jobs</h1><table><thead><tr><th>id</th><th>kind</th><th>priority</th><th>status</th><th>model</th><th>started</th>
      <th>duration</th><th>progress</th><th>eta</th><th>resources</th><th></th></tr></thead><tbody>${rows}</tbody></table>`;
  },

  async job(id) {
    const j = await get(`/api/jobs/${encodeURIComponent(id)}`);
    let html = `<h1><span class="job-id">${esc(j.id)}</span> ${badge(j.status)}</h1>
      <p class="muted">${esc(j.kind)} · ${esc(j.model_class)} · priority ${j.priority || 0}${j.preemptible === false ? " (not preemptible)" : ""}
      · started ${when(j.started)} · holds ${held(j.resources)}${j.preemptions ? ` · preempted ${j.preemptions}×` : ""}
      ${eta(j) ? ` · ${eta(j)}` : ""}${DONE.includes(j.status) ? "" : ` · <button data-stop="${esc(j.id)}">stop</button>`}</p>`;
    if (j.reason) html += `<p class="reason">${esc(j.reason)}</p>`;
    if (j.error) html += `<p class="error">${esc(j.error)}</p>`;
    if (j.kind === "train" && !DONE.includes(j.status)) {
      html += `<form class="update" data-update="${esc(j.id)}"><label>change from the next epoch:
        <input name="set" placeholder="lr=0.001, num_epochs=40" size="40"></label> <button>update</button></form>`;
    }
    html += changes(j);
    if (j.kind === "release") html += timeline(j);
    html += j.kind === "tune" ? tuneCharts(j) : trainCharts(j);
    html += `<h2>Log</h2><pre class="log">${esc((j.log || []).join("\n"))}</pre>`;
    return html;
  },

  async models() {
    const models = await get("/api/models");
    if (!models.length) return `<h1>Models</h1><p class="muted">The registry is empty. <code>rm.registry.put(result, "key")</code> adds a version.</p>`;
    return `<h1>Models</h1>` + models.map((m) => `<h2 class="model-key">${esc(m.key)}</h2><table><thead><tr><th>version</th>
      <th>aliases</th><th>created</th><th>metrics</th><th>class</th><th>lineage</th></tr></thead><tbody>` +
      m.versions.map((v) => `<tr><td>${v.version}</td><td>${v.aliases.map((a) => `<code>@${esc(a)}</code>`).join(" ")}</td>
        <td>${when(v.created)}</td><td>${Object.entries(v.metrics || {}).filter(([, x]) => typeof x === "number").slice(0, 4).map(([k, x]) => `${esc(k)} ${esc(num(x))}`).join("<br>")}</td>
        <td>${esc((v.model_class || "").split(".").pop())} <span class="muted">${esc(v.backend)}</span></td>
        <td>${v.job ? `job <a href="#/jobs/${encodeURIComponent(v.job)}">${esc(v.job)}</a><br>` : ""}<span class="muted">${esc(v.lineage.run || v.lineage.trial_id || v.lineage.checkpoint || "")}</span></td></tr>`).join("") +
      `</tbody></table>`).join("");
  },

  async routes() {
    // Rollouts (served.rollout, `raymodel serve rollout`): step, shares, the guard and the candidate's figures.
    const pct = (x) => (x == null ? "–" : (100 * x).toFixed(1) + "%");
    const rolloutTable = (list) => !list.length ? "" : `<h2>Rollouts</h2><table class="rollouts"><thead><tr><th>route</th>
      <th>from → to</th><th>status</th><th>step</th><th>shares</th><th>guard</th><th>candidate</th><th>why</th></tr></thead><tbody>` +
      list.map((o) => { const c = o.figures.candidate, g = o.guard; return `<tr><td><code>${esc(o.route)}</code></td>
      <td><code>${esc(o.baseline)}</code> → <code>${esc(o.candidate)}</code></td><td><span class="status ${esc(o.status.toUpperCase().replace(" ", "_"))}">${esc(o.status)}</span></td>
      <td class="num">${o.step}/${o.steps.length}</td>
      <td>${Object.entries(o.split).map(([ref, w]) => `${esc(ref)} ${(100 * w).toFixed(0)}%`).join(", ")}</td>
      <td>errors ≤ ${pct(g.max_error_rate)}${g.max_p99_ms == null ? "" : `, p99 ≤ ${num(g.max_p99_ms, 3)} ms`}, ${g.min_requests} requests a step</td>
      <td>${c.requests} requests, ${c.errors} failed (${pct(c.error_rate)}), p99 ${c.p99_ms == null ? "–" : num(c.p99_ms, 3) + " ms"}</td>
      <td>${esc(o.reason || "")}</td></tr>`; }).join("") + `</tbody></table>`;
    // A route of several versions (a split, a shadow, "digits@*"): one row of figures per version.
    const ms = (v) => (v == null ? "–" : num(v, 3) + " ms");
    const versionRows = (s) => {
      const versions = Object.entries(s.versions || {});
      const shadows = Object.entries(s.shadows || {});
      if (!versions.length && !shadows.length) return "";
      const refs = Object.entries(s.refs || {});
      const share = (label) => refs.filter(([ref, l]) => l === label && s.split && s.split[ref] != null)
        .map(([ref]) => `${esc(ref)} ${(100 * s.split[ref]).toFixed(0)}%`).join(", ");
      const rows = versions.map(([label, f]) => `<tr><td><code>${esc(label)}</code></td><td>${share(label) || "–"}</td>
        <td class="num">${f.requests}</td><td class="num">${num(f.rate_per_s, 3)}/s</td><td class="num">${ms(f.p50_ms)}</td>
        <td class="num">${ms(f.p99_ms)}</td><td class="num">${f.errors}</td><td></td></tr>`).join("");
      const mirrored = shadows.map(([label, f]) => `<tr class="shadow"><td><code>${esc(label)}</code></td><td>shadow of ${esc(f.answered)}</td>
        <td class="num">${f.sent}</td><td colspan="3"></td><td class="num">${f.errors}</td>
        <td>agreement ${f.agreement == null ? "–" : (100 * f.agreement).toFixed(1) + "%"} of ${f.compared}${f.mean_abs_diff == null ? "" : `; mean |diff| ${num(f.mean_abs_diff, 3)}`}</td></tr>`).join("");
      return `<tr><td></td><td colspan="7"><table class="versions"><thead><tr><th>version</th><th>split</th><th>requests</th><th>rate</th>
        <th>p50</th><th>p99</th><th>errors</th><th>agreement</th></tr></thead><tbody>${rows}${mirrored}</tbody></table></td></tr>`;
    };
    const [routes, rollouts] = await Promise.all([get("/api/routes"), get("/api/rollouts")]);
    if (!routes.length && !rollouts.length) return `<h1>Routes</h1><p class="muted">Nothing is served. <code>model.serve("/digits")</code> starts a route.</p>`;
    const rows = routes.map((r) => { const s = r.stats || {}; return `<tr><td><code>${esc(r.route || "–")}</code></td><td>${esc(r.name)} <span class="muted">(${r.replicas} replica${r.replicas === 1 ? "" : "s"})</span></td>
      <td>${badge(r.healthy ? "HEALTHY" : r.status)}</td><td>${esc(s.serving || "–")}</td><td class="num">${s.rate_per_s == null ? "–" : num(s.rate_per_s, 3) + "/s"}</td>
      <td class="num">${s.p50_ms == null ? "–" : num(s.p50_ms, 3) + " ms"}</td><td class="num">${s.p99_ms == null ? "–" : num(s.p99_ms, 3) + " ms"}</td>
      <td class="num">${num(s.mean_batch_size, 3)}</td></tr>${versionRows(s)}`; }).join("");
    const table = !routes.length ? `<p class="muted">Nothing is served.</p>` : `<table><thead><tr><th>route</th><th>application</th><th>health</th><th>serving</th><th>requests</th>
      <th>p50</th><th>p99</th><th>mean batch</th></tr></thead><tbody>${rows}</tbody></table>
      <p class="muted">Rates and latencies: the last minute, as a replica of each route saw it.</p>`;
    return `<h1>Routes</h1>${table}${rolloutTable(rollouts)}`;
  },

  async resources() {
    const r = await get("/api/resources");
    const gib = (name, v) => (name.includes("memory") ? `${(v / 2 ** 30).toFixed(1)} GiB` : num(v, 3));
    const rows = Object.entries(r.cluster).map(([name, c]) => `<tr><td>${esc(name)}</td>
      <td><span class="bar"><div style="width:${c.total ? (100 * c.used) / c.total : 0}%"></div></span></td>
      <td class="num">${gib(name, c.used)} used</td><td class="num">${gib(name, c.free)} free</td><td class="num">${gib(name, c.total)} total</td></tr>`).join("");
    const jobs = r.jobs.map((j) => `<tr><td><a href="#/jobs/${encodeURIComponent(j.id)}">${esc(j.id)}</a></td><td>${esc(j.kind)}</td><td>${held(j.resources)}</td></tr>`).join("");
    const pools = (r.pools || []).map((p) => `<tr><td>${esc(p.id)}<br><span class="muted">${esc(p.key)}</span></td>
      <td class="num">${p.workers}</td><td>${held(p.resources)}</td>
      <td>${p.state === "busy" && p.job ? `busy: <a href="#/jobs/${encodeURIComponent(p.job)}">${esc(p.job)}</a>` : esc(p.state)}</td>
      <td class="num">${num(p.since_s, 3)} s</td><td class="num">${p.jobs_run}</td></tr>`).join("");
    return `<h1>Resources</h1><p class="muted">${r.nodes} node(s)</p><table><tbody>${rows}</tbody></table>
      <h2>Held by running jobs</h2>${jobs ? `<table><thead><tr><th>job</th><th>kind</th><th>holds</th></tr></thead><tbody>${jobs}</tbody></table>` : `<p class="muted">No job is running.</p>`}
      <h2>Pools</h2>${pools ? `<table><thead><tr><th>pool</th><th>workers</th><th>holds</th><th>state</th><th>since</th><th>jobs run</th></tr></thead><tbody>${pools}</tbody></table>` : `<p class="muted">No pool: the next training job starts one.</p>`}`;
  },
};

function trainCharts(j) {
  const rows = j.history || [];
  const series = (key) => ({name: key, points: rows.filter((r) => typeof r[key] === "number").map((r) => [r.epoch, r[key]])});
  const losses = j.metrics.filter((k) => /loss/.test(k));
  const others = j.metrics.filter((k) => !/loss/.test(k) && !/^(time|lr)/.test(k) && k !== "world_size");
  let html = `<h2>Learning curves <span class="muted">(${rows.length} epochs${j.epochs ? ` of ${j.epochs}` : ""})</span></h2><div class="charts">`;
  if (losses.length) html += chart("loss", losses.map(series));
  if (others.length) html += chart("validation metrics", others.map(series));
  if (j.metrics.includes("world_size")) html += chart("workers (world size)", [series("world_size")]);
  return html + "</div>";
}

// A release's stages on one time axis: a bar per stage that ended (its figures beside it), then the one under way.
function timeline(j) {
  const stages = j.stages || [];
  const t0 = stages.length ? stages[0].start : j.started, now = DONE.includes(j.status) ? (j.ended || Date.now() / 1000) : Date.now() / 1000;
  const span = Math.max(now - t0, 1e-3);
  const bar = (start, end) => `<span class="bar stage"><div style="margin-left:${(100 * (start - t0)) / span}%;width:${Math.max((100 * (end - start)) / span, 0.5)}%"></div></span>`;
  const rows = stages.map((s) => `<tr><td>${esc(s.stage)}</td><td>${bar(s.start, s.end)}</td><td class="num">${secs(s.end - s.start)}</td><td>${esc(s.text)}</td></tr>`);
  if (!DONE.includes(j.status)) {
    const from = stages.length ? stages[stages.length - 1].end : (j.started || now);
    rows.push(`<tr class="muted"><td>${esc(j.stage)}</td><td>${bar(from, now)}</td><td class="num">${secs(now - from)}</td><td>under way</td></tr>`);
  }
  return `<h2>Stages</h2><table class="stages"><thead><tr><th>stage</th><th>timeline</th><th>took</th><th>figures</th></tr></thead><tbody>${rows.join("")}</tbody></table>`;
}

function eta(j) {
  if (j.eta === null || j.eta === undefined || DONE.includes(j.status)) return "";
  return `${j.status === "PENDING" ? "starts" : "ends"} in ~${Math.round(j.eta)} s`;
}

function changes(j) {
  const list = j.changes || [];
  if (!list.length) return "";
  const shown = (o) => Object.entries(o || {}).map(([k, v]) => `<code>${esc(k)}=${esc(JSON.stringify(v))}</code>`).join(" ");
  return `<h2>Changes</h2><table class="changes"><thead><tr><th>from epoch</th><th>config</th><th>settings</th></tr></thead><tbody>` +
    list.map((c) => `<tr><td class="num">${c.epoch === null || c.epoch === undefined ? `<span class="muted">${esc(c.note || "next boundary")}</span>` : c.epoch}</td>
      <td>${shown(c.config)}</td><td>${shown(c.settings)}</td></tr>`).join("") + `</tbody></table>`;
}

const SETTINGS = ["num_epochs", "checkpoint_every", "keep_checkpoints"];

function parseChanges(text) {
  const out = {config: {}, settings: {}};
  for (const part of text.split(",").map((s) => s.trim()).filter(Boolean)) {
    const at = part.indexOf("=");
    if (at < 1) throw new Error(`"${part}": write key=value`);
    const key = part.slice(0, at).trim(), raw = part.slice(at + 1).trim();
    let value;
    try { value = JSON.parse(raw); } catch { value = raw; }
    (SETTINGS.includes(key) ? out.settings : out.config)[key] = value;
  }
  return out;
}

function tuneCharts(j) {
  const metric = j.metric;
  const trials = j.trials || [];
  const series = trials.map((t) => ({name: `${t.trial_id}${t.trial_id === j.best_trial_id ? " ★ best" : ""}`, bold: t.trial_id === j.best_trial_id,
    points: (j.history || []).filter((r) => r.trial_id === t.trial_id && typeof r[metric] === "number").map((r) => [r.epoch, r[metric]])}));
  const keys = [...new Set(trials.flatMap((t) => Object.keys(t.config || {})))].filter((k) => trials.some((t) => t.config[k] !== trials[0].config[k]));
  const rows = trials.map((t) => `<tr${t.trial_id === j.best_trial_id ? ' class="best"' : ""}><td>${esc(t.trial_id)}${t.trial_id === j.best_trial_id ? " ★" : ""}</td>
    ${keys.map((k) => `<td>${esc(num(t.config[k]))}</td>`).join("")}<td class="num">${esc(num(t.metric))}</td><td class="num">${t.epochs}</td>
    <td>${badge(t.status)}</td><td>${t.stopped_early ? "yes" : "no"}</td></tr>`).join("");
  return `<h2>Trials <span class="muted">(${esc(metric)}, ${esc(j.mode)})</span></h2><table><thead><tr><th>trial</th>${keys.map((k) => `<th>${esc(k)}</th>`).join("")}
    <th>${esc(metric)}</th><th>epochs</th><th>status</th><th>stopped early</th></tr></thead><tbody>${rows}</tbody></table>
    <div class="charts">${chart(`${metric}, every trial`, series, {width: 760, height: 300})}</div>`;
}

// ---------------------------------------------------------------- plumbing
async function render() {
  if (busy) return;
  const typing = view.querySelector("form.update input");
  if (typing && (typing.value || document.activeElement === typing)) return; // not while a change is being written
  busy = true;
  const [, name = "jobs", ...rest] = (location.hash || "#/jobs").split("/");
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === name));
  try {
    const html = name === "jobs" && rest.length ? await views.job(decodeURIComponent(rest.join("/"))) : await (views[name] || views.jobs)();
    view.innerHTML = html;
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    view.innerHTML = `<p class="error">${esc(err.message)}</p>`;
  } finally {
    busy = false;
  }
}

view.addEventListener("submit", async (event) => {
  const id = event.target.dataset && event.target.dataset.update;
  if (!id) return;
  event.preventDefault();
  let body;
  try { body = parseChanges(event.target.elements.set.value); } catch (err) { alert(err.message); return; }
  const token = sessionStorage.getItem("raymodel-token") || "";
  const response = await fetch(`/api/jobs/${encodeURIComponent(id)}/update`, {method: "POST",
    headers: {"X-Raymodel-Token": token, "Content-Type": "application/json"}, body: JSON.stringify(body)});
  if (!response.ok) alert((await response.json()).error);
  else event.target.elements.set.value = "";
  event.target.elements.set.blur();
  render();
});

view.addEventListener("click", async (event) => {
  const id = event.target.dataset && event.target.dataset.stop;
  if (!id) return;
  const token = sessionStorage.getItem("raymodel-token") || "";
  const response = await fetch(`/api/jobs/${encodeURIComponent(id)}/stop`, {method: "POST", headers: {"X-Raymodel-Token": token}});
  if (!response.ok) alert((await response.json()).error);
  render();
});

window.addEventListener("hashchange", render);
render();
setInterval(render, 1000);
