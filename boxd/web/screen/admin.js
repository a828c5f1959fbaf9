// The box itself: workspaces, settings, the vault's names, tokens, paired devices, pause.

import { api, get, post } from "./api.js";
import { act, field, h, lines, replace, shown, toast, when } from "./dom.js";
import { setPaused, state, watch } from "./store.js";
import { folderHash } from "./places.js";

function table(headings, rows, empty) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", {}, h("thead", {}, h("tr", {}, headings.map((name) => h("th", { scope: "col" }, name)))), h("tbody", {}, rows));
}

export function workspacesView(main) {
  const list = h("div", {}, h("p", { class: "empty" }, "Loading…"));
  const name = h("input", { name: "name", required: true, autocomplete: "off", maxlength: "100" });
  const create = h("button", { type: "submit", class: "primary" }, "Create");
  async function load() {
    const found = await get("/api/workspaces");
    replace(list, table(["Name", "Path", ""], found.map((ws) => h("tr", { "data-workspace": ws.name },
      h("td", {}, h("a", { href: folderHash(ws.name), "data-browse": ws.name }, shown(ws.name))), h("td", { class: "mono" }, shown(ws.path ?? "")),
      h("td", {}, h("button", { type: "button", class: "danger", onclick: async (event) => {
        if (!confirm(`Remove the workspace ${ws.name}? It goes to the box's trash.`)) return;
        if (await act(event.currentTarget, () => api("DELETE", `/api/workspaces/${encodeURIComponent(ws.name)}`), "Removed.")) load();
      } }, "Remove")))), "No workspaces."));
  }
  replace(main, h("h1", {}, "Workspaces"),
    h("section", { class: "panel" }, list),
    h("form", { class: "panel stack", "aria-label": "New workspace", onsubmit: async (event) => {
      event.preventDefault();
      if (await act(create, () => post("/api/workspaces", { name: name.value.trim() }), "Created.")) { name.value = ""; load(); }
    } }, h("h2", {}, "New workspace"), field("Name", name), h("div", { class: "actions" }, create)));
  load().catch((error) => replace(list, h("p", { class: "error" }, error.message)));
  return () => {};
}

const LABELS = {
  defaultBudgetCents: "Default budget (US cents)",
  defaultHosts: "Default hosts, one per line",
  networkDefault: "Network for tasks that name no hosts",
  agentFolders: "Folders agents may work on, one per line",
  taskMemoryMaxBytes: "Memory per task (bytes)",
  taskTasksMax: "Processes per task",
  taskCPUPercent: "CPU per task (% of one core)",
  taskDiskQuotaBytes: "Disk per task (bytes; empty: no quota)",
  allTasksMemoryMaxBytes: "Memory for all tasks (bytes)",
  allTasksTasksMax: "Processes for all tasks",
  maxRunningTasks: "Tasks running at once",
  modelBaseUrl: "Model API address",
};

// A setting's input, by the type of its value: numbers, words, lists (one per line), choices.
const CHOICES = { networkDefault: ["none", "allowlist"] };
// Numbers that are null while off: an empty field.
const OFF_WHEN_EMPTY = new Set(["taskDiskQuotaBytes"]);

function settingInput(name, value) {
  if (CHOICES[name]) return h("select", { name }, CHOICES[name].map((choice) => h("option", { value: choice, selected: choice === value }, choice)));
  if (OFF_WHEN_EMPTY.has(name)) return h("input", { name, type: "number", step: "1", value: value === null ? "" : String(value), placeholder: "off" });
  if (Array.isArray(value)) { const area = h("textarea", { name, rows: "3" }); area.value = value.join("\n"); return area; }
  if (typeof value === "number") return h("input", { name, type: "number", step: "1", value: String(value) });
  return h("input", { name, value: String(value ?? ""), autocomplete: "off" });
}

function settingValue(input, was) {
  if (OFF_WHEN_EMPTY.has(input.name)) return input.value === "" ? null : Number(input.value);
  if (Array.isArray(was)) return input.value.split("\n").map((line) => line.trim()).filter(Boolean);
  if (typeof was === "number") return input.value === "" ? was : Number(input.value);
  return input.value;
}

function settingsPanel() {
  const box = h("section", { class: "panel", "aria-labelledby": "settings-h" }, h("h2", { id: "settings-h" }, "Settings"), h("p", { class: "empty" }, "Loading…"));
  async function load() {
    const current = await get("/api/settings");
    const inputs = Object.entries(current).map(([name, value]) => [name, value, settingInput(name, value)]);
    const save = h("button", { type: "submit", class: "primary" }, "Save settings");
    replace(box, h("h2", { id: "settings-h" }, "Settings"),
      h("form", { class: "stack", onsubmit: async (event) => {
        event.preventDefault();
        const changes = {};
        for (const [name, was, input] of inputs) {
          const now = settingValue(input, was);
          if (JSON.stringify(now) !== JSON.stringify(was)) changes[name] = now;
        }
        if (!Object.keys(changes).length) { toast("Nothing changed."); return; }
        if (await act(save, () => api("PATCH", "/api/settings", changes), "Saved.")) load();
      } }, h("div", { class: "row" }, inputs.map(([name, , input]) => field(LABELS[name] ?? name, input))), h("div", { class: "actions" }, save)));
  }
  load().catch((error) => replace(box, h("h2", {}, "Settings"), h("p", { class: "error" }, error.message)));
  return box;
}

