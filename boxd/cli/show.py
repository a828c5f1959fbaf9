"""How boxctl prints tasks and steps for a person; `--json` prints what the API returned.

Everything a task or an app wrote (titles, steps, questions, errors, tool output, keys) reaches
the owner's terminal through `visible`: a task must not clear the screen, move the cursor, set
the window title or forge a line that looks like boxd's own.
"""

import json
import re
import time
import unicodedata
from typing import Any

from boxd.wire.pairing_qr import qr_text

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Unicode's control, format, separator, private, surrogate and unassigned characters.
_HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn")
# Only characters outside printable ASCII need a look.
_CANDIDATES = re.compile(r"[^\x20-\x7e]")
_CANDIDATES_KEEPING_NEWLINES = re.compile(r"[^\x20-\x7e\n]")
# Each line of a step after its first starts with this, which no line of boxd's own does.
CONTINUED = "  " + " " * 8 + "  | "


def _shown(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _shown(char) if unicodedata.category(char) in _HIDDEN else char


def visible(value: object, lines: bool = False) -> str:
    """The text with control characters (ESC, CR, C1 codes, bidi overrides, line and paragraph
    separators) shown as escapes like \\x1b; a newline stays one only where `lines` says so."""
    text = value if isinstance(value, str) else str(value)
    return (_CANDIDATES_KEEPING_NEWLINES if lines else _CANDIDATES).sub(_escape, text)


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2)


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def task_line(task: dict[str, Any]) -> str:
    shown = {name: visible(task.get(name, "")) for name in ("id", "state", "worker", "title")}
    return f"{shown['id']}  {shown['state']:<8} {shown['worker']:<6} {shown['title']}"


def task_table(tasks: list[dict[str, Any]]) -> str:
    if not tasks:
        return "No tasks yet. boxctl start --worker fake 'step hello' starts one."
    header = f"{'ID':<10}  {'STATE':<8} {'WORKER':<6} TITLE"
    return "\n".join([header, *(task_line(task) for task in tasks)])


def step_line(step: dict[str, Any]) -> str:
    first, *more = visible(step.get("text", ""), lines=True).split("\n")
    return "\n".join([f"  {clock(step['at'])}  {first}", *(CONTINUED + line for line in more)])


def state_line(state: str, error: str | None, at: float) -> str:
    line = f"  {clock(at)}  -> {visible(state)}"
    return f"{line}: {visible(error)}" if error else line


_FIELDS = (
    "state",
    "title",
    "user",
    "workspace",
    "folders",
    "review",
    "worker",
    "model",
    "budgetCents",
    "costCents",
    "hosts",
    "tools",
    "source",
    "app",
    "error",
)


def task_details(task: dict[str, Any]) -> str:
    lines = [f"Task {visible(task['id'])}"]
    for field in _FIELDS:
        if field in task and task[field] not in ([], None):
            value = task[field]
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            lines.append(f"  {field + ':':<13}{visible(shown)}")
    steps = task.get("steps", [])
    lines.append(f"  steps:       {len(steps)}")
    lines.extend("  " + step_line(step).replace("\n", "\n  ") for step in steps)
    return "\n".join(lines)


def approval_line(approval: dict[str, Any]) -> str:
    cost = f" ({approval['costCents']:g} cents)" if approval.get("costCents") is not None else ""
    shown = {name: visible(approval.get(name, "")) for name in ("id", "state", "question")}
    return f"{shown['id']}  {shown['state']:<8} {shown['question']}{cost}"


def approval_table(approvals: list[dict[str, Any]]) -> str:
    if not approvals:
        return "Nothing waits for your OK."
    return "\n".join(approval_line(approval) for approval in approvals)


def limits_words(limits: dict[str, Any]) -> str:
    """An app's or a member's token's limits in one line: what its tasks may have."""
    budget = limits.get("maxBudgetCents")
    parts = [
        "budget at most "
        + ("Settings defaultBudgetCents" if budget is None else f"{budget} cents"),
        *(
            f"{field} {', '.join(limits[field])}" if limits.get(field) else f"no {field}"
            for field in ("tools", "hosts", "workspaces")
        ),
    ]
    return visible("; ".join(parts))


def _token_lines(token: dict[str, Any]) -> list[str]:
    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(token["createdAt"]))
    line = (
        f"{token['id']:<12}  {token['role']:<6} {visible(token.get('createdBy', '')):<12} "
        f"{made:<16} {visible(token['name'])}"
    )
    if "limits" not in token:
        return [line]
    return [line, f"{'':<14}limits: {limits_words(token['limits'])}"]


