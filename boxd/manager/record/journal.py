"""Every log event also goes to journald, so `journalctl BOX_TASK=<id>` tells the task's story.

journald is for reading; SQLite is the record. Sending is a datagram to journald, and it only
happens on the store's own thread, never on the event loop.
"""

import json

from systemd import journal

from boxd.wire.event import EventKind
from boxd.wire.models.event_record import Event


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
    # Straight to sendv with the fields made here: journal.send would build the same fields
    # through keyword arguments and a generator, for every event (and walk the stack for the
    # caller's file and function, had they not been named).
    journal.sendv(
        f"MESSAGE={story(event)}",
        f"CODE_FILE={__file__}",
        "CODE_FUNC=send",
        "SYSLOG_IDENTIFIER=boxd",
        f"BOX_TASK={event.task}",
        f"BOX_EVENT={event.kind}",
        f"BOX_SEQ={event.seq}",
    )
