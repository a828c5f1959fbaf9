// The tasks: the list (what waits for the owner first), the approvals, and one task's story,
// files and review.

import { get, post } from "./api.js";
import { act, diffKinds, dollars, h, replace, shown, when } from "./dom.js";
import * as live from "./live.js";
import { loadApprovals, putTask, state, watch } from "./store.js";
import { fileHash, folderHash, partsOf } from "./places.js";

const ORDER = { waiting: 0, running: 1, queued: 2, failed: 3, done: 4, undone: 5 };
const ENDED = new Set(["done", "failed", "undone"]);

function stateBadge(value) {
  return h("span", { class: `state ${value}` }, value);
}

function budget(task) {
  const spent = Number(task.costCents || 0);
  const limit = Number(task.budgetCents || 0);
  const share = limit > 0 ? Math.min(100, (spent / limit) * 100) : spent > 0 ? 100 : 0;
  const bar = h("span", { class: `bar${spent > limit ? " over" : ""}`, role: "img", "aria-label": `${dollars(spent)} of a ${dollars(limit)} budget` });
  const fill = h("span", {});
  // Through the CSSOM: the page's policy refuses style attributes.
  fill.style.width = `${share.toFixed(1)}%`;
  bar.append(fill);
  return h("div", { class: "budget" }, bar, `${dollars(spent)} of ${dollars(limit)}`);
}

function taskRow(task) {
  return h("li", {},
    h("a", { class: `task ${task.state}`, href: `#/task/${encodeURIComponent(task.id)}`, "data-task": task.id },
      h("span", { class: "title" }, shown(task.title)),
      stateBadge(task.state),
      task.step ? h("span", { class: "step" }, shown(task.step, true)) : null,
      task.error ? h("span", { class: "step" }, shown(task.error, true)) : null,
      budget(task)));
}

// The budget an approval would pass: what the task spent, and this on top.
function approvalCard(approval) {
  const task = state.tasks.get(approval.task);
  const facts = h("dl", { class: "facts" });
  // Payee and purpose are the task's words: a bidi override there could turn what is paid around.
  const fact = (name, value) => { if (value !== undefined && value !== null && value !== "") facts.append(h("dt", {}, name), h("dd", {}, shown(value))); };
  fact("Task", task ? task.title : approval.task);
  fact("Tool", approval.tool);
  fact("Model", approval.model);
  fact("Payee", approval.payee);
  fact("Purpose", approval.purpose);
  if (approval.costCents !== undefined && approval.costCents !== null) {
    fact("Cost", dollars(approval.costCents));
    if (task) {
      const total = Number(task.costCents || 0) + Number(approval.costCents);
      const over = total > Number(task.budgetCents || 0);
      fact("Budget", `${dollars(total)} spent with this, ${over ? "over" : "within"} its ${dollars(task.budgetCents)} budget`);
    }
  }
  fact("Asked", when(approval.askedAt));
  const answer = (approved) => async (event) => {
    await act(event.currentTarget, () => post(`/api/approvals/${encodeURIComponent(approval.id)}`, { approved }), approved ? "Approved." : "Denied.");
    await loadApprovals().catch(() => {});
  };
  return h("section", { class: "approval", "data-approval": approval.id, "aria-label": "Waiting for your OK" },
    h("div", { class: "question" }, shown(approval.question ?? "", true)),
    facts,
    h("div", { class: "actions" },
      h("button", { type: "button", class: "primary", onclick: answer(true) }, "Approve"),
      h("button", { type: "button", class: "danger", onclick: answer(false) }, "Deny")));
}

export function approvalsPanel(filter = () => true) {
  const panel = h("div", { class: "approvals" });
  const render = () => {
    const shown = state.approvals.filter(filter);
    replace(panel, shown.length ? [h("h2", {}, "Waiting for your OK"), shown.map(approvalCard)] : []);
  };
  render();
  return { element: panel, render };
}

export function tasksView(main) {
  const approvals = approvalsPanel();
  const list = h("ul", { class: "list", "aria-label": "Tasks" });
  const render = () => {
    approvals.render();
    const tasks = [...state.tasks.values()].sort(
      (a, b) => (ORDER[a.state] ?? 9) - (ORDER[b.state] ?? 9) || b.createdAt - a.createdAt);
    replace(list, tasks.length ? tasks.map(taskRow) : h("li", { class: "empty" }, state.loaded ? "No tasks yet. Start one from New task." : "Loading…"));
  };
  replace(main, h("h1", {}, "Tasks"), approvals.element, h("div", { class: "panel" }, list));
  render();
  return watch(render);
}

