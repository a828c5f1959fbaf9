"""Keeping a personal task: its layer's changes, deletions included, go into the real folders.

What the task saw is recorded when it starts (a manifest of its view: kind, size and modification
time of every path). When the owner keeps it, every path the task changed must still be in the
real folder as the task saw it; if the owner changed one since, that is a conflict and nothing
is applied. A path already as the task left it is no conflict, so a keep that stopped half-way
can be kept again.

boxd reads the layer (its own) and streams it to a process running as the account that asked
for the task (as_owner.py; each folder's owner when root asked), which checks for conflicts and
writes, by directory fds and following no link: what lands in the real folders is what that
account could have written there, and nothing lands outside them. Holes stay holes. If that
process stops half-way, the outcome says which paths were applied and which were not.
"""

import contextlib
import json
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boxd.manager.folders.beneath import READ_FLAGS
from boxd.manager.folders.folder_stream import StreamError
from boxd.manager.folders.folders import Folder
from boxd.manager.folders.mirror import MirrorError, State, acting_uid, state_of
from boxd.manager.folders.owner_process import OwnerError, OwnerProcess

# How overlayfs marks a folder whose lower content is gone, and a deleted path (diffs.py too).
OPAQUE = "trusted.overlay.opaque"


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


def is_whiteout(info: os.stat_result) -> bool:
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def layer_changes(layer: Path) -> list[Change]:
    """Parents before what is in them, in one order, so a keep that stops can say what is left."""
    changes = []
    for path, info in _walk(layer):
        whiteout = is_whiteout(info)
        opaque = stat.S_ISDIR(info.st_mode) and _is_opaque(layer / path)
        changes.append(Change(path, info, deleted=whiteout, replaces=opaque))
    return sorted(changes, key=lambda change: change.path.split("/"))


class Places:
    """Where a path of the task's view is in the real folders: one folder is the view itself;
    several sit side by side under their names. Paths in a folder are relative ("" for itself)."""

    def __init__(self, folders: list[Folder]) -> None:
        self.folders = folders
        self._by_name = {f.name: f for f in folders}

    def real(self, path: str) -> tuple[Folder, str] | None:
        if len(self.folders) == 1:
            return self.folders[0], path
        top, _, rest = path.partition("/")
        folder = self._by_name.get(top)
        return None if folder is None else (folder, rest)

    def view(self, folder: Folder, relative: str) -> str:
        if len(self.folders) == 1:
            return relative
        return f"{folder.name}/{relative}" if relative else folder.name


class KeepError(Exception):
    """Nothing was applied, for the reason in the words."""


@dataclass
class Outcome:
    """What a keep did: conflicts (nothing applied), or the paths applied, and if it stopped
    half-way, where, why and what was not applied."""

    conflicts: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)
    stopped_at: str | None = None
    why: str | None = None

    def stopped_words(self) -> str:
        """A keep that stopped half-way, in words: what is in the folders now and what is not."""
        return (
            f"Keeping stopped at {self.stopped_at}: {self.why}. Applied (in your folders now): "
            f"{_listed(self.applied)}. Not applied: {_listed(self.not_applied)}. Fix what "
            "stopped it and keep again (what was applied counts as no conflict), or undo the "
            "task (what was applied stays)."
        )


def _listed(paths: list[str]) -> str:
    if not paths:
        return "nothing"
    more = f" and {len(paths) - 20} more" if len(paths) > 20 else ""
    return ", ".join(paths[:20]) + more


@dataclass
class _Plan:
    folder: Folder
    items: list[tuple[str, str, Change]] = field(default_factory=list)  # view, relative, change


def _kind(info: os.stat_result) -> str:
    return state_of(info)[0]


def _sent(change: Change, relative: str, layer: Path) -> dict[str, Any]:
    info = change.info
    sent: dict[str, Any] = {
        "p": relative,
        "k": _kind(info),
        "del": change.deleted,
        "rep": change.replaces,
        "m": stat.S_IMODE(info.st_mode),
        "s": info.st_size,
        "t": info.st_mtime_ns,
        "a": info.st_atime_ns,
    }
    if stat.S_ISLNK(info.st_mode) and not change.deleted:
        sent["l"] = os.readlink(layer / change.path)
    return sent


def _plans(changes: list[Change], places: Places) -> list[_Plan]:
    plans = {folder.path: _Plan(folder) for folder in places.folders}
    for change in changes:
        place = places.real(change.path)
        if place is None:
            continue
        if not change.deleted and _kind(change.info) == "other":
            continue  # devices, sockets and FIFOs a task made are not files to keep
        folder, relative = place
        plans[folder.path].items.append((change.path, relative, change))
    return [plan for plan in plans.values() if plan.items]


