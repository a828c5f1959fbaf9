// Building the page. Text from the box (titles, steps, file names, diffs: all written by tasks
// we do not trust) only ever becomes text nodes, never HTML.

export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") element.className = value;
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name in element && typeof value !== "string") element[name] = value;
    else element.setAttribute(name, value === true ? "" : value);
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
}

export function dollars(cents) {
  const value = Number(cents || 0) / 100;
  return value.toLocaleString(undefined, { style: "currency", currency: "USD", minimumFractionDigits: 2, maximumFractionDigits: value < 1 && value > 0 ? 4 : 2 });
}

export function when(seconds) {
  if (!seconds) return "";
  const date = new Date(seconds * 1000);
  const today = new Date();
  return date.toDateString() === today.toDateString()
    ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" })
    : date.toLocaleString([], { dateStyle: "medium", timeStyle: "short" });
}

export function toast(message, kind = "") {
  const box = document.getElementById("toasts");
  const item = h("div", { class: `toast ${kind}`, role: kind === "bad" ? "alert" : "status" }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "bad" ? 9000 : 4000);
}

// Runs what a button does, with the button disabled meanwhile; a refusal is shown in the box's
// own words.
export async function act(button, work, done) {
  button.disabled = true;
  try {
    const result = await work();
    if (done) toast(done);
    return result;
  } catch (error) {
    toast(error.message, "bad");
    return undefined;
  } finally {
    button.disabled = false;
  }
}

export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2)}`;
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control, hint ? h("span", { class: "hint" }, hint) : null);
}

export function lines(text) {
  return text.split(/[\n,]/).map((line) => line.trim()).filter(Boolean);
}

// Characters that make task text read other than it is: controls, bidi overrides and isolates
// (a file "invoice\u202Etxt.exe" shows as "invoiceexe.txt"), and marks that draw nothing. Tab stays.
const HIDDEN = /[\0-\x08\x0a-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;

// The text with each such character as a visible escape, \n as \n.
export function shown(text) {
  return String(text).replace(HIDDEN, (c) => (c === "\n" ? "\\n" : `\\u{${c.codePointAt(0).toString(16).toUpperCase()}}`));
}

// What each line of a unified diff is. Headers (--- and +++) only come before the first hunk:
// inside one, "---x" is the line "--x" removed, not a header.
export function diffKinds(lines) {
  let inHunk = false;
  return lines.map((line) => {
    if (line.startsWith("@@")) { inHunk = true; return "hunk"; }
    if (!inHunk) return "";
    return line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "";
  });
}
