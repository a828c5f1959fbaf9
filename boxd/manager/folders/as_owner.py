"""What boxd does in a personal folder, done by a process that runs as the account that asked.

boxd starts `python -I -m boxd.manager.folders.as_owner VERB FOLDER UID` with that account's uid,
gid and groups (owner_process.py): the account that asked for the task, which owns the folder, or
the folder's owner when root asked. What it reads is what that account can read, what it writes
the account could have written, and root's power is never used on a path a user controls. On top
of the account's credentials, every path is walked from the folder's fd one name at a time with
O_NOFOLLOW (beneath.py), files are opened with O_NONBLOCK and read only if fstat says they are
regular, so a folder swapped for a link, or a file for a FIFO, mid-copy leads nowhere. For read
and keep, the folder must belong to UID when it is opened.

Verbs (the protocol is folder_stream.py's):
- look: the path as the account asked for it, followed (links too) with the account's rights:
  `{"real": path, "folder": bool, "owner": uid, "unreadable": why or null}`, or `{"missing":
  true}`, or `{"error": ...}` when it cannot be followed.
- read: the mirror's manifest comes in (`{"have": {path: state}}`); out go the folder's entries,
  parents first, with the content of each file whose state differs from the mirror's.
- keep: the task's changes and what it saw come in; out go the paths that conflict. On
  `{"go": true}` the changes are applied in order, each file's content read from the stream,
  and each path applied is reported, or the one that failed, and why.
"""

import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

from boxd.manager.folders.beneath import (
    READ_FLAGS,
    lstat_at,
    open_dir,
    open_folder,
    open_path,
    parent_of,
    remove_at,
    walk,
)
from boxd.manager.folders.folder_stream import Reader, Writer
from boxd.manager.folders.mirror import state_of
from boxd.manager.folders.pause import pause, point_name

# A file or folder the task made gets its mode without the bits a usual umask (022) takes away:
# never writable by others, never setuid, setgid or sticky. One the owner had keeps at most the
# mode it had.
NEW_MASK = 0o755
_LINKISH = ("Too many levels of symbolic links", "Not a directory")


def words(error: BaseException) -> str:
    """An error as a person reads it: a folder swapped for a link says so."""
    if isinstance(error, OSError) and error.strerror:
        if error.strerror in _LINKISH:
            return "a folder on its way is a link or a file now, so it was not followed"
        return str(error.strerror[0].lower() + error.strerror[1:])
    return str(error) or type(error).__name__


def _state(info: os.stat_result) -> list[Any]:
    return list(state_of(info))


# --- look: where a path the account named leads ------------------------------------------------


def _look(asked: str, out: Writer) -> int:
    try:
        real = Path(asked).resolve(strict=True)
    except FileNotFoundError:
        out.record({"missing": True})
        return 0
    except (OSError, RuntimeError) as error:
        out.record({"error": words(error)})
        return 0
    try:
        info = os.lstat(real)
    except OSError as error:
        out.record({"error": words(error)})
        return 0
    folder = stat.S_ISDIR(info.st_mode)
    unreadable: str | None = None
    if folder:
        try:
            fd = open_path(str(real))
            try:
                os.listdir(fd)
            finally:
                os.close(fd)
        except OSError as error:
            unreadable = words(error)
    found = {"real": str(real), "folder": folder, "owner": info.st_uid}
    out.record(found | {"unreadable": unreadable})
    return 0


# --- read: the owner's folder, into the mirror --------------------------------------------------


def _send_tree(folder: int, prefix: str, have: dict[str, Any], out: Writer) -> None:
    for name in sorted(os.listdir(folder)):
        relative = prefix + name
        info = lstat_at(folder, name)
        # What belongs to root stays out of the copy, as it always has.
        if info is None or info.st_uid == 0:
            continue
        if stat.S_ISDIR(info.st_mode):
            pause(point_name("mirror", relative))
            try:
                child = open_dir(folder, name)
            except OSError as error:
                out.record({"skip": relative, "why": words(error)})
                continue
            try:
                now = os.fstat(child)
                if now.st_uid == 0:
                    continue
                out.record({"p": relative, "k": "dir", "m": stat.S_IMODE(now.st_mode)})
                _send_tree(child, relative + "/", have, out)
            finally:
                os.close(child)
        elif stat.S_ISLNK(info.st_mode):
            try:
                target = os.readlink(name, dir_fd=folder)
            except OSError as error:
                out.record({"skip": relative, "why": words(error)})
                continue
            out.record(
                {"p": relative, "k": "link", "l": target}
                | {"s": info.st_size, "t": info.st_mtime_ns, "a": info.st_atime_ns}
            )
        elif stat.S_ISREG(info.st_mode):
            _send_file(folder, name, relative, info, have, out)
        # Devices, sockets and FIFOs are not files a task works on; they are left out.


def _send_file(
    folder: int, name: str, relative: str, info: os.stat_result, have: dict[str, Any], out: Writer
) -> None:
    header = {"p": relative, "k": "file", "m": stat.S_IMODE(info.st_mode)}
    if have.get(relative) == _state(info):
        out.record(header | {"same": True})
        return
    pause(point_name("mirror", relative))
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=folder)
    except OSError as error:
        out.record({"skip": relative, "why": words(error)})
        return
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or now.st_uid == 0:
            out.record({"skip": relative, "why": "it is no longer a plain file"})
            return
        out.record(
            header
            | {"m": stat.S_IMODE(now.st_mode), "s": now.st_size}
            | {"t": now.st_mtime_ns, "a": now.st_atime_ns}
        )
        out.content(fd, now.st_size)
    finally:
        os.close(fd)


# --- keep: the task's changes, into the owner's folder ------------------------------------------


