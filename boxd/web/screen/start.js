// Starting a task: everything POST /api/tasks takes, with the box's own words for what is wrong.

import { get, post } from "./api.js";
import { act, field, h, lines, replace, toast } from "./dom.js";
import { putTask } from "./store.js";

const MAX_FILES = 8;

function readBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1] ?? "");
    reader.onerror = () => reject(new Error(`${file.name} could not be read`));
    reader.readAsDataURL(file);
  });
}

export function startView(main) {
  const title = h("input", { name: "title", required: true, maxlength: "200", autocomplete: "off" });
  const prompt = h("textarea", { name: "prompt", required: true, rows: "6" });
  const worker = h("select", { name: "worker" }, h("option", { value: "droid" }, "Droid"), h("option", { value: "claude" }, "Claude Code"), h("option", { value: "fake" }, "Fake (for trying the box)"));
  const model = h("input", { name: "model", list: "models", placeholder: "sonnet", autocomplete: "off" });
  const models = h("datalist", { id: "models" }, ["sonnet", "opus", "haiku"].map((name) => h("option", { value: name })));
  const autonomy = h("select", { name: "autonomy" }, ["low", "medium", "high"].map((value) => h("option", { value }, value)));
  const plan = h("input", { type: "checkbox", name: "plan", id: "plan" });
  const where = { workspace: h("input", { type: "radio", name: "where", value: "workspace", checked: true, id: "where-workspace" }),
    folders: h("input", { type: "radio", name: "where", value: "folders", id: "where-folders" }),
    files: h("input", { type: "radio", name: "where", value: "files", id: "where-files" }) };
  const workspace = h("select", { name: "workspace" }, h("option", { value: "home" }, "home"));
  const folders = h("textarea", { name: "folders", rows: "2", placeholder: "/home/you/notes" });
  const files = h("input", { type: "file", name: "files", multiple: true });
  const hosts = h("textarea", { name: "hosts", rows: "2", placeholder: "api.github.com, *.example.com" });
  const tools = h("input", { name: "tools", placeholder: "wallet.pay, mail.send", autocomplete: "off" });
  const budget = h("input", { name: "budgetCents", type: "number", min: "0", step: "1", inputmode: "numeric", placeholder: "from Settings" });
  const submit = h("button", { type: "submit", class: "primary" }, "Start task");

  const places = { workspace: field("Workspace", workspace), folders: field("Real folders, one per line", folders, "The task works on a copy; nothing changes in them until you keep it."), files: field(`Files to share (1 to ${MAX_FILES}, 5 MB in all)`, files, "They go to a new workspace of their own.") };
  const showPlace = () => { for (const [name, box] of Object.entries(places)) box.hidden = !where[name].checked; };
  Object.values(where).forEach((radio) => radio.addEventListener("change", showPlace));
  showPlace();

  async function request() {
    const body = { title: title.value, prompt: prompt.value, worker: worker.value, droid: { autonomy: autonomy.value, plan: plan.checked } };
    if (model.value.trim()) body.model = model.value.trim();
    if (where.workspace.checked) body.workspace = workspace.value;
    if (where.folders.checked) body.folders = folders.value.split("\n").map((line) => line.trim()).filter(Boolean);
    if (where.files.checked) {
      if (files.files.length > MAX_FILES) throw new Error(`Share at most ${MAX_FILES} files.`);
      body.files = await Promise.all([...files.files].map(async (file) => ({ name: file.name, content: await readBase64(file) })));
    }
    const hostList = lines(hosts.value);
    if (hostList.length) body.hosts = hostList;
    const toolList = lines(tools.value);
    if (toolList.length) body.tools = toolList;
    if (budget.value !== "") body.budgetCents = Number(budget.value);
    return body;
  }

  const form = h("form", { class: "stack panel", "aria-label": "New task", novalidate: true,
    onsubmit: async (event) => {
      event.preventDefault();
      const task = await act(submit, async () => post("/api/tasks", await request()));
      if (task) {
        putTask(task);
        toast(task.state === "queued" ? "Started: it waits as queued." : "Started.");
        location.hash = `#/task/${encodeURIComponent(task.id)}`;
      }
    } },
    field("Title", title),
    field("Prompt", prompt),
    h("div", { class: "row" }, field("Worker", worker), field("Model", model, "sonnet, opus, haiku or a full claude- model id"), field("Autonomy", autonomy)),
    h("div", { class: "choice" }, h("label", { for: "plan" }, plan, "Plan first (Droid's spec mode)")),
    h("fieldset", {}, h("legend", {}, "Where it works"),
      h("div", { class: "choice" },
        h("label", { for: "where-workspace" }, where.workspace, "A workspace"),
        h("label", { for: "where-folders" }, where.folders, "My real folders"),
        h("label", { for: "where-files" }, where.files, "Files I share")),
      places.workspace, places.folders, places.files),
    h("div", { class: "row" }, field("Hosts it may reach", hosts, "One per line or comma-separated; none if empty"), field("Tools", tools), field("Budget (US cents)", budget)),
    models,
    h("div", { class: "actions" }, submit));
  replace(main, h("h1", {}, "New task"), form);
  get("/api/workspaces").then((found) => {
    replace(workspace, found.map((ws) => h("option", { value: ws.name }, ws.name)));
    if (found.some((ws) => ws.name === "home")) workspace.value = "home";
  }).catch(() => {});
  title.focus();
  return () => {};
}
