"""boxctl get WORKSPACE[:PATH] [DEST]: a file or a folder of the workspace as it stands, made the
caller's own files (boxctl runs as the caller, so what it writes is theirs and goes only where
they may write).

A file comes through OpenWorkspaceFile, a folder (or the whole workspace) through
OpenWorkspaceArchive, a tar read as it comes and extracted with tarfile's 'data' filter: nothing
lands outside DEST (no absolute path, no '..', no write through a link that leads out), no
device or FIFO is made, no setuid bit or group/other write bit kept. A link whose target leads
out of DEST (a task's link to /etc/shadow) is left out, and said so: the filter refuses it, and
making it would hand a later tool a way out. What is there already is never overwritten unless
--force is given: DEST existing is refused before anything is asked of boxd.
"""

import argparse
import os
import sys
import tarfile
from pathlib import Path
from typing import IO, Any

from boxd.cli import show
from boxd.cli.workspace_files import copy_raw, split
from boxd.dbus import interface as api
from boxd.dbus.client import BoxClient
from boxd.errors import BoxError, Problem, die

# Reasons shown one by one; past this many, only counted.
SHOWN_LEFT_OUT = 20


def add_parser(commands: Any) -> None:
    get = commands.add_parser(
        "get", help="copy a workspace's file or folder as it stands to your own files"
    )
    get.add_argument(
        "where", metavar="WORKSPACE[:PATH]", help="like docs (all of it) or docs:notes/summary.md"
    )
    get.add_argument(
        "dest",
        nargs="?",
        metavar="DEST",
        help="where to put it (default: its last name, in this folder); - writes it to stdout, "
        "a folder as a tar",
    )
    get.add_argument("--force", action="store_true", help="write over files that are there already")


async def run(client: BoxClient, arguments: argparse.Namespace) -> int:
    name, path = split(arguments.where, path_needed=False)
    last = path.rsplit("/", 1)[-1] if path else name
    dest = arguments.dest or last
    if dest != "-" and not arguments.force:
        _not_there(Path(dest))
    if path:
        try:
            _, fd = await client.call_for_fd(api.OPEN_WORKSPACE_FILE, name, path)
        except BoxError as not_a_file:
            if not_a_file.problem != Problem.INVALID:
                raise
            try:
                return await _folder(client, name, path, dest)
            except BoxError as not_a_folder:
                if not_a_folder.problem == Problem.INVALID:
                    raise not_a_file from None  # a link, a FIFO: the file's refusal says so
                raise
        try:
            _file(fd, dest, arguments.force)
        finally:
            os.close(fd)
        if dest != "-":
            print(f"got {show.visible(f'{name}:{path}')} into {show.visible(dest)}")
        return 0
    return await _folder(client, name, path, dest)


def _not_there(dest: Path) -> None:
    if dest.is_symlink() or dest.exists():
        die(
            Problem.INVALID,
            f"{show.visible(str(dest))!r} is there already and boxctl get does not overwrite: "
            "name another DEST, or pass --force to write over it",
        )


def _file(fd: int, dest: str, force: bool) -> None:
    if dest == "-":
        sys.stdout.flush()
        copy_raw(fd, sys.stdout.fileno())
        return
    target = Path(dest)
    if force:
        # Written beside it and put in its place: a link at DEST is replaced, never written
        # through, and a half-written file is never left in its place.
        partial = target.with_name(f".{target.name}.boxctl-get")
        _write_new(fd, partial)
        os.replace(partial, target)
    else:
        _write_new(fd, target)


