// launch ui: the list of runs, a run's page, a sweep's page. Data arrives as server-sent events while the page
// is shown (and stops when it is hidden); every text from a run is set as text, never as markup.
"use strict";

// The token every request needs: the page's own (index.html), sent with each request; never a cookie.
const token = decodeURIComponent(document.querySelector('meta[name="launch-token"]').content);
const main = document.getElementById("main");
const live = document.getElementById("live");
const where = document.getElementById("where");
let source = null;
let view = null; // {kind, id}
let chosen = null; // the sweep points whose curves are overlaid
let sortKey = "point";
let sortUp = true;
let lastData = null;
let actionSaid = ""; // what the last action answered, kept across updates of the page

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

const fmt = {
  time: (t) => (t ? new Date(t * 1000).toLocaleString() : "-"),
  duration(s) {
    if (s === null || s === undefined) return "-";
    s = Math.max(0, Math.round(s));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? `${h}h ${m}m` : m ? `${m}m ${r}s` : `${r}s`;
  },
  num: (v, digits = 4) => (v === null || v === undefined ? "-" : typeof v === "number" ? +v.toPrecision(digits) + "" : v),
  result(r) {
    if (!r) return "-";
    const parts = [];
    if (r.eval_accuracy !== undefined) parts.push(`acc ${(r.eval_accuracy * 100).toFixed(2)}%`);
    if (r.eval_loss !== undefined) parts.push(`loss ${fmt.num(r.eval_loss)}`);
    return parts.join(", ") || "-";
  },
};

function stateBadge(state, id) {
  const word = String(state || "?");
  return el("span", { class: `state ${word.split(" ")[0]}`, id, text: word });
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => (c instanceof Node ? el("td", {}, c) : el("td", { text: c ?? "-" })))))));
}

function link(text, hash) {
  return el("a", { href: hash, text });
}

// Curves: one SVG per chart, each series a polyline over the same axes.
const COLOURS = ["#3056d3", "#e4572e", "#17a398", "#f3a712", "#8e44ad", "#2e4057", "#c0392b", "#76b041", "#a0522d", "#ff6f91"];

function chart(title, series) {
  const W = 460, H = 220, L = 52, R = 12, T = 24, B = 30;
  const all = series.flatMap((s) => s.points);
  const svg = el("svg:svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-title": title });
  svg.append(el("svg:text", { x: L, y: 15, text: title }));
  if (!all.length) return svg;
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  svg.append(el("svg:line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
    el("svg:line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
    el("svg:text", { x: 4, y: sy(y1) + 4, text: fmt.num(y1, 3) }), el("svg:text", { x: 4, y: sy(y0), text: fmt.num(y0, 3) }),
    el("svg:text", { x: L, y: H - 10, text: `step ${x0}` }), el("svg:text", { x: W - R - 70, y: H - 10, text: `step ${x1}` }));
  series.forEach((s, i) => {
    const colour = COLOURS[(s.colour ?? i) % COLOURS.length];
    const points = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.append(el("svg:polyline", { points, fill: "none", stroke: colour, "stroke-width": 2 }));
    if (s.points.length === 1) svg.append(el("svg:circle", { cx: sx(s.points[0][0]), cy: sy(s.points[0][1]), r: 3, fill: colour }));
    const legend = el("svg:text", { x: W - R - 150, y: T + 12 + 13 * i, text: s.name });
    legend.style.fill = colour;
    svg.append(legend);
  });
  return svg;
}

function chartsOf(curves) {
  // Losses together, accuracies together, every other number on its own.
  const groups = {};
  for (const [tag, points] of Object.entries(curves)) {
    const name = tag.split("/").pop();
    const group = name.includes("loss") ? "loss" : name.includes("acc") ? "accuracy" : tag;
    (groups[group] ||= []).push({ name: tag, points });
  }
  return el("div", { class: "charts" }, ...Object.entries(groups).map(([group, series]) => chart(group, series)));
}

// The confirmation before an action: what it does, and the command it runs.
function confirmThen(text, command, then) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-command").textContent = command;
  dialog.returnValue = "";
  dialog.onclose = () => { if (dialog.returnValue === "yes") then(); };
  dialog.showModal();
}