def _state_at(root: int, relative: str) -> list[Any] | None:
    """The path's state, found by fds; a step that is a link now is a state of its own."""
    if relative == "":
        return _state(os.fstat(root))
    try:
        parent, name = parent_of(root, relative)
    except FileNotFoundError:
        return None
    except OSError:
        return ["blocked", 0, 0]
    try:
        info = lstat_at(parent, name)
        return None if info is None else _state(info)
    finally:
        os.close(parent)


def _files_under(root: int, relative: str) -> dict[str, list[Any]]:
    try:
        folder = open_folder(root, relative)
    except OSError:
        return {}
    try:
        prefix = relative + "/" if relative else ""
        return {
            prefix + path: _state(info)
            for path, info in walk(folder)
            if not stat.S_ISDIR(info.st_mode)
        }
    finally:
        os.close(folder)


def conflicts(root: int, changes: list[dict[str, Any]], saw: dict[str, Any]) -> list[str]:
    """The paths the task changed that are no longer in the folder as the task saw it."""
    found: list[str] = []
    for change in changes:
        path = change["p"]
        now = _state_at(root, path)
        if change["k"] == "dir" and not change["rep"] and not change["del"]:
            # A folder the task only wrote into: its files speak for themselves.
            if now is not None and now[0] != "dir":
                found.append(path)
            continue
        if change["del"] and now is None:
            continue  # gone anyway: nothing of the owner's is lost
        if not change["del"] and now == [change["k"], change["s"], change["t"]]:
            continue  # already as the task left it: a keep that stopped half-way, kept again
        if now != saw.get(path):
            found.append(path)
        if change["rep"] or change["del"]:
            # Every file the task threw away with a folder must be as the task saw it too.
            prefix = path + "/" if path else ""
            before = {p: s for p, s in saw.items() if p.startswith(prefix) and s[0] != "dir"}
            after = _files_under(root, path) if now is not None and now[0] == "dir" else {}
            found.extend(p for p in set(before) | set(after) if before.get(p) != after.get(p))
    return sorted(set(found))


def _mode(task_mode: int, present: os.stat_result | None) -> int:
    if present is not None and stat.S_ISREG(present.st_mode):
        return task_mode & stat.S_IMODE(present.st_mode) & 0o777
    return task_mode & NEW_MASK


def _put(parent: int, name: str, present: os.stat_result | None, temporary: str) -> None:
    """Renames the finished temporary file over `name`: the owner never sees half of it."""
    if present is not None and stat.S_ISDIR(present.st_mode):
        remove_at(parent, name)
    os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)


def _apply(root: int, change: dict[str, Any], reader: Reader) -> None:
    path = change["p"]
    if path == "":
        if change["rep"]:
            for name in os.listdir(root):
                remove_at(root, name)
        return
    parent, name = parent_of(root, path)
    try:
        present = lstat_at(parent, name)
        temporary = f".{name[:200]}.{secrets.token_hex(4)}.boxd"
        if change["del"]:
            remove_at(parent, name)
        elif change["k"] == "dir":
            if present is not None and (not stat.S_ISDIR(present.st_mode) or change["rep"]):
                remove_at(parent, name)
                present = None
            if present is None:
                os.mkdir(name, 0o700, dir_fd=parent)
                made = open_dir(parent, name)
                try:
                    os.fchmod(made, change["m"] & NEW_MASK)
                finally:
                    os.close(made)
        elif change["k"] == "link":
            os.symlink(change["l"], temporary, dir_fd=parent)
            times = (change["a"], change["t"])
            os.utime(temporary, ns=times, dir_fd=parent, follow_symlinks=False)
            _put(parent, name, present, temporary)
        elif change["k"] == "file":
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temporary, flags, 0o600, dir_fd=parent)
            try:
                head = reader.record()
                if head is None or head.get("p") != path:
                    raise OSError(f"boxd sent no content for {path}")
                reader.content(fd, change["s"])
                os.fchmod(fd, _mode(change["m"], present))
                os.utime(fd, ns=(change["a"], change["t"]))
                os.fsync(fd)
                _put(parent, name, present, temporary)
            except BaseException:
                os.unlink(temporary, dir_fd=parent)
                raise
            finally:
                os.close(fd)
    finally:
        os.close(parent)


def _keep(root: int, reader: Reader, out: Writer) -> int:
    plan = reader.record()
    if plan is None:
        return 1
    changes: list[dict[str, Any]] = plan["changes"]
    out.record({"conflicts": conflicts(root, changes, plan["saw"])})
    out.flush()
    go = reader.record()
    if go is None or not go.get("go"):
        return 0
    for change in changes:
        pause(point_name("keep", change["p"]))
        try:
            _apply(root, change, reader)
        except Exception as error:
            out.record({"failed": change["p"], "why": words(error)})
            out.flush()
            return 1
        out.record({"applied": change["p"]})
        out.flush()
    return 0


def main(argv: list[str]) -> int:
    verb, folder, uid = argv[0], argv[1], int(argv[2])
    out = Writer(sys.stdout.buffer)
    reader = Reader(sys.stdin.buffer)
    if verb == "look":
        status = _look(folder, out)
        out.flush()
        return status
    try:
        root = open_path(folder)
        if os.fstat(root).st_uid != uid:
            raise OSError(0, "it belongs to another account now")
    except OSError as error:
        out.record({"error": words(error)})
        out.flush()
        return 1
    if verb == "read":
        asked = reader.record()
        _send_tree(root, "", dict(asked["have"]) if asked else {}, out)
        status = 0
    elif verb == "keep":
        status = _keep(root, reader, out)
    else:
        out.record({"error": f"no verb {verb}"})
        status = 2
    out.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
