// The box's events as they happen (GET /api/events, Server-Sent Events fed by boxd's D-Bus
// signals). The browser reconnects by itself; after a gap the page reloads what it shows, since
// events sent meanwhile are gone.

const handlers = { step: new Set(), task: new Set(), approval: new Set(), reconnected: new Set() };

export function on(kind, handler) { handlers[kind].add(handler); }
export function off(kind, handler) { handlers[kind].delete(handler); }

function tell(kind, data) { handlers[kind].forEach((handler) => handler(data)); }

let wasOpen = false;
let lost = false;

export function connect() {
  const badge = document.getElementById("live");
  const source = new EventSource("/api/events");
  source.addEventListener("open", () => {
    badge.textContent = "live";
    badge.className = "live on";
    if (wasOpen && lost) tell("reconnected", null);
    wasOpen = true;
    lost = false;
  });
  source.addEventListener("error", () => {
    lost = true;
    badge.className = "live off";
    if (source.readyState !== EventSource.CLOSED) {
      badge.textContent = "reconnecting";
      return;
    }
    // A refusal (the session ended, or too many screens open) closes it for good: try again
    // now and then, which also notices a new login.
    badge.textContent = "offline";
    setTimeout(connect, 5000);
  });
  // The box's last word on a stream whose caller may no longer hear it (a revoked session):
  // try again later, which a new login answers, and the API's 401 says how to log in.
  source.addEventListener("end", () => {
    source.close();
    badge.textContent = "offline";
    badge.className = "live off";
    lost = true;
    setTimeout(connect, 5000);
  });
  for (const kind of ["step", "task", "approval"]) {
    source.addEventListener(kind, (message) => {
      let data;
      try { data = JSON.parse(message.data); } catch { return; }
      tell(kind, data);
    });
  }
  return source;
}