// As `boxctl vault ls` says it (boxd/cli/show.py whose).
function whose(belongsTo) {
  if (belongsTo === null) return "no one: no tool or model gets it";
  if (belongsTo === "box") return "the box: a model key, for the model gateway only";
  return `app ${belongsTo}: its tools only`;
}

function vaultPanel() {
  const list = h("div", {});
  const name = h("input", { name: "secret-name", required: true, autocomplete: "off", placeholder: "ANTHROPIC_API_KEY" });
  const value = h("input", { name: "secret-value", type: "password", required: true, autocomplete: "new-password" });
  const set = h("button", { type: "submit", class: "primary" }, "Set");
  async function load() {
    const secrets = await get("/api/vault");
    replace(list, table(["Name", "Belongs to", ""], secrets.map((secret) => {
      const label = secret.name;
      return h("tr", { "data-secret": label }, h("td", { class: "mono" }, label), h("td", {}, whose(secret.belongsTo)), h("td", {},
        h("button", { type: "button", class: "danger", onclick: async (event) => {
          if (!confirm(`Remove ${label} from the vault?`)) return;
          if (await act(event.currentTarget, () => api("DELETE", `/api/vault/${encodeURIComponent(label)}`), "Removed.")) load();
        } }, "Remove")));
    }), "The vault is empty."));
  }
  load().catch((error) => replace(list, h("p", { class: "error" }, error.message)));
  return h("section", { class: "panel" }, h("h2", {}, "Vault"),
    h("p", { class: "muted" }, "An app's secrets are named app.name (mail.password) and reach that app's tools only; the model keys are the box's. No task and no screen ever sees a value."),
    list,
    h("form", { class: "stack", "aria-label": "Set a secret", onsubmit: async (event) => {
      event.preventDefault();
      const ok = await act(set, () => api("PUT", `/api/vault/${encodeURIComponent(name.value.trim())}`, { value: value.value }), "Saved in the vault.");
      value.value = "";
      if (ok) { name.value = ""; load(); }
    } }, h("div", { class: "row" }, field("Name", name), field("Value", value)), h("div", { class: "actions" }, set)));
}

function tokensPanel() {
  const tokens = h("div", {});
  const devices = h("div", {});
  const pairing = h("div", {});
  const deviceName = h("input", { name: "device", required: true, autocomplete: "off", placeholder: "my phone" });
  const pair = h("button", { type: "submit", class: "primary" }, "Make a pairing code");
  const revoke = (token) => h("button", { type: "button", class: "danger", onclick: async (event) => {
    if (!confirm(`Revoke ${token.name}? It stops working at once.`)) return;
    if (await act(event.currentTarget, () => api("DELETE", `/api/tokens/${encodeURIComponent(token.id)}`), "Revoked.")) load();
  } }, "Revoke");
  const row = (token) => h("tr", { "data-token": token.id }, h("td", {}, token.name), h("td", {}, token.role), h("td", {}, when(token.createdAt)), h("td", {}, revoke(token)));
  const limitedRow = (token) => h("tr", { "data-token": token.id }, h("td", {}, token.name), h("td", {}, token.role),
    h("td", { "data-limits": "" }, token.limits ? limitsText(token.limits) : "acts as the owner"), h("td", {}, when(token.createdAt)), h("td", {}, revoke(token)));
  async function load() {
    const found = await get("/api/tokens");
    replace(tokens, table(["Name", "Role", "Limits", "Made", ""], found.filter((t) => t.role !== "device").map(limitedRow), "No tokens. Make one below, or with boxctl token create."));
    replace(devices, table(["Name", "Role", "Paired", ""], found.filter((t) => t.role === "device").map(row), "No paired devices."));
  }
  load().catch((error) => replace(tokens, h("p", { class: "error" }, error.message)));
  return [
    h("section", { class: "panel" }, h("h2", {}, "Paired devices"), devices,
      h("form", { class: "stack", "aria-label": "Pair a device", onsubmit: async (event) => {
        event.preventDefault();
        const made = await act(pair, () => post("/api/pairings", { name: deviceName.value.trim() }));
        if (!made) return;
        const qr = made.qrSvg ? h("img", { src: `data:image/svg+xml;charset=utf-8,${encodeURIComponent(made.qrSvg)}`, alt: `QR code of the pairing code ${made.code}` }) : null;
        replace(pairing, h("div", { class: "pairing" }, qr, h("div", {},
          h("p", {}, "On the device, enter this code (or scan it) within ten minutes:"),
          h("p", { class: "code mono", "data-pairing-code": made.code }, made.code),
          made.expiresInSeconds ? h("p", { class: "muted" }, `For ${made.device}; good once, until ${when(Date.now() / 1000 + made.expiresInSeconds)}.`) : null)));
        deviceName.value = "";
      } }, field("Device name", deviceName), h("div", { class: "actions" }, pair)), pairing),
    h("section", { class: "panel" }, h("h2", {}, "Tokens"), tokens, tokenForm(load)),
  ];
}

