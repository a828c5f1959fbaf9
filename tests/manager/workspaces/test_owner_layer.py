"""The layers of an owner's deletion and rename (boxd/manager/workspaces/owner_layer.py), over temp
folders standing for a workspace's base and a task's done layer, with the tests' marks
(tests/support/layer_marks.py). What a task left first: a link to /etc/shadow, a FIFO."""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.workspaces import owner_layer
from boxd.manager.workspaces.owner_layer import Made, delete_layer, rename_layer, stage, throw_away
from boxd.manager.workspaces.stack_view import Level, Stack, list_folder, open_file
from tests.support.layer_marks import MARKS, delete, whiteout_at, write


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    base, task = tmp_path / "base", tmp_path / "1"
    base.mkdir()
    task.mkdir()
    write(base, "docs/a.md", "a\n")
    write(base, "docs/inner/b.md", "b\n")
    write(base, "gone.md", "gone\n")
    delete(task, "gone.md")
    write(task, "notes.md", "notes\n")
    (task / "shadow").symlink_to("/etc/shadow")
    os.mkfifo(task / "pipe")
    return Stack([Level("1", task), Level(None, base)], MARKS)


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Made]:
    staged = stage(tmp_path / "store", -1)
    yield staged
    throw_away(staged)


def on_top(made: Made, stack: Stack) -> Stack:
    return Stack([Level("2", made.path), *stack.levels], MARKS)


def names(stack: Stack, path: str = "") -> list[str]:
    return [entry.name for entry in list_folder(stack, path).entries]


def read(stack: Stack, path: str) -> bytes:
    fd, _ = open_file(stack, path)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def test_a_rename_copies_a_link_as_a_link_never_what_it_points_to(made: Made, stack: Stack) -> None:
    assert rename_layer(made, stack, "shadow", "moved", whiteout_at) == "link"
    assert os.readlink(made.path / "moved") == "/etc/shadow"
    assert made.bytes == 0
    assert "shadow" not in names(on_top(made, stack))


def test_a_fifo_is_not_renamed_nor_opened(made: Made, stack: Stack) -> None:
    with pytest.raises(BoxError, match="only files, links and folders are renamed"):
        rename_layer(made, stack, "pipe", "moved", whiteout_at)


@pytest.mark.parametrize(
    ("source", "target", "words"),
    [
        ("docs", "docs/inner/docs", "cannot be moved into itself"),
        ("notes.md", "docs/a.md", "already in the workspace"),
        ("gone.md", "back.md", "there is nothing at 'gone.md'"),
        ("notes.md", "shadow/x", "'shadow' is a link in the workspace"),
        ("notes.md", "../x", "not a path in the workspace"),
        ("/etc/passwd", "x", "relative"),
        ("", "x", "cannot be renamed"),
    ],
)
def test_a_rename_that_cannot_be_is_refused(
    made: Made, stack: Stack, source: str, target: str, words: str
) -> None:
    with pytest.raises(BoxError, match=words):
        rename_layer(made, stack, source, target, whiteout_at)


def test_a_folder_rename_over_the_caps_is_refused(
    made: Made, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_layer, "MAX_ENTRIES", 2)
    with pytest.raises(BoxError, match="at most 2 files and folders"):
        rename_layer(made, stack, "docs", "papers", whiteout_at)


def test_a_file_renamed(made: Made, stack: Stack) -> None:
    assert rename_layer(made, stack, "notes.md", "new/place.md", whiteout_at) == "file"
    view = on_top(made, stack)
    assert read(view, "new/place.md") == b"notes\n"
    assert "notes.md" not in names(view)
    assert os.stat(made.path / "new/place.md").st_mode & 0o060 == 0o060


def test_a_folder_renamed_with_all_it_holds(made: Made, stack: Stack) -> None:
    assert rename_layer(made, stack, "docs", "papers", whiteout_at) == "dir"
    view = on_top(made, stack)
    assert names(view) == ["notes.md", "papers", "pipe", "shadow"]
    assert names(view, "papers") == ["a.md", "inner"]
    assert read(view, "papers/inner/b.md") == b"b\n"
    assert (made.files, made.folders) == (2, 2)