function storyLine(event) {
  const data = event.data || {};
  let text;
  let kind = "other";
  switch (event.kind) {
    case "task.step": text = data.text; kind = "step"; break;
    case "task.state": text = `The task is ${data.state}${data.error ? `: ${data.error}` : ""}`; break;
    case "tool.call": text = `Calls ${data.tool ?? "a tool"}`; break;
    case "tool.result": text = `${data.tool ?? "The tool"} ${data.ok ? "answered" : `failed: ${data.error ?? ""}`}${data.costCents ? ` (${dollars(data.costCents)})` : ""}`; break;
    case "cost": text = `Spent ${dollars(data.cents)}${data.what ? ` on ${data.what}` : ""}`; break;
    case "approval": text = data.state ? `Approval ${data.state}${data.question ? `: ${data.question}` : ""}` : `Asks: ${data.question ?? ""}`; break;
    case "net.refused": text = `Refused: ${data.target ?? "a connection"} (${data.reason ?? ""})${data.count > 1 ? ` ×${data.count}` : ""}`; break;
    default: text = event.kind;
  }
  return h("li", { class: kind, "data-seq": event.seq }, h("time", {}, when(event.at)), h("span", { class: "text" }, shown(text ?? "", true)));
}

function diffLines(text) {
  const lines = text.split("\n");
  const kinds = diffKinds(lines);
  return h("pre", {}, lines.map((line, at) => h("span", { class: `line ${kinds[at]}` }, shown(line))));
}

// Where a done workspace task's changed file now is in the workspace's browser (what a later
// task did to it shows there); nothing for a file it deleted, or a task on real folders.
function placesOf(task) {
  if (task.state !== "done" || !task.workspace || task.folders || task.folder) return () => null;
  return (file) => {
    if (file.change === "deleted" || (file.kind !== "file" && file.kind !== "dir")) return null;
    return (file.kind === "dir" ? folderHash : fileHash)(task.workspace, partsOf(file.path));
  };
}

// One entry of the review (GET /api/tasks/{id}/diff): a text diff, or why there is none; its
// name a link to its place in the workspace when `place` names one.
export function changeView(file, open = false, place = null) {
  const what = h("span", { class: `change ${file.change}` }, file.change);
  const note = (text) => h("span", { class: "muted" }, ` (${text})`);
  const why = [];
  if (file.kind === "dir") why.push("folder");
  if (file.kind === "link") why.push(`link to ${shown(file.target ?? file.oldTarget ?? "?")}`);
  if (file.kind === "other") why.push("not a file, folder or link");
  if (file.oldKind && file.oldKind !== file.kind) why.push(`was a ${file.oldKind}`);
  if (file.binary) why.push("binary file");
  if (file.tooLarge) why.push("too large to compare");
  if (file.notShown) why.push(file.notShown);
  if (file.skipped) why.push(`keep leaves it out: ${file.skipped}`);
  if (file.truncated) why.push("diff cut short");
  const href = place ? place(file) : null;
  const path = href ? h("a", { href, class: "place", "data-place": file.path, title: "Open it in the workspace" }, shown(file.path)) : shown(file.path);
  const name = [what, path, why.length ? note(why.join("; ")) : null];
  if (!file.diff) return h("li", {}, name);
  // Drawn when first opened: a task can change a thousand files of a quarter megabyte each.
  const details = h("details", { class: "diff" }, h("summary", {}, name));
  const draw = () => { if (details.open && details.childElementCount === 1) details.append(diffLines(file.diff)); };
  details.addEventListener("toggle", draw);
  details.open = open;
  draw();
  return h("li", {}, details);
}

async function loadFiles(task, box) {
  if (task.state === "queued") { replace(box, h("p", { class: "empty" }, "Nothing yet.")); return; }
  try {
    const diff = await get(`/api/tasks/${encodeURIComponent(task.id)}/diff`);
    const files = diff.files || [];
    const place = placesOf(task);
    replace(box,
      files.length ? h("ul", { class: "files" }, files.map((file) => changeView(file, files.length <= 10, place))) : h("p", { class: "empty" }, "No files changed."),
      diff.truncated ? h("p", { class: "muted" }, "The list stops here: the task changed more than the review shows.") : null);
  } catch (error) {
    replace(box, h("p", { class: "empty" }, error.message));
  }
}

function detailActions(task, reload) {
  const buttons = [];
  const run = (path, done) => async (event) => {
    const answer = await act(event.currentTarget, () => post(`/api/tasks/${encodeURIComponent(task.id)}/${path}`), done);
    if (answer) { putTask(answer); reload(); }
  };
  if (!ENDED.has(task.state)) buttons.push(h("button", { type: "button", class: "danger", onclick: run("stop", "Stopped.") }, "Stop"));
  if (task.review === "pending") buttons.push(h("button", { type: "button", class: "primary", onclick: run("keep", "Kept: the changes are in your folders.") }, "Keep changes"));
  if (ENDED.has(task.state) && task.state !== "undone") buttons.push(h("button", { type: "button", onclick: run("undo", "Undone.") }, "Undo"));
  return h("div", { class: "actions" }, buttons);
}

