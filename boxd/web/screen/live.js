// The box's events as they happen (GET /api/events, Server-Sent Events fed by boxd's D-Bus
// signals), read with fetch rather than EventSource, which cannot send the session's header.
// After a gap the page reloads what it shows, since events sent meanwhile are gone.

import { request } from "./api.js";

const handlers = { step: new Set(), task: new Set(), approval: new Set(), reconnected: new Set() };

export function on(kind, handler) { handlers[kind].add(handler); }
export function off(kind, handler) { handlers[kind].delete(handler); }

function tell(kind, data) { handlers[kind].forEach((handler) => handler(data)); }

// A stream that broke is opened again soon, as EventSource would; one the box refused or ended
// (too many screens open, the session revoked) is tried now and then, which a 401 ends.
const AGAIN_MS = 1000;
const REFUSED_MS = 5000;

let controller = null;
let running = false;

function badge(text, on) {
  const shown = document.getElementById("live");
  shown.textContent = text;
  shown.className = on ? "live on" : "live off";
}

// One event of the stream's text (lines up to a blank line), as the EventSource spec reads it.
function parse(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const at = line.indexOf(":");
    const field = at < 0 ? line : line.slice(0, at);
    let value = at < 0 ? "" : line.slice(at + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { name, data: data.join("\n") } : null;
}

// Passes on the events until the stream ends: true when the box said its last word ("end").
async function read(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return false;
      text += value.replace(/\r\n?/g, "\n");
      let at;
      while ((at = text.indexOf("\n\n")) >= 0) {
        const event = parse(text.slice(0, at));
        text = text.slice(at + 2);
        if (!event) continue;
        if (event.name === "end") return true;
        if (!(event.name in handlers) || event.name === "reconnected") continue;
        let data;
        try { data = JSON.parse(event.data); } catch { continue; }
        tell(event.name, data);
      }
    }
  } catch {
    return false;
  } finally {
    reader.cancel().catch(() => {});
  }
}

const pause = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

async function run() {
  let wasOpen = false;
  let lost = false;
  while (running) {
    controller = new AbortController();
    let wait = REFUSED_MS;
    try {
      const response = await request("GET", "/api/events", { accept: "text/event-stream", signal: controller.signal });
      badge("live", true);
      if (wasOpen && lost) tell("reconnected", null);
      wasOpen = true;
      lost = false;
      const ended = await read(response.body);
      if (!running) return;
      lost = true;
      badge(ended ? "offline" : "reconnecting", false);
      if (!ended) wait = AGAIN_MS;
    } catch (error) {
      if (!running) return;
      lost = true;
      badge("offline", false);
      // The session is gone: the page says how to log in again; nothing to try.
      if (error.status === 401) { running = false; return; }
    }
    await pause(wait);
  }
}

export function connect() {
  if (running) return;
  running = true;
  run();
}

export function disconnect() {
  running = false;
  if (controller) controller.abort();
  badge("offline", false);
}
