"""A scripted stand-in for Anthropic's Messages API, for tests that need a model upstream: a
stand-in for the model only, never for Droid, systemd or the broker.

The server half is stdlib only, since the test machine's system python3 runs it:

    python3 model_server.py HOST PORT DIR [CERT KEY]    (with CERT and KEY: HTTPS)

Each `POST /v1/messages` is answered by the next turn of `DIR/script.json` (a JSON list), and
recorded, headers and body, as one line of `DIR/requests.jsonl`; the n-th request since the
script was set gets turn n, and past the script's end a plain text turn "All done.". A turn:

    {"blocks": [{"type": "text", "text": "..."},
                {"type": "tool_use", "name": "Create", "input": {...}}],
     "usage": {"input_tokens": 100, "output_tokens": 5,
               "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
     "status": 200,           # anything else answers an Anthropic-shaped error with it
     "error": "...",          # that error's message (optional)
     "stream": true,          # SSE, or one JSON message; by default what the request asked for
     "cutAfter": 3,           # optional: hang up after this many SSE events
     "holdAfter": [1, 60],    # optional: after this many SSE events, wait this many seconds
     "delay": 0.5}            # optional: seconds before answering

Anything else is a 404 in the API's error shape. The other half, `ModelServer`, is the tests'
API: start it in a test machine's `outside` namespace (testbed/outside_world.py) as
https://model.test:9443 (or over plain http at http://model.test:9090), set a script, read the
requests.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from testbed.machine import Machine, MachineProcess

SCRIPT = "script.json"
REQUESTS = "requests.jsonl"
READY = "ready"
DONE_TURN: dict[str, Any] = {"blocks": [{"type": "text", "text": "All done."}]}
DEFAULT_USAGE = {
    "input_tokens": 100,
    "output_tokens": 5,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


# --- the server (stdlib only) -------------------------------------------------------------------


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _content(blocks: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    content = []
    for i, block in enumerate(blocks):
        if block["type"] == "tool_use":
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{turn}_{i}",
                    "name": block["name"],
                    "input": block.get("input", {}),
                }
            )
        else:
            content.append({"type": "text", "text": block["text"]})
    return content


def _events(turn: dict[str, Any], number: int, model: str) -> list[bytes]:
    """The SSE of a turn, as Anthropic sends it: usage in message_start (output so far) and the
    cumulative output count in message_delta."""
    usage = {**DEFAULT_USAGE, **turn.get("usage", {})}
    content = _content(turn.get("blocks", []), number)
    stop = "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn"
    start_usage = {**usage, "output_tokens": min(1, usage["output_tokens"])}
    message: dict[str, Any] = {
        "id": f"msg_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    events = [_sse("message_start", {"type": "message_start", "message": message})]
    for i, block in enumerate(content):
        if block["type"] == "tool_use":
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events += [
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": opening},
            ),
            _sse(
                "content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}
            ),
            _sse("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]
    events += [
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return events


def _message(turn: dict[str, Any], number: int, model: str) -> dict[str, Any]:
    content = _content(turn.get("blocks", []), number)
    return {
        "id": f"msg_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn",
        "stop_sequence": None,
        "usage": {**DEFAULT_USAGE, **turn.get("usage", {})},
    }


class Handler(BaseHTTPRequestHandler):
    directory: Path
    lock = threading.Lock()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        if self.path.split("?")[0] != "/v1/messages":
            self._error(404, f"no {self.path} here")
            return
        with self.lock:
            log = self.directory / REQUESTS
            number = len(log.read_text().splitlines()) if log.exists() else 0
            record = {
                "at": time.time(),
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
            with log.open("a") as out:
                out.write(json.dumps(record) + "\n")
            script = json.loads((self.directory / SCRIPT).read_text())
        turn = script[number] if number < len(script) else DONE_TURN
        time.sleep(float(turn.get("delay", 0)))
        status = int(turn.get("status", 200))
        if status != 200:
            self._error(status, turn.get("error", f"scripted status {status}"))
            return
        model = body.get("model", "") if isinstance(body, dict) else ""
        stream = turn.get("stream", isinstance(body, dict) and body.get("stream") is True)
        if not stream:
            self._json(200, _message(turn, number, model))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        events = _events(turn, number, model)
        cut = turn.get("cutAfter")
        hold_after, hold_seconds = turn.get("holdAfter", [None, 0])
        for number_sent, event in enumerate(events if cut is None else events[:cut]):
            if number_sent == hold_after:
                time.sleep(float(hold_seconds))
            self.wfile.write(event)
            self.wfile.flush()

    def do_GET(self) -> None:
        self._error(404, f"no GET {self.path} here")

    def _error(self, status: int, message: str) -> None:
        kind = ERROR_TYPES.get(status, "api_error")
        self._json(status, {"type": "error", "error": {"type": kind, "message": message}})

    def _json(self, status: int, value: dict[str, Any]) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class DualStack(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def serve(host: str, port: int, directory: Path, tls: tuple[str, str] | None = None) -> None:
    Handler.directory = directory
    if not (directory / SCRIPT).exists():
        (directory / SCRIPT).write_text("[]")
    server_class = DualStack if ":" in host else ThreadingHTTPServer
    server = server_class((host, port), Handler)
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    (directory / READY).write_text(str(port))
    server.serve_forever()


# --- the tests' API -----------------------------------------------------------------------------

NAME = "model.test"
PORT = 9090
DIR = "/run/model-server"
# Over HTTPS, with the outside world's certificate (which the machine trusts, and which covers
# NAME): the box reaches the model the way it reaches Anthropic's API, and only so (Settings
# modelBaseUrl takes plain http to this machine's loopback alone).
TLS_PORT = 9443
TLS_DIR = "/run/model-server-tls"
BASE_URL = f"https://{NAME}:{TLS_PORT}"
# The same server over plain http, for the attacker's tests of where the key may go.
PLAIN_URL = f"http://{NAME}:{PORT}"


class ModelServer:
    """The scripted model server in a test machine, served from the `outside` namespace: at
    BASE_URL (names in the machine's /etc/hosts) over HTTPS, or at PLAIN_URL without `tls`."""

    def __init__(self, machine: Machine, *, tls: bool = True) -> None:
        self.machine = machine
        self.tls = tls
        self.port = TLS_PORT if tls else PORT
        self.dir = TLS_DIR if tls else DIR
        self.process: MachineProcess | None = None

    @property
    def base_url(self) -> str:
        return BASE_URL if self.tls else PLAIN_URL

    def start(self) -> ModelServer:
        # Imported here: the machine runs this file with its own python3, without tests/.
        from testbed.outside_world import DIR as OUTSIDE
        from testbed.outside_world import NAMESPACE, ensure_outside

        ensure_outside(self.machine)
        self.machine.run("mkdir", "-p", self.dir)
        self.machine.run("rm", "-f", f"{self.dir}/{READY}")
        self.machine.run("tee", f"{self.dir}/server.py", input=Path(__file__).read_text())
        self.set_script([])
        tls = [f"{OUTSIDE}/cert.pem", f"{OUTSIDE}/key.pem"] if self.tls else []
        self.process = self.machine.spawn(
            "ip",
            "netns",
            "exec",
            NAMESPACE,
            "python3",
            f"{self.dir}/server.py",
            "::",
            str(self.port),
            self.dir,
            *tls,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ready = self.machine.run("test", "-e", f"{self.dir}/{READY}", check=False)
            if ready.returncode == 0:
                return self
            time.sleep(0.1)
        self.stop()
        raise AssertionError("the model server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def set_script(self, turns: list[dict[str, Any]]) -> None:
        """The turns the next requests get, in order; the requests so far are forgotten."""
        self.machine.run("tee", f"{self.dir}/{SCRIPT}", input=json.dumps(turns))
        self.machine.run("rm", "-f", f"{self.dir}/{REQUESTS}")

    def requests(self) -> list[dict[str, Any]]:
        """Every request since the script was set: {at, path, headers (lower-case), body}."""
        text = self.machine.run("cat", f"{self.dir}/{REQUESTS}", check=False).stdout
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def wait_for_requests(self, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        """The requests since the script was set, once there are `count` of them."""
        deadline = time.monotonic() + timeout
        while len(came := self.requests()) < count:
            assert time.monotonic() < deadline, came
            time.sleep(0.2)
        return came


if __name__ == "__main__":
    certificate = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else None
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), certificate)
