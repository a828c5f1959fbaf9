"""The workspace as a tar (boxd/manager/workspaces/archive.py), on temp folders standing for a
workspace's base and done layers (the marks of tests/support/layer_marks.py). Every archive is
read back twice: with Python's tarfile and with the system's GNU tar, a client no one here wrote.
The attacker's cases come first."""

import io
import os
import shutil
import stat
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.workspaces import archive, stack_view
from boxd.manager.workspaces.archive import Stalled, Summary, archive_name, write_archive
from boxd.manager.workspaces.stack_view import MAX_LISTED, Level, Stack
from tests.support.layer_marks import MARKS, OPAQUE, delete, write

Levels = tuple[Path, Path, Path]


@pytest.fixture(autouse=True)
def no_fd_left_open() -> Iterator[None]:
    """Every test's archive closes every fd it opened, whatever became of it."""
    before = len(os.listdir("/proc/self/fd"))
    yield
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.fixture
def levels(tmp_path: Path) -> Levels:
    """Two done layers ("2" newest, "1") and the base."""
    made = tmp_path / "2", tmp_path / "1", tmp_path / "base"
    for path in made:
        path.mkdir()
    return made


def stack(levels: Levels) -> Stack:
    newer, older, base = levels
    return Stack([Level("2", newer), Level("1", older), Level(None, base)], MARKS)


def made(levels: Levels, tmp_path: Path, path: str = "", top: str = "ws") -> tuple[Path, Summary]:
    """The archive of `path`, written to a file."""
    tar = tmp_path / "out.tar"
    with tar.open("wb") as out:
        summary = write_archive(stack(levels), path, top, out.fileno())
    return tar, summary


