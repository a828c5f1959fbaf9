"""The review of a task's changes: every path in its layer against what it replaces in the layers
below (the workspace as the task saw it), with a unified diff of each text file.

A change is what keep.py calls one: every entry of the layer, a whiteout (overlayfs's mark for a
deleted path) a deletion, an opaque folder one whose old content is gone. What a layer entry
replaces is found as overlayfs finds it: the layers below, newest first, the first that has the
path wins; a whiteout or a non-folder on the way, or the end of an opaque folder, hides what is
further down.

The layer was written by the task, an attacker: every path is walked from a folder's fd one name
at a time following no link (beneath.py), a file is opened with O_NOFOLLOW | O_NONBLOCK and read
only if fstat says it is a plain file, and no more than MAX_DIFF_READ bytes of it. Runs in a
thread (asyncio.to_thread): it reads files and diffs them.
"""

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.folders.beneath import (
    DIR_FLAGS,
    READ_FLAGS,
    lstat_at,
    open_dir,
    open_folder,
    parent_of,
)
from boxd.manager.folders.keep import OPAQUE, is_whiteout
from boxd.manager.pages import PAGE_CHARS, cursor
from boxd.manager.workspaces.text_diff import Slow, is_text, unified
from boxd.reading.strict_json import size
from boxd.wire.models.task_diff import (
    MAX_DIFF_FILES,
    MAX_DIFF_READ,
    PAGE_SECONDS,
    Change,
    FileChange,
    Kind,
)

# Keep (keep.py's _plans) applies no devices, sockets or FIFOs a task made.
KEEP_SKIPS = "keep leaves devices, sockets and FIFOs out"


def _opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False


@dataclass(frozen=True)
class Marks:
    """How deletions and replaced folders are marked: overlayfs's way, or a test's."""

    whiteout: Callable[[os.stat_result], bool] = is_whiteout
    opaque: Callable[[int], bool] = _opaque


@dataclass(frozen=True)
class _Old:
    """A path as it is in the layers below: the fd of the layer that has it, and its lstat."""

    root: int
    info: os.stat_result


@dataclass(frozen=True)
class _Entry:
    path: str
    new: os.stat_result | None  # None: deleted
    old: _Old | None  # None: added


ABSENT = "absent"  # not in this layer: look further down
HIDDEN = "hidden"  # this layer hides it: it is nowhere below either


class Below:
    """The layers under the task's own, newest first, as open folder fds (the caller's)."""

    def __init__(self, roots: list[int], marks: Marks) -> None:
        self.roots = roots
        self.marks = marks

    def look(self, root: int, parts: list[str]) -> tuple[os.stat_result | str, bool]:
        """The path's lstat in one layer, or ABSENT or HIDDEN; and whether a folder on the
        way is opaque there, which hides the path in the layers further down."""
        fd = os.dup(root)
        opaque_above = False
        try:
            for number, name in enumerate(parts):
                try:
                    info = lstat_at(fd, name)
                except OSError:
                    return HIDDEN, opaque_above
                if info is None:
                    return (HIDDEN if opaque_above else ABSENT), opaque_above
                if self.marks.whiteout(info):
                    return HIDDEN, opaque_above
                if number == len(parts) - 1:
                    return info, opaque_above
                if not stat.S_ISDIR(info.st_mode):
                    return HIDDEN, opaque_above
                try:
                    inner = open_dir(fd, name)
                except OSError:
                    return HIDDEN, opaque_above
                os.close(fd)
                fd = inner
                opaque_above = opaque_above or self.marks.opaque(fd)
            return HIDDEN, opaque_above
        finally:
            os.close(fd)

    def find(self, path: str) -> _Old | None:
        parts = path.split("/")
        for root in self.roots:
            found, _ = self.look(root, parts)
            if isinstance(found, os.stat_result):
                return _Old(root, found)
            if found == HIDDEN:
                return None
        return None

    def listing(self, path: str) -> dict[str, _Old]:
        """What the folder `path` holds in the layers below, merged as overlayfs merges it."""
        seen: dict[str, _Old | None] = {}
        for root in self.roots:
            found, opaque_above = self.look(root, path.split("/"))
            if found == ABSENT:
                continue
            if not isinstance(found, os.stat_result) or not stat.S_ISDIR(found.st_mode):
                break
            try:
                fd = open_folder(root, path)
            except OSError:
                break
            try:
                for child in os.listdir(fd):
                    if child in seen:
                        continue
                    info = lstat_at(fd, child)
                    if info is None or self.marks.whiteout(info):
                        seen[child] = None  # hidden in the layers further down too
                    else:
                        seen[child] = _Old(root, info)
                opaque = opaque_above or self.marks.opaque(fd)
            finally:
                os.close(fd)
            if opaque:
                break
        return {name: old for name, old in seen.items() if old is not None}

    def gone_under(self, path: str, keeps: set[str]) -> Iterator[_Entry]:
        """Everything below the folder `path` but the names in `keeps`, deleted."""
        for name, old in sorted(self.listing(path).items()):
            if name in keeps:
                continue
            inner = f"{path}/{name}"
            yield _Entry(inner, None, old)
            if stat.S_ISDIR(old.info.st_mode):
                yield from self.gone_under(inner, set())


