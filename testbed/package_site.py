"""A package site in a test machine's outside world (testbed/outside_world.py), over HTTPS on
port 8443 of its public face, for the clients a task installs things with:

    https://<name>:8443/simple/        a package index for pip (PEP 503), from client_cache's
                                       wheels
    https://<name>:8443/npm/           an npm registry: the packuments and tarballs of
                                       client_cache's NPM_PACKAGES (npm, undici, Anthropic's
                                       TypeScript SDK and its tree), scoped names too, as
                                       the real registry publishes them
    https://<name>:8443/git/hello.git  a git repository over HTTP (the "dumb" protocol: static
                                       files, as any web server can serve a bare repository)

Every name of the outside world reaches it (allowed.test, other.test, ...), so a test lists one
and tries another. What arrives is appended to the outside world's log (`tcp 8443 HOST PATH`),
beside its other servers', so a test asserts that a refused request never arrived.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from .client_cache import NPM_PACKAGES, integrity_of, manifest_of, npm_tarballs, python_wheels
from .image import suite
from .machine import Machine, MachineProcess
from .outside_world import DIR, LOG, NAMESPACE, arrived, ensure_outside

PORT = 8443
SITE = "/srv/package-site"
GIT_FILE = "hello.txt"
GIT_TEXT = "hello from git"

SERVER = f"""
import sys, ssl, socket, threading
from urllib.parse import unquote
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path({SITE!r}).resolve()
TYPES = {{".html": "text/html", ".json": "application/json"}}


class Files(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        with open({LOG!r}, "a") as log:
            log.write(f"tcp {PORT} {{self.headers.get('Host')}} {{path}}\\n")
        # npm asks for a scoped package as /@scope%2fname; its folder is @scope/name.
        target = (ROOT / unquote(path).lstrip("/")).resolve()
        if target.is_dir():
            target = next((target / i for i in ("index.html", "index.json")
                           if (target / i).is_file()), target)
        if not (target == ROOT or ROOT in target.parents) or not target.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = target.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", TYPES.get(target.suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class DualStack(ThreadingHTTPServer):
    address_family = socket.AF_INET6


server = DualStack(("::", {PORT}), Files)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain("{DIR}/cert.pem", "{DIR}/key.pem")
server.socket = context.wrap_socket(server.socket, server_side=True)
print("ready", flush=True)
server.serve_forever()
"""

# A bare repository with one commit, packed and described for the dumb protocol.
GIT_REPOSITORY = f"""
set -e
rm -rf /tmp/hello-work {SITE}/git/hello.git
git init -q -b main /tmp/hello-work
echo '{GIT_TEXT}' > /tmp/hello-work/{GIT_FILE}
git -C /tmp/hello-work add {GIT_FILE}
git -C /tmp/hello-work -c user.name=test -c user.email=test@box commit -q -m hello
git clone -q --bare /tmp/hello-work {SITE}/git/hello.git
git -C {SITE}/git/hello.git repack -q -a -d
git -C {SITE}/git/hello.git update-server-info
rm -rf /tmp/hello-work
"""


def _normalized(project: str) -> str:
    """PEP 503's name of a project, from a wheel's file name."""
    return project.lower().replace("_", "-").replace(".", "-")


def _index(site: Path) -> None:
    folder = python_wheels(suite())
    files = site / "files"
    files.mkdir(parents=True)
    projects: dict[str, list[str]] = {}
    for wheel in sorted(folder.glob("*.whl")):
        shutil.copyfile(wheel, files / wheel.name)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        link = f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a><br>'
        projects.setdefault(_normalized(wheel.name.split("-")[0]), []).append(link)
    for project, links in projects.items():
        (site / "simple" / project).mkdir(parents=True)
        page = f"<!DOCTYPE html><html><body>{''.join(links)}</body></html>"
        (site / "simple" / project / "index.html").write_text(page)
    listing = "".join(f'<a href="{p}/">{p}</a><br>' for p in sorted(projects))
    (site / "simple" / "index.html").write_text(f"<html><body>{listing}</body></html>")


def _registry(site: Path, host: str) -> None:
    """A packument per package, at the path npm asks for (a scoped name's slash as a folder: the
    server unquotes `@scope%2fname`), its one version's manifest the package.json the tarball
    carries, as the registry publishes it, with the tarball's address on this site."""
    for name, tarball in npm_tarballs().items():
        version = NPM_PACKAGES[name]
        folder = site / "npm" / name
        (folder / "-").mkdir(parents=True)
        shutil.copyfile(tarball, folder / "-" / tarball.name)
        packument = {
            "name": name,
            "dist-tags": {"latest": version},
            "versions": {
                version: {
                    **manifest_of(tarball),
                    "dist": {
                        "tarball": f"https://{host}:{PORT}/npm/{name}/-/{tarball.name}",
                        "integrity": integrity_of(tarball),
                    },
                }
            },
        }
        (folder / "index.json").write_text(json.dumps(packument))


def start_package_site(machine: Machine, host: str) -> MachineProcess:
    """Builds the site in the machine (the npm registry's tarballs named under `host`, the
    name a test lists) and serves it from the outside world's namespace."""
    ensure_outside(machine)
    site = machine.root / SITE.lstrip("/")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    _index(site)
    _registry(site, host)
    (site / "git").mkdir()
    machine.run("sh", "-c", GIT_REPOSITORY)
    machine.run("tee", f"{DIR}/package_site.py", input=SERVER)
    server = machine.spawn("ip", "netns", "exec", NAMESPACE, "python3", f"{DIR}/package_site.py")
    deadline = time.monotonic() + 20
    probe = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", f"https://{host}:{PORT}/"]
    while time.monotonic() < deadline:
        if machine.run(*probe, check=False).stdout == "404":
            return server
        time.sleep(0.1)
    server.kill()
    raise AssertionError(f"the package site did not start; it logged: {arrived(machine)}")
