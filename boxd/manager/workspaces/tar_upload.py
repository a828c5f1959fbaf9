"""An owner's upload: a tar stream (plain or gzip-compressed) read from a descriptor, its entries
written under a folder of a staged layer (owner_layer.py).

The stream comes from boxctl or the web process, and through them from anyone who can upload:
it is read as an attacker's. Only plain files and folders are taken; a link (symbolic or hard),
a device, a FIFO or anything else refuses the whole upload in words. Why no links: an entry
after a link can name a path through it (`a -> /etc`, then `a/passwd`), which is the classic way
out of an extraction; a hard link names another entry, or a file outside; and a workspace needs
none of them from its owner (a task that wants a link makes one). Names are checked as the
review checks a path (stack_view.checked: relative, no '..', '.', empty name or NUL, 4,096
bytes), entries count against the change's caps (owner_layer.MAX_ENTRIES, MAX_BYTES) as they
come, headers that carry a name or attributes (pax, GNU long names) are at most 64 KiB, and the
stream must end with tar's end-of-archive mark: a stream cut off between two entries is a
truncated upload, not a smaller one. A sender that stops sending for IDLE_SECONDS is given up on.
"""

import os
import select
import stat
import tarfile
import zlib
from typing import Any, NoReturn

from boxd.errors import BoxError, Problem, die
from boxd.manager.workspaces import stack_view
from boxd.manager.workspaces.diffs import shown_name
from boxd.manager.workspaces.owner_layer import (
    EXEC_MODE,
    FILE_MODE,
    FOLDER_MODE,
    MAX_ENTRIES,
    Made,
    must_be_folder_or_absent,
    write_file,
)
from boxd.manager.workspaces.stack_view import Stack

# A sender that sends nothing this long is given up on. Long, since the web process spools a
# multipart part whole before its first byte comes (its size leads its tar header): a 1 GiB part
# over a slow link keeps the pipe silent that long. Only the owner's doors upload.
IDLE_SECONDS = 600.0
MAX_HEADER = 64 * 1024
_HEADERS = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)


class _Cut(tarfile.TarError):
    pass


class _Member(tarfile.TarInfo):
    """A tar header read with caps: a name or attributes header at most MAX_HEADER bytes, which
    tarfile would read whole into memory; a header cut short is a cut-off stream."""

    @classmethod
    def fromtarfile(cls, tarfile_: tarfile.TarFile) -> "_Member":
        fileobj: Any = tarfile_.fileobj
        buf = fileobj.read(tarfile.BLOCKSIZE)
        if len(buf) != tarfile.BLOCKSIZE:
            raise _Cut("the upload ended before tar's end-of-archive mark")
        obj = cls.frombuf(buf, tarfile_.encoding, tarfile_.errors)
        obj.offset = fileobj.tell() - tarfile.BLOCKSIZE
        if obj.type in _HEADERS and obj.size > MAX_HEADER:
            raise _Cut(f"a tar header of {obj.size} bytes: at most {MAX_HEADER} are read")
        process = getattr(obj, "_proc_member")  # noqa: B009 (tarfile's own, not typed)
        member: _Member = process(tarfile_)
        return member


class _Source:
    """The descriptor, read with a limit on how long the sender may stay silent."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.poll = select.poll()
        self.poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            size = 1 << 20
        if not self.poll.poll(int(IDLE_SECONDS * 1000)):
            die(
                Problem.INVALID,
                f"the upload sent nothing for {int(IDLE_SECONDS)} s: given up; nothing was added",
            )
        return os.read(self.fd, size)


NOTHING = "nothing was added"


def _refuse(words: str) -> NoReturn:
    die(Problem.INVALID, f"{words}; {NOTHING}")


def _entry_parts(folder: list[str], name: str) -> list[str] | None:
    """The entry's path in the workspace as names, or None for the archive's own root ("./")."""
    if name.startswith("/"):
        _refuse(f"{shown_name(name)[0][:80]!r} in the upload is an absolute path")
    inner = name.rstrip("/")
    while inner.startswith("./"):
        inner = inner[2:]
    if inner in ("", "."):
        return None
    try:
        return stack_view.checked("/".join([*folder, inner]))
    except BoxError as refused:
        _refuse(f"an entry of the upload: {refused.message}")


def _what(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "not a plain file or folder"


def add_tar(made: Made, stack: Stack, folder: str, fd: int) -> None:
    """Writes the tar stream read from `fd` under `folder` in the staged layer `made`."""
    parts = stack_view.checked(folder)
    must_be_folder_or_absent(stack, parts, NOTHING)
    made.folder(parts, stack)
    try:
        source: Any = _Source(fd)
        with tarfile.open(fileobj=source, mode="r|*", tarinfo=_Member) as archive:
            for seen, member in enumerate(archive):
                if seen >= MAX_ENTRIES:
                    _refuse(f"the upload has more than {MAX_ENTRIES} entries")
                _add(made, stack, parts, archive, member)
    except (tarfile.TarError, EOFError, zlib.error) as error:
        _refuse(f"the upload is not a whole tar archive ({error})")
    if made.files + made.folders == 0:
        _refuse("the upload holds no files or folders")


def _add(
    made: Made, stack: Stack, folder: list[str], archive: tarfile.TarFile, member: tarfile.TarInfo
) -> None:
    inner = _entry_parts(folder, member.name)
    if inner is None:
        return
    path = "/".join(inner)
    shown = shown_name(path)[0]
    if not (member.isreg() or member.isdir()):
        _refuse(f"{shown!r} is {_what(member)}: an upload holds plain files and folders only")
    found = stack_view.lookup(stack, path)
    must_be_folder_or_absent(stack, inner[:-1], NOTHING)
    if member.isdir():
        if found is not None and not stat.S_ISDIR(found.st_mode):
            _refuse(f"{shown!r} is a file in the workspace and a folder in the upload")
        made.count(path, True)
        fd = made.folder(inner, stack)
        if found is None:
            made.own(fd, FOLDER_MODE)
        return
    if found is not None and stat.S_ISDIR(found.st_mode):
        _refuse(f"{shown!r} is a folder in the workspace and a file in the upload")
    content = archive.extractfile(member)
    if content is None:
        _refuse(f"{shown!r} could not be read from the upload")
    mode = EXEC_MODE if member.mode & 0o111 else FILE_MODE
    mtime = float(member.mtime) if 0 <= member.mtime < 2**40 else None
    write_file(made, stack, inner, content.read, member.size, mode, mtime)
