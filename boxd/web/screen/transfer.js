// Files to and from a workspace through the page. Every request carries the session as its
// bearer token, which a plain link or <img> cannot send: so a download is fetched here and handed
// to the browser as a blob (or streamed to a file the owner picks, when large), and an upload is
// a multipart POST of what was picked or dropped.

import { request } from "./api.js";
import { shown } from "./dom.js";
import { apiPath, downloadName, humanSize } from "./places.js";

// Past this a file is not gathered in the tab's memory (a task can write a terabyte, sparse):
// it streams into a file the owner picks where the browser can (Chromium's
// showSaveFilePicker), and is refused with what to run instead where it cannot.
export const IN_MEMORY = 256 * 1000 * 1000;

// Saves the answer of `path` as `name` in the browser's downloads, through a blob.
export async function saveAs(path, name) {
  const blob = await (await request("GET", path, { accept: "*/*" })).blob();
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  // Escaped as on the page: a bidi override in a saved file's name would make "invoice\u202etxt.exe"
  // read as invoiceexe.txt in the owner's file manager.
  link.download = shown(name);
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  // The download has its own copy once it began; a minute is ample for the browser to start it.
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

// Streams the answer of `path` into a file the owner picks. The picker is asked for first,
// while the click that asked for the download still counts as the owner's.
async function streamTo(path, name) {
  let handle;
  try {
    handle = await window.showSaveFilePicker({ suggestedName: shown(name) });
  } catch (error) {
    if (error.name === "AbortError") return; // the owner closed the picker
    throw error;
  }
  const response = await request("GET", path, { accept: "*/*" });
  await response.body.pipeTo(await handle.createWritable());
}

export function downloadFile(workspace, parts, size) {
  const path = apiPath("files", workspace, parts);
  const name = downloadName(workspace, parts, false);
  if (!(Number(size) > IN_MEMORY)) return saveAs(path, name);
  if (typeof window.showSaveFilePicker === "function") return streamTo(path, name);
  const where = `${workspace}:${parts.join("/")}`;
  throw new Error(`This file is ${humanSize(size)}, more than this browser can save without holding it all in memory: run boxctl get '${where}' on this computer.`);
}

// A folder's size is not known before its tar is made: it goes through the tab's memory.
export function downloadFolder(workspace, parts) {
  return saveAs(apiPath("archive", workspace, parts), downloadName(workspace, parts, true));
}

// Picked or dropped files, each with the path under the current folder it goes to ("a.txt", or
// "photos/2024/a.jpg" for a folder picked or dropped whole): the part's filename carries it.
export async function upload(workspace, parts, files) {
  const form = new FormData();
  for (const { file, path } of files) form.append("file", file, path);
  const answer = await request("POST", apiPath("files", workspace, parts), { body: form });
  const text = await answer.text();
  try { return text ? JSON.parse(text) : null; } catch { return null; }
}

// The files of an <input type=file>, a folder's (webkitdirectory) with their relative paths.
export function picked(input) {
  return [...input.files].map((file) => ({ file, path: file.webkitRelativePath || file.name }));
}

function readAll(reader) {
  // A folder's reader hands its entries out in batches (100 in Chromium) until an empty one.
  return new Promise((resolve, reject) => {
    const found = [];
    const next = () => reader.readEntries((batch) => {
      if (!batch.length) { resolve(found); return; }
      found.push(...batch);
      next();
    }, reject);
    next();
  });
}

async function walk(entry, into) {
  if (entry.isFile) {
    const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
    into.push({ file, path: entry.fullPath.replace(/^\/+/, "") });
  } else if (entry.isDirectory) {
    for (const child of await readAll(entry.createReader())) await walk(child, into);
  }
}

// What was dropped, folders walked down. The entries are taken while the drop event lasts: its
// DataTransfer is emptied as soon as the handler returns.
export function dropped(event) {
  const entries = [...event.dataTransfer.items]
    .filter((item) => item.kind === "file")
    .map((item) => (item.webkitGetAsEntry ? item.webkitGetAsEntry() : null));
  const plain = [...event.dataTransfer.files];
  return (async () => {
    if (!entries.length || entries.some((entry) => !entry)) {
      return plain.map((file) => ({ file, path: file.name }));
    }
    const files = [];
    for (const entry of entries) await walk(entry, files);
    return files;
  })();
}
