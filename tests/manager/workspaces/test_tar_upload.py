"""An owner's upload read from a tar stream (boxd/manager/workspaces/tar_upload.py) into a staged
layer, over temp folders standing for a workspace's base and a done layer. The attacker's
streams first: links, devices, '..', absolute names, huge counts, huge headers, a stream cut
off, a gzip bomb, a sender that goes silent; then what an upload is for."""

import gzip
import io
import os
import stat
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.workspaces import owner_layer, tar_upload
from boxd.manager.workspaces.owner_layer import Made, stage, throw_away
from boxd.manager.workspaces.stack_view import Level, Stack, list_folder
from tests.support.layer_marks import MARKS, write


@pytest.fixture
def base(tmp_path: Path) -> Path:
    made = tmp_path / "base"
    made.mkdir()
    write(made, "docs/old.md", "old\n")
    write(made, "notes.md", "notes\n")
    (made / "out").symlink_to("/etc")
    return made


@pytest.fixture
def stack(base: Path, tmp_path: Path) -> Stack:
    (tmp_path / "1").mkdir()
    return Stack([Level("1", tmp_path / "1"), Level(None, base)], MARKS)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Made]:
    staged = stage(tmp_path / "store", -1)
    yield staged
    throw_away(staged)


def a_tar(*members: tuple[tarfile.TarInfo, bytes | None], end: bool = True) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in members:
            archive.addfile(info, io.BytesIO(content) if content is not None else None)
    data = out.getvalue()
    if not end:
        # Without its end-of-archive mark: the two zero blocks and the record's padding.
        data = data.rstrip(b"\0")
        data += b"\0" * (-len(data) % 512)
    return data


