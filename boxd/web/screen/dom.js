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

// Characters that make task text read other than it is, as boxctl's `visible` picks them
// (Unicode's control, format, separator, private, surrogate and unassigned characters): a bidi
// override turns "invoice\u202etxt.exe" into "invoiceexe.txt" on the screen. A tab stays.
const HIDDEN = /[^\t\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Cn}]/gu;
const HIDDEN_KEEPING_NEWLINES = /[^\t\n\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Cn}]/gu;

function escaped(char) {
  if (char === "\n") return "\\n";
  if (char === "\r") return "\\r";
  const code = char.codePointAt(0);
  const hex = code.toString(16);
  return code < 0x100 ? `\\x${hex.padStart(2, "0")}` : code <= 0xffff ? `\\u${hex.padStart(4, "0")}` : `\\U${hex.padStart(8, "0")}`;
}

// The text with each such character as a visible escape; a newline stays one where `lines` says.
export function shown(text, lines = false) {
  return String(text).replace(lines ? HIDDEN_KEEPING_NEWLINES : HIDDEN, escaped);
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
