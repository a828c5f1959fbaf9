"""The vault: the owner's secrets, one file each, encrypted by `systemd-creds` with the host's
key, kept apart by whose they are (boxd.wire.secret_names), so that systemd hands each process the
secrets of one owner and nothing else:

- `BOX_HOME/vault/box/<name>.cred`: the box's (the model keys), for the model gateway;
- `BOX_HOME/vault/apps/<app>/<name>.cred`: app <app>'s, for its runner alone
  (`LoadCredentialEncrypted=vault:/var/lib/box/vault/apps/%i` in box-app@.service);
- `BOX_HOME/vault/<name>.cred`: a secret of a name that is neither's, set before secrets had
  owners. It reaches no one; the owner sees it listed as no one's and removes it.

`open` moves a vault of the old layout (every file in `vault/`) into this one: a file is renamed,
never decrypted, since its embedded name is the same in either place.

systemd decrypts each `<name>.cred` of a directory into the credentials directory as
`vault_<name>.cred`. What systemd 252 needs for that, found on Debian 12:

- the name embedded in an encrypted file must be its credential's name, `vault_<name>.cred`,
  or the unit does not start;
- the directory must exist (empty is fine); hidden files in it are skipped, so a half-written
  `.<name>.cred.*` never reaches a unit; a directory inside it is read too, its files under
  other names, which is why no unit loads `vault/` itself;
- names and values of a unit's credentials may not pass 1 MiB in all, or the unit does not
  start: counted for each directory.

A value travels to systemd-creds on its stdin, never on a command line, and appears in no log
line and no error: those name the secret only.
"""

import asyncio
import base64
import binascii
import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.run import NotInstalled, run
from boxd.wire.caller import Caller
from boxd.wire.model_key import KEY_NAMES
from boxd.wire.secret_names import (
    BOX,
    SECRET_NAME,
    SUFFIX,
    belongs_to,
    credential_name,
    is_app_name,
)

log = logging.getLogger(__name__)

MAX_VALUE = 64 * 1024
# systemd 252 refuses to start a unit whose credentials, names and values together, pass 1 MiB.
MAX_TOTAL = 1024 * 1024
# The host's key (/var/lib/systemd/credential.secret, made on first use), not a TPM: a secret
# sealed to TPM PCRs becomes unreadable after a firmware or Secure Boot update, and one file
# that cannot be decrypted stops every unit that loads it from starting.
ENCRYPT = ("systemd-creds", "encrypt", "--with-key=host")
BOX_PART = "box"
APPS_PART = "apps"


def vault_dir(home: Path) -> Path:
    return home / "vault"


def check_name(name: str) -> str:
    if not SECRET_NAME.fullmatch(name):
        die(
            Problem.INVALID,
            f"{name[:80]!r} is not a secret name: 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, like mail.password",
        )
    return name


def owner_of(name: str) -> str:
    """Whose the secret is; a 400 for a name that is no one's."""
    owner = belongs_to(name)
    if owner is None:
        die(
            Problem.INVALID,
            f"{name} belongs to no app: a secret is an app's, named <app>.<name> like "
            f"mail.password (only that app's tools get it), or one of the box's model keys "
            f"({', '.join(KEY_NAMES)})",
        )
    return owner


async def _nothing(_: str) -> None:
    return None


