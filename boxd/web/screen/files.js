// A workspace as a file browser (#/files/WS/a/b): a folder's entries with their sizes, times and
// the task that last changed each, breadcrumbs, download of a file or the folder, upload by
// picking files or a folder or dropping them on the page, rename and delete. Names are written by
// tasks: they only ever become text nodes, their control and bidi characters shown as escapes.

import { api, get } from "./api.js";
import { act, h, replace, shown, toast } from "./dom.js";
import { apiPath, fileHash, folderHash, humanSize, renamedTo } from "./places.js";
import { putTask, state, watch } from "./store.js";
import { downloadFile, downloadFolder, dropped, picked, upload } from "./transfer.js";

// A time as the API gives it (ISO 8601, UTC), in the reader's own zone.
export function whenIso(text) {
  if (!text) return "";
  const date = new Date(text);
  return Number.isNaN(date.getTime()) ? String(text) : date.toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
}

// The task that last changed a file, by its title when the screen knows it.
export function taskLink(id) {
  if (!id) return h("span", { class: "muted" }, "the workspace's base");
  const task = state.tasks.get(id);
  return h("a", { href: `#/task/${encodeURIComponent(id)}`, "data-task-link": id }, shown(task ? task.title : id));
}

export function crumbs(workspace, parts, last = parts.length - 1) {
  const trail = [h("a", { href: "#/workspaces" }, "Workspaces"), " / ", h("a", { href: folderHash(workspace) }, shown(workspace))];
  parts.forEach((part, at) => {
    trail.push(" / ");
    trail.push(at < last ? h("a", { href: folderHash(workspace, parts.slice(0, at + 1)) }, shown(part)) : h("span", {}, shown(part)));
  });
  return h("nav", { class: "crumbs", "aria-label": "Where in the workspace" }, trail);
}

// The owner's change the box made of it, named so the owner can find (and undo) it; known to
// the page at once, so the listing names it by its title.
function changed(answer, fallback) {
  if (answer && answer.id) putTask(answer);
  toast(answer && answer.title ? shown(answer.title) : fallback);
}

export async function renameEntry(button, workspace, parts) {
  const answer = prompt(`New name for ${shown(parts.join("/"))} (a path with / moves it from the workspace's top)`, parts[parts.length - 1]);
  const to = renamedTo(parts, answer);
  if (!to || to.join("/") === parts.join("/")) return null;
  const done = await act(button, () => api("POST", apiPath("rename", workspace), { from: parts.join("/"), to: to.join("/") }));
  if (done) changed(done, "Renamed.");
  return done ? to : null;
}

export async function deleteEntry(button, workspace, parts, folder) {
  const what = `${folder ? "the folder" : ""} ${shown(parts.join("/"))}${folder ? " and everything in it" : ""}`.trim();
  if (!confirm(`Delete ${what} from the workspace ${shown(workspace)}? Undo on the change's task page brings it back.`)) return false;
  const done = await act(button, () => api("DELETE", apiPath("files", workspace, parts)));
  if (done) changed(done, "Deleted.");
  return Boolean(done);
}

function kindOf(entry) {
  if (entry.kind === "dir") return "folder";
  if (entry.kind === "link") return "link";
  if (entry.kind === "other") return "other";
  return "file";
}

function entryRow(workspace, parts, entry, reload) {
  const here = [...parts, entry.name];
  const name = shown(entry.name);
  // A name that is not UTF-8 comes as an escaped stand-in no path reaches: boxctl handles it.
  const reachable = !entry.nameNotUtf8;
  let label;
  if (!reachable) label = h("span", {}, name, h("span", { class: "muted" }, " (not UTF-8: use boxctl)"));
  else if (entry.kind === "dir") label = h("a", { href: folderHash(workspace, here), class: "entry dir" }, `${name}/`);
  else if (entry.kind === "file") label = h("a", { href: fileHash(workspace, here), class: "entry file" }, name);
  else if (entry.kind === "link") label = h("span", { class: "entry link" }, name, h("span", { class: "muted" }, ` → ${shown(entry.target ?? "?")}`));
  else label = h("span", { class: "entry other" }, name, h("span", { class: "muted" }, " (not a file, folder or link)"));
  const buttons = [];
  if (reachable && (entry.kind === "file" || entry.kind === "dir")) {
    buttons.push(h("button", { type: "button", class: "small", onclick: (event) => act(event.currentTarget, () => (entry.kind === "dir" ? downloadFolder(workspace, here) : downloadFile(workspace, here, entry.size))) }, "Download"));
  }
  if (reachable) {
    buttons.push(h("button", { type: "button", class: "small", onclick: async (event) => { if (await renameEntry(event.currentTarget, workspace, here)) reload(); } }, "Rename"));
    buttons.push(h("button", { type: "button", class: "small danger", onclick: async (event) => { if (await deleteEntry(event.currentTarget, workspace, here, entry.kind === "dir")) reload(); } }, "Delete"));
  }
  return h("tr", { "data-entry": entry.name, "data-kind": entry.kind },
    h("td", { class: "name" }, label),
    h("td", {}, kindOf(entry)),
    h("td", { class: "num" }, entry.kind === "dir" ? "" : humanSize(entry.size)),
    h("td", {}, whenIso(entry.modified)),
    h("td", {}, taskLink(entry.task)),
    h("td", { class: "row-actions" }, buttons));
}