def _entries(layer: int, prefix: str, below: Below, replaced: bool) -> Iterator[_Entry]:
    """The layer's changes, parents first, in name order. `replaced`: the folder is opaque, or
    inside one, so what the layers below held in it and the layer does not is gone."""
    names = sorted(os.listdir(layer))
    if replaced and prefix:
        yield from below.gone_under(prefix.rstrip("/"), set(names))
    for name in names:
        path = prefix + name
        try:
            info = lstat_at(layer, name)
        except OSError:
            continue
        if info is None:
            continue  # gone since it was listed: a running task's
        old = below.find(path)
        if below.marks.whiteout(info):
            if old is not None:
                yield _Entry(path, None, old)
                if stat.S_ISDIR(old.info.st_mode):
                    yield from below.gone_under(path, set())
            continue
        if not stat.S_ISDIR(info.st_mode):
            yield _Entry(path, info, old)
            if old is not None and stat.S_ISDIR(old.info.st_mode):
                yield from below.gone_under(path, set())
            continue
        if old is None or not stat.S_ISDIR(old.info.st_mode):
            yield _Entry(path, info, old)
        try:
            inner = open_dir(layer, name)
        except OSError:
            continue
        try:
            opaque = replaced or below.marks.opaque(inner)
            yield from _entries(inner, path + "/", below, opaque and old is not None)
        finally:
            os.close(inner)


def kind_of(info: os.stat_result) -> Kind:
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISLNK(mode):
        return Kind.LINK
    return Kind.DIR if stat.S_ISDIR(mode) else Kind.OTHER


def shown_name(path: str) -> tuple[str, bool]:
    """The name as text, and whether it was not UTF-8 (its bytes then show as \\xNN)."""
    if path.isascii():
        return path, False  # the common case, and a folder lists thousands (stack_view.py)
    raw = os.fsencode(path)
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), True


class _Unread(Exception):
    """A side that could not be read, in words."""


