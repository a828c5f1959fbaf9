"""boxctl get's extraction (boxd/cli/get.py) of archives the manager's own writer makes
(boxd/manager/workspaces/archive.py) from an attacker's layers, read from a pipe as they come:
nothing lands outside DEST, a link that leads out is left out and said so, names and sparse
files arrive as they are, nothing there is overwritten without --force."""

import os
import threading
from pathlib import Path

import pytest

from boxd.cli.get import Got, _file, _not_there, extract
from boxd.errors import BoxError
from boxd.manager.workspaces.archive import write_archive
from boxd.manager.workspaces.stack_view import Level, Stack
from tests.support.layer_marks import MARKS, delete, write


def got_from(layer: Path, base: Path, dest: Path, top: str = "ws") -> Got:
    """The archive of the two levels, written by a thread into a pipe and extracted from it."""
    stack = Stack([Level("1", layer), Level(None, base)], MARKS)
    read_end, write_end = os.pipe()

    def writer() -> None:
        try:
            write_archive(stack, "", top, write_end)
        finally:
            os.close(write_end)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with os.fdopen(read_end, "rb") as stream:
        got = extract(stream, top, dest)
    thread.join(10)
    return got


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, Path]:
    layer, base = tmp_path / "layer", tmp_path / "base"
    layer.mkdir()
    base.mkdir()
    return layer, base


def test_a_link_that_leads_out_is_left_out_and_said(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    layer, base = made
    (layer / "shadow").symlink_to("/etc/shadow")
    (layer / "up").symlink_to("../../outside")
    write(layer, "docs/a.md", "a")
    (layer / "docs/here").symlink_to("a.md")
    dest = tmp_path / "dest"
    got = got_from(layer, base, dest)
    assert got.files == 1 and got.links == 1
    assert not (dest / "shadow").is_symlink() and not (dest / "up").is_symlink()
    assert os.readlink(dest / "docs/here") == "a.md"
    left = "\n".join(got.left_out)
    assert "'shadow' -> '/etc/shadow': it leads out of the folder" in left
    assert "'up' -> '../../outside'" in left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "dest", "layer"]


def test_names_sparse_files_and_deletions_arrive_as_they_are(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    layer, base = made
    names = ["esc\x1b[31mred", "nl\nx", os.fsdecode(b"latin-\xe9")]
    for name in names:
        write(layer, name, "x")
    with (layer / "huge").open("wb") as huge:
        huge.seek(1 << 30)
        huge.write(b"end")
        huge.truncate(1 << 40)
    write(base, "gone.md", "deleted by the task")
    delete(layer, "gone.md")
    os.mkfifo(layer / "pipe")
    dest = tmp_path / "dest"
    got_from(layer, base, dest)
    assert set(os.listdir(dest)) == {*names, "huge"}
    info = os.stat(dest / "huge")
    assert info.st_size == 1 << 40 and info.st_blocks * 512 < 1 << 20
    with (dest / "huge").open("rb") as huge:
        huge.seek(1 << 30)
        assert huge.read(3) == b"end"


def test_modes_are_the_callers_safe_ones(made: tuple[Path, Path], tmp_path: Path) -> None:
    layer, base = made
    write(layer, "run", "#!/bin/sh\n")
    os.chmod(layer / "run", 0o6777)
    dest = tmp_path / "dest"
    got_from(layer, base, dest)
    assert os.stat(dest / "run").st_mode & 0o7777 == 0o755


def test_what_is_there_is_not_overwritten_without_force(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("mine")
    (tmp_path / "link").symlink_to("/nowhere")
    for there in ("notes.md", "link"):
        with pytest.raises(BoxError, match="is there already and boxctl get does not overwrite"):
            _not_there(tmp_path / there)
    _not_there(tmp_path / "new.md")


def test_force_puts_the_file_in_place_of_a_link_never_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / "notes.md").symlink_to(victim)
    source = tmp_path / "source"
    source.write_bytes(b"from the workspace")
    fd = os.open(source, os.O_RDONLY)
    try:
        _file(fd, str(tmp_path / "notes.md"), force=True)
    finally:
        os.close(fd)
    assert victim.read_text() == "untouched"
    assert not (tmp_path / "notes.md").is_symlink()
    assert (tmp_path / "notes.md").read_bytes() == b"from the workspace"


def test_a_link_that_leads_out_only_through_a_later_link_is_left_out(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    """The attacker's chain: 'L' (sorted first) -> 'c/d/d/d/../../../../outside' stays inside
    DEST by its letters while c/d does not exist yet; then c/d -> '.' is made (inside too), and
    L now climbs three folders above DEST. Each link checked alone when made is not enough."""
    layer, base = made
    (layer / "L").symlink_to("c/d/d/d/../../../../outside")
    (layer / "c").mkdir()
    (layer / "c/d").symlink_to(".")
    outside = tmp_path / "a" / "b" / "outside"
    dest = tmp_path / "a" / "b" / "c" / "dest"
    dest.parent.mkdir(parents=True)
    got = got_from(layer, base, dest)
    for link in dest.rglob("*"):
        if link.is_symlink():
            resolved = os.path.realpath(link)
            assert resolved == str(dest) or resolved.startswith(f"{dest}/"), (link, resolved)
    assert not (dest / "L").is_symlink()
    assert os.readlink(dest / "c/d") == "."
    assert "'L' -> " in "\n".join(got.left_out)
    assert not outside.exists()