function uploadControls(workspace, parts, reload) {
  const send = async (button, files) => {
    if (!files.length) return;
    const done = await act(button, () => upload(workspace, parts, files));
    if (done) { changed(done, `Uploaded ${files.length} file${files.length === 1 ? "" : "s"}.`); reload(); }
  };
  const filesInput = h("input", { type: "file", multiple: true, name: "files", class: "visually-hidden", id: "upload-files" });
  const folderInput = h("input", { type: "file", multiple: true, name: "folder", class: "visually-hidden", id: "upload-folder" });
  folderInput.webkitdirectory = true;
  const pickFiles = h("button", { type: "button", onclick: () => filesInput.click() }, "Upload files");
  const pickFolder = h("button", { type: "button", onclick: () => folderInput.click() }, "Upload a folder");
  filesInput.addEventListener("change", async () => { await send(pickFiles, picked(filesInput)); filesInput.value = ""; });
  folderInput.addEventListener("change", async () => { await send(pickFolder, picked(folderInput)); folderInput.value = ""; });
  return { controls: [pickFiles, pickFolder, filesInput, folderInput], send, pickFiles };
}

// Rows drawn at once: the box lists up to 10,000 entries of a folder, and a table of them all
// with their buttons takes the page a while to lay out.
const ROWS_AT_ONCE = 1000;

export function filesView(main, workspace, parts) {
  const table = h("div", {}, h("p", { class: "empty" }, "Loading…"));
  const more = h("div", {});
  const dropNote = h("p", { class: "drop-note muted" }, "Drop files or folders anywhere here to upload them to this folder.");
  let generation = 0;

  const draw = (answer, shownRows) => {
    const entries = answer.entries || [];
    const rows = entries.slice(0, shownRows).map((entry) => entryRow(workspace, parts, entry, reload));
    replace(table, rows.length
      ? h("table", { class: "entries" },
        h("thead", {}, h("tr", {}, ["Name", "Kind", "Size", "Changed", "By", ""].map((name) => h("th", { scope: "col" }, name)))),
        h("tbody", {}, rows))
      : h("p", { class: "empty" }, "This folder is empty."));
    const left = entries.length - rows.length;
    replace(more,
      left > 0 ? h("p", {}, h("button", { type: "button", onclick: () => draw(answer, entries.length) }, `Show the other ${left} entries`)) : null,
      answer.truncated ? h("p", { class: "muted", role: "status" }, `The listing stops after ${entries.length} entries: the folder holds more than the box lists at once.`) : null);
  };
  async function load() {
    const mine = ++generation;
    const answer = await get(apiPath("list", workspace, parts));
    if (mine === generation) draw(answer, ROWS_AT_ONCE);
  }
  function reload() {
    load().catch((error) => replace(table, h("p", { class: "error" }, error.message)));
  }
  const { controls, send, pickFiles } = uploadControls(workspace, parts, reload);
  const panel = h("section", { class: "panel browser", "aria-label": "Files" }, table, more);
  replace(main,
    crumbs(workspace, parts),
    h("h1", {}, parts.length ? shown(parts[parts.length - 1]) : shown(workspace)),
    h("div", { class: "actions" },
      controls,
      h("button", { type: "button", onclick: (event) => act(event.currentTarget, () => downloadFolder(workspace, parts)) }, parts.length ? "Download this folder" : "Download the workspace")),
    dropNote, panel);
  // Dropping anywhere on the view: the browser would otherwise open the file in place of the page.
  const over = (event) => { event.preventDefault(); main.classList.add("dropping"); };
  const out = () => main.classList.remove("dropping");
  const drop = async (event) => {
    event.preventDefault();
    out();
    let files;
    try { files = await dropped(event); } catch (error) { toast(`The browser could not read what was dropped: ${error.message}`, "bad"); return; }
    await send(pickFiles, files);
  };
  // A task of this workspace that ends (or is undone) changes what it holds: listed again.
  const ended = () => [...state.tasks.values()]
    .filter((task) => task.workspace === workspace && (task.state === "done" || task.state === "undone"))
    .map((task) => `${task.id}:${task.state}`).sort().join(",");
  let seen = ended();
  const stop = watch((what) => {
    if (what !== "tasks" && what !== "reconnected") return;
    const now = ended();
    if (now !== seen || what === "reconnected") { seen = now; reload(); }
  });
  main.addEventListener("dragover", over);
  main.addEventListener("dragleave", out);
  main.addEventListener("drop", drop);
  reload();
  return () => {
    stop();
    generation += 1;
    out();
    main.removeEventListener("dragover", over);
    main.removeEventListener("dragleave", out);
    main.removeEventListener("drop", drop);
  };
}