def token_table(tokens: list[dict[str, Any]]) -> str:
    if not tokens:
        return "No tokens. boxctl token create makes one."
    header = f"{'ID':<12}  {'ROLE':<6} {'MADE BY':<12} {'MADE':<16} NAME"
    return "\n".join([header, *(line for t in tokens for line in _token_lines(t))])


def whose(belongs_to: str | None) -> str:
    """Whose a vault secret is, as `boxctl vault ls` and the screen say it."""
    if belongs_to is None:
        return "no one: no tool or model gets it"
    if belongs_to == "box":
        return "the box: a model key, for the model gateway only"
    return f"app {belongs_to}: its tools only"


def secret_table(secrets: list[dict[str, Any]]) -> str:
    if not secrets:
        return "The vault is empty. boxctl vault set NAME < FILE adds one."
    width = max(len("NAME"), *(len(str(s["name"])) for s in secrets))
    return "\n".join(
        [
            f"{'NAME':<{width}}  BELONGS TO",
            *(f"{s['name']:<{width}}  {whose(s.get('belongsTo'))}" for s in secrets),
        ]
    )


def pairing_text(pairing: dict[str, Any], qr: bool = False) -> str:
    """The code, and under it (`qr`, for a terminal) the code as a QR code for the device's
    camera; a pipe gets the text alone, which a script reads more easily."""
    minutes = pairing["expiresInSeconds"] // 60
    code = visible(pairing["code"])
    drawn = f"{qr_text(code)}\n" if qr else ""
    return (
        f"Pairing code for {visible(pairing['device'])}: {code}\n"
        f"{drawn}"
        f"It works once, for {minutes} minutes. On the device: POST /api/pair with "
        f'{{"code": "{code}"}}; the answer holds its token.'
    )


def agents_line(agents: dict[str, Any]) -> str:
    if agents["paused"]:
        return (
            "The agents are paused: new tasks stay queued and running ones carry on. "
            "boxctl resume starts the queued ones."
        )
    return "The agents are running: queued tasks start in the order they came."


def install_line(install: dict[str, Any], agent: str, tasks: str, when: str = "") -> str:
    """An agent's install (GET /api/droid, /api/claude) as a sentence: `agent` is its name
    ("Claude Code"), `tasks` what its tasks are called ("Claude"), `when` when boxd installs it
    if it is not installed yet."""
    version = visible(install["version"])
    if install["installed"]:
        return f"{agent} {version} is installed."
    if install["installing"]:
        return f"{agent} {version} is being installed; {tasks} tasks wait, queued, until it is."
    return visible(install["error"] or f"{agent} {version} is not installed{when}.")


def diff_head(review: dict[str, Any]) -> str:
    """The first line of `boxctl diff`: whose changes, and against what."""
    state = visible(review["state"])
    pending = f", review {visible(review['review'])}" if review.get("review") else ""
    return (
        f"Task {visible(review['id'])} ({state}{pending}) on {visible(review['workspace'])}, "
        "compared with the workspace as the task saw it when it started:"
    )


def diff_entry(item: dict[str, Any]) -> str:
    """One changed path and its diff. Names, link targets and contents are the task's: every
    control character shows as an escape, and only the diff's own newlines stay."""
    kind = item["kind"]
    notes = []
    if kind == "link":
        notes.append(f"link to {visible(item.get('target', '?'))}")
        if "oldTarget" in item:
            notes.append(f"was a link to {visible(item['oldTarget'])}")
    elif kind != "file":
        notes.append({"dir": "folder", "other": "not a file: a FIFO, socket or device"}[kind])
    if "oldKind" in item:
        notes.append(f"was a {'folder' if item['oldKind'] == 'dir' else visible(item['oldKind'])}")
    if item.get("binary"):
        notes.append("binary")
    if item.get("tooLarge"):
        sizes = [item[name] for name in ("oldSize", "size") if name in item]
        notes.append(f"too large to show: {' -> '.join(f'{n:,}' for n in sizes)} bytes")
    if item.get("nameNotUtf8"):
        notes.append("its name is not UTF-8")
    for field in ("notShown", "skipped"):
        if item.get(field):
            notes.append(visible(item[field]))
    said = f"  ({'; '.join(notes)})" if notes else ""
    lines = [f"{visible(item['change']):<8} {visible(item['path'])}{said}"]
    if "diff" in item:
        text = item["diff"] or "(the same content: only its mode or time changed)\n"
        lines.append(visible(text, lines=True).rstrip("\n"))
    if item.get("truncated"):
        lines.append("... (the diff is cut here)")
    return "\n".join(lines)
