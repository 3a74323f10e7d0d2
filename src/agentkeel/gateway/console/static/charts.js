// Inline SVG charts and the step waterfall, drawn with the DOM only (no library, no CDN).
// Every text from a run is set as text (textContent), never parsed as markup.

const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];

export function colorOf(name, names) {
  return PALETTE[Math.max(names.indexOf(name), 0) % PALETTE.length];
}

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function frame(width, height, label) {
  return svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img", "aria-label": label });
}

function axes(root, box, maxX, maxY, xLabel, yLabel) {
  const { left, top, right, bottom } = box;
  root.append(svg("line", { x1: left, y1: bottom, x2: right, y2: bottom, class: "axis" }));
  root.append(svg("line", { x1: left, y1: top, x2: left, y2: bottom, class: "axis" }));
  root.append(svg("text", { x: left - 6, y: top + 4, "text-anchor": "end", class: "tick" }, formatNumber(maxY)));
  root.append(svg("text", { x: left - 6, y: bottom, "text-anchor": "end", class: "tick" }, "0"));
  root.append(svg("text", { x: right, y: bottom + 16, "text-anchor": "end", class: "tick" }, xLabel(maxX)));
  root.append(svg("text", { x: left, y: top - 8, class: "tick" }, yLabel));
}

export function formatNumber(value) {
  return value >= 10000 ? `${(value / 1000).toFixed(1)}k` : String(Math.round(value));
}

// Cumulative tokens (input + output) per caller against time since the run started.
export function spendChart(calls, callers) {
  const width = 760, height = 220, box = { left: 56, top: 24, right: 520, bottom: 190 };
  const root = frame(width, height, "token spend by caller over time");
  const maxX = Math.max(1, ...calls.map((c) => c.t_ms || 0));
  const totals = {};
  const series = {};
  for (const call of calls) {
    totals[call.caller] = (totals[call.caller] || 0) + call.input_tokens + call.output_tokens;
    (series[call.caller] ||= [{ x: 0, y: 0 }]).push({ x: call.t_ms || 0, y: totals[call.caller] });
  }
  const maxY = Math.max(1, ...Object.values(totals));
  axes(root, box, maxX, maxY, (x) => `${(x / 1000).toFixed(1)} s`, "tokens (cumulative)");
  const px = (x) => box.left + (x / maxX) * (box.right - box.left);
  const py = (y) => box.bottom - (y / maxY) * (box.bottom - box.top);
  callers.forEach((caller, index) => {
    const points = series[caller] || [];
    const path = points.map((p, i) => `${i ? "L" : "M"}${px(p.x).toFixed(1)},${py(p.y).toFixed(1)}`).join(" ");
    const color = colorOf(caller, callers);
    root.append(svg("path", { d: path, fill: "none", stroke: color, "stroke-width": 2, "data-caller": caller }));
    for (const p of points.slice(1)) root.append(svg("circle", { cx: px(p.x), cy: py(p.y), r: 3, fill: color }));
    const legendY = box.top + index * 18;
    root.append(svg("rect", { x: box.right + 16, y: legendY - 9, width: 10, height: 10, fill: color }));
    root.append(svg("text", { x: box.right + 32, y: legendY, class: "legend" }, `${caller} ${formatNumber(totals[caller] || 0)}`));
  });
  return root;
}

// Input tokens of each model call in order: the context the model was sent. A compaction's
// summary call is marked; the calls after it show what the compaction took away.
export function contextChart(calls, callers) {
  const width = 760, height = 220, box = { left: 56, top: 24, right: 740, bottom: 190 };
  const root = frame(width, height, "context size per model call");
  const maxY = Math.max(1, ...calls.map((c) => c.input_tokens));
  axes(root, box, calls.length, maxY, (n) => `${n} calls`, "input tokens per call");
  const slot = (box.right - box.left) / Math.max(calls.length, 1);
  calls.forEach((call, index) => {
    const h = (call.input_tokens / maxY) * (box.bottom - box.top);
    const x = box.left + index * slot + slot * 0.15;
    const bar = svg("rect", {
      x: x.toFixed(1), y: (box.bottom - h).toFixed(1), width: Math.max(slot * 0.7, 1).toFixed(1), height: h.toFixed(1),
      fill: call.compaction ? "#9ca3af" : colorOf(call.caller, callers), "data-seq": call.seq,
    });
    bar.append(svg("title", {}, `#${call.seq} ${call.caller} ${call.model}: ${call.input_tokens} in${call.compaction ? " (compaction summary)" : ""}`));
    root.append(bar);
  });
  return root;
}

// The step waterfall: one row per item of the aligned timeline, indented under its parent (a
// subagent under the task call that started it, its calls under it, a file change under its tool
// call), a bar from start to end. A journal row is labelled with its seq; a checkpoint or stream
// row with the seq it follows. A row a divergence names is marked.
export function waterfall(steps, totalMs, callers) {
  const byParent = new Map();
  for (const step of steps) {
    const key = step.parent || "";
    if (!byParent.has(key)) byParent.set(key, []);
    byParent.get(key).push(step);
  }
  const table = el("div", { class: "waterfall", "data-testid": "waterfall" });
  const scale = Math.max(totalMs, 1);
  const visit = (parent, depth) => {
    for (const step of byParent.get(parent) || []) {
      const flags = step.divergences || [];
      const row = el("div", { class: `step step-${step.kind} status-${step.status}${flags.length ? " diverged" : ""}`, "data-kind": step.kind,
        "data-source": step.source, "data-seq": step.seq, "data-depth": depth, "data-divergences": flags.length ? flags.join(" ") : null });
      const at = step.source === "journal" ? `#${step.seq}` : `after #${step.seq}`;
      const where = `journal seq ${step.seq}, attempt ${step.attempt ?? "?"}, step ${step.step ?? "?"}`;
      const label = el("div", { class: "label", title: flags.length ? `${where}; divergence: ${flags.join(", ")}` : where,
        text: `${flags.length ? "⚠ " : ""}${at} ${step.label}` });
      label.style.paddingLeft = `${depth * 18 + 4}px`;
      const track = el("div", { class: "track" });
      const bar = el("div", { class: "bar" });
      const start = step.start_ms ?? 0;
      const end = step.end_ms ?? totalMs;
      bar.style.left = `${(start / scale) * 100}%`;
      bar.style.width = `${Math.max(((end - start) / scale) * 100, 0.4)}%`;
      bar.style.background = colorOf(step.caller, callers);
      bar.title = `${step.caller}: ${start.toFixed(0)}-${end.toFixed(0)} ms`;
      track.append(bar);
      row.append(label, track);
      table.append(row);
      visit(step.id, depth + 1);
    }
  };
  visit("", 0);
  return table;
}
