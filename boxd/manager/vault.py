"""The vault: the owner's secrets, one file each, `BOX_HOME/vault/<name>.cred`, encrypted by
`systemd-creds` with the host's key.

systemd hands them to every broker: `LoadCredentialEncrypted=vault:/var/lib/box/vault` in
`box-broker@.service` decrypts each `<name>.cred` into the broker's credentials directory as
`vault_<name>.cred`, and the broker gives a tool only those it declared. What systemd 252 needs
for that, found on Debian 12 (see units/box-broker@.service):

- the name embedded in an encrypted file must be its credential's name, `vault_<name>.cred`,
  or the broker does not start;
- the directory must exist (empty is fine); hidden files in it are skipped, so a half-written
  `.<name>.cred.*` never reaches a broker;
- names and values of a unit's credentials may not pass 1 MiB in all, or the broker does not
  start.

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
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from boxd.caller import Caller
from boxd.errors import Problem, die
from boxd.secret_names import SECRET_NAME, SUFFIX, credential_name

log = logging.getLogger(__name__)

MAX_VALUE = 64 * 1024
# systemd 252 refuses to start a unit whose credentials, names and values together, pass 1 MiB.
MAX_TOTAL = 1024 * 1024
# The host's key (/var/lib/systemd/credential.secret, made on first use), not a TPM: a secret
# sealed to TPM PCRs becomes unreadable after a firmware or Secure Boot update, and one file
# that cannot be decrypted stops every broker from starting.
ENCRYPT = ("systemd-creds", "encrypt", "--with-key=host")


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


class Vault:
    def __init__(self, home: Path, encrypt: Sequence[str] = ENCRYPT) -> None:
        self.directory = vault_dir(home)
        self._encrypt = tuple(encrypt)
        self._lock = asyncio.Lock()
        # How many times the vault's files have changed in this run, counted once the change is
        # made: a broker started ahead (a spare's) that saw an older count may hold old secrets.
        self.changes = 0

    @contextlib.asynccontextmanager
    async def unchanged(self) -> AsyncIterator[int]:
        """The count of changes, held: no secret is set or removed until the caller is done
        acting on it (starting a task whose broker may have loaded the vault before)."""
        async with self._lock:
            yield self.changes

    def open(self) -> None:
        """Makes the directory (brokers do not start without it) and drops what a set cut off
        mid-way left behind."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        for leftover in self.directory.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}{SUFFIX}"

    def names(self) -> list[str]:
        found = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            name = path.name.removesuffix(SUFFIX)
            if SECRET_NAME.fullmatch(name) and path.is_file():
                found.append(name)
        return sorted(found)

    # The owner's methods over D-Bus.

    async def set_secret(self, caller: Caller, args: list[str]) -> dict[str, str]:
        name, value = check_name(args[0]), args[1]
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
            others = sum(self._loaded_size(n) for n in self.names() if n != name)
            if others + len(credential_name(name)) + size > MAX_TOTAL:
                die(
                    Problem.TOO_LARGE,
                    f"the vault would pass {MAX_TOTAL // 1024} KiB in all with {name}, more than "
                    "systemd loads into a broker; remove secrets you no longer need first",
                )
            sealed = await self._sealed(name, value)
            await asyncio.to_thread(self._write, name, sealed)
        log.info("secret %s set by %s", name, caller.name)
        return {"name": name}

    async def remove_secret(self, caller: Caller, args: list[str]) -> dict[str, str]:
        name = check_name(args[0])
        async with self._lock:
            try:
                await asyncio.to_thread(self._remove, name)
            except FileNotFoundError:
                die(Problem.NOT_FOUND, f"no secret {name} in the vault")
        log.info("secret %s removed by %s", name, caller.name)
        return {"name": name}

    async def list_secrets(self, caller: Caller, args: list[str]) -> list[str]:
        return self.names()

    # Files.

    async def _sealed(self, name: str, value: str) -> bytes:
        try:
            process = await asyncio.create_subprocess_exec(
                *self._encrypt,
                f"--name={credential_name(name)}",
                "-",
                "-",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            die(
                Problem.FAILED,
                f"cannot keep {name}: {self._encrypt[0]} is not installed (systemd 250 or newer "
                "has it)",
            )
        sealed, stderr = await process.communicate(value.encode())
        if process.returncode != 0 or not sealed:
            why = _last_words(stderr.decode(errors="replace"), value)
            die(
                Problem.FAILED,
                f"systemd-creds could not encrypt {name} (exit status {process.returncode})"
                + (f": {why}" if why else ""),
            )
        return sealed

    def _write(self, name: str, sealed: bytes) -> None:
        """Replaces the file at once: a broker starting meanwhile loads the old or the new."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = self.directory / f".{name}{SUFFIX}.{secrets.token_hex(4)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(sealed)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self._path(name))
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self.changes += 1  # in one thread at a time: under self._lock
        self._sync_directory()

    def _remove(self, name: str) -> None:
        self._path(name).unlink()
        self.changes += 1
        self._sync_directory()

    def _sync_directory(self) -> None:
        descriptor = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

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
