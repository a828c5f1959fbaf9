"""A stand-in for the npm registry that VM tests run inside the test machine (stdlib only, the
machine's own python3), as a `Type=notify` service:

    npm_registry_server.py PORT TARBALLS

It serves `/<scope>/<name>/-/<name>-<version>.tgz` from the file of that name in TARBALLS (the
host's download cache, bound read-only into the machine) on 127.0.0.1, and the test steers it:

    POST /-/test/mode     {"serve": "good" | "wrong" | "missing", "hold": true | false}
    POST /-/test/release  answers the downloads held so far, and holds no more
    GET  /-/test/state    {"waiting": <downloads held now>, "served": <tarballs answered>}

"wrong" serves a well-formed package of the same name whose binary is a shell script, as a
registry or mirror in an attacker's hands would; "missing" answers 404.
"""

import io
import json
import re
import signal
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_TARBALL = re.compile(r"^/@[a-z0-9-]+/[a-z0-9-]+/-/([a-z0-9.-]+\.tgz)$")
_CHUNK = 1024 * 1024


def _impostor() -> bytes:
    script = b"#!/bin/sh\necho 'not droid' > /tmp/impostor-ran\n"
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo("package/bin/droid")
        info.size = len(script)
        info.mode = 0o755
        archive.addfile(info, io.BytesIO(script))
    return out.getvalue()


class Steering:
    def __init__(self, tarballs: Path) -> None:
        self.tarballs = tarballs
        self.serve = "good"
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.released.set()
        self.waiting = 0
        self.served = 0

    def set(self, serve: str, hold: bool) -> None:
        with self.lock:
            self.serve = serve
            if hold:
                self.released.clear()
            else:
                self.released.set()

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"waiting": self.waiting, "served": self.served, "serve": self.serve}


class Handler(BaseHTTPRequestHandler):
    steering: Steering
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        print(format % args, file=sys.stderr, flush=True)

    def _json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/-/test/mode":
            self.steering.set(body.get("serve", "good"), bool(body.get("hold", False)))
        elif self.path == "/-/test/release":
            self.steering.set(self.steering.serve, False)
        else:
            self._json({"error": "no such control"}, 404)
            return
        self._json(self.steering.state())

    def do_GET(self) -> None:
        if self.path == "/-/test/state":
            self._json(self.steering.state())
            return
        found = _TARBALL.match(self.path)
        if found is None:
            self._json({"error": "Not found"}, 404)
            return
        steering = self.steering
        with steering.lock:
            steering.waiting += 1
        steering.released.wait()
        with steering.lock:
            steering.waiting -= 1
            serve = steering.serve
        try:
            if serve == "missing":
                self._json({"error": "Not found"}, 404)
            elif serve == "wrong":
                self._send_bytes(_impostor())
            else:
                self._send_file(steering.tarballs / found.group(1))
        finally:
            with steering.lock:
                steering.served += 1

    def _send_bytes(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_file(self, path: Path) -> None:
        if not path.is_file():
            self._json({"error": f"{path.name} is not in the test cache"}, 404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(path.stat().st_size))
        self.end_headers()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                self.wfile.write(chunk)


def main() -> None:
    port, tarballs = int(sys.argv[1]), Path(sys.argv[2])
    Handler.steering = Steering(tarballs)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    # Its unit is started with NotifyAccess=all: the message comes from systemd-notify.
    subprocess.run(["systemd-notify", "--ready"], check=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