def file(name: str, content: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(content), mode, 1_700_000_000
    return info, content


def entry(name: str, kind: bytes, target: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def source(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "upload.tar"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def add(made: Made, stack: Stack, tmp_path: Path, data: bytes, folder: str = "") -> None:
    fd = source(tmp_path, data)
    try:
        tar_upload.add_tar(made, stack, folder, fd)
    finally:
        os.close(fd)


def refused(made: Made, stack: Stack, tmp_path: Path, data: bytes, folder: str = "") -> str:
    with pytest.raises(BoxError) as caught:
        add(made, stack, tmp_path, data, folder)
    assert caught.value.problem == Problem.INVALID
    assert "nothing was added" in caught.value.message
    return caught.value.message


def in_layer(made: Made) -> list[str]:
    return sorted(
        str(path.relative_to(made.path)) for path in made.path.rglob("*") if path != made.path
    )


# The attacker's streams.


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        (tarfile.SYMTYPE, "a symbolic link"),
        (tarfile.LNKTYPE, "a hard link"),
        (tarfile.CHRTYPE, "a device"),
        (tarfile.BLKTYPE, "a device"),
        (tarfile.FIFOTYPE, "a FIFO"),
    ],
)
def test_a_link_device_or_fifo_refuses_the_upload(
    made: Made, stack: Stack, tmp_path: Path, kind: bytes, words: str
) -> None:
    data = a_tar(file("first.md"), entry("evil", kind, "/etc/shadow"), file("evil/passwd"))
    message = refused(made, stack, tmp_path, data)
    assert f"'evil' is {words}" in message
    assert not (made.path / "evil").exists()


@pytest.mark.parametrize(
    "name", ["../escape", "a/../../escape", "/etc/cron.d/evil", "a/./b", "a//b", "../../"]
)
def test_a_name_out_of_the_folder_is_refused(
    made: Made, stack: Stack, tmp_path: Path, name: str
) -> None:
    data = a_tar(file(name))
    refused(made, stack, tmp_path, data, "docs")
    assert not (tmp_path / "escape").exists()
    assert not (made.path.parent / "escape").exists()


def test_a_long_name_is_refused(made: Made, stack: Stack, tmp_path: Path) -> None:
    assert "at most 255 bytes" in refused(made, stack, tmp_path, a_tar(file("a" * 256)))
    deep = "/".join(["d" * 200] * 21)
    assert "at most 4096 bytes" in refused(made, stack, tmp_path, a_tar(file(deep)))


def test_too_many_entries_refused_as_they_come(
    made: Made, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_layer, "MAX_ENTRIES", 5)
    data = a_tar(*(file(f"f{n}") for n in range(6)))
    assert "at most 5 files and folders" in refused(made, stack, tmp_path, data)


def test_a_flood_of_empty_root_entries_is_counted(
    made: Made, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tar_upload, "MAX_ENTRIES", 5)
    data = a_tar(*(entry("./", tarfile.DIRTYPE) for _ in range(10)))
    assert "more than 5 entries" in refused(made, stack, tmp_path, data)


def test_too_many_bytes_refused_before_they_are_written(
    made: Made, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_layer, "MAX_BYTES", 1000)
    data = a_tar(file("a", b"x" * 600), file("b", b"x" * 600))
    assert "at most 0 MiB" in refused(made, stack, tmp_path, data)
    assert not (made.path / "b").exists()


def test_a_gzip_bomb_stops_at_the_caps(
    made: Made, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header that says 8 GiB of zeros, which gzip makes a few MiB of: refused from the
    header, before anything is written or decompressed past it."""
    info = tarfile.TarInfo("bomb")
    info.size = 8 << 30
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    body = gzip.compress(header + b"\0" * (8 << 20), compresslevel=9)
    assert len(body) < 64 * 1024
    assert "at most 1024 MiB" in refused(made, stack, tmp_path, body)
    assert not (made.path / "bomb").exists()


def test_a_gzip_of_zeros_is_an_empty_upload(made: Made, stack: Stack, tmp_path: Path) -> None:
    body = gzip.compress(b"\0" * (64 << 20), compresslevel=9)
    assert "holds no files" in refused(made, stack, tmp_path, body)


def test_a_huge_pax_header_is_refused(made: Made, stack: Stack, tmp_path: Path) -> None:
    info = tarfile.TarInfo("big")
    info.pax_headers = {"comment": "x" * (200 * 1024)}
    data = a_tar((info, b""))
    assert "a tar header of" in refused(made, stack, tmp_path, data)


@pytest.mark.parametrize("cut", ["between", "inside", "header"])
def test_a_stream_cut_off_is_refused(made: Made, stack: Stack, tmp_path: Path, cut: str) -> None:
    whole = a_tar(file("a", b"A" * 2000), file("b", b"B" * 2000), end=False)
    data = {"between": whole, "inside": whole[:-1000], "header": whole[: 512 * 5 + 100]}[cut]
    message = refused(made, stack, tmp_path, data)
    assert "not a whole tar archive" in message or "ended in the middle" in message


def test_garbage_is_refused(made: Made, stack: Stack, tmp_path: Path) -> None:
    assert "not a whole tar archive" in refused(made, stack, tmp_path, os.urandom(4096))
    assert "not a whole tar archive" in refused(made, stack, tmp_path, b"")


def test_a_silent_sender_is_given_up(
    made: Made, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tar_upload, "IDLE_SECONDS", 0.2)
    read, write_end = os.pipe()
    os.write(write_end, a_tar(file("a"), end=False)[:512])
    try:
        with pytest.raises(BoxError) as caught:
            tar_upload.add_tar(made, stack, "", read)
        assert "sent nothing for" in caught.value.message
    finally:
        os.close(read)
        os.close(write_end)


def test_nothing_goes_through_a_link_in_the_workspace(
    made: Made, stack: Stack, tmp_path: Path
) -> None:
    """`out` is a link to /etc in the base: a file under it is refused, a folder named so too."""
    assert "'out' is a link in the workspace" in refused(
        made, stack, tmp_path, a_tar(file("out/passwd"))
    )
    with pytest.raises(BoxError, match="'out' is a link"):
        add(made, stack, tmp_path, a_tar(file("passwd")), "out")


def test_a_file_over_a_folder_and_a_folder_over_a_file_are_refused(
    made: Made, stack: Stack, tmp_path: Path
) -> None:
    assert "is a folder in the workspace" in refused(made, stack, tmp_path, a_tar(file("docs")))
    folder = entry("notes.md", tarfile.DIRTYPE)
    assert "is a file in the workspace" in refused(made, stack, tmp_path, a_tar(folder))
    assert "notes.md' is a file in the workspace" in refused(
        made, stack, tmp_path, a_tar(file("notes.md/inner"))
    )


def test_a_name_twice_is_refused(made: Made, stack: Stack, tmp_path: Path) -> None:
    assert "twice" in refused(made, stack, tmp_path, a_tar(file("a"), file("a")))
    made2 = stage(tmp_path / "store", -1)
    try:
        message = refused(made2, stack, tmp_path, a_tar(file("b"), file("b/c")))
        assert "a file in the upload and a folder too" in message
    finally:
        throw_away(made2)


def test_a_full_disk_is_refused_in_words(
    made: Made, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_layer, "KEEP_FREE", 1 << 62)
    with pytest.raises(BoxError) as caught:
        add(made, stack, tmp_path, a_tar(file("a", b"x" * 100)))
    assert caught.value.problem == Problem.FULL
    assert "too full" in caught.value.message and "nothing was added" in caught.value.message


# What an upload is for.


def test_files_and_folders_land_under_the_folder(made: Made, stack: Stack, tmp_path: Path) -> None:
    data = a_tar(
        entry("./", tarfile.DIRTYPE),
        entry("./pics/", tarfile.DIRTYPE),
        file("./pics/a.png", b"PNG"),
        file("run.sh", b"#!/bin/sh\n", 0o755),
        file("deep/er/c.txt", b"c"),
    )
    add(made, stack, tmp_path, data, "docs")
    assert in_layer(made) == [
        "docs",
        "docs/deep",
        "docs/deep/er",
        "docs/deep/er/c.txt",
        "docs/pics",
        "docs/pics/a.png",
        "docs/run.sh",
    ]
    assert (made.files, made.folders, made.bytes) == (3, 1, 14)
    script = os.stat(made.path / "docs/run.sh")
    assert stat.S_IMODE(script.st_mode) == owner_layer.EXEC_MODE
    assert script.st_mtime == 1_700_000_000
    picture = os.stat(made.path / "docs/pics/a.png")
    assert stat.S_IMODE(picture.st_mode) == owner_layer.FILE_MODE
    folder = os.stat(made.path / "docs/deep")
    assert stat.S_IMODE(folder.st_mode) == owner_layer.FOLDER_MODE
    # The stack with the new layer on top: the old file and the new ones side by side.
    on_top = Stack([Level("2", made.path), *stack.levels], MARKS)
    names = [entry.name for entry in list_folder(on_top, "docs").entries]
    assert names == ["deep", "old.md", "pics", "run.sh"]


def test_a_gzip_tar_and_a_pipe(made: Made, stack: Stack) -> None:
    data = gzip.compress(a_tar(file("a.md", b"hello")))
    read, write_end = os.pipe()

    def send() -> None:
        with os.fdopen(write_end, "wb") as out:
            out.write(data)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        tar_upload.add_tar(made, stack, "new/folder", read)
    finally:
        sender.join()
        os.close(read)
    assert (made.path / "new/folder/a.md").read_bytes() == b"hello"


def test_a_file_replaces_a_file(made: Made, stack: Stack, tmp_path: Path) -> None:
    add(made, stack, tmp_path, a_tar(file("notes.md", b"new")))
    on_top = Stack([Level("2", made.path), *stack.levels], MARKS)
    entries = {entry.name: entry for entry in list_folder(on_top, "").entries}
    assert entries["notes.md"].size == 3 and entries["notes.md"].layer == "2"
