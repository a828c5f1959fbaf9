"""The Droid package for test machines, downloaded once into the host's test cache beside the
image and bound read-only into every machine at the same path, where testbed/npm_registry.py
serves it: no test machine reaches npm, and none pays for the download twice. Claude Code's
package goes into the same folder, downloaded the first time a test asks for it.

    droid_tarball()   # /var/cache/boxd-test/droid/cli-linux-x64-0.225.2.tgz, checked
    claude_tarball()  # /var/cache/boxd-test/droid/claude-code-linux-x64-2.1.337.tgz, checked
    claude_unpacked() # .../droid/claude-2.1.337/claude: its binary, for the unit tests

Root's cache is /var/cache/boxd-test; anyone else's (the unit tests run without root) is
$XDG_CACHE_HOME/boxd-test, so the unit tests get the binary themselves on any machine.
"""

from __future__ import annotations

import functools
import os
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from boxd.agents.installer import DEFAULT_REGISTRY, Pin, integrity_of
from boxd.claude.installer import CLAUDE
from boxd.claude.release import BINARY_IN_PACKAGE, VERSION
from boxd.droid.installer import DROID

from .file_lock import held
from .image import log


def _cache_root() -> Path:
    if chosen := os.environ.get("BOXD_TEST_CACHE"):
        return Path(chosen)
    if os.geteuid() == 0:
        return Path("/var/cache/boxd-test")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "boxd-test"


CACHE_DIR = _cache_root() / "droid"
# Where machines see CACHE_DIR (read-only).
MACHINE_DIR = "/var/cache/boxd-test/droid"


class DroidCacheError(RuntimeError):
    pass


@functools.cache
def droid_tarball() -> Path:
    return _cached(DROID)


@functools.cache
def claude_tarball() -> Path:
    return _cached(CLAUDE)


@functools.cache
def claude_unpacked() -> Path:
    """Claude Code's binary from the checked tarball, unpacked once beside it (never into
    /var/lib/boxd, which is the host's own install)."""
    tarball = claude_tarball()
    final = CACHE_DIR / f"claude-{VERSION}" / "claude"
    with held(
        CACHE_DIR / ".lock",
        f"[boxd-test image] another process is unpacking {CLAUDE.name}; waiting for it",
    ):
        if final.is_file():
            return final
        final.parent.mkdir(exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=".unpack-", dir=final.parent)
        try:
            with tarfile.open(tarball) as package, os.fdopen(fd, "wb") as out:
                member = package.extractfile(BINARY_IN_PACKAGE)
                if member is None:
                    raise DroidCacheError(f"{tarball} holds no {BINARY_IN_PACKAGE}")
                shutil.copyfileobj(member, out)
            os.chmod(partial, 0o755)
            os.rename(partial, final)
        finally:
            Path(partial).unlink(missing_ok=True)
    return final


def _cached(pin: Pin) -> Path:
    """The pinned package in the cache, downloaded from npm the first time; its integrity is
    checked once per test run, so a damaged cache is replaced rather than served."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    url = pin.tarball_url(DEFAULT_REGISTRY)
    final = CACHE_DIR / url.rsplit("/", 1)[1]
    with held(
        CACHE_DIR / ".lock",
        f"[boxd-test image] another process is fetching {pin.name}; waiting for it",
    ):
        if final.is_file() and integrity_of(final) == pin.integrity:
            return final
        log(f"downloading {pin.name} for test machines (once): {url}")
        fd, partial = tempfile.mkstemp(prefix=".download-", dir=CACHE_DIR)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
                while chunk := response.read(1024 * 1024):
                    out.write(chunk)
            if integrity_of(Path(partial)) != pin.integrity:
                raise DroidCacheError(f"{url} did not serve {pin.name} as published")
            os.chmod(partial, 0o644)
            # The rename is what makes it visible, so a half download never is.
            os.rename(partial, final)
        finally:
            Path(partial).unlink(missing_ok=True)
    return final


@functools.cache
def droid_cache_dir() -> Path:
    """The folder to bind into machines. A host that cannot download the package still boots
    machines: only a test that installs Droid fails then, its stand-in saying the package is not
    in the cache. Asked once per test run, like the download."""
    try:
        return droid_tarball().parent
    except (OSError, DroidCacheError) as error:
        log(f"Droid is not in the test cache, and could not be downloaded: {error}")
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        return CACHE_DIR
