"""boxctl ls, cat and history: the workspace as it stands, read through the manager.

`cat` writes the file's bytes as they are to a pipe or a file; to a terminal, a task's file
could drive it (escape sequences, a changed title, bidi tricks), so its control characters show
as escapes there, as every name boxctl prints does (boxd.cli.show)."""

import argparse
import codecs
import errno
import os
import sys
from typing import Any

from boxd.cli import show
from boxd.dbus import interface as api
from boxd.dbus.client import BoxClient, whole
from boxd.errors import Problem, die

COMMANDS = ("ls", "cat", "history")
CHUNK = 1 << 20


def add_parsers(commands: Any) -> None:
    listing = commands.add_parser("ls", help="list a workspace's folder as it stands")
    listing.add_argument("where", metavar="WORKSPACE[:PATH]", help="like docs or docs:notes")
    listing.add_argument("--json", action="store_true")
    cat = commands.add_parser("cat", help="print a workspace's file as it stands")
    cat.add_argument("where", metavar="WORKSPACE:PATH", help="like docs:notes/summary.md")
    history = commands.add_parser("history", help="the tasks that touched a path, newest first")
    history.add_argument("where", metavar="WORKSPACE:PATH")
    history.add_argument("--json", action="store_true")


def split(where: str, path_needed: bool) -> tuple[str, str]:
    name, _, path = where.partition(":")
    path = path.strip("/")
    if not name or (path_needed and not path):
        shape = "WORKSPACE:PATH" if path_needed else "WORKSPACE[:PATH]"
        die(Problem.INVALID, f"{show.visible(where)!r} is not {shape}, like docs:notes.md")
    return name, path


def entry_line(entry: dict[str, Any]) -> str:
    kind = {"dir": "d", "link": "l", "file": "-"}.get(entry["kind"], "?")
    task = entry.get("task") or "base"
    name = show.visible(entry["name"]) + ("/" if entry["kind"] == "dir" else "")
    if entry["kind"] == "link":
        name += f" -> {show.visible(entry.get('target') or '?')}"
    return f"{kind} {entry['size']:>12} {entry['modified'][:19]} {task:<10} {name}"


def history_lines(found: dict[str, Any]) -> list[str]:
    lines = [f"{t['task']:<10} {t['change']:<8} boxctl diff {t['task']}" for t in found["tasks"]]
    if found["inBase"]:
        lines.append("base       the workspace as it was made")
    if not lines:
        lines.append(f"no task touched {show.visible(found['path'])}")
    return lines


def copy_raw(fd: int, out: int) -> None:
    """Every byte, as it is: the kernel's copy where it can (a file, a pipe)."""
    try:
        while os.sendfile(out, fd, None, CHUNK):
            pass
        return
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
    while chunk := os.read(fd, CHUNK):
        os.write(out, chunk)


def copy_shown(fd: int) -> None:
    """The text with its control characters as escapes, bytes that are not UTF-8 as \\xNN."""
    decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
    while chunk := os.read(fd, CHUNK):
        sys.stdout.write(show.visible(decoder.decode(chunk), lines=True))
    sys.stdout.write(show.visible(decoder.decode(b"", final=True), lines=True))
    sys.stdout.flush()


async def run(client: BoxClient, arguments: argparse.Namespace) -> int:
    as_json = getattr(arguments, "json", False)
    if arguments.command == "ls":
        name, path = split(arguments.where, path_needed=False)
        found = await whole(
            lambda page: client.call(api.LIST_WORKSPACE_FILES, name, path, page), "entries"
        )
        if as_json:
            print(show.as_json(found))
            return 0
        for entry in found["entries"]:
            print(entry_line(entry))
        if found.get("truncated"):
            print("(more entries than boxd lists: this folder is cut short)")
        return 0
    if arguments.command == "history":
        name, path = split(arguments.where, path_needed=True)
        found = await client.call(api.GET_WORKSPACE_FILE_HISTORY, name, path)
        print(show.as_json(found) if as_json else "\n".join(history_lines(found)))
        return 0
    name, path = split(arguments.where, path_needed=True)
    _, fd = await client.call_for_fd(api.OPEN_WORKSPACE_FILE, name, path)
    try:
        sys.stdout.flush()
        if os.isatty(sys.stdout.fileno()):
            copy_shown(fd)
        else:
            copy_raw(fd, sys.stdout.fileno())
    finally:
        os.close(fd)
    return 0
