// The console's views: the runs list (#/) and a run page (#/runs/<thread_id>/<run_id>).
import { api, ApiError, credential, follow, setCredential } from "./api.js";
import { contextChart, el, formatNumber, spendChart, waterfall } from "./charts.js";

const view = document.getElementById("view");
const TERMINAL = new Set(["success", "error", "timeout", "interrupted"]);
const STATUSES = ["", "pending", "running", "success", "error", "timeout", "interrupted"];
let leave = () => {}; // stops the current view's timers and streams

function report(error) {
  const item = el("li", { text: error instanceof ApiError && error.status === 401
    ? `401: ${error.detail} (enter an API key above)` : String(error.message || error) });
  document.getElementById("errors").append(item);
}

function clearErrors() {
  document.getElementById("errors").replaceChildren();
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

function section(title, testid, ...children) {
  return el("section", { "data-testid": testid }, el("h2", { text: title }), ...children);
}

// -- runs list ------------------------------------------------------------------------------
function runsView() {
  const filters = el("form", { class: "filters", "data-testid": "filters" });
  const status = el("select", { name: "status", "aria-label": "status" });
  for (const value of STATUSES) status.append(el("option", { value, text: value || "any status" }));
  const inputs = ["assistant_id", "stop_reason", "q"].map((name) =>
    el("input", { name, "aria-label": name, placeholder: { assistant_id: "assistant", stop_reason: "stop reason (none: clean)", q: "run or thread id" }[name] }));
  filters.append(status, ...inputs, el("button", { type: "submit", text: "Filter" }));
  const body = el("tbody");
  const table = el("table", { class: "runs", "data-testid": "runs" },
    el("thead", {}, el("tr", {}, ...["run", "thread", "assistant", "status", "stop reason", "tokens", "duration", "created"].map((h) => el("th", { text: h })))),
    body);
  view.replaceChildren(section("Runs", "runs-section", filters, table));
  const load = async () => {
    const query = Object.fromEntries(new FormData(filters).entries());
    try {
      const runs = await api("console/api/runs", { query });
      body.replaceChildren(...runs.map(runRow));
      clearErrors();
    } catch (error) {
      report(error);
    }
  };
  filters.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  load();
  const timer = setInterval(load, 3000);
  return () => clearInterval(timer);
}

function runRow(run) {
  const link = el("a", { href: `#/runs/${run.thread_id}/${run.run_id}`, text: run.run_id });
  return el("tr", { "data-run-id": run.run_id, "data-status": run.status },
    el("td", {}, link), el("td", { text: run.thread_id }), el("td", { text: run.assistant_id }),
    el("td", {}, el("span", { class: `badge status-${run.status}`, text: run.status })),
    el("td", { text: run.stop_reason || "" }), el("td", { text: formatNumber(run.total_tokens) }),
    el("td", { text: duration(run.duration_s) }), el("td", { text: new Date(run.created_at).toLocaleString() }));
}

// -- run page -------------------------------------------------------------------------------
function runView(threadId, runId) {
  const base = `threads/${encodeURIComponent(threadId)}/runs/${encodeURIComponent(runId)}`;
  const head = el("div", { class: "run-head" });
  const live = el("span", { class: "live", "data-testid": "live", text: "loading" });
  const body = el("div");
  view.replaceChildren(el("p", {}, el("a", { href: "#/", text: "← runs" })), head, live, body);
  const controller = new AbortController();
  let pending = null;
  let events = 0;
  let following = false;
  const stop = () => { controller.abort(); clearTimeout(pending); };
  const refresh = async () => {
    if (controller.signal.aborted) return null; // left the page, or the run was rolled back and deleted
    try {
      const doc = await api(`console/api/${base}/timeline`, { signal: controller.signal });
      head.replaceChildren(...runHead(doc, base, refresh, stop));
      body.replaceChildren(...runBody(doc));
      clearErrors();
      return doc;
    } catch (error) {
      if (!controller.signal.aborted) report(error);
      return null;
    }
  };
  const soon = () => { if (!controller.signal.aborted) pending ||= setTimeout(() => { pending = null; refresh(); }, 400); };
  const watch = async () => {
    if (following) return;
    following = true;
    live.textContent = "live";
    live.dataset.state = "live";
    try {
      await follow(`${base}/stream`, (event) => {
        events += 1;
        live.textContent = `live: ${events} events, last ${event.event}`;
        soon();
      }, controller.signal);
    } catch (error) {
      if (controller.signal.aborted) return;
      report(error);
    } finally {
      following = false;
    }
    const doc = await refresh();
    if (doc && TERMINAL.has(doc.run.status)) {
      live.textContent = `END (${doc.run.status})`;
      live.dataset.state = "end";
    } else if (!controller.signal.aborted) {
      setTimeout(watch, 1000); // the stream closed early (a restart, a drain): join again
    }
  };
  refresh().then((doc) => {
    if (!doc) return;
    if (TERMINAL.has(doc.run.status)) {
      live.textContent = `ended (${doc.run.status})`;
      live.dataset.state = "ended";
    } else {
      watch();
    }
  });
  return stop;
}

function runHead(doc, base, refresh, stop) {
  const run = doc.run;
  const usage = run.usage || {};
  const active = !TERMINAL.has(run.status);
  const cancel = (action) => async () => {
    if (action === "rollback" && !window.confirm("Roll back this run? Its checkpoints and file changes are undone and the run is deleted.")) return;
    try {
      await api(`${base}/cancel`, { method: "POST", query: { action } });
      if (action === "rollback") { // a rolled-back run is deleted: stop reading it, back to the list
        stop();
        location.hash = "#/";
      } else {
        refresh();
      }
    } catch (error) {
      report(error);
    }
  };
  const interrupt = el("button", { type: "button", "data-testid": "interrupt", disabled: !active, text: "Interrupt (keep progress)" });
  const rollback = el("button", { type: "button", "data-testid": "rollback", disabled: !active, text: "Cancel and roll back" });
  interrupt.addEventListener("click", cancel("interrupt"));
  rollback.addEventListener("click", cancel("rollback"));
  const started = new Date(doc.started_at);
  const ended = doc.ended_at ? new Date(doc.ended_at) : null;
  return [
    el("h2", { text: `Run ${run.run_id}` }),
    el("dl", { class: "facts" },
      el("dt", { text: "status" }), el("dd", {}, el("span", { class: `badge status-${run.status}`, "data-testid": "run-status", text: run.status })),
      el("dt", { text: "stop reason" }), el("dd", { "data-testid": "primary-stop-reason", text: run.stop_reason || "none" }),
      el("dt", { text: "outcome" }), el("dd", { "data-testid": "outcome", text: active ? "not ended" : doc.clean ? "clean success" : run.status === "success" ? "success, capped or stopped by a guard" : run.status }),
      el("dt", { text: "resume from" }), el("dd", { "data-testid": "resume", text: doc.resume_checkpoint_id ? `checkpoint ${doc.resume_checkpoint_id} (the thread's head)` : "no checkpoint" }),
      el("dt", { text: "thread" }), el("dd", { text: run.thread_id }),
      el("dt", { text: "assistant" }), el("dd", { text: run.assistant_id }),
      el("dt", { text: "attempt" }), el("dd", { text: String(run.attempt) }),
      el("dt", { text: "tokens" }), el("dd", { "data-testid": "tokens", text: tokens(active, usage, doc.model_calls) }),
      el("dt", { text: "duration" }), el("dd", { text: ended ? duration((ended - started) / 1000) : "running" })),
    el("div", { class: "actions" }, interrupt, rollback),
  ];
}

// The record's usage is written when the run ends; until then the journal's model calls say
// what it has spent so far.
function tokens(active, usage, calls) {
  if (!active) return `${usage.total_tokens || 0} (${usage.input_tokens || 0} in, ${usage.output_tokens || 0} out)`;
  const input = calls.reduce((sum, c) => sum + c.input_tokens, 0);
  const output = calls.reduce((sum, c) => sum + c.output_tokens, 0);
  return `${input + output} so far (${input} in, ${output} out)`;
}

function runBody(doc) {
  // Model callers first, so the charts and the waterfall give each the same colour.
  const callers = [...new Set([...doc.model_calls.map((c) => c.caller), ...doc.steps.map((s) => s.caller)])];
  const spenders = callers.filter((caller) => doc.model_calls.some((c) => c.caller === caller));
  const calls = doc.model_calls.length > 0;
  const none = el("p", { class: "hint", text: "no model call journaled" });
  const total = Math.max(0, ...doc.steps.map((s) => s.end_ms ?? s.start_ms ?? 0));
  const reasons = el("ol", { class: "reasons" }, ...(doc.run.stop_reasons || []).map((reason) =>
    el("li", { "data-code": reason.code },
      el("strong", { text: reason.code }), ` from ${reason.source || "?"} at seq ${reason.seq ?? "?"}`,
      reason.detail ? el("span", { class: "detail", text: `: ${reason.detail}` }) : null)));
  const stream = doc.stream.state === "gone" ? "stream gone (a live view with bounded retention; the journal and checkpoints are the record)"
    : `stream ${doc.stream.state} (${doc.stream.events} events)`;
  return [
    section("Stop reasons", "stop-reasons", doc.run.stop_reasons?.length ? reasons : el("p", { text: "none: the run stopped on its own" })),
    section("Divergences", "divergences", divergences(doc.divergences)),
    section("Attempts", "attempts", attempts(doc.attempts)),
    section("Timeline", "timeline", el("p", { class: "hint", text: `${doc.steps.length} rows over ${(total / 1000).toFixed(2)} s; journal up to seq ${doc.last_seq}, ${doc.checkpoints} checkpoints, ${stream}` }), waterfall(doc.steps, total, callers)),
    section("Token spend by caller", "spend", el("div", { "data-testid": "spend-chart" }, calls ? spendChart(doc.model_calls, spenders) : none)),
    section("Context size per model call", "context", el("div", { "data-testid": "context-chart" }, calls ? contextChart(doc.model_calls, callers) : none.cloneNode(true))),
    section("Files changed", "changes", ...(doc.changes.length ? doc.changes.map(fileChange) : [el("p", { text: "no file changed" })])),
    section("Subagents", "subagents", subagents(doc.subagents)),
    section("Chain manifest", "manifest", el("pre", { text: doc.manifest ? JSON.stringify(doc.manifest, null, 2) : "not journaled" })),
  ];
}

// Where journal, checkpoints and stream disagree, or have holes (runtime/divergence.py): a flag
// means a lost write, a bug or an edited store, never a normal run.
function divergences(flags) {
  if (!flags.length) return el("p", { class: "agree", "data-testid": "no-divergence", text: "none: journal, checkpoints and stream agree" });
  return el("ul", { class: "warnings" }, ...flags.map((flag) => el("li", { "data-code": flag.code },
    el("strong", { text: `⚠ ${flag.code}` }), flag.journal_seq === null ? "" : ` at seq ${flag.journal_seq}`,
    el("span", { class: "detail", text: `: ${flag.detail}` }))));
}

function attempts(list) {
  if (!list.length) return el("p", { class: "hint", text: "no attempt journaled yet" });
  return el("ol", { class: "attempts" }, ...list.map((a) => el("li", { "data-attempt": a.attempt },
    `attempt ${a.attempt}: ${a.began || "?"}${a.owner ? ` by ${a.owner}` : ""}${a.lost_owner ? ` (${a.lost_owner} lost)` : ""} → ${a.ended || "no end yet"}, seq ${a.first_seq}–${a.last_seq}`)));
}

function diffBlock(text) {
  const pre = el("pre", { class: "diff" });
  for (const line of text.split("\n")) {
    const kind = line.startsWith("+++") || line.startsWith("---") ? "file" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "ctx";
    pre.append(el("span", { class: `line ${kind}`, text: `${line}\n` }));
  }
  return pre;
}

function fileChange(change) {
  const steps = (change.steps || []).map((step, index) => el("li", { "data-tool-call-id": step.tool_call_id || "" },
    el("div", { class: "step-head", text: `step ${index + 1}: ${step.tool_name || "?"} (${step.tool_call_id || "no call"}, seq ${step.tool_seq ?? "?"})${step.agent ? ` by ${step.agent}` : ""}${step.verified === false ? " — replay does not match the recorded hash" : step.verified ? " — verified against the recorded hash" : ""}` }),
    step.diff ? diffBlock(step.diff) : el("p", { class: "hint", text: `content not recorded; sha256 ${short(step.before_sha256)} → ${short(step.after_sha256)}` })));
  return el("article", { class: "file", "data-path": change.path, "data-change": change.change },
    el("h3", { text: `${change.change} ${change.path}` }),
    el("p", { class: "hint", text: `sha256 ${short(change.before_sha256)} → ${short(change.after_sha256)}, recorded at seq ${change.seq}` }),
    change.diff ? el("details", { open: true }, el("summary", { text: "whole run" }), diffBlock(change.diff)) : null,
    steps.length ? el("ol", { class: "file-steps" }, ...steps) : el("p", { class: "hint", text: "changed outside any reporting tool (no steps)" }));
}

function short(sha) {
  return sha ? sha.slice(0, 12) : "none";
}

function subagents(children) {
  if (!children.length) return el("p", { text: "no subagent" });
  return el("table", {}, el("thead", {}, el("tr", {}, ...["task", "type", "status", "stop reason", "tokens", "turns", "files"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...children.map((c) => el("tr", { "data-task-id": c.task_id },
      el("td", { text: c.description || c.task_id }), el("td", { text: c.subagent_type || "" }), el("td", { text: c.status }),
      el("td", { text: c.stop_reason || "" }), el("td", { text: String(c.usage?.total_tokens ?? "") }),
      el("td", { text: String(c.turns ?? "") }), el("td", { text: (c.files_changed || []).join(", ") })))));
}

// -- shell ----------------------------------------------------------------------------------
function route() {
  leave();
  clearErrors();
  const match = location.hash.match(/^#\/runs\/([^/]+)\/([^/]+)$/);
  leave = match ? runView(decodeURIComponent(match[1]), decodeURIComponent(match[2])) : runsView();
}

function showAuth() {
  document.getElementById("auth-state").textContent = credential() ? "key set for this tab" : "no key";
}

document.getElementById("auth").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("api-key");
  setCredential(input.value.trim());
  input.value = "";
  showAuth();
  route();
});
document.getElementById("forget").addEventListener("click", () => { setCredential(""); showAuth(); route(); });
window.addEventListener("hashchange", route);
showAuth();
route();
