"""The workspace as it stands, for its owner: the base with every done layer over it, exactly what
the next task would see, read from the stack's folders and never through a mount.

A path is found as overlayfs finds it (diffs.Below): the layers newest first, the first that has
the path wins; a whiteout, a non-folder on the way or the end of an opaque folder hides what is
further down. A folder's listing merges its layers the same way.

Every layer was written by a task, an attacker, so this reads them with the diff review's care:
every path walked from a folder's fd one name at a time following no link (beneath.py), a link
listed as a link and never followed, a file opened with O_NOFOLLOW | O_NONBLOCK and handed out
only if fstat says it is a plain file, so a FIFO never blocks and a file swapped for a link since
it was listed is refused. Sync: the manager calls these in asyncio.to_thread.
"""

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import NoReturn

from boxd.errors import Problem, die
from boxd.manager.folders.beneath import (
    DIR_FLAGS,
    READ_FLAGS,
    NotBeneath,
    open_folder,
    parent_of,
    split,
)
from boxd.manager.workspaces.diffs import ABSENT, Below, Marks, kind_of, shown_name
from boxd.manager.workspaces.layers import Layers
from boxd.paths import workspaces_dir
from boxd.wire.models.task_diff import Kind
from boxd.wire.models.task_request import MAX_PATH

# Entries in one folder's listing; beyond, the listing stops and says it was cut.
MAX_LISTED = 10_000
# Names read in one folder across its layers, hidden ones (whiteouts) too: a layer of a million
# whiteouts ends the listing here rather than holding a thread.
MAX_SCANNED = 10 * MAX_LISTED
# One name in a path, in bytes (Linux's NAME_MAX): a longer one is no file's.
MAX_NAME = 255


@dataclass(frozen=True)
class Level:
    """One folder of the stack: a done layer, by its name in the layer store, or the base."""

    name: str | None  # None: the base
    path: Path


@dataclass(frozen=True)
class Stack:
    levels: list[Level]  # newest first, the base last
    marks: Marks = field(default_factory=Marks)


def stack_of(layers: Layers, workspace: str, done: list[str]) -> Stack:
    """The stack of `workspace` with the done layers `done` (layer names, newest first)."""
    levels = [Level(name, layers.store(workspace) / name) for name in done]
    return Stack([*levels, Level(None, workspaces_dir(layers.home) / workspace)])


@dataclass(frozen=True)
class Entry:
    name: str  # as shown_name shows it: bytes that are not UTF-8 as \xNN
    not_utf8: bool
    kind: Kind
    size: int
    mtime: float
    layer: str | None  # the topmost layer that has it: the task that last changed it; None: base


@dataclass(frozen=True)
class Listing:
    entries: list[Entry]  # by name
    truncated: bool  # more than MAX_LISTED entries (or MAX_SCANNED names): some are left out


# A name's lstat and the layer it was found in, until it becomes an Entry.
_Found = tuple[os.stat_result, str | None]


def _entry(name: str, info: os.stat_result, layer: str | None) -> Entry:
    shown, not_utf8 = shown_name(name)
    return Entry(shown, not_utf8, kind_of(info), info.st_size, info.st_mtime, layer)


def checked(path: str) -> list[str]:
    """The names of a requested path ("" is the workspace itself), refused in words as the diff
    review refuses a path: no absolute path, no "..", ".", empty name or NUL, length caps."""
    if path == "":
        return []
    shown = shown_name(path)[0][:80]
    if len(os.fsencode(path)) > MAX_PATH:
        die(Problem.INVALID, f"a path in a workspace is at most {MAX_PATH} bytes")
    if path.startswith("/"):
        die(Problem.INVALID, f"{shown!r}: a path in a workspace is relative, with no leading /")
    try:
        parts = split(path)
    except NotBeneath:
        die(
            Problem.INVALID,
            f"{shown!r} is not a path in the workspace: it has an empty name, '.', '..' or NUL",
        )
    if any(len(os.fsencode(part)) > MAX_NAME for part in parts):
        die(Problem.INVALID, f"a name in a workspace is at most {MAX_NAME} bytes")
    return parts


