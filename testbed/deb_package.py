"""boxd's Debian package of this checkout, as `make deb` builds it (debian/make-deb), for the
test machines to install with apt as an owner would.

Built once and cached by the content of what it is built from (and the version asked for), so
every test of a session, and the next session if nothing changed, installs the same file; a
lock keeps two pytest processes from building at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .file_lock import held
from .image import REPO_ROOT

CACHE = Path(os.environ.get("BOXD_TEST_CACHE", "/var/cache/boxd-test")) / "debs"
# What the package is made of (debian/rules reads nothing else of the tree).
SOURCES = ("boxd", "units", "polkit", "docs", "debian", "README.md", "pyproject.toml")
# The venv postinst makes, which boxd's units run.
VENV = "/usr/lib/boxd/venv"
SKIPPED = frozenset({"__pycache__", "build", ".mypy_cache", ".ruff_cache", ".pytest_cache"})


class PackageError(RuntimeError):
    pass


def log(message: str) -> None:
    print(f"[boxd-test deb] {message}", file=sys.stderr, flush=True)


def _files(path: Path) -> Iterator[Path]:
    if path.is_symlink() or path.is_file():
        yield path
    elif path.is_dir():
        for child in sorted(path.iterdir()):
            if child.name not in SKIPPED and not child.name.endswith(".egg-info"):
                yield from _files(child)


def tree_digest(version: str | None) -> str:
    """Of every file the package is built from (name, mode and content) and the version."""
    digest = hashlib.sha256(f"version {version}\n".encode())
    for source in SOURCES:
        for path in _files(REPO_ROOT / source):
            name = str(path.relative_to(REPO_ROOT))
            if path.is_symlink():
                digest.update(f"link {name} {os.readlink(path)}\n".encode())
                continue
            digest.update(f"file {name} {path.stat().st_mode & 0o111:o}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def built_deb(version: str | None = None) -> Path:
    """The .deb of this tree (at `version`, pyproject's by default), built if not cached."""
    final = CACHE / tree_digest(version)
    found = sorted(final.glob("boxd_*.deb"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    # One build at a time, whatever its tree: they share the wheelhouse.
    with held(
        CACHE / ".lock",
        "[boxd-test deb] another process is building boxd's package; waiting for it",
    ):
        found = sorted(final.glob("boxd_*.deb"))
        if found:
            return found[0]
        build = Path(tempfile.mkdtemp(prefix=".build-", dir=CACHE))
        try:
            started = time.monotonic()
            argv = [str(REPO_ROOT / "debian/make-deb"), "--out", str(build)]
            if version is not None:
                argv += ["--version", version]
            env = dict(os.environ, BOXD_WHEELHOUSE=str(CACHE.parent / "wheels"))
            done = subprocess.run(argv, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
                raise PackageError(f"make deb failed (status {done.returncode}):\n{tail}")
            deb = Path(done.stdout.strip().splitlines()[-1])
            kept = build / "kept"
            kept.mkdir()
            deb.rename(kept / deb.name)
            kept.chmod(0o755)
            # The rename is what makes a package visible, so a half-built one never is.
            shutil.rmtree(final, ignore_errors=True)
            kept.rename(final)
            log(f"built {deb.name} in {time.monotonic() - started:.1f} s")
        finally:
            shutil.rmtree(build, ignore_errors=True)
        _prune(keep=final)
    return final / deb.name


def _prune(keep: Path, how_many: int = 8) -> None:
    """Every change to the tree builds a package of about 7 MB: the newest few stay. A machine
    installs from its own copy, so none is in use."""
    built = sorted(
        (p for p in CACHE.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in built[how_many:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    print(built_deb())