function act(action, data) {
  const command = data.commands[action];
  const what = action === "cancel" ? "Stop every process of this job (as `launch cancel` does)?" : "Submit this sweep's failed points again?";
  confirmThen(what, command, async () => {
    const say = (text) => { actionSaid = text; document.getElementById("action-result").textContent = text; };
    document.querySelectorAll(".actions button").forEach((b) => { b.disabled = true; });
    say(`running: ${command}`);
    const response = await fetch("/api/action", { method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `token ${token}` }, body: JSON.stringify({ action, id: data.id }) });
    const said = response.headers.get("Content-Type")?.startsWith("application/json") ? await response.json() : { output: await response.text(), ok: false };
    const how = said.running ? "still running" : said.ok ? "done" : "failed";
    say(`${said.command || command}: ${how}${said.exit_status !== undefined ? ` (exit status ${said.exit_status})` : ""}\n${said.output || ""}`);
  });
}

function actionBar(data) {
  const bar = el("span", { class: "actions" });
  if (data.running && data.commands.cancel) bar.append(el("button", { class: "danger", id: "cancel", text: data.kind === "sweep" ? "Cancel sweep" : "Cancel", onclick: () => act("cancel", data) }));
  if (data.failed && data.failed.length && data.commands.retry)
    bar.append(el("button", { id: "retry", text: `Retry failed (${data.failed.join(", ")})`, onclick: () => act("retry", data) }));
  return bar;
}

function renderList(data) {
  where.textContent = data.folders.join(", ");
  const rows = data.runs.map((r) => [
    link(r.name, `#/${r.kind}/${encodeURIComponent(r.id)}`), r.profile, r.backend, r.job_id || "-", stateBadge(r.state),
    r.world, fmt.time(r.started), fmt.duration((r.ended ?? Date.now() / 1000) - r.started),
    r.kind === "sweep" ? `${r.points} points` : fmt.num(r.last_step), fmt.result(r.result)]);
  main.replaceChildren(el("section", {}, el("h2", { text: `${data.runs.length} runs and sweeps` }),
    table(["name", "profile", "backend", "job id", "state", "nodes x processes", "start", "duration", "last step", "eval"], rows)));
}

function renderRun(d) {
  where.replaceChildren(link("all runs", "#/"), ` / ${d.name}`);
  const p = d.progress || {};
  const facts = el("div", { class: "facts" },
    el("div", {}, "step", el("b", { id: "step", text: p.step ?? d.last_step ?? "-" }), p.total_steps ? ` of ${p.total_steps}` : ""),
    el("div", {}, "samples/s", el("b", { text: fmt.num(p.samples_per_second, 4) })),
    el("div", {}, "ETA", el("b", { text: d.running && p.eta_s !== null && p.eta_s !== undefined ? fmt.duration(p.eta_s) : "-" })),
    el("div", {}, "nodes x processes", el("b", { text: d.world })),
    el("div", {}, "eval", el("b", { text: fmt.result(d.result) })),
    el("div", {}, "job", el("b", { text: `${d.backend}${d.job_id ? " " + d.job_id : ""}` })));
  const ranks = table(["rank", "host", "pid", "state", "exit", "peak memory", "error"], (d.ranks || []).map((r) => [
    String(r.rank), r.host, String(r.pid ?? "-"), stateBadge(r.state), r.signal ? r.signal : r.exit_code ?? "-",
    r.max_rss_mb ? `${Math.round(r.max_rss_mb)} MiB` : "-", r.error || ""]));
  const byHost = {};
  for (const r of d.ranks || []) (byHost[r.host] ||= []).push(r);
  const nodes = table(["node", "host", "ranks", "states", "peak memory"], Object.entries(byHost).map(([host, rs], node) => [
    String(node), host, rs.map((r) => r.rank).join(", "), [...new Set(rs.map((r) => r.state))].join(", "),
    `${Math.round(rs.reduce((sum, r) => sum + (r.max_rss_mb || 0), 0))} MiB`]));
  const sections = [
    el("h1", {}, el("span", { text: d.name }), stateBadge(d.state, "state"), d.exit_code !== null && d.exit_code !== undefined ? el("span", { class: "muted", text: `exit status ${d.exit_code}` }) : null, actionBar(d)),
    el("pre", { id: "action-result", class: "muted", text: actionSaid }),
    el("section", {}, facts),
  ];
  if (d.report && d.report.length) sections.push(el("section", {}, el("h2", { text: "What happened" }), el("pre", { class: "report", id: "report", text: d.report.join("\n") })));
  sections.push(el("section", {}, el("h2", { text: "Curves" }), chartsOf(d.curves || {})));
  sections.push(el("section", {}, el("h2", { text: "Nodes" }), nodes, el("h2", { text: "Ranks" }), ranks));
  const log = el("pre", { id: "log", text: (d.log_tail || []).join("\n") || "(no log yet)" });
  sections.push(el("section", {}, el("h2", { text: "Logs (every rank, merged in time order)" }), log));
  if (d.check) sections.push(el("section", {}, el("h2", { text: "check" }), el("pre", { text: d.check })));
  sections.push(el("section", {}, el("h2", { text: "Code and plan" }),
    el("p", { text: d.snapshot ? `snapshot: ${d.snapshot}` : "no snapshot: the job ran the live files" }),
    el("details", {}, el("summary", { text: "the plan, as rendered" }), el("pre", { text: d.plan }))));
  const keep = document.getElementById("log");
  const atEnd = !keep || keep.scrollTop + keep.clientHeight >= keep.scrollHeight - 4;
  const open = document.querySelector("details")?.open;
  main.replaceChildren(...sections);
  if (open) document.querySelector("details").open = true;
  if (atEnd) log.scrollTop = log.scrollHeight;
}

