"""The manager's signals as tests send them: its well-known name's owners, a stranger, and a task
event."""

import json
from typing import Any

from dbus_fast import Message

from boxd.dbus.interface import TASK, task_path
from tests.support.fake_bus import signal

TASK_ID = "t000000001"
BOXD = ":1.10"
NEW_BOXD = ":1.99"
STRANGER = ":1.66"


def event(
    sender: str, seq: int, kind: str, data: dict[str, Any], destination: str | None = None
) -> Message:
    body = {"seq": seq, "task": TASK_ID, "kind": kind, "at": 1.0, "data": data}
    return signal(
        sender,
        task_path(TASK_ID),
        TASK,
        "Event",
        "tss",
        [seq, kind, json.dumps(body)],
        destination=destination,
    )
