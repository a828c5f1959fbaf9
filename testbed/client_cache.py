"""The clients agents install, downloaded once into the host's test cache, for the package
site of a test machine's outside world (testbed/package_site.py) to serve: test machines have no
network, so what a task installs with pip or npm comes from here, through the task's egress.

    python_wheels(suite)   # anthropic, requests, httpx and their dependencies, as wheels for
                           # the release's Python (pip download from PyPI, once)
    npm_tarballs()         # npm itself, undici and Anthropic's TypeScript SDK with all it
                           # needs, pinned, their integrity checked
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from .file_lock import held
from .image import log

CACHE_DIR = Path(os.environ.get("BOXD_TEST_CACHE", "/var/cache/boxd-test")) / "clients"
# What a task installs with pip: Anthropic's SDK at the version issue 36 was found with, and
# the two HTTP clients most Python code uses.
PYTHON_CLIENTS = ("anthropic==2.17.0", "requests", "httpx")
# The Python of each release's test image.
PYTHON_OF = {"trixie": "3.13", "bookworm": "3.11"}
# npm to run npm with (Debian's nodejs has none), and undici, the package Node's fetch is made
# of: on Node before 24 the way to send fetch through HTTPS_PROXY is its EnvHttpProxyAgent.
# Both support Node 18 (bookworm's) and 20 (trixie's).
NPM_TOOLS = {"npm": "10.9.9", "undici": "6.29.1"}
# Anthropic's TypeScript SDK, the current release (3 December 2026), and the versions of its
# dependency tree npm resolved for it that day: the site serves only these, so npm in a task
# resolves to them. Its README asks for Node 20 or later but it declares no `engines`, and it
# runs on Node 18 as well (docs/agents.md, the compatibility table). `zod`, an optional peer, is
# left out: npm installs no optional peer; it asks for zod's packument and goes on past the
# site's 404.
TYPESCRIPT_SDK = "@anthropic-ai/sdk"
TYPESCRIPT_SDK_TREE = {
    TYPESCRIPT_SDK: "1.17.0",
    "@opentelemetry/api": "1.10.0",
    "json-schema-to-ts": "3.1.1",
    "@babel/runtime": "7.29.17",
    "ts-algebra": "2.0.0",
    "standardwebhooks": "1.3.0",
    "@stablelib/base64": "1.0.1",
    "fast-sha256": "1.3.0",
}
NPM_PACKAGES = {**NPM_TOOLS, **TYPESCRIPT_SDK_TREE}
REGISTRY = "https://registry.npmjs.org"
# Written last, so a cache a download left half done is made again.
COMPLETE = ".complete"


class ClientCacheError(RuntimeError):
    pass


@functools.cache
def python_wheels(suite: str) -> Path:
    """A folder of wheels for the release's Python: PYTHON_CLIENTS and all they need."""
    version = PYTHON_OF[suite]
    folder = CACHE_DIR / f"python{version}"
    folder.mkdir(parents=True, exist_ok=True)
    wanted = json.dumps(PYTHON_CLIENTS)
    with held(folder / ".lock", "[boxd-test] another process is downloading wheels; waiting"):
        done = folder / COMPLETE
        if done.is_file() and done.read_text() == wanted:
            return folder
        log(f"downloading {', '.join(PYTHON_CLIENTS)} for Python {version} from PyPI (once)")
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--isolated",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            f"--python-version={version}",
            "--implementation=cp",
            *(
                f"--platform={p}"
                for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
            ),
            f"--dest={folder}",
            *PYTHON_CLIENTS,
        ]
        ran = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if ran.returncode != 0:
            raise ClientCacheError(
                f"pip download exited with status {ran.returncode}: {ran.stderr[-2000:]}"
            )
        done.write_text(wanted)
    return folder


def _integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@functools.cache
def npm_tarballs() -> dict[str, Path]:
    """Each of NPM_PACKAGES' tarballs, as the registry published it, by package name; a scoped
    package's under its scope's folder (npm/@anthropic-ai/sdk-1.17.0.tgz, the registry's name)."""
    folder = CACHE_DIR / "npm"
    folder.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    with held(folder / ".lock", "[boxd-test] another process is downloading npm; waiting"):
        for name, version in NPM_PACKAGES.items():
            final = folder / f"{name}-{version}.tgz"
            found[name] = final
            if final.is_file():
                continue
            final.parent.mkdir(exist_ok=True)
            # The registry answers a scoped name with its slash as it is.
            with urllib.request.urlopen(f"{REGISTRY}/{name}/{version}", timeout=60) as answer:
                dist = json.load(answer)["dist"]
            log(f"downloading {name} {version} from npm (once): {dist['tarball']}")
            with urllib.request.urlopen(dist["tarball"], timeout=120) as answer:
                data = answer.read()
            if _integrity(data) != dist["integrity"]:
                raise ClientCacheError(f"{dist['tarball']} is not {name} {version} as published")
            fd, partial = tempfile.mkstemp(prefix=".download-", dir=final.parent)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(partial, 0o644)
            os.rename(partial, final)
    _check_tree(found)
    return found


def manifest_of(path: Path) -> dict[str, Any]:
    """The package.json a tarball carries (in its one top folder, `package/` as npm packs)."""
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] == "package.json" and member.isfile():
                carried = archive.extractfile(member)
                assert carried is not None
                manifest: dict[str, Any] = json.load(carried)
                return manifest
    raise ClientCacheError(f"{path} carries no package.json")


def _check_tree(found: dict[str, Path]) -> None:
    """Every package a pinned one needs is pinned too: the site serves nothing else, and a
    missing one would fail npm in a task with a 404, far from the cause."""
    for name, path in found.items():
        manifest = manifest_of(path)
        if (manifest.get("name"), manifest.get("version")) != (name, NPM_PACKAGES[name]):
            raise ClientCacheError(f"{path} holds {manifest.get('name')} {manifest.get('version')}")
        # What a tarball bundles (npm's own dependencies) comes inside it; an optional peer
        # is one npm leaves out.
        bundled = manifest.get("bundleDependencies") or manifest.get("bundledDependencies") or []
        optional = manifest.get("peerDependenciesMeta", {})
        needed = [
            *(n for n in manifest.get("dependencies", {}) if n not in bundled),
            *(
                n
                for n in manifest.get("peerDependencies", {})
                if not optional.get(n, {}).get("optional")
            ),
        ]
        missing = [n for n in needed if n not in NPM_PACKAGES]
        if missing:
            raise ClientCacheError(
                f"{name} {NPM_PACKAGES[name]} needs {', '.join(missing)}, which NPM_PACKAGES "
                "does not pin: add the versions npm resolves for it"
            )


def integrity_of(path: Path) -> str:
    """npm's integrity string (SRI, sha512) of a tarball."""
    return _integrity(path.read_bytes())


def main() -> None:
    """Downloads what test_clients.py installs, for every release (testbed/prepare.py)."""
    for suite in PYTHON_OF:
        python_wheels(suite)
    npm_tarballs()


if __name__ == "__main__":
    main()
