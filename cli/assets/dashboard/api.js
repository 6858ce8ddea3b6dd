// The HTTP API as the dashboard speaks it (docs/http-api.md). Every
// request carries the operator's token from this tab's session storage,
// never from the URL. A 401 is `Unauthorized`; any other refusal is an
// `ApiError` with the server's own reason (the problem document's detail).

const TOKEN = "ratchet-api-token";

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

export function setToken(token) {
  sessionStorage.setItem(TOKEN, token);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN);
}

export function hasToken() {
  return sessionStorage.getItem(TOKEN) !== null;
}

function headers(accept, extra = {}) {
  const all = { Accept: accept, ...extra };
  const token = sessionStorage.getItem(TOKEN);
  if (token) all.Authorization = `Bearer ${token}`;
  return all;
}

async function send(method, path, { accept = "application/json", body, signal } = {}) {
  const init = { method, headers: headers(accept), signal, cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.ok) return response;
  const detail = await reason(response);
  if (response.status === 401) throw new Unauthorized(detail);
  throw new ApiError(response.status, detail);
}

async function reason(response) {
  try {
    const problem = await response.json();
    return problem.detail || problem.title || response.statusText;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

export async function get(path, signal) {
  return (await send("GET", path, { signal })).json();
}

export async function post(path, body = {}) {
  return (await send("POST", path, { body })).json();
}

/** An artifact's bytes, with the media type the server gave them. */
export async function bytes(path) {
  const response = await send("GET", path, { accept: "*/*" });
  return response.blob();
}

/**
 * A run's Server-Sent Events (`event: run` or `stage`, JSON data) until
 * the run has finished or `signal` aborts. Read with fetch, not
 * EventSource, which cannot send the token in a header.
 */
export async function* events(path, signal) {
  const response = await send("GET", path, { accept: "text/event-stream", signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { event: "message", data: "" };
      for (const line of block.split("\n")) {
        const colon = line.indexOf(":");
        if (colon <= 0) continue;
        const field = line.slice(0, colon);
        const text = line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event.event = text;
        if (field === "data") event.data += text;
      }
      if (event.data) yield { event: event.event, data: JSON.parse(event.data) };
    }
  }
}

export const path = {
  runs: (query) => `/runs?${new URLSearchParams(query)}`,
  run: (id) => `/runs/${encodeURIComponent(id)}`,
  sub: (id, tail) => `/runs/${encodeURIComponent(id)}/${tail}`,
  artifact: (id, stage, output) =>
    `/runs/${encodeURIComponent(id)}/artifacts/${encodeURIComponent(stage)}/${encodeURIComponent(output)}`,
  gate: (id, stage, verdict) =>
    `/runs/${encodeURIComponent(id)}/stages/${encodeURIComponent(stage)}/${verdict}`,
};
