// Places in a workspace: the screen's addresses for them (#/files/WS/a/b a folder, #/file/WS/a/b
// a file), the API's paths, and sizes as people read them. No DOM here, so node tests it as it is.

const segments = (parts) => parts.map(encodeURIComponent).join("/");

// "a/b/" or "/a//b" is the folder a/b: the API's paths never hold an empty name.
export function partsOf(path) {
  return String(path ?? "").split("/").filter(Boolean);
}

export function folderHash(workspace, parts = []) {
  return `#/files/${encodeURIComponent(workspace)}${parts.length ? `/${segments(parts)}` : ""}`;
}

export function fileHash(workspace, parts) {
  return `#/file/${encodeURIComponent(workspace)}/${segments(parts)}`;
}

// Where an address's segments (after #/files/ or #/file/) point; a broken %-escape stays as it
// was typed, naming a file no workspace has, not an exception.
export function placeOf(rest) {
  const decoded = rest.filter(Boolean).map((part) => {
    try { return decodeURIComponent(part); } catch { return part; }
  });
  const [workspace = "", ...parts] = decoded;
  return { workspace, parts };
}

// /api/workspaces/WS/KIND[/a/b]: list, files, history, archive.
export function apiPath(kind, workspace, parts = []) {
  const base = `/api/workspaces/${encodeURIComponent(workspace)}/${kind}`;
  return parts.length ? `${base}/${segments(parts)}` : base;
}

const UNITS = ["kB", "MB", "GB", "TB", "PB", "EB"];

// Decimal units, as file managers show them: 999 B, 1.2 kB, 34 MB, 5.0 GB.
export function humanSize(bytes) {
  let value = Number(bytes);
  if (!Number.isFinite(value) || value < 0) return "";
  if (value < 1000) return `${value} B`;
  let unit = -1;
  while (value >= 1000 && unit < UNITS.length - 1) { value /= 1000; unit += 1; }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${UNITS[unit]}`;
}

// The total size a Range answer names ("bytes 0-99/1234"), or its body's length.
export function totalSize(status, contentRange, contentLength) {
  if (status === 206 && contentRange) {
    const total = Number(String(contentRange).split("/")[1]);
    if (Number.isFinite(total)) return total;
  }
  const length = Number(contentLength);
  return contentLength !== null && Number.isFinite(length) ? length : null;
}

// What a download is saved as: the file's own name, or the archive's as the box names it.
export function downloadName(workspace, parts, folder) {
  if (!folder) return parts[parts.length - 1] || workspace;
  return parts.length ? `${workspace}-${parts[parts.length - 1]}.tar` : `${workspace}.tar`;
}

// Where a rename sends an entry: a bare name stays in its folder; a name with a slash is a path
// from the workspace's top.
export function renamedTo(parts, answer) {
  const typed = String(answer ?? "").trim();
  if (!typed) return null;
  if (typed.includes("/")) return partsOf(typed);
  return [...parts.slice(0, -1), typed];
}
