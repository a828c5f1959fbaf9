"""How a task's broker and an app's runner talk, on the runner's socket
(`/run/boxd-apps/<app>.sock`, box-app@.socket: its group boxd-broker, so only brokers connect).

One JSON object a line, each way. A request carries an `id` its answer repeats, so one
connection carries many calls at once and answers come in the order they are ready:

- `{"id", "do": "hello"}` → `{"id", "app"}`: the first request of each connection, which says
  the runner started (systemd starts it on the connection);
- `{"id", "do": "tools"}` → `{"id", "tools": [{"name", "description", "input", "needsOk"}]}`:
  the tools the app offers, `input` the JSON Schema of each one's input (`GET /tools`);
- `{"id", "do": "check", "tool", "input"}` → `{"id", "input", "costCents", "needsOk"}`: the
  input validated (as JSON), what it costs and whether the tool always asks;
- `{"id", "do": "run", "tool", "input", "key", "task"}` → `{"id", "ok": true, "output"}` or
  `{"id", "ok": false, "error"}` (the tool's answer, to record), or `{"id", "full"}` (the disk
  is full: not an answer, nothing to record; the same key runs again later).

`check` and `run` may answer `{"id", "refused"}`: no such tool, a tool the runner refuses, or an
input that is not valid, in words for the task. A connection that ends with requests unanswered
left them unanswered: a run cut off so is run again with the same key, as after a broker's kill.
"""

import json
from pathlib import Path
from typing import Any

from boxd.reading.caps import MAX_DATA, MAX_DATA_WORDS

SOCKETS = Path("/run/boxd-apps")
# A run's input (MAX_DATA) with the task, or a tool's output (MAX_DATA), as JSON with room to
# spare: a longer line ends the connection.
MAX_LINE = 8 * MAX_DATA


def socket_path(directory: Path, app: str) -> Path:
    return directory / f"{app}.sock"


def line(message: dict[str, Any]) -> bytes:
    """One message: JSON escapes every line break inside it (and, ASCII only, any text a
    task sent, lone surrogates included)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def too_large(tool: str) -> str:
    """What a tool whose output passes MAX_DATA answers, said by its runner or its broker."""
    return (
        f"{tool} answered with more than {MAX_DATA_WORDS} of JSON, more than the box keeps of a "
        "tool's output"
    )
