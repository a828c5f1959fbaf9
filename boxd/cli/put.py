"""`boxctl put SRC... WORKSPACE[:FOLDER]` and `boxctl workspace create NAME --from DIR`: files and
folders of the caller's, read as the caller (boxctl runs as them), sent to the manager as a tar
stream through a pipe (AddToWorkspace), where they become one owner's change.

What the caller could not send as a plain file or folder is left out and named on stderr: a
link (the box takes no links from an upload: docs/workspaces.md says why), a FIFO, a socket, a
device. A FIFO is never opened, so it cannot hang the upload.
"""

import asyncio
import os
import stat
import sys
import tarfile
from pathlib import Path
from typing import Any

from boxd.cli.show import visible
from boxd.dbus import interface as api
from boxd.dbus.client import BoxClient
from boxd.errors import BoxError, Problem, die


def destination(text: str) -> tuple[str, str]:
    """WORKSPACE[:FOLDER] as (workspace, folder)."""
    name, _, folder = text.partition(":")
    if not name:
        die(Problem.INVALID, f"{text!r}: name the workspace, as in home or home:docs")
    return name, folder.strip("/")


def _left_out(path: str, why: str) -> None:
    print(f"boxctl: left out {visible(path)}: {why}", file=sys.stderr, flush=True)


def _only_plain(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if member.isreg() or member.isdir():
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        return member
    why = "a link" if member.issym() or member.islnk() else "not a plain file or folder"
    _left_out(member.name, f"{why}; an upload holds plain files and folders only")
    return None


def _tar_into(fd: int, sources: list[tuple[str, str]]) -> None:
    """Writes the tar of `sources` (path, name in the archive) into the pipe `fd`; stops
    quietly if the manager stopped reading (it answers why)."""
    try:
        with (
            os.fdopen(fd, "wb", closefd=True) as pipe,
            tarfile.open(fileobj=pipe, mode="w|", format=tarfile.PAX_FORMAT) as archive,
        ):
            for path, name in sources:
                archive.add(path, arcname=name, recursive=True, filter=_only_plain)
    except BrokenPipeError:
        pass
    except OSError as error:
        # Unreadable: said here; the manager meets a cut-off stream and adds nothing.
        _left_out(error.filename or "a file", f"{error.strerror or error}; nothing was added")


def _sources(paths: list[str], contents: bool) -> list[tuple[str, str]]:
    found = []
    for path in paths:
        try:
            info = os.lstat(path)
        except OSError as error:
            die(Problem.INVALID, f"{visible(path)}: {error.strerror or error}")
        if stat.S_ISLNK(info.st_mode) and not contents:
            die(Problem.INVALID, f"{visible(path)} is a link: put what it points to instead")
        if contents:
            if not stat.S_ISDIR(os.stat(path).st_mode):
                die(Problem.INVALID, f"{visible(path)} is not a folder")
            found.append((path, "."))
        else:
            found.append((path, Path(os.path.abspath(path)).name))
    return found


async def add(
    client: BoxClient,
    name: str,
    folder: str,
    sources: list[tuple[str, str]],
) -> dict[str, Any]:
    read, write = os.pipe2(os.O_CLOEXEC)
    writer = asyncio.create_task(asyncio.to_thread(_tar_into, write, sources))
    try:
        answer: dict[str, Any] = await client.call_with_fd(api.ADD_TO_WORKSPACE, read, name, folder)
    finally:
        # The manager has its own copy: ours closed, a writer it stopped reading meets EPIPE.
        os.close(read)
        await writer
    return answer


async def put(client: BoxClient, paths: list[str], target: str) -> dict[str, Any]:
    name, folder = destination(target)
    return await add(client, name, folder, _sources(paths, contents=False))


async def create_from(client: BoxClient, name: str, folder: str) -> dict[str, Any]:
    """Makes the workspace, then imports the folder's contents as its first owner's change."""
    sources = _sources([folder], contents=True)
    made = await client.call(api.CREATE_WORKSPACE, name)
    try:
        change = await add(client, name, "", sources)
    except BoxError as error:
        die(
            Problem.FAILED,
            f"workspace {name} was made, but importing {visible(folder)} failed: {error.message}. "
            f"Put the files in with boxctl put, or remove it with boxctl workspace rm {name}",
        )
    return {**made, "change": change}