def test_a_deletion_is_a_whiteout(made: Made, stack: Stack) -> None:
    assert delete_layer(made, stack, "docs/inner", whiteout_at) == "dir"
    view = on_top(made, stack)
    assert names(view, "docs") == ["a.md"]
    # The layer holds the mark and the folder it is in, nothing else.
    assert sorted(str(p.relative_to(made.path)) for p in made.path.rglob("*")) == [
        "docs",
        "docs/inner",
    ]


def test_a_deletion_of_what_is_not_there_is_refused(made: Made, stack: Stack) -> None:
    with pytest.raises(BoxError) as caught:
        delete_layer(made, stack, "gone.md", whiteout_at)
    assert caught.value.problem == Problem.NOT_FOUND
    with pytest.raises(BoxError, match="cannot be deleted here"):
        delete_layer(made, stack, "", whiteout_at)


def test_a_link_is_deleted_not_what_it_points_to(made: Made, stack: Stack) -> None:
    assert delete_layer(made, stack, "shadow", whiteout_at) == "link"
    assert os.path.exists("/etc/shadow")
    assert "shadow" not in names(on_top(made, stack))


def test_overlayfs_whiteout_is_a_0_0_character_device(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a character device is made by root only")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        owner_layer.whiteout(fd, "gone")
    finally:
        os.close(fd)
    info = os.lstat(tmp_path / "gone")
    assert os.major(info.st_rdev) == 0 and os.minor(info.st_rdev) == 0
    from boxd.manager.folders.keep import is_whiteout

    assert is_whiteout(info)


def test_a_renamed_file_or_folder_loses_its_setuid_and_setgid_bits(
    made: Made, stack: Stack, tmp_path: Path
) -> None:
    """A task's setuid file is its own user's; copied by root in a rename it would be root's,
    setuid root, with the task's bytes. The copy keeps no setuid or setgid bit (a folder keeps
    the setgid boxd gives every folder it makes)."""
    task = tmp_path / "1"
    write(task, "tool", "#!/bin/sh\n")
    os.chmod(task / "tool", 0o6755)
    write(task, "kit/run", "#!/bin/sh\n")
    os.chmod(task / "kit/run", 0o4755)
    rename_layer(made, stack, "tool", "moved", whiteout_at)
    rename_layer(made, stack, "kit", "kit2", whiteout_at)
    assert os.stat(made.path / "moved").st_mode & 0o7777 == 0o775
    assert os.stat(made.path / "kit2/run").st_mode & 0o7777 == 0o775


def test_a_rename_of_a_folder_of_many_folders_holds_few_descriptors(
    made: Made, stack: Stack, tmp_path: Path
) -> None:
    """A task's folder of thousands of folders (node_modules, or made to this end): renaming it
    must not hold a descriptor per folder in root's manager, whose limit all its other work
    shares; two such changes at once would run it out."""
    task = tmp_path / "1"
    for number in range(600):
        write(task, f"many/f{number}/sub/x", "x")
    before = len(os.listdir("/proc/self/fd"))
    rename_layer(made, stack, "many", "moved", whiteout_at)
    held = len(os.listdir("/proc/self/fd")) - before
    assert held <= 2 * owner_layer.FOLDERS_HELD, held
    assert (made.path / "moved/f599/sub/x").read_text() == "x"
    assert (
        os.stat(made.path / "moved/f7").st_mode & 0o7777
        == os.stat(task / "many/f7").st_mode & 0o777 | 0o2070
    )


def test_a_rename_of_a_folder_deeper_than_python_recurses_is_refused_in_words(
    made: Made, stack: Stack, tmp_path: Path
) -> None:
    """A task's chain of 1,500 folders (a path of 3,000 bytes, well within 4,096): the owner's
    rename of it is refused in words, never a RecursionError that reads as boxd failing."""
    fd = os.open(tmp_path / "1", os.O_RDONLY | os.O_DIRECTORY)
    for name in ["deep", *["a"] * 1500]:
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    try:
        with pytest.raises(BoxError) as refused:
            rename_layer(made, stack, "deep", "moved", whiteout_at)
    finally:
        # Python's rmtree recurses: pytest's own clean-up could not remove this chain.
        subprocess.run(["rm", "-rf", str(tmp_path / "1" / "deep")], check=True)
        throw_away(made)
        subprocess.run(["rm", "-rf", str(made.path)], check=True)
    assert refused.value.problem == Problem.INVALID
    assert "deep" in str(refused.value)
