// The console's one way to the gateway: every request carries the credential the user typed
// (kept in sessionStorage: this tab only, gone when it closes, never sent by the browser on its
// own as a cookie would be). It is sent as `x-api-key` (auth.mode api_keys) and as
// `Authorization: Bearer` (api_keys and jwt), exactly as an SDK client sends it.
// URLs are relative to the page (/console), so a gateway behind a path prefix works too.

const KEY = "agentkeel.credential";

export function credential() {
  return sessionStorage.getItem(KEY) || "";
}

export function setCredential(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const result = { ...extra };
  const key = credential();
  if (key) {
    result["x-api-key"] = key;
    result["authorization"] = `Bearer ${key}`;
  }
  return result;
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

function url(path, query = {}) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") params.append(name, String(value));
  }
  const text = params.toString();
  return path + (text ? `?${text}` : "");
}

export async function api(path, { method = "GET", query = {}, signal } = {}) {
  const response = await fetch(url(path, query), { method, headers: headers({ accept: "application/json" }), signal });
  if (!response.ok) {
    let detail = response.statusText;
    try {
      detail = (await response.json()).detail || detail;
    } catch {
      // a body that is not JSON: the status text says enough
    }
    throw new ApiError(response.status, detail);
  }
  if (response.status === 202 || response.status === 204) return null;
  return response.json();
}

// Follow a run's SSE stream (GET .../stream, the same route SDK clients join) until the server
// closes it after END. `onEvent({event, data, id})` is called per event; resolves on the close.
// fetch, not EventSource: EventSource cannot send the credential headers.
export async function follow(path, onEvent, signal) {
  const response = await fetch(path, { headers: headers({ accept: "text/event-stream" }), signal });
  if (!response.ok) throw new ApiError(response.status, response.statusText);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const parsed = parseFrame(frame);
      if (parsed) onEvent(parsed);
    }
  }
}

function parseFrame(frame) {
  const event = { event: "message", data: "", id: null };
  let any = false;
  for (const line of frame.split("\n")) {
    if (!line || line.startsWith(":")) continue; // heartbeats are comments
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event.event = value;
    else if (field === "data") event.data += (event.data ? "\n" : "") + value;
    else if (field === "id") event.id = value;
    any = true;
  }
  if (!any) return null;
  try {
    event.data = event.data ? JSON.parse(event.data) : null;
  } catch {
    // keep the raw text
  }
  return event;
}