@contextlib.contextmanager
def _opened(stack: Stack) -> Iterator[list[tuple[str | None, int]]]:
    """Each level's name and folder fd, newest first; one that is not there (undone and cleaned
    up since) is left out, as the diff review leaves it out."""
    with contextlib.ExitStack() as closing:
        roots = []
        for level in stack.levels:
            try:
                fd = os.open(level.path, DIR_FLAGS)
            except FileNotFoundError:
                continue
            closing.callback(os.close, fd)
            roots.append((level.name, fd))
        yield roots


# Public for the archive, which holds the level roots open for its whole walk.
level_roots = _opened


def _topmost(
    stack: Stack, roots: list[tuple[str | None, int]], parts: list[str]
) -> tuple[str | None, int, os.stat_result] | None:
    """The level that shows `parts`, its fd and the path's lstat there; None: not in the view."""
    below = Below([fd for _, fd in roots], stack.marks)
    for name, fd in roots:
        found, _ = below.look(fd, parts)
        if isinstance(found, os.stat_result):
            return name, fd, found
        if found != ABSENT:
            return None
    return None


def list_folder(stack: Stack, path: str) -> Listing:
    """The folder `path` as the next task would see it: each visible entry and the layer that
    last changed it."""
    parts = checked(path)
    with _opened(stack) as roots:
        levels = folder_levels(stack, roots, path, parts)
        try:
            seen, cut = _merged(stack, levels, MAX_SCANNED)
        finally:
            for _, fd in levels:
                os.close(fd)
        return _listing(seen, cut)


def folder_levels(
    stack: Stack, roots: list[tuple[str | None, int]], path: str, parts: list[str] | None = None
) -> list[tuple[str | None, int]]:
    """The levels that show the folder `path` (relative to `roots`), newest first, each with an
    fd of the folder there (the caller closes them): those further down than a whiteout, a
    non-folder on the way or an opaque folder are hidden. `roots` are the level roots `level_roots`
    gives, or the levels of a folder above as this gave them, `path` then relative to it (the
    archive's walk, which so never walks a deep path from the top again)."""
    parts = checked(path) if parts is None else parts
    shown = shown_name(path)[0]
    below = Below([fd for _, fd in roots], stack.marks)
    levels: list[tuple[str | None, int]] = []
    try:
        for layer, root in roots:
            opaque_above = False
            if parts:
                found, opaque_above = below.look(root, parts)
                if found == ABSENT:
                    continue
                if not isinstance(found, os.stat_result) or not stat.S_ISDIR(found.st_mode):
                    if not levels:
                        _not_a_folder(shown, found)
                    break
            try:
                fd = open_folder(root, path)
            except OSError:
                break  # swapped for something else since it was looked up: it hides the rest
            levels.append((layer, fd))
            if opaque_above or stack.marks.opaque(fd):
                break
        if not levels:
            _not_a_folder(shown, None)
    except BaseException:
        for _, fd in levels:
            os.close(fd)
        raise
    return levels


def merged_entries(
    stack: Stack, levels: list[tuple[str | None, int]]
) -> list[tuple[str, os.stat_result, str | None]]:
    """Every visible entry of a folder (no cap: the archive's walk), by name: its name, lstat
    and the layer that shows it; `levels` as folder_levels gives them."""
    seen, _ = _merged(stack, levels, None)
    shown = [(name, *where) for name, where in seen.items() if where is not None]
    return sorted(shown, key=itemgetter(0))


def _merged(
    stack: Stack, levels: list[tuple[str | None, int]], cap: int | None
) -> tuple[dict[str, _Found | None], bool]:
    """A folder's names merged across its levels as overlayfs merges them (None: hidden from the
    levels further down), and whether `cap` names were read before the end."""
    # None: hidden from the layers further down. Entries are made last, for those shown.
    seen: dict[str, _Found | None] = {}
    for layer, fd in levels:
        with os.scandir(fd) as names:
            for item in names:
                if item.name in seen:
                    continue
                if cap is not None and len(seen) >= cap:
                    return seen, True
                try:
                    info = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                hidden = stack.marks.whiteout(info)
                seen[item.name] = None if hidden else (info, layer)
    return seen, False


def _not_a_folder(shown: str, found: os.stat_result | str | None) -> NoReturn:
    if isinstance(found, os.stat_result):
        die(Problem.INVALID, f"{shown!r} is a {kind_of(found).value}, not a folder")
    die(Problem.NOT_FOUND, f"there is no folder {shown!r} in the workspace")


