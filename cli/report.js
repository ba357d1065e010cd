// Draws the report page's charts (cli/report.py) from the JSON embedded in it, as SVG.
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, parent, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}
function frame(id, width, height) {
  const svg = el("svg", {width: width, height: height, id: id + "-chart", class: "chart"});
  document.getElementById(id).appendChild(svg);
  return svg;
}
function empty(id, why) {
  const p = document.createElement("p");
  p.className = "empty"; p.textContent = why;
  document.getElementById(id).appendChild(p);
}
const W = 900, H = 260, L = 56, R = 16, T = 12, B = 32;
const history = D.history;
const largest = values => values.reduce((a, b) => (b > a ? b : a), -Infinity);  // no spread: long runs
const lastStep = largest([D.job.steps - 1, 1, largest(history.map(p => p.step)), largest(D.events.map(e => e.step))]);
const x = step => L + (W - L - R) * step / lastStep;
function axes(svg, top, label) {
  el("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999"}, svg);
  el("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#999"}, svg);
  el("text", {x: L - 4, y: T + 8, "text-anchor": "end"}, svg, top.toPrecision(3));
  el("text", {x: L - 4, y: H - B, "text-anchor": "end"}, svg, "0");
  el("text", {x: W - R, y: H - 8, "text-anchor": "end"}, svg, "step " + lastStep);
  el("text", {x: L + 4, y: T + 8}, svg, label);
}
function curve(id, key, label, colour) {
  const points = history.filter(p => p[key] !== undefined && p[key] !== null && isFinite(p[key]));
  if (!points.length) { empty(id, "no " + label + " reported yet"); return null; }
  const svg = frame(id, W, H);
  const top = largest(points.map(p => p[key])) * 1.1 || 1;
  const y = v => H - B - (H - B - T) * v / top;
  axes(svg, top, label);
  const d = points.map((p, i) => (i ? "L" : "M") + x(p.step).toFixed(1) + "," + y(p[key]).toFixed(1)).join(" ");
  el("path", {d: d, fill: "none", stroke: colour, "stroke-width": 1.5, class: "series", "data-points": points.length}, svg);
  return svg;
}

// Throughput, with the events that explain it.
const throughput = curve("throughput", "samples_per_s", "samples/s", "#333");
if (throughput) {
  for (const e of D.events) {
    const colour = D.marked[e.kind];
    if (!colour) continue;
    const line = el("line", {x1: x(e.step), x2: x(e.step), y1: T, y2: H - B, stroke: colour, "stroke-dasharray": "4 3",
                             class: "marker", "data-kind": e.kind, "data-step": e.step}, throughput);
    el("title", {}, line, e.kind + " at step " + e.step + (e.device ? " (" + e.device + ")" : "") +
                          (e.plan_version ? " v" + e.plan_version : ""));
  }
}

// Each device's straggling rate over the steps, as a heat map.
const devices = [...new Set(history.flatMap(p => Object.keys(p.rates || {})))].sort();
if (!devices.length) {
  empty("heatmap", "no rates reported yet");
} else {
  const row = 16, heat = frame("heatmap", W, T + row * devices.length + B);
  const column = step => L + (W - L - R) * step / (lastStep + 1);  // the whole run fits the width
  const colour = r => { const t = Math.min(Math.max((r - 1) / 3, 0), 1);
                        return "rgb(" + Math.round(255 - 40 * t) + "," + Math.round(245 - 200 * t) + "," + Math.round(235 - 200 * t) + ")"; };
  devices.forEach((device, i) => {
    el("text", {x: L - 4, y: T + row * i + 12, "text-anchor": "end"}, heat, device);
    history.forEach((p, k) => {
      const rate = (p.rates || {})[device];
      if (rate === undefined) return;
      const until = k + 1 < history.length ? column(history[k + 1].step) : column(lastStep + 1);
      const cell = el("rect", {x: column(p.step), y: T + row * i, width: Math.max(until - column(p.step), 1),
                               height: row - 2, fill: colour(rate),
                               class: "cell", "data-device": device, "data-step": p.step, "data-rate": rate}, heat);
      el("title", {}, cell, device + " at step " + p.step + ": " + rate + "x");
    });
  });
  el("text", {x: W - R, y: T + row * devices.length + 20, "text-anchor": "end"}, heat, "white 1x (healthy) ... red 4x and slower");
}

// The loss curve.
curve("loss", "loss", "loss", "#1f77b4");

// The plans side by side: each device's role in each version.
if (!D.plans.length) {
  empty("plans", "no plans");
} else {
  const versions = [...D.plans].sort((a, b) => a.version - b.version);
  const roles = versions.map(v => {
    const role = {};
    (v.plan.pipelines || []).forEach((p, pi) => (p.stages || []).forEach((s, si) => (s.devices || []).forEach(d => {
      role[d] = {pipeline: pi, text: "p" + pi + " s" + si + " [" + s.layers[0] + "," + s.layers[1] + ") tp" + s.devices.length +
                 " mb" + p.micro_batches};
    })));
    (v.plan.removed || []).forEach(d => { role[d] = {pipeline: -1, text: "removed"}; });
    return role;
  });
  const all = [...new Set(roles.flatMap(r => Object.keys(r)))].sort();
  const col = 150, row = 18, left = 90;
  const grid = frame("plans", left + col * versions.length + R, 30 + row * all.length + 8);
  const hues = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d"];
  versions.forEach((v, j) => {
    el("text", {x: left + col * j + 4, y: 16}, grid, "v" + v.version + (v.committed ? "" : " (not committed)"));
    all.forEach((device, i) => {
      const r = roles[j][device];
      const fill = !r ? "#eee" : r.pipeline < 0 ? "#ccc" : hues[r.pipeline % hues.length];
      el("rect", {x: left + col * j, y: 24 + row * i, width: col - 4, height: row - 2, fill: fill, class: "role",
                  "data-version": v.version, "data-device": device, "data-role": r ? r.text : "idle"}, grid);
      el("text", {x: left + col * j + 4, y: 24 + row * i + 12}, grid, r ? r.text : "-");
    });
  });
  all.forEach((device, i) => el("text", {x: left - 6, y: 24 + row * i + 12, "text-anchor": "end"}, grid, device));
}
document.body.setAttribute("data-drawn", "true");