def _saw_in(folder: Folder, saw: dict[str, State], places: Places) -> dict[str, State]:
    if len(places.folders) == 1:
        return saw
    prefix = folder.name + "/"
    inside = {p.removeprefix(prefix): s for p, s in saw.items() if p.startswith(prefix)}
    if folder.name in saw:
        inside[""] = saw[folder.name]
    return inside


def _read_answers(child: OwnerProcess, answers: list[dict[str, Any]]) -> None:
    with contextlib.suppress(StreamError, OSError, ValueError):
        while (answer := child.reader.record()) is not None:
            answers.append(answer)


def _send(child: OwnerProcess, plan: _Plan, layer: Path, outcome: Outcome) -> bool:
    """Streams the plan's files to the owner's process as it applies them; True if all went."""
    answers: list[dict[str, Any]] = []
    listening = threading.Thread(target=_read_answers, args=(child, answers), daemon=True)
    listening.start()
    ours: str | None = None  # why boxd itself could not go on, if it could not
    try:
        child.writer.record({"go": True})
        for view, relative, change in plan.items:
            if change.deleted or not stat.S_ISREG(change.info.st_mode):
                continue
            try:
                fd = os.open(layer / change.path, READ_FLAGS)
            except OSError as error:
                ours = f"the task's copy of {view} could not be read ({error.strerror})"
                break
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    ours = f"the task's copy of {view} is no longer a plain file"
                    break
                child.writer.record({"p": relative})
                child.writer.content(fd, change.info.st_size)
            finally:
                os.close(fd)
        child.writer.flush()
    except BrokenPipeError:
        pass  # it stopped reading: it says why below
    child.close_input()
    status = child.finish()
    listening.join()
    by_relative = {relative: view for view, relative, _ in plan.items}
    done: set[str] = set()
    for answer in answers:
        if "applied" in answer:
            done.add(str(answer["applied"]))
        elif "failed" in answer:
            outcome.stopped_at = by_relative.get(str(answer["failed"]), str(answer["failed"]))
            outcome.why = ours or str(answer.get("why"))
    outcome.applied.extend(view for view, relative, _ in plan.items if relative in done)
    left = [view for view, relative, _ in plan.items if relative not in done]
    if status == 0 and not left:
        return True
    outcome.not_applied.extend(left)
    if outcome.stopped_at is None:
        outcome.stopped_at = left[0] if left else plan.folder.name
        outcome.why = ours or child.complaint()
    return False


def keep(
    changes: list[Change], saw: dict[str, State], layer: Path, places: Places, asker: int
) -> Outcome:
    """Checks every folder for conflicts, then applies the changes folder by folder, as the
    account `asker` (each folder's owner, when root asked)."""
    plans = _plans(changes, places)
    with contextlib.ExitStack() as stack:
        children: list[OwnerProcess] = []
        for plan in plans:
            try:
                uid = acting_uid(asker, plan.folder.path)
                child = stack.enter_context(OwnerProcess(uid, "keep", str(plan.folder.path)))
            except MirrorError as error:
                raise KeepError(f"{error}; nothing was applied") from None
            except (OwnerError, OSError) as error:
                why = f"folder {plan.folder.path}: {error}; nothing was applied"
                raise KeepError(why) from None
            children.append(child)
            child.writer.record(
                {
                    "changes": [_sent(c, relative, layer) for _, relative, c in plan.items],
                    "saw": _saw_in(plan.folder, saw, places),
                }
            )
            child.writer.flush()
        found: list[str] = []
        for plan, child in zip(plans, children, strict=True):
            try:
                answer = child.reader.record()
            except StreamError:
                answer = None
            if answer is None or "conflicts" not in answer:
                child.finish()
                said = answer.get("error") if answer else child.complaint()
                raise KeepError(f"folder {plan.folder.path}: {said}; nothing was applied")
            found.extend(places.view(plan.folder, str(p)) for p in answer["conflicts"])
        if found:
            return Outcome(conflicts=sorted(found))
        outcome = Outcome()
        for number, (plan, child) in enumerate(zip(plans, children, strict=True)):
            if not _send(child, plan, layer, outcome):
                for later in plans[number + 1 :]:
                    outcome.not_applied.extend(view for view, _, _ in later.items)
                break
        return outcome
