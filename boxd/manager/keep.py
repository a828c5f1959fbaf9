"""Keeping a personal task: its layer's changes, deletions included, go into the real folders.

What the task saw is recorded when it starts (a manifest of its view: kind, size and modification
time of every path). When the owner keeps it, every path the task changed must still be in the
real folder as the task saw it; if the owner changed one since, that is a conflict and nothing
is applied. Files written into the real folders belong to the folder's owner.
"""

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from boxd.manager.folders import Folder
from boxd.manager.mirror import State, remove_entry, state_of

_OPAQUE = "trusted.overlay.opaque"


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) for everything under root, parents first."""
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                path = Path(entry.path)
                yield str(path.relative_to(root)), info
                if stat.S_ISDIR(info.st_mode):
                    stack.append(path)


def take_manifest(view: Path) -> dict[str, State]:
    return {path: state_of(info) for path, info in _walk(view)}


def save_manifest(manifest: dict[str, State], file: Path) -> None:
    with file.open("w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        json.dump(manifest, handle)
        handle.flush()
        os.fsync(handle.fileno())


def load_manifest(file: Path) -> dict[str, State]:
    return {path: (s[0], s[1], s[2]) for path, s in json.loads(file.read_text()).items()}


@dataclass(frozen=True)
class Change:
    """One entry of a task's layer. `replaces`: an opaque folder, whose old content is gone."""

    path: str
    info: os.stat_result
    deleted: bool = False
    replaces: bool = False


def _is_whiteout(info: os.stat_result) -> bool:
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, _OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def layer_changes(layer: Path) -> list[Change]:
    changes = []
    for path, info in _walk(layer):
        whiteout = _is_whiteout(info)
        opaque = stat.S_ISDIR(info.st_mode) and _is_opaque(layer / path)
        changes.append(Change(path, info, deleted=whiteout, replaces=opaque))
    return changes


class Places:
    """Where a path of the task's view is in the real folders: one folder is the view itself;
    several sit side by side under their names."""

    def __init__(self, folders: list[Folder]) -> None:
        self._folders = folders
        self._by_name = {f.name: f for f in folders}

    def real(self, path: str) -> tuple[Folder, Path] | None:
        if len(self._folders) == 1:
            return self._folders[0], self._folders[0].path / path
        top, _, rest = path.partition("/")
        folder = self._by_name.get(top)
        if folder is None:
            return None
        return folder, folder.path / rest if rest else folder.path


def _now(path: Path) -> State | None:
    try:
        return state_of(path.lstat())
    except FileNotFoundError:
        return None


def conflicts(changes: list[Change], saw: dict[str, State], places: Places) -> list[str]:
    """The paths the task changed that are no longer in the real folders as the task saw them."""
    found: list[str] = []
    for change in changes:
        place = places.real(change.path)
        if place is None:
            continue
        real = place[1]
        if stat.S_ISDIR(change.info.st_mode) and not change.replaces:
            # A folder the task only wrote into: its files speak for themselves.
            now = _now(real)
            if now is not None and now[0] != "dir":
                found.append(change.path)
            continue
        now = _now(real)
        gone_anyway = change.deleted and now is None
        if now != saw.get(change.path) and not gone_anyway:
            found.append(change.path)
        if change.replaces or change.deleted:
            # Every file the task threw away with a folder must be as the task saw it too.
            prefix = change.path + "/"
            before = {p: s for p, s in saw.items() if p.startswith(prefix) and s[0] != "dir"}
            after: dict[str, State] = {}
            if real.is_dir() and not real.is_symlink():
                after = {f"{prefix}{p}": s for p, s in take_manifest(real).items() if s[0] != "dir"}
            found.extend(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    return sorted(set(found))


class UnsafePath(Exception):
    """A path in the real folder leads elsewhere through a link the owner made since."""


def _owner(folder: Folder) -> tuple[int, int]:
    info = folder.path.stat()
    return info.st_uid, info.st_gid


def apply(changes: list[Change], layer: Path, places: Places) -> int:
    """Writes the layer into the real folders; returns how many paths it changed. Every path is
    checked before the first is written, so a refusal leaves the folders as they were."""
    plan: list[tuple[Change, Folder, Path]] = []
    for change in changes:
        place = places.real(change.path)
        if place is None:
            continue
        folder, real = place
        if real != folder.path and real.parent.resolve() != real.parent:
            raise UnsafePath(
                f"{change.path}: a folder on its way in {folder.path} is a link now, so "
                "nothing was written"
            )
        plan.append((change, folder, real))
    applied = 0
    for change, folder, real in plan:
        uid, gid = _owner(folder)
        source = layer / change.path
        mode = stat.S_IMODE(change.info.st_mode) & ~0o6000
        if change.deleted:
            remove_entry(real)
        elif stat.S_ISDIR(change.info.st_mode):
            if real != folder.path:
                if real.is_symlink() or (real.exists() and not real.is_dir()) or change.replaces:
                    remove_entry(real)
                if not real.exists():
                    real.mkdir(mode=mode)
                    os.chown(real, uid, gid)
                    os.chmod(real, mode)
            elif change.replaces:
                for entry in list(real.iterdir()):
                    remove_entry(entry)
        elif stat.S_ISREG(change.info.st_mode) or stat.S_ISLNK(change.info.st_mode):
            _replace(source, real, change.info, mode, uid, gid)
        else:
            continue
        applied += 1
    return applied


def _replace(source: Path, real: Path, info: os.stat_result, mode: int, uid: int, gid: int) -> None:
    """Puts the file in place in one rename, so the owner never sees half of it."""
    if real.is_dir() and not real.is_symlink():
        shutil.rmtree(real)
    fd, name = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".boxd")
    os.close(fd)
    temporary = Path(name)
    try:
        if stat.S_ISLNK(info.st_mode):
            temporary.unlink()
            temporary.symlink_to(os.readlink(source))
            os.lchown(temporary, uid, gid)
            os.utime(temporary, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
        else:
            with source.open("rb") as reading, temporary.open("wb") as writing:
                shutil.copyfileobj(reading, writing, 1 << 20)
                writing.flush()
                os.fsync(writing.fileno())
            os.chown(temporary, uid, gid)
            os.chmod(temporary, mode)
            os.utime(temporary, ns=(info.st_atime_ns, info.st_mtime_ns))
        temporary.rename(real)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