def members(tar: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(tar) as opened:
        return {member.name: member for member in opened.getmembers()}


def extracted(tar: Path, into: Path) -> Path:
    """Extracts with the system's GNU tar, as a person would, and returns the folder."""
    into.mkdir()
    subprocess.run(["tar", "-xf", str(tar), "-C", str(into)], check=True, capture_output=True)
    return into


def every_client(tar: Path, tmp_path: Path) -> list[Path]:
    """Extracted by GNU tar, Python's tarfile and, where it is installed, bsdtar (libarchive)."""
    outs = [extracted(tar, tmp_path / "x"), python_extracted(tar, tmp_path / "p")]
    if shutil.which("bsdtar"):
        (tmp_path / "b").mkdir()
        bsdtar = ["bsdtar", "-xf", str(tar), "-C", str(tmp_path / "b")]
        subprocess.run(bsdtar, check=True, capture_output=True)
        outs.append(tmp_path / "b")
    return outs


def python_extracted(tar: Path, into: Path) -> Path:
    with tarfile.open(tar) as opened:
        opened.extractall(into, filter="data")
    return into


# The attacker's cases.


def test_a_link_out_is_stored_as_a_link_and_never_followed(levels: Levels, tmp_path: Path) -> None:
    newer, _, _ = levels
    (newer / "shadow").symlink_to("/etc/shadow")
    (newer / "etc").symlink_to("/etc")
    tar, summary = made(levels, tmp_path)
    found = members(tar)
    assert found["ws/shadow"].issym() and found["ws/shadow"].linkname == "/etc/shadow"
    assert found["ws/etc"].issym() and summary.links == 2 and summary.files == 0
    assert b"root:" not in tar.read_bytes()
    out = extracted(tar, tmp_path / "x")
    assert os.readlink(out / "ws/shadow") == "/etc/shadow"
    assert not (out / "ws/etc").is_dir() or (out / "ws/etc").is_symlink()


def test_fifos_sockets_and_devices_are_left_out_without_hanging(
    levels: Levels, tmp_path: Path
) -> None:
    newer, _, _ = levels
    os.mkfifo(newer / "pipe")
    if os.geteuid() == 0:
        os.mknod(newer / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    write(newer, "kept.md", "kept")
    done: list[tuple[Path, Summary]] = []
    writer = threading.Thread(target=lambda: done.append(made(levels, tmp_path)), daemon=True)
    writer.start()
    writer.join(10)
    assert done, "the archive hung on a FIFO"
    tar, summary = done[0]
    assert set(members(tar)) == {"ws", "ws/kept.md"}
    assert summary.left_out == {"FIFO, socket or device": 1 + (os.geteuid() == 0)}


@pytest.mark.parametrize("swap", ["link", "fifo", "folder"])
def test_a_file_swapped_between_listing_and_opening_is_left_out(
    levels: Levels, tmp_path: Path, swap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer, _, _ = levels
    write(newer, "report.md", "the report")
    write(newer, "other.md", "other")
    listed = stack_view.merged_entries

    def then_swapped(*args: object, **kwargs: object) -> object:
        found = listed(*args, **kwargs)  # type: ignore[arg-type]
        if (newer / "report.md").is_file():
            (newer / "report.md").unlink()
            if swap == "link":
                (newer / "report.md").symlink_to("/etc/shadow")
            elif swap == "fifo":
                os.mkfifo(newer / "report.md")
            else:
                write(newer, "report.md/inner", "inner")
        return found

    monkeypatch.setattr(archive, "merged_entries", then_swapped)
    done: list[tuple[Path, Summary]] = []
    writer = threading.Thread(target=lambda: done.append(made(levels, tmp_path)), daemon=True)
    writer.start()
    writer.join(10)
    assert done, "the archive hung on what was swapped in"
    tar, summary = done[0]
    assert set(members(tar)) == {"ws", "ws/other.md"}
    assert summary.left_out == {"changed while archived": 1}
    assert b"root:" not in tar.read_bytes()


def test_a_folder_swapped_for_a_link_under_the_walk_is_not_followed(
    levels: Levels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer, _, _ = levels
    write(newer, "docs/report.md", "the report")
    write(tmp_path / "outside", "report.md", "secret")
    listed = stack_view.merged_entries

    def then_swapped(*args: object, **kwargs: object) -> object:
        found = listed(*args, **kwargs)  # type: ignore[arg-type]
        if not (newer / "docs").is_symlink():  # the top listed, docs not entered yet
            (newer / "docs").rename(tmp_path / "moved")
            (newer / "docs").symlink_to(tmp_path / "outside")
        return found

    monkeypatch.setattr(archive, "merged_entries", then_swapped)
    tar, summary = made(levels, tmp_path)
    assert b"secret" not in tar.read_bytes()
    assert "ws/docs/report.md" not in members(tar)
    assert summary.left_out == {"changed while archived": 1}


NAMES = ["esc\x1b[31mred", "cr\rhidden", "evil\u202etxt.exe", "nl\nx", "tab\tand space", "é.md"]


def test_names_go_in_as_their_bytes(levels: Levels, tmp_path: Path) -> None:
    newer, _, _ = levels
    for name in NAMES:
        write(newer, name, name)
    not_utf8 = os.fsdecode(b"latin-\xe9\xff.txt")
    write(newer, not_utf8, "bytes")
    tar, _ = made(levels, tmp_path)
    assert set(members(tar)) == {"ws", *(f"ws/{name}" for name in [*NAMES, not_utf8])}
    for out in every_client(tar, tmp_path):
        names = set(os.listdir(os.fsencode(out / "ws")))
        assert names == {*(os.fsencode(name) for name in NAMES), b"latin-\xe9\xff.txt"}
        assert (out / "ws" / not_utf8).read_bytes() == b"bytes"
        assert (out / "ws" / "nl\nx").read_text() == "nl\nx"


def deep(root: Path, total: int) -> str:
    """Makes folders a/a/... and a file, the path `total` bytes long, walked by fds (its length
    is past what one syscall takes), and returns the path."""
    parts = ["a"] * ((total - 1) // 2)
    last = "f" * (total - 2 * len(parts))
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for part in parts:
        os.mkdir(part, dir_fd=fd)
        inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open(last, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)
    path = "/".join([*parts, last])
    assert len(path) == total
    return path


def undeep(root: Path) -> None:
    """Removes what `deep` made a folder at a time: pytest's cleanup recurses and would fail."""
    while (root / "a").exists():
        if (root / "a/a").exists():
            (root / "a/a").rename(root / "next")
        shutil.rmtree(root / "a")
        if (root / "next").exists():
            (root / "next").rename(root / "a")


def test_a_4096_byte_path_is_archived_and_a_longer_one_left_out(
    levels: Levels, tmp_path: Path
) -> None:
    newer, older, _ = levels
    try:
        longest = deep(newer, 4096)
        too_long = deep(older, 4098)
        tar, summary = made(levels, tmp_path, top="w")
    finally:
        undeep(newer)
        undeep(older)
    found = members(tar)
    assert f"w/{longest}" in found and f"w/{too_long}" not in found
    assert summary.left_out == {"path longer than 4096 bytes": 1}
    listed = subprocess.run(["tar", "-tf", str(tar)], check=True, capture_output=True).stdout
    assert f"w/{longest}".encode() in listed.splitlines()


def test_a_terabyte_sparse_file_is_archived_sparse(levels: Levels, tmp_path: Path) -> None:
    newer, _, _ = levels
    with (newer / "huge").open("wb") as huge:
        huge.seek(1 << 30)
        huge.write(b"middle")
        huge.truncate(1 << 40)
    with (newer / "holes-at-both-ends").open("wb") as holes:
        holes.seek(1 << 20)
        holes.write(b"x" * 5000)
        holes.truncate(3 << 20)
    with (newer / "all-hole").open("wb") as empty:
        empty.truncate(1 << 40)
    tar, summary = made(levels, tmp_path)
    assert summary.sparse == 3 and tar.stat().st_size < 1 << 20
    found = members(tar)
    assert found["ws/huge"].size == 1 << 40 and found["ws/huge"].issparse()
    for out in every_client(tar, tmp_path):
        for name, size in (("huge", 1 << 40), ("all-hole", 1 << 40)):
            got = os.stat(out / "ws" / name)
            assert got.st_size == size and got.st_blocks * 512 < 1 << 20  # sparse on disk too
        with (out / "ws/huge").open("rb") as huge:
            huge.seek((1 << 30) - 2)
            assert huge.read(10) == b"\0\0middle\0\0"
        both = (out / "ws/holes-at-both-ends").read_bytes()
        assert both == bytes(1 << 20) + b"x" * 5000 + bytes((3 << 20) - (1 << 20) - 5000)


def test_a_file_that_shrinks_while_read_is_padded_and_the_archive_stays_whole(
    levels: Levels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer, _, _ = levels
    write(newer, "log", b"y" * 100_000)
    write(newer, "after", "after")
    data = archive._Walk._data

    def then_shrunk(walk: object, fd: int, info: os.stat_result, archived: str) -> None:
        if info.st_size == 100_000:
            os.truncate(newer / "log", 10)  # after its fstat, before its data is read
        data(walk, fd, info, archived)  # type: ignore[arg-type]

    monkeypatch.setattr(archive._Walk, "_data", then_shrunk)
    tar, summary = made(levels, tmp_path)
    monkeypatch.undo()
    assert summary.changed == 1
    with tarfile.open(tar) as opened:
        log = opened.extractfile("ws/log")
        assert log is not None and log.read() == b"y" * 10 + bytes(100_000 - 10)
        after = opened.extractfile("ws/after")
        assert after is not None and after.read() == b"after"
    extracted(tar, tmp_path / "x")


def test_a_folder_past_the_listing_cap_is_archived_whole(levels: Levels, tmp_path: Path) -> None:
    _, older, base = levels
    count = MAX_LISTED + 500
    for number in range(count):
        (base / f"base-{number}").touch()
    for number in range(0, count, 2):
        delete(older, f"base-{number}")
    tar, summary = made(levels, tmp_path)
    assert summary.files == count // 2
    assert len(members(tar)) == count // 2 + 1


def test_a_reader_that_goes_away_ends_the_archive_with_epipe(
    levels: Levels, tmp_path: Path
) -> None:
    newer, _, _ = levels
    write(newer, "big", os.urandom(4 << 20))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with pytest.raises(BrokenPipeError):
            write_archive(stack(levels), "", "ws", write_end)
    finally:
        os.close(write_end)


def test_a_reader_that_takes_nothing_is_given_up(levels: Levels) -> None:
    newer, _, _ = levels
    write(newer, "big", os.urandom(4 << 20))
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        with pytest.raises(Stalled):
            write_archive(stack(levels), "", "ws", write_end, stall=0.2)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_path_that_is_not_a_folder_is_refused_before_anything_is_written(
    levels: Levels,
) -> None:
    newer, _, _ = levels
    write(newer, "file.md", "x")
    out = io.BytesIO()
    for path, problem in (("file.md", Problem.INVALID), ("nowhere", Problem.NOT_FOUND)):
        read_end, write_end = os.pipe()
        with pytest.raises(BoxError) as caught:
            write_archive(stack(levels), path, "ws", write_end)
        os.close(write_end)
        assert caught.value.problem == problem
        out.write(os.read(read_end, 100))
        os.close(read_end)
    assert out.getvalue() == b""


# The ordinary cases.


def test_the_workspace_as_it_stands_whiteouts_and_opaque_folders(
    levels: Levels, tmp_path: Path
) -> None:
    newer, older, base = levels
    write(base, "notes.md", "base notes")
    write(base, "gone.md", "deleted later")
    write(base, "docs/old.md", "hidden by an opaque folder")
    write(base, "src/a.py", "a")
    write(older, "notes.md", "older notes")
    write(older, "src/b.py", "b")
    delete(newer, "gone.md")
    write(newer, "docs/new.md", "new")
    os.setxattr(newer / "docs", OPAQUE, b"y")
    write(newer, "empty/.keep", "")
    tar, summary = made(levels, tmp_path)
    want = {
        "ws/notes.md": b"older notes",
        "ws/docs/new.md": b"new",
        "ws/src/a.py": b"a",
        "ws/src/b.py": b"b",
        "ws/empty/.keep": b"",
    }
    assert set(members(tar)) == {*want, "ws", "ws/docs", "ws/src", "ws/empty"}
    assert summary.files == 5 and summary.folders == 4 and summary.left_out == {}
    for out in (extracted(tar, tmp_path / "x"), python_extracted(tar, tmp_path / "p")):
        got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert got == want


def test_a_folder_of_the_workspace(levels: Levels, tmp_path: Path) -> None:
    newer, _, base = levels
    write(base, "docs/a.md", "a")
    write(newer, "docs/sub/b.md", "b")
    write(newer, "other.md", "not in it")
    tar, _ = made(levels, tmp_path, "docs", "ws-docs")
    assert set(members(tar)) == {"ws-docs", "ws-docs/a.md", "ws-docs/sub", "ws-docs/sub/b.md"}


def test_modes_and_times_are_kept_and_the_owner_can_read_them(
    levels: Levels, tmp_path: Path
) -> None:
    newer, _, _ = levels
    write(newer, "run.sh", "#!/bin/sh\n")
    os.chmod(newer / "run.sh", 0o4755)
    write(newer, "locked/secret", "s")
    os.chmod(newer / "locked/secret", 0o000)
    os.chmod(newer / "locked", 0o000)
    os.utime(newer / "run.sh", (1_000_000_000, 1_000_000_000))
    try:
        tar, _ = made(levels, tmp_path)
    finally:
        os.chmod(newer / "locked", 0o755)
    found = members(tar)
    assert found["ws/run.sh"].mode == 0o755 and found["ws/run.sh"].mtime == 1_000_000_000
    assert found["ws/locked"].mode == 0o700 and found["ws/locked/secret"].mode == 0o600


@pytest.mark.parametrize(
    ("workspace", "path", "name"),
    [
        ("site", "", "site.tar"),
        ("site", "docs/api", "site-api.tar"),
        ("site", 'a/"; rm -rf /\r\n.md', "site-__.md.tar"),
        ("site", "..", "site-_.tar"),
        ("site", "évité\u202e", "site-_vit__.tar"),
    ],
)
def test_the_download_name_is_safe(workspace: str, path: str, name: str) -> None:
    assert archive_name(workspace, path) == name


@pytest.mark.parametrize(
    ("name", "kind", "linkname", "size", "mtime"),
    [
        ("ws/a.txt", tarfile.REGTYPE, "", 12345, 1_700_000_000),
        ("ws/docs", tarfile.DIRTYPE, "", 0, 5),
        ("ws/ctl\x1b[2J\n", tarfile.REGTYPE, "", 1, 0),
        ("ws/shadow", tarfile.SYMTYPE, "/etc/shadow", 0, 3),
        ("ws/" + "n" * 97, tarfile.REGTYPE, "", 0, 0),
        ("ws/" + "n" * 98, tarfile.REGTYPE, "", 0, 0),  # past 100 bytes: a pax record
        ("ws/é", tarfile.REGTYPE, "", 0, 0),
        ("ws/big", tarfile.REGTYPE, "", 8**11, 0),
        ("ws/old", tarfile.REGTYPE, "", 0, -1),
    ],
)
def test_the_quick_header_is_tarfiles_to_the_byte(
    name: str, kind: bytes, linkname: str, size: int, mtime: int
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size, info.mtime, info.mode = kind, linkname, size, mtime, 0o644
    walk = archive._Walk(stack((Path("/"),) * 3), archive._Out(-1, 1), Summary())
    walk.header(info)
    assert bytes(walk.out.buffer) == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