def _read(root: int, path: str) -> bytes | None:
    """At most MAX_DIFF_READ bytes of a plain file, or None if it is larger."""
    try:
        parent, name = parent_of(root, path)
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as error:
        raise _Unread(f"it could not be opened ({error.strerror or error})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Unread("it is no longer a plain file")
        chunks: list[bytes] = []
        left = MAX_DIFF_READ + 1
        while left > 0:
            chunk = os.read(fd, min(left, 64 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return None if left <= 0 else b"".join(chunks)
    except OSError as error:
        raise _Unread(f"it could not be read ({error.strerror or error})") from None
    finally:
        os.close(fd)


def _link(root: int, path: str) -> str:
    parent, name = parent_of(root, path)
    try:
        return shown_name(os.readlink(name, dir_fd=parent))[0]
    finally:
        os.close(parent)


def describe(entry: _Entry, layer: int, personal: bool) -> dict[str, Any]:
    """One entry as the API shows it (task_diff.FileChange)."""
    name, not_utf8 = shown_name(entry.path)
    new, old = entry.new, entry.old
    now = new if new is not None else old.info if old is not None else None
    assert now is not None
    change = Change.DELETED if new is None else Change.ADDED if old is None else Change.CHANGED
    kind = kind_of(now)
    fields: dict[str, Any] = {"path": name, "change": change, "kind": kind}
    if not_utf8:
        fields["nameNotUtf8"] = True
    old_kind = kind_of(old.info) if old is not None else None
    if new is not None and old_kind is not None and old_kind != kind:
        fields["oldKind"] = old_kind
    if personal and kind == Kind.OTHER and new is not None:
        fields["skipped"] = KEEP_SKIPS
    try:
        if new is not None and kind == Kind.LINK:
            fields["target"] = _link(layer, entry.path)
        if old is not None and old_kind == Kind.LINK:
            fields["oldTarget" if new is not None else "target"] = _link(old.root, entry.path)
    except OSError as error:
        fields["notShown"] = f"its link could not be read ({error.strerror or error})"
    new_file = new is not None and kind == Kind.FILE
    old_file = old is not None and old_kind == Kind.FILE
    if not (new_file or old_file):
        return FileChange(**fields).model_dump(mode="json", exclude_none=True)
    if new_file:
        assert new is not None
        fields["size"] = new.st_size
    if old_file:
        assert old is not None
        fields["oldSize" if new is not None else "size"] = old.info.st_size
    try:
        after = _read(layer, entry.path) if new_file else b""
        before = _read(old.root, entry.path) if old_file and old is not None else b""
    except _Unread as why:
        fields["notShown"] = str(why)
        return FileChange(**fields).model_dump(mode="json", exclude_none=True)
    if after is None or before is None:
        fields["tooLarge"] = True
        return FileChange(**fields).model_dump(mode="json", exclude_none=True)
    if not (is_text(after) and is_text(before)):
        fields["binary"] = True
        return FileChange(**fields).model_dump(mode="json", exclude_none=True)
    try:
        text, cut = unified(name, before if old_file else None, after if new_file else None)
    except Slow as slow:
        fields["notShown"] = str(slow)
        return FileChange(**fields).model_dump(mode="json", exclude_none=True)
    fields["diff"] = text
    if cut:
        fields["truncated"] = True
    return FileChange(**fields).model_dump(mode="json", exclude_none=True)


@dataclass(frozen=True)
class DiffPage:
    files: list[dict[str, Any]]
    truncated: bool
    next: str | None


def diff_page(
    layer: Path, below: list[Path], page: str, personal: bool, marks: Marks = Marks()
) -> DiffPage:
    """One page of the review: the entries after the page's cursor (pages.py's), whole, up to
    PAGE_CHARS of JSON. `below`: the layers under the task's own, newest first; one that is not
    there (undone and cleaned up since) is left out."""
    after = cursor(page)
    with contextlib.ExitStack() as stack:
        root = os.open(layer, DIR_FLAGS)
        stack.callback(os.close, root)
        roots = []
        for path in below:
            try:
                fd = os.open(path, DIR_FLAGS)
            except FileNotFoundError:
                continue
            stack.callback(os.close, fd)
            roots.append(fd)
        try:
            changes = _entries(root, "", Below(roots, marks), False)
            found = list(islice(changes, MAX_DIFF_FILES + 1))
        except RecursionError:
            die(Problem.FAILED, "the task's changes hold folders nested too deep to review")
        truncated = len(found) > MAX_DIFF_FILES
        files: list[dict[str, Any]] = []
        used = 0
        began = time.monotonic()
        for number, entry in enumerate(found[:MAX_DIFF_FILES]):
            if after is not None and number <= after:
                continue
            if files and time.monotonic() - began > PAGE_SECONDS:
                # The rest in the next page: no call holds a thread for long.
                return DiffPage(files, truncated, str(number - 1))
            item = describe(entry, root, personal)
            shown = size(item)
            if files and used + shown > PAGE_CHARS:
                return DiffPage(files, truncated, str(number - 1))
            files.append(item)
            used += shown
        return DiffPage(files, truncated, None)