class Vault:
    def __init__(self, home: Path, encrypt: Sequence[str] = ENCRYPT) -> None:
        self.directory = vault_dir(home)
        self._encrypt = tuple(encrypt)
        self._lock = asyncio.Lock()
        # How many times the vault's files have changed in this run, counted once the change is
        # made: a broker started ahead (a spare's) that saw an older count may hold old secrets.
        self.changes = 0
        # Told, once a secret is set or removed, whose it was (boxd.wire.secret_names.belongs_to):
        # the app's runner holds its secrets as they were when it started.
        self.changed: Callable[[str], Awaitable[None]] = _nothing

    @contextlib.asynccontextmanager
    async def unchanged(self) -> AsyncIterator[int]:
        """The count of changes, held: no secret is set or removed until the caller is done
        acting on it (starting a task whose broker may have loaded the vault before)."""
        async with self._lock:
            yield self.changes

    def place(self, owner: str) -> Path:
        """The directory of `owner`'s secrets (an app's name, or BOX)."""
        if owner == BOX:
            return self.directory / BOX_PART
        return self.directory / APPS_PART / owner

    def open(self) -> None:
        """Makes the directories (a unit that loads one does not start without it), moves what
        the old layout kept in `vault/` to its owner's, and drops what a set cut off mid-way
        left behind."""
        for directory in (self.directory, self.place(BOX), self.directory / APPS_PART):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)
        for directory in (self.directory, *self._owned_directories()):
            for leftover in directory.glob(".*.tmp"):
                leftover.unlink(missing_ok=True)
        moved = 0
        for name in self._files_in(self.directory):
            owner = belongs_to(name)
            if owner is None:
                log.warning(
                    "the vault's secret %s belongs to no app and reaches no tool; "
                    "`boxctl vault rm %s` removes it",
                    name,
                    name,
                )
                continue
            place = self.place(owner)
            place.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Renamed: one rename at a time, so a cut-off move leaves each file in one place.
            os.replace(self.directory / f"{name}{SUFFIX}", place / f"{name}{SUFFIX}")
            moved += 1
        if moved:
            for directory in (self.directory, *self._owned_directories()):
                _sync_directory(directory)
            log.info("moved %d secret(s) of the vault to their owners' directories", moved)

    def app_directory(self, app: str) -> Path:
        """App `app`'s directory, made if it is not there: its runner's unit loads it."""
        place = self.place(app)
        place.mkdir(mode=0o700, parents=True, exist_ok=True)
        return place

    def _owned_directories(self) -> Iterator[Path]:
        yield self.place(BOX)
        apps = self.directory / APPS_PART
        if apps.is_dir():
            for app in sorted(apps.iterdir()):
                if is_app_name(app.name) and app.is_dir() and not app.is_symlink():
                    yield app

    @staticmethod
    def _files_in(directory: Path) -> list[str]:
        found = []
        for path in directory.glob(f"*{SUFFIX}"):
            name = path.name.removesuffix(SUFFIX)
            if SECRET_NAME.fullmatch(name) and path.is_file() and not path.is_symlink():
                found.append(name)
        return sorted(found)

    def _path(self, name: str) -> Path:
        """Where the secret is kept: its owner's directory, or `vault/` for no one's."""
        owner = belongs_to(name)
        return (self.directory if owner is None else self.place(owner)) / f"{name}{SUFFIX}"

    def listing(self) -> list[dict[str, Any]]:
        """Each secret's name and whose it is, by name."""
        found = [
            {"name": name, "belongsTo": belongs_to(name)}
            for directory in (self.directory, *self._owned_directories())
            for name in self._files_in(directory)
            # In the place its name gives it: a file put elsewhere by hand reaches no one.
            if self._path(name).parent == directory
        ]
        return sorted(found, key=lambda secret: str(secret["name"]))

    def names(self) -> list[str]:
        return [str(secret["name"]) for secret in self.listing()]

    # The owner's methods over D-Bus.

    async def set_secret(self, caller: Caller, name: str, value: str) -> dict[str, str]:
        name = check_name(name)
        owner = owner_of(name)
        size = len(value.encode())
        if not value:
            die(Problem.INVALID, f"the value of {name} is empty; boxctl vault rm {name} removes it")
        if "\0" in value:
            die(Problem.INVALID, f"the value of {name} holds a NUL character; secrets are text")
        if size > MAX_VALUE:
            die(
                Problem.TOO_LARGE,
                f"the value of {name} is {size} bytes; a secret holds at most {MAX_VALUE} bytes",
            )
        async with self._lock:
            # One unit loads one owner's secrets: systemd's limit holds for each owner.
            together = [n for n in self.names() if n != name and belongs_to(n) == owner]
            others = sum(self._loaded_size(n) for n in together)
            if others + len(credential_name(name)) + size > MAX_TOTAL:
                whose = "the box's secrets" if owner == BOX else f"app {owner}'s secrets"
                die(
                    Problem.TOO_LARGE,
                    f"{whose} would pass {MAX_TOTAL // 1024} KiB in all with {name}, more than "
                    "systemd loads into one process; remove secrets you no longer need first",
                )
            sealed = await self._sealed(name, value)
            await asyncio.to_thread(self._write, name, sealed)
        log.info("secret %s set by %s", name, caller.name)
        await self.changed(owner)
        return {"name": name}

    async def remove_secret(self, caller: Caller, name: str) -> dict[str, str]:
        name = check_name(name)
        async with self._lock:
            try:
                await asyncio.to_thread(self._remove, name)
            except FileNotFoundError:
                die(Problem.NOT_FOUND, f"no secret {name} in the vault")
        log.info("secret %s removed by %s", name, caller.name)
        owner = belongs_to(name)
        if owner is not None:
            await self.changed(owner)
        return {"name": name}

    async def list_secrets(self, caller: Caller) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.listing)

    # Files.

    async def _sealed(self, name: str, value: str) -> bytes:
        try:
            ran = await run(
                *self._encrypt,
                f"--name={credential_name(name)}",
                "-",
                "-",
                input=value.encode(),
                keep_output=True,
            )
        except NotInstalled:
            die(
                Problem.FAILED,
                f"cannot keep {name}: {self._encrypt[0]} is not installed (systemd 250 or newer "
                "has it)",
            )
        sealed = ran.stdout
        if ran.status != 0 or not sealed:
            why = _last_words(ran.stderr.decode(errors="replace"), value)
            die(
                Problem.FAILED,
                f"systemd-creds could not encrypt {name} (exit status {ran.status})"
                + (f": {why}" if why else ""),
            )
        return sealed

    def _write(self, name: str, sealed: bytes) -> None:
        """Replaces the file at once: a unit starting meanwhile loads the old or the new."""
        path = self._path(name)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.parent / f".{name}{SUFFIX}.{secrets.token_hex(4)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(sealed)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self.changes += 1  # in one thread at a time: under self._lock
        _sync_directory(path.parent)

    def _remove(self, name: str) -> None:
        path = self._path(name)
        path.unlink()
        self.changes += 1
        _sync_directory(path.parent)

    def _loaded_size(self, name: str) -> int:
        """At least what the secret counts against systemd's limit: the decoded file holds its
        credential name and its value, plus a header and the cipher's tag."""
        try:
            data = self._path(name).read_bytes()
        except FileNotFoundError:
            return 0
        try:
            return len(base64.b64decode(data))
        except (binascii.Error, ValueError):
            return len(data)


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _last_words(stderr: str, value: str) -> str:
    """systemd-creds's reason, without its warnings; nothing at all if it echoed the value."""
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and "not located on encrypted media" not in line
    ]
    if not lines or value in stderr:
        return ""
    return lines[-1][:300]