function renderSweep(d) {
  where.replaceChildren(link("all runs", "#/"), ` / ${d.name}`);
  const points = d.points_table || [];
  if (chosen === null) chosen = new Set(points.slice(0, 6).map((p) => p.point));
  const key = (p) => ({ point: p.point, values: p.values, state: p.state, step: p.last_step ?? -1,
    acc: p.result.eval_accuracy ?? -1, loss: p.result.eval_loss ?? Infinity }[sortKey]);
  const sorted = [...points].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (sortUp ? 1 : -1));
  const head = [["", null], ["point", "point"], ["values", "values"], ["state", "state"], ["last step", "step"], ["eval acc", "acc"], ["eval loss", "loss"]];
  const thead = el("tr", {}, ...head.map(([label, k]) => el("th", k ? { class: "sortable", "data-key": k, text: label,
    onclick: () => { sortUp = sortKey === k ? !sortUp : true; sortKey = k; renderSweep(d); } } : { text: label })));
  const body = sorted.map((p) => el("tr", { "data-point": p.point },
    el("td", {}, el("input", { type: "checkbox", ...(chosen.has(p.point) ? { checked: "" } : {}),
      onclick: (e) => { e.target.checked ? chosen.add(p.point) : chosen.delete(p.point); renderSweep(d); } })),
    el("td", {}, p.id ? link(String(p.point), `#/run/${encodeURIComponent(p.id)}`) : String(p.point)),
    el("td", { text: p.values }), el("td", {}, stateBadge(p.state)), el("td", { text: fmt.num(p.last_step) }),
    el("td", { text: p.result.eval_accuracy !== undefined ? `${(p.result.eval_accuracy * 100).toFixed(2)}%` : "-" }),
    el("td", { text: fmt.num(p.result.eval_loss) })));
  const overlay = (tag) => chart(tag, points.filter((p) => chosen.has(p.point) && p.curves[tag])
    .map((p) => ({ name: `p${p.point} ${p.values}`, points: p.curves[tag], colour: p.point })));
  const tags = [...new Set(points.flatMap((p) => Object.keys(p.curves)))].filter((t) => /loss|acc/.test(t));
  main.replaceChildren(
    el("h1", {}, el("span", { text: d.name }), stateBadge(d.state, "state"), actionBar(d)),
    el("pre", { id: "action-result", class: "muted", text: actionSaid }),
    el("section", {}, el("h2", { text: `${points.length} points (${d.backend}${d.job_id ? ", array " + d.job_id : ""})` }),
      el("table", { id: "points" }, el("thead", {}, thead), el("tbody", {}, ...body))),
    el("section", {}, el("h2", { text: "Curves of the chosen points" }), el("div", { class: "charts" }, ...tags.map(overlay))));
}

function render(data) {
  lastData = data;
  if (view.kind === "list") renderList(data);
  else if (data.kind === "sweep") renderSweep(data);
  else renderRun(data);
}

function listen() {
  if (source) source.close();
  const query = view.kind === "list" ? "" : `?id=${encodeURIComponent(view.id)}`;
  source = new EventSource(`/api/events${query}${query ? "&" : "?"}token=${encodeURIComponent(token)}`);
  source.onmessage = (event) => { live.textContent = `live · ${new Date().toLocaleTimeString()}`; render(JSON.parse(event.data)); };
  source.onerror = () => { live.textContent = "reconnecting…"; };
}

function route() {
  const [, kind, id] = location.hash.match(/^#\/(run|sweep)\/(.+)$/) || [];
  view = kind ? { kind, id: decodeURIComponent(id) } : { kind: "list" };
  chosen = null;
  actionSaid = "";
  main.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  listen();
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden && source) { source.close(); source = null; live.textContent = "paused"; }
  else if (!document.hidden && !source) listen();
});
window.addEventListener("hashchange", route);
route();
