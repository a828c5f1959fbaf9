"""The last line a worker printed, so a failed task says more than its exit status.

journald keeps one file (and its archives) for every uid that logged (`SplitMode=uid`), and each
task has a uid of its own: a box that ran a thousand tasks has a thousand files. A reader opens
every file it is given, so it is given only the system's and the worker's user's, not a
descriptor for every task that ever ran (which ran boxd out of them).
"""

import asyncio
import os
import pwd
from pathlib import Path

from systemd import journal

# journald reads the worker's stdout on its own schedule; give it a moment to catch up.
_CATCH_UP_SECONDS = 0.3
_MAX_CHARS = 300
# Persistent, then volatile storage; each holds a directory named for the machine id.
JOURNAL_DIRS = (Path("/var/log/journal"), Path("/run/log/journal"))
_SUFFIXES = (".journal", ".journal~")


def journal_files(
    machine_id: str, uid: int | None, dirs: tuple[Path, ...] = JOURNAL_DIRS
) -> list[str]:
    """The system's journal files, and those of `uid` (active and archived), in `dirs`."""
    wanted = {"system", *(() if uid is None else (f"user-{uid}",))}
    found = []
    for base in dirs:
        directory = base / machine_id
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in sorted(names):
            if not name.endswith(_SUFFIXES):
                continue
            # user-1000.journal, or archived: user-1000@<seqnum>-<time>.journal(~)
            owner = name.split("@", 1)[0].removesuffix("~").removesuffix(".journal")
            if owner in wanted:
                found.append(str(directory / name))
    return found


def _uid(user: str | None) -> int | None:
    if user is None:
        return None
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _read(unit: str, user: str | None) -> str | None:
    machine_id = Path("/etc/machine-id").read_text().strip()
    files = journal_files(machine_id, _uid(user))
    if not files:
        return None
    reader = journal.Reader(files=files)
    try:
        reader.this_boot()
        reader.add_match(_SYSTEMD_UNIT=unit, _TRANSPORT="stdout")
        reader.seek_tail()
        entry = reader.get_previous()
    finally:
        reader.close()
    message = entry.get("MESSAGE") if entry else None
    if isinstance(message, bytes):
        message = message.decode(errors="replace")
    if not isinstance(message, str) or not message.strip():
        return None
    return message.strip()[:_MAX_CHARS]


async def last_words(unit: str, user: str | None = None) -> str | None:
    """The unit's last line on stdout; `user` is the account it ran as, when not root."""
    await asyncio.sleep(_CATCH_UP_SECONDS)
    try:
        return await asyncio.to_thread(_read, unit, user)
    except OSError:
        return None
