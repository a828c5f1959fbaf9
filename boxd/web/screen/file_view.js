// One file of a workspace (#/file/WS/a/b.md): its text or its picture, else a download; who
// changed it (its history, newest first), download, rename and delete.
//
// The file's bytes are a task's: text becomes a text node with its control and bidi characters
// escaped; a picture is shown as an <img> of a blob, where an SVG's script never runs (and the
// files route forbids it anyway with a sandboxing policy).

import { ApiError, get, request } from "./api.js";
import { act, h, replace, shown } from "./dom.js";
import { crumbs, deleteEntry, renameEntry, taskLink } from "./files.js";
import { apiPath, fileHash, folderHash, humanSize, totalSize } from "./places.js";
import { downloadFile } from "./transfer.js";

// Enough text for a page; the rest is a download away.
export const TEXT_LIMIT = 256 * 1024;
// Pictures past this are not fetched just to be shown.
export const IMAGE_LIMIT = 20 * 1000 * 1000;
const TEXTUAL = /^(text\/|application\/(json|xml|javascript|x-sh|toml|yaml)\b)|\+(json|xml)\b/;

async function readUpTo(response, limit) {
  // A 200 to a ranged request is the whole file: read no more of it than the page shows.
  if (!response.body) return new Uint8Array(0);
  const reader = response.body.getReader();
  const chunks = [];
  let length = 0;
  while (length < limit) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    length += value.length;
  }
  reader.cancel().catch(() => {});
  const bytes = new Uint8Array(Math.min(length, limit));
  let at = 0;
  for (const chunk of chunks) {
    const part = chunk.subarray(0, bytes.length - at);
    bytes.set(part, at);
    at += part.length;
    if (at >= bytes.length) break;
  }
  return bytes;
}

async function fetchStart(path) {
  try {
    return await request("GET", path, { accept: "*/*", headers: { Range: `bytes=0-${TEXT_LIMIT - 1}` } });
  } catch (error) {
    // An empty file has no byte 0 to send: 416, and the whole (empty) file is what to show.
    if (error instanceof ApiError && error.status === 416) return request("GET", path, { accept: "*/*" });
    throw error;
  }
}

// The preview, and what the answer said of the file (its size and type).
async function preview(path, name, box, urls) {
  const response = await fetchStart(path);
  const type = (response.headers.get("Content-Type") || "").toLowerCase();
  const size = totalSize(response.status, response.headers.get("Content-Range"), response.headers.get("Content-Length"));
  // The box serves an SVG as the text it is; drawn here as a picture, where its script never runs.
  const svg = /\.svg$/i.test(name) && type.startsWith("text/plain");
  if (type.startsWith("image/") || svg) {
    if (size !== null && size > IMAGE_LIMIT) {
      if (response.body) response.body.cancel().catch(() => {});
      replace(box, h("p", { class: "empty" }, `A picture of ${humanSize(size)}: too large to show here. Download it to look at it.`));
      return { size, type };
    }
    const whole = response.status === 206 && size !== null && size > TEXT_LIMIT;
    if (whole && response.body) response.body.cancel().catch(() => {});
    const blob = await (whole ? await request("GET", path, { accept: "*/*" }) : response).blob();
    // Typed, so an SVG draws as one; as an <img> it runs nothing.
    const url = URL.createObjectURL(new Blob([blob], { type: svg ? "image/svg+xml" : type.split(";")[0] }));
    urls.push(url);
    replace(box, h("img", { class: "preview-image", src: url, alt: `The picture ${shown(name)}` }));
    return { size, type };
  }
  if (TEXTUAL.test(type)) {
    const bytes = await readUpTo(response, TEXT_LIMIT);
    const text = new TextDecoder("utf-8").decode(bytes);
    const cut = size !== null && size > bytes.length;
    replace(box,
      cut ? h("p", { class: "muted", role: "status" }, `Shows the first ${humanSize(bytes.length)} of ${humanSize(size)}: download the file for the rest.`) : null,
      h("pre", { class: "preview-text" }, shown(text, true)));
    return { size, type };
  }
  if (response.body) response.body.cancel().catch(() => {});
  replace(box, h("p", { class: "empty" }, `No preview for this kind of file (${shown(type || "unknown type")}). Download it to open it.`));
  return { size, type };
}

function historyList(answer) {
  const tasks = answer.tasks || [];
  const items = tasks.map((entry) => h("li", { "data-history": entry.task },
    h("span", { class: `change ${entry.change}` }, entry.change), taskLink(entry.task)));
  if (answer.inBase) items.push(h("li", {}, h("span", { class: "change" }, "base"), h("span", { class: "muted" }, "in the workspace before any task")));
  return items.length ? h("ul", { class: "files history" }, items) : h("p", { class: "empty" }, "No task changed it.");
}

export function fileView(main, workspace, parts) {
  const name = parts[parts.length - 1] || "";
  const box = h("div", { class: "preview" }, h("p", { class: "empty" }, "Loading…"));
  const facts = h("dl", { class: "facts" });
  const history = h("div", {}, h("p", { class: "empty" }, "Loading…"));
  const urls = [];
  const path = apiPath("files", workspace, parts);
  const parent = parts.slice(0, -1);
  // The file's size, once the preview's answer named it: a large file is not downloaded through
  // the tab's memory (transfer.js).
  let size = null;
  const download = h("button", { type: "button", class: "primary", onclick: (event) => act(event.currentTarget, () => downloadFile(workspace, parts, size)) }, "Download");
  const rename = h("button", { type: "button", onclick: async (event) => {
    const to = await renameEntry(event.currentTarget, workspace, parts);
    if (to) location.hash = fileHash(workspace, to);
  } }, "Rename");
  const remove = h("button", { type: "button", class: "danger", onclick: async (event) => {
    if (await deleteEntry(event.currentTarget, workspace, parts, false)) location.hash = folderHash(workspace, parent);
  } }, "Delete");
  replace(main,
    crumbs(workspace, parts, parts.length - 1),
    h("h1", { class: "file-name" }, shown(name)),
    h("div", { class: "actions" }, download, rename, remove),
    h("div", { class: "grid" },
      h("section", { class: "panel", "aria-label": "Preview" }, box),
      h("aside", { class: "panel" }, h("h2", {}, "About"), facts, h("h2", {}, "Changed by"), history)));
  const fact = (label, value) => facts.append(h("dt", {}, label), h("dd", {}, value));
  fact("Workspace", h("a", { href: folderHash(workspace) }, shown(workspace)));
  fact("Folder", h("a", { href: folderHash(workspace, parent) }, parent.length ? shown(parent.join("/")) : "(the top)"));
  preview(path, name, box, urls)
    .then((found) => {
      size = found.size;
      if (size !== null) fact("Size", `${humanSize(size)} (${size} bytes)`);
      if (found.type) fact("Type", shown(found.type));
    })
    .catch((error) => replace(box, h("p", { class: "error" }, error.message)));
  get(apiPath("history", workspace, parts))
    .then((answer) => replace(history, historyList(answer)))
    .catch((error) => replace(history, h("p", { class: "error" }, error.message)));
  return () => urls.forEach((url) => URL.revokeObjectURL(url));
}
