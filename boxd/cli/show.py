"""How boxctl prints tasks and steps for a person; `--json` prints what the API returned."""

import json
import time
from typing import Any


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2)


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def task_line(task: dict[str, Any]) -> str:
    return f"{task['id']}  {task['state']:<8} {task['worker']:<6} {task['title']}"


def task_table(tasks: list[dict[str, Any]]) -> str:
    if not tasks:
        return "No tasks yet. boxctl start --worker fake 'step hello' starts one."
    header = f"{'ID':<10}  {'STATE':<8} {'WORKER':<6} TITLE"
    return "\n".join([header, *(task_line(task) for task in tasks)])


def step_line(step: dict[str, Any]) -> str:
    return f"  {clock(step['at'])}  {step['text']}"


def state_line(state: str, error: str | None, at: float) -> str:
    line = f"  {clock(at)}  -> {state}"
    return f"{line}: {error}" if error else line


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
    lines = [f"Task {task['id']}"]
    for field in _FIELDS:
        if field in task and task[field] not in ([], None):
            value = task[field]
            shown = ", ".join(value) if isinstance(value, list) else value
            lines.append(f"  {field + ':':<13}{shown}")
    steps = task.get("steps", [])
    lines.append(f"  steps:       {len(steps)}")
    lines.extend(f"  {step_line(step)}" for step in steps)
    return "\n".join(lines)


def approval_line(approval: dict[str, Any]) -> str:
    cost = f" ({approval['costCents']:g} cents)" if approval.get("costCents") is not None else ""
    return f"{approval['id']}  {approval['state']:<8} {approval['question']}{cost}"


def approval_table(approvals: list[dict[str, Any]]) -> str:
    if not approvals:
        return "Nothing waits for your OK."
    return "\n".join(approval_line(approval) for approval in approvals)


def token_table(tokens: list[dict[str, Any]]) -> str:
    if not tokens:
        return "No tokens. boxctl token create makes one."
    header = f"{'ID':<12}  {'ROLE':<5} {'MADE BY':<12} {'MADE':<16} NAME"
    return "\n".join(
        [
            header,
            *(
                f"{t['id']:<12}  {t['role']:<5} {t.get('createdBy', ''):<12} "
                f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(t['createdAt'])):<16} "
                f"{t['name']}"
                for t in tokens
            ),
        ]
    )