function facts(task) {
  const list = h("dl", { class: "facts" });
  const fact = (name, value) => { if (value !== undefined && value !== null && value !== "") list.append(h("dt", {}, name), h("dd", {}, value)); };
  fact("Worker", task.worker + (task.model ? ` · ${task.model}` : ""));
  fact("Where", task.folders ? task.folders.join(", ") : task.folder ?? ["workspace ", h("a", { href: folderHash(task.workspace) }, shown(task.workspace))]);
  fact("Source", task.source);
  fact("Requester", task.requester);
  fact("App", task.app);
  fact("Hosts", (task.hosts || []).join(", ") || "none");
  fact("Tools", (task.tools || []).join(", ") || "none");
  fact("Review", task.review);
  fact("Started", when(task.createdAt));
  fact("Ended", when(task.endedAt));
  fact("Saw", (task.saw || []).join(", "));
  return list;
}

// An open tab shows the last lines of a story, so a task that logs for days cannot fill the
// browser's memory; the whole story is in `boxctl show ID`.
const STORY_LINES = 500;

export function taskView(main, id) {
  const header = h("div", {});
  const story = h("ol", { class: "story", "aria-label": "The task's story", "aria-live": "polite" });
  const files = h("div", {}, h("p", { class: "empty" }, "Loading…"));
  const approvals = approvalsPanel((approval) => approval.task === id);
  const side = h("div", {});
  const filesHeading = h("h2", {}, "Files it changed");
  let task = null;
  let lastSeq = 0;
  let filesShownFor = "";
  let hidden = 0;
  const earlier = h("li", { class: "empty" });

  const renderHeader = () => {
    if (!task) return;
    replace(header,
      h("p", {}, h("a", { href: "#/tasks" }, "← All tasks")),
      h("h1", {}, shown(task.title), " ", stateBadge(task.state)),
      task.error ? h("p", { class: "error", role: "alert" }, shown(task.error, true)) : null,
      budget(task),
      detailActions(task, reload));
    replace(side, h("h2", {}, "About"), facts(task), h("h2", {}, "Prompt"), h("p", { class: "prose" }, shown(task.prompt ?? "", true)));
    filesHeading.textContent = task.review === "pending" ? "Review its changes, then keep or undo" : "Files it changed";
    const filesKey = `${task.state}:${task.review ?? ""}`;
    if (filesKey !== filesShownFor) { filesShownFor = filesKey; loadFiles(task, files); }
  };
  const addEvent = (event) => {
    if (event.seq <= lastSeq) return;
    lastSeq = event.seq;
    if (story.firstChild && story.firstChild.classList.contains("empty") && story.firstChild !== earlier) story.replaceChildren();
    story.append(storyLine(event));
    if (story.childElementCount - (hidden ? 1 : 0) > STORY_LINES) {
      if (!hidden) story.prepend(earlier);
      earlier.nextSibling.remove();
      hidden += 1;
      earlier.textContent = `${hidden} earlier steps are not shown here (boxctl show ${id} has them all).`;
    }
  };
  async function reload() {
    try {
      const whole = await get(`/api/tasks/${encodeURIComponent(id)}`);
      const { steps, ...rest } = whole;
      task = rest;
      putTask(rest);
      story.replaceChildren();
      lastSeq = 0;
      hidden = 0;
      for (const step of steps) addEvent({ kind: "task.step", seq: step.seq, at: step.at, data: step });
      if (!steps.length) story.append(h("li", { class: "empty" }, "No steps yet."));
      renderHeader();
    } catch (error) {
      replace(main, h("p", { class: "error" }, error.message), h("p", {}, h("a", { href: "#/tasks" }, "← All tasks")));
    }
  }
  replace(main, header,
    h("div", { class: "grid" },
      h("div", {}, approvals.element, h("section", { class: "panel" }, h("h2", {}, "Story"), story),
        h("section", { class: "panel", "aria-label": "Files" }, filesHeading, files)),
      h("aside", { class: "panel" }, side)));
  const onStep = ({ task: which, event }) => { if (which === id && event) addEvent(event); };
  live.on("step", onStep);
  const stop = watch((what) => {
    approvals.render();
    if (what === "reconnected") { reload(); return; }
    const known = state.tasks.get(id);
    if (task && known && known !== task) { task = { ...task, ...known }; renderHeader(); }
  });
  reload();
  return () => { stop(); live.off("step", onStep); };
}