// What an app's or a member's token lets its tasks have, as boxctl token ls says it.
function limitsText(limits) {
  const budget = limits.maxBudgetCents === null || limits.maxBudgetCents === undefined ? "the default budget" : `${limits.maxBudgetCents} cents`;
  const named = (what) => (limits[what] && limits[what].length ? `${what} ${limits[what].join(", ")}` : `no ${what}`);
  return [`budget at most ${budget}`, named("tools"), named("hosts"), named("workspaces")].join("; ");
}

// A new token with its limits; the box checks every field and says what it refused. The token
// is shown here once: only its hash is kept.
function tokenForm(reload) {
  const name = h("input", { name: "token-name", required: true, autocomplete: "off", maxlength: "100", placeholder: "u-4711, or the app's name" });
  const role = h("select", { name: "token-role" }, [["member", "A member (a person in the business)"], ["app", "An app"], ["owner", "The owner (a script of yours, no limits)"]].map(([value, text]) => h("option", { value }, text)));
  // Text, not a number input: the box refuses what is not a whole number, in its own words,
  // rather than the browser turning it into nothing.
  const budget = h("input", { name: "token-budget", inputmode: "numeric", autocomplete: "off", placeholder: "the default budget" });
  const tools = h("textarea", { name: "token-tools", rows: "2", placeholder: "none" });
  const hosts = h("textarea", { name: "token-hosts", rows: "2", placeholder: "none" });
  const workspaces = h("textarea", { name: "token-workspaces", rows: "2" });
  workspaces.value = "home";
  const limited = h("div", { class: "row" }, field("Highest budget (US cents)", budget), field("Tools, one per line", tools),
    field("Hosts, one per line", hosts, "example.com, example.com:443 or *.example.com"), field("Workspaces, one per line", workspaces));
  role.addEventListener("change", () => { limited.hidden = role.value === "owner"; });
  const shown = h("div", {});
  const make = h("button", { type: "submit", class: "primary" }, "Make a token");
  return h("form", { class: "stack", "aria-label": "Make a token", onsubmit: async (event) => {
    event.preventDefault();
    const body = { name: name.value.trim(), role: role.value };
    if (role.value !== "owner") {
      const cents = budget.value.trim();
      body.limits = { tools: lines(tools.value), hosts: lines(hosts.value), workspaces: lines(workspaces.value) };
      if (cents) body.limits.maxBudgetCents = /^[0-9]+$/.test(cents) ? Number(cents) : cents;
    }
    const made = await act(make, () => post("/api/tokens", body), "Token made.");
    if (!made) return;
    replace(shown, h("div", { class: "pairing" }, h("div", {},
      h("p", {}, `The token for ${body.name}, shown this once (send it as Authorization: Bearer):`),
      h("p", { class: "code mono", "data-made-token": "" }, made.token))));
    name.value = ""; budget.value = ""; tools.value = ""; hosts.value = ""; workspaces.value = "home";
    reload();
  } }, h("h3", {}, "Make a token"), h("div", { class: "row" }, field("Name", name), field("For", role)), limited, h("div", { class: "actions" }, make), shown);
}

function pausePanel() {
  const box = h("section", { class: "panel" });
  const render = () => {
    const button = h("button", { type: "button", class: state.paused ? "primary" : "", onclick: (event) => togglePause(event.currentTarget) }, state.paused ? "Resume agents" : "Pause agents");
    replace(box, h("h2", {}, "Agents"), h("p", {}, state.paused ? "Paused: new tasks wait as queued." : "Running: new tasks start at once."), button);
  };
  render();
  return { element: box, stop: watch((what) => { if (what === "pause") render(); }) };
}

export async function togglePause(button) {
  const answer = await act(button, () => post(state.paused ? "/api/resume" : "/api/pause"), state.paused ? "Resumed." : "Paused.");
  if (answer) setPaused(Boolean(answer.paused));
}

export function settingsView(main) {
  const pause = pausePanel();
  replace(main, h("h1", {}, "Settings"), pause.element, settingsPanel(), vaultPanel(), tokensPanel());
  return pause.stop;
}

