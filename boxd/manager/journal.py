"""Every log event also goes to journald, so `journalctl BOX_TASK=<id>` tells the task's story.

journald is for reading; SQLite is the record. Sending is a datagram to journald, and it only
happens on the store's own thread, never on the event loop.
"""

import json

from systemd import journal

from boxd.event import Event, EventKind


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
    return f"Task {event.task} {event.kind}: {json.dumps(data)[:500]}"


def send(event: Event) -> None:
    journal.send(
        story(event),
        SYSLOG_IDENTIFIER="boxd",
        BOX_TASK=event.task,
        BOX_EVENT=event.kind,
        BOX_SEQ=str(event.seq),
    )
