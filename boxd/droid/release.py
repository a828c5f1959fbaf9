"""The one Droid release this box runs, and where boxd installs it.

Pinned: Factory's platform package for Linux x86-64 at one exact version, checked against the
integrity the npm registry publishes for it, so a registry (or a mirror) that serves anything
else is refused. The package `@factory/cli` is only a Node.js shim that finds this binary (and
wants Node 20, newer than Debian 12's); the binary itself is all Droid needs.
"""

from pathlib import Path

VERSION = "0.225.2"
PACKAGE = "@factory/cli-linux-x64"
# `npm view @factory/cli-linux-x64@0.225.2 dist.integrity`
INTEGRITY = (
    "sha512-1ctPmJwAqs0s/QNiaFp6vxr90AQa7j3VgFzLns9OaTffzOCd4csExNpL4w99"
    "tNlBLmQbbYqp0rUHlAhoD8R31A=="
)
# The binary inside the package's tarball.
BINARY_IN_PACKAGE = "package/bin/droid"
# Root's, read-only to everyone else; a worker's sandbox (ProtectSystem=strict) sees it as is.
DROID_DIR = Path("/var/lib/boxd/droid")


def droid_binary(version: str = VERSION) -> Path:
    return DROID_DIR / version / "droid"