def _write_new(fd: int, target: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        out = os.open(target, flags, 0o666)
    except FileExistsError:
        die(Problem.INVALID, f"{show.visible(str(target))!r} appeared meanwhile: not overwritten")
    except OSError as error:
        die(Problem.FAILED, f"cannot write {show.visible(str(target))!r}: {error.strerror}")
    try:
        copy_raw(fd, out)
    except BaseException:
        os.unlink(target)
        raise
    finally:
        os.close(out)


async def _folder(client: BoxClient, name: str, path: str, dest: str) -> int:
    answer, fd = await client.call_for_fd(api.OPEN_WORKSPACE_ARCHIVE, name, path)
    try:
        if dest == "-":
            sys.stdout.flush()
            copy_raw(fd, sys.stdout.fileno())
            return 0
        top = str(answer["filename"]).removesuffix(".tar")
        with os.fdopen(os.dup(fd), "rb") as stream:
            got = extract(stream, top, Path(dest))
    finally:
        os.close(fd)
    where = f"{name}:{path}" if path else name
    print(f"got {show.visible(where)} into {show.visible(dest)}: {got.said()}")
    for line in got.left_out[:SHOWN_LEFT_OUT]:
        print(f"  left out {line}")
    if len(got.left_out) > SHOWN_LEFT_OUT:
        print(f"  and {len(got.left_out) - SHOWN_LEFT_OUT} more left out")
    return 0


class Got:
    def __init__(self) -> None:
        self.files = 0
        self.folders = 0
        self.links = 0
        self.left_out: list[str] = []

    def said(self) -> str:
        counts = f"{self.files} files, {self.folders} folders, {self.links} links"
        return counts + (f"; {len(self.left_out)} left out" if self.left_out else "")


def extract(stream: IO[bytes], top: str, dest: Path) -> Got:
    """Extracts the archive read from `stream` (entries under the one folder `top`) into `dest`,
    read as it comes; each entry checked here first (the Python of a box may predate tarfile's
    filters, 3.11.4) and then through tarfile's 'data' filter where there is one; an entry
    either refuses is left out, and said."""
    got = Got()
    dest.mkdir(exist_ok=True)
    root = os.path.realpath(dest)
    data = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    refusals = getattr(tarfile, "FilterError", ())
    links: list[tarfile.TarInfo] = []
    with tarfile.open(fileobj=stream, mode="r|", errorlevel=1) as tar:
        for member in tar:
            if member.name == top:
                continue  # DEST itself
            inside, slash, rest = member.name.partition("/")
            if inside != top or not slash or not rest:
                got.left_out.append(f"{show.visible(member.name)!r}: not under {top}/")
                continue
            member.name = rest
            why = _refused(member, root)
            if why is not None:
                got.left_out.append(f"{_what(member)}: {why}")
                continue
            _own_mode(member)
            try:
                tar.extract(member, root, set_attrs=True, **data)  # type: ignore[arg-type]
            except refusals as refused:
                got.left_out.append(f"{_what(member)}: {show.visible(str(refused))}")
                continue
            if member.isdir():
                got.folders += 1
            elif member.issym():
                got.links += 1
                links.append(member)
            else:
                got.files += 1
    _unmake_links_out(links, root, got)
    return got


def _unmake_links_out(links: list[tarfile.TarInfo], root: str, got: Got) -> None:
    """Removes the links made that now lead out of `root`. Each was checked as it was made, but
    a link made later can change where an earlier one leads: 'L' -> 'c/d/d/../../..' stays
    inside by its letters until c/d -> '.' is made, and then climbs out. So every link is
    checked again once all are made, until none that is left leads out (removing one can change
    where another leads)."""
    while True:
        out = [
            link
            for link in links
            if not _within(os.path.realpath(os.path.join(root, link.name)), root)
        ]
        if not out:
            return
        for link in out:
            os.unlink(os.path.join(root, link.name))
            links.remove(link)
            got.links -= 1
            got.left_out.append(f"{_what(link)}: it leads out of the folder")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _refused(member: tarfile.TarInfo, root: str) -> str | None:
    """Why the entry is not made in `root`, or None: only folders, plain files and links that
    stay inside, by names that stay inside even through the links made before them."""
    if not (member.isdir() or member.isreg() or member.issym()):
        return "not a plain file, folder or link"
    parts = member.name.split("/")
    if member.name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        return "a name that leads out of the folder"
    if not _within(os.path.realpath(os.path.join(root, member.name)), root):
        return "under a link that leads out of the folder"
    if member.issym():
        parent = os.path.dirname(os.path.join(root, member.name))
        target = os.path.realpath(os.path.join(parent, member.linkname))
        if os.path.isabs(member.linkname) or not _within(target, root):
            return "it leads out of the folder"
    return None


def _own_mode(member: tarfile.TarInfo) -> None:
    """The caller's own file: no setuid, setgid or sticky bit, no write for group or others, and
    always readable (a folder enterable) by the caller; no owner but the caller."""
    mode = member.mode & 0o755
    member.mode = mode | (0o700 if member.isdir() else 0o600)
    member.uid = member.gid = os.getuid()
    member.uname = member.gname = ""


def _what(member: tarfile.TarInfo) -> str:
    shown = show.visible(member.name)
    if member.issym() or member.islnk():
        return f"link {shown!r} -> {show.visible(member.linkname)!r}"
    return repr(shown)
