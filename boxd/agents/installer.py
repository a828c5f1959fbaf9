"""The installer of an agent's pinned binary: `boxd droid-install` (boxd/droid/installer.py)
and `boxd claude-install` (boxd/claude/installer.py), as their units run them (the manager
starts a unit when its binary is missing). A `Pin` says which package, which member of it, and
where.

The tarball is downloaded whole and checked against the pinned integrity before anything in it
is read, so a registry, a mirror or a proxy that serves other bytes installs nothing. Of the
package only the binary is taken, as a regular file of a sane size; it is written beside its
final path and renamed there, so a half-written binary is never at that path.
"""

import base64
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DEFAULT_REGISTRY = "https://registry.npmjs.org"
REGISTRY_VARIABLE = "BOX_NPM_REGISTRY"
# Droid's published tarball is 114 MB and its binary 254 MB, Claude Code's 196 MB and 428 MB:
# several times that is no agent.
MAX_TARBALL_BYTES = 512 * 1024 * 1024
MAX_BINARY_BYTES = 1024 * 1024 * 1024
DOWNLOAD_TIMEOUT_SECONDS = 60.0
_CHUNK = 1024 * 1024

Opener = Callable[[str], IO[bytes]]


@dataclass(frozen=True)
class Pin:
    """One pinned platform package and where its binary goes."""

    # "Droid 0.225.2", as the owner reads it.
    name: str
    package: str
    version: str
    integrity: str
    # The binary's path inside the tarball, and its file name once installed.
    member: str
    binary: str
    # Holds <version>/<binary>.
    directory: Path

    def tarball_url(self, registry: str) -> str:
        short = self.package.rsplit("/", 1)[1]
        return f"{registry.rstrip('/')}/{self.package}/-/{short}-{self.version}.tgz"

    def installed(self, directory: Path | None = None) -> Path:
        return (directory or self.directory) / self.version / self.binary

    @property
    def failed(self) -> str:
        return f"{self.name} could not be installed: "


class InstallError(Exception):
    """Why an agent could not be installed, in words for the owner."""


def failure_reason(line: str, pin: Pin) -> str | None:
    """The reason in the last line a failed install printed, for the manager to pass on."""
    return line.removeprefix(pin.failed).rstrip(".") if line.startswith(pin.failed) else None


def _open_url(url: str) -> IO[bytes]:
    # Here, not at the top: the manager imports this module for failure_reason, and
    # urllib.request brings http.client and email, which it never uses.
    import urllib.request

    response: IO[bytes] = urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS)
    return response


def registry() -> str:
    chosen = os.environ.get(REGISTRY_VARIABLE, "").strip() or DEFAULT_REGISTRY
    if not chosen.startswith(("https://", "http://")):
        raise InstallError(
            f"{REGISTRY_VARIABLE} must be an http:// or https:// address, not {chosen!r}"
        )
    return chosen


def integrity_of(path: Path) -> str:
    """The file's integrity as npm writes it: sha512-<base64 of the digest>."""
    digest = hashlib.sha512()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def download(url: str, into: Path, open_url: Opener = _open_url) -> None:
    """Downloads `url` into the file `into`, refusing more than MAX_TARBALL_BYTES."""
    try:
        with open_url(url) as response, into.open("wb") as out:
            size = 0
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > MAX_TARBALL_BYTES:
                    raise InstallError(
                        f"{url} sent more than {MAX_TARBALL_BYTES // (1024 * 1024)} MB, "
                        "far more than the package"
                    )
                out.write(chunk)
    except urllib.error.HTTPError as error:
        raise InstallError(f"{url} answered {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise InstallError(f"{url} could not be reached: {error.reason}") from None
    except (OSError, ValueError) as error:
        raise InstallError(f"downloading {url} failed: {error}") from None


def check_integrity(tarball: Path, url: str, expected: str, pin: Pin) -> None:
    found = integrity_of(tarball)
    if found != expected:
        # The digests are for the journal; the reason, which the owner reads, stays short.
        print(f"boxd: {url} has integrity {found}, not {expected}", file=sys.stderr)
        raise InstallError(f"{url} did not serve {pin.name} as published (its sha512 differs)")


def extract_binary(tarball: Path, target: Path, member_name: str) -> None:
    """Writes the package's binary to `target` (a new file, its maker's, 0755). Takes that one
    member only, and only as one regular file of a sane size: never a link, a device, or a
    second member of the same name that tar would write over the first. Read as a stream, in
    one pass: the binary is a quarter of a gigabyte."""
    taken = 0
    try:
        with tarfile.open(tarball, "r|gz") as archive:
            for member in archive:
                if member.name != member_name:
                    continue
                taken += 1
                if taken > 1:
                    raise InstallError(f"the package holds {member_name} more than once")
                _take(archive, member, target)
    except (tarfile.TarError, EOFError, OSError) as error:
        raise InstallError(f"the package cannot be unpacked: {error}") from None
    if taken == 0:
        raise InstallError(f"the package holds no {member_name}")


def _take(archive: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> None:
    if not member.isreg():
        raise InstallError(f"{member.name} in the package is not a regular file")
    if member.size > MAX_BINARY_BYTES:
        raise InstallError(
            f"{member.name} in the package is {member.size} bytes, more than the "
            f"{MAX_BINARY_BYTES} an agent's binary may be"
        )
    source = archive.extractfile(member)
    if source is None:
        raise InstallError(f"{member.name} in the package cannot be read")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with source, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out, _CHUNK)
        out.flush()
        # Made by root (the unit's user), so root's; read and run by every worker.
        os.fchmod(out.fileno(), 0o755)
        os.fsync(out.fileno())


def install(
    pin: Pin,
    directory: Path | None = None,
    registry_url: str | None = None,
    open_url: Opener = _open_url,
    integrity: str | None = None,
) -> bool:
    """Installs the pinned binary unless it is already there. Returns whether it had to."""
    directory = directory or pin.directory
    final = pin.installed(directory)
    if final.is_file():
        return False
    url = pin.tarball_url(registry_url or registry())
    version_dir = final.parent
    version_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    # The download and the new binary live beside the final path, on the same file system, so
    # the rename is atomic; a run cut short leaves only these behind, and they go next time.
    for leftover in version_dir.glob(f".{pin.binary}-*"):
        leftover.unlink(missing_ok=True)
    for leftover in directory.glob(".download-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=directory) as scratch:
        tarball = Path(scratch) / "package.tgz"
        download(url, tarball, open_url)
        check_integrity(tarball, url, integrity or pin.integrity, pin)
        partial = version_dir / f".{pin.binary}-{os.getpid()}"
        partial.unlink(missing_ok=True)
        try:
            extract_binary(tarball, partial, pin.member)
            partial.rename(final)
        finally:
            partial.unlink(missing_ok=True)
    version_fd = os.open(version_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(version_fd)
    finally:
        os.close(version_fd)
    return True


def main(pin: Pin) -> None:
    binary = pin.installed()
    try:
        if install(pin):
            print(f"boxd: {pin.name} installed at {binary}", flush=True)
        else:
            print(f"boxd: {pin.name} is already installed at {binary}", flush=True)
    except InstallError as error:
        print(pin.failed + str(error), file=sys.stderr, flush=True)
        sys.exit(1)