def _listing(seen: dict[str, _Found | None], cut: bool) -> Listing:
    shown = [(name, where) for name, where in seen.items() if where is not None]
    found = sorted(shown, key=itemgetter(0))
    entries = [_entry(name, info, layer) for name, (info, layer) in found[:MAX_LISTED]]
    return Listing(entries, cut or len(found) > MAX_LISTED)


_WHAT = {
    stat.S_IFLNK: "a link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFDIR: "a folder",
}


def _refuse(shown: str, mode: int) -> NoReturn:
    what = _WHAT.get(stat.S_IFMT(mode), "not a plain file")
    die(Problem.INVALID, f"{shown!r} is {what}, not a plain file: only plain files are read")


def open_file(stack: Stack, path: str) -> tuple[int, Entry]:
    """An O_RDONLY fd of the plain file the view shows at `path` (the caller closes it), and its
    entry as fstat sees the open file."""
    parts = checked(path)
    shown = shown_name(path)[0]
    if not parts:
        die(Problem.INVALID, "the workspace itself is a folder, not a plain file")
    with _opened(stack) as roots:
        top = _topmost(stack, roots, parts)
        if top is None:
            die(Problem.NOT_FOUND, f"there is no file {shown!r} in the workspace")
        layer, root, info = top
        # Refused before it is opened: a device is never opened at all.
        if not stat.S_ISREG(info.st_mode):
            _refuse(shown, info.st_mode)
        try:
            parent, name = parent_of(root, path)
        except OSError as error:
            die(
                Problem.FAILED,
                f"{shown!r} could not be reached: a folder on its way changed "
                f"({error.strerror or error})",
            )
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno == errno.ELOOP:  # swapped for a link since it was looked up
                _refuse(shown, stat.S_IFLNK)
            die(Problem.FAILED, f"{shown!r} could not be opened ({error.strerror or error})")
        finally:
            os.close(parent)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                _refuse(shown, opened.st_mode)
            # The open fd is what is read from now on: nothing swapped in the layer reaches it.
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd, _entry(parts[-1], opened, layer)


def history(stack: Stack, path: str) -> list[str | None]:
    """The levels that touch `path`, newest first: each done layer that wrote it, deleted it (a
    whiteout, a file over a folder on its way) or made an opaque folder over it, and last None if
    the base has it."""
    parts = checked(path)
    if not parts:
        die(Problem.INVALID, "a file's history needs a path in the workspace")
    with _opened(stack) as roots:
        below = Below([fd for _, fd in roots], stack.marks)
        return [name for name, fd in roots if below.look(fd, parts)[0] != ABSENT]


def changes(stack: Stack, path: str) -> list[tuple[str | None, str]]:
    """What each level that touches `path` did to it, newest first, as history lists them:
    "deleted" (a whiteout, or a file or opaque folder over it), "added" (written where no older
    level shows it) or "changed" (written over an older one)."""
    parts = checked(path)
    if not parts:
        die(Problem.INVALID, "a file's history needs a path in the workspace")
    with _opened(stack) as roots:
        below = Below([fd for _, fd in roots], stack.marks)
        found = [(name, below.look(fd, parts)[0]) for name, fd in roots]
    touched = [(name, isinstance(seen, os.stat_result)) for name, seen in found if seen != ABSENT]
    said = []
    for number, (name, written) in enumerate(touched):
        older = touched[number + 1][1] if number + 1 < len(touched) else False
        said.append((name, "deleted" if not written else "changed" if older else "added"))
    return said


def link_target(stack: Stack, layer: str | None, path: str) -> str | None:
    """The target of the link at `path` in one level (a listing's entry's), read and never
    followed; None if it is no longer a link there."""
    level = next((lv for lv in stack.levels if lv.name == layer), None)
    if level is None:
        return None
    try:
        root = os.open(level.path, DIR_FLAGS)
    except OSError:
        return None
    try:
        parent, name = parent_of(root, path)
    except (OSError, NotBeneath):
        return None
    finally:
        os.close(root)
    try:
        return shown_name(os.readlink(name, dir_fd=parent))[0]
    except OSError:
        return None
    finally:
        os.close(parent)
