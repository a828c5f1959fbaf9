"""Every log event also goes to journald, so `journalctl BOX_TASK=<id>` tells the task's story.

journald is for reading; SQLite is the record. Sending is a datagram to journald, and it only
happens on the store's own thread, never on the event loop.
"""

import json

from systemd import journal

from boxd.event import EventKind
from boxd.event_record import Event


def story(event: Event) -> str:
    data = event.data
    if event.kind == EventKind.TASK_STATE:
        line = f"Task {event.task} is {data.get('state')}"
        if data.get("title"):
            line += f": {data['title']}"
        if data.get("error"):
            line += f" ({data['error']})"
        return line
    if event.kind == EventKind.TASK_STEP:
        return f"Task {event.task} step: {data.get('text')}"
    if event.kind == EventKind.TOOL_CALL:
        return f"Task {event.task} calls {data.get('tool')} (key {data.get('key')})"
    if event.kind == EventKind.TOOL_RESULT:
        outcome = "ok" if data.get("ok") else f"failed: {data.get('error')}"
        return (
            f"Task {event.task} {data.get('tool')} (key {data.get('key')}) {outcome}, "
            f"{data.get('costCents', 0)} cents"
        )
    if event.kind == EventKind.COST:
        return f"Task {event.task} spent {data.get('cents')} cents on {data.get('what')}"
    if event.kind == EventKind.APPROVAL:
        if data.get("state") == "pending":
            return f"Task {event.task} asks the owner: {data.get('question')} ({data.get('id')})"
        return (
            f"Task {event.task} approval {data.get('id')} {data.get('state')} by {data.get('by')}"
        )
    if event.kind == EventKind.NET_REFUSED:
        count = data.get("count", 1)
        times = f" {count} times" if count != 1 else ""
        return f"Task {event.task} was refused {data.get('target')}{times}: {data.get('reason')}"
    return f"Task {event.task} {event.kind}: {json.dumps(data)[:500]}"


def send(event: Event) -> None:
    journal.send(
        story(event),
        # Named here, or python-systemd walks the stack to find them for every event.
        CODE_FILE=__file__,
        CODE_FUNC="send",
        SYSLOG_IDENTIFIER="boxd",
        BOX_TASK=event.task,
        BOX_EVENT=event.kind,
        BOX_SEQ=str(event.seq),
    )
