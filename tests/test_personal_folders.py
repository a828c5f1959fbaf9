"""The rules for personal folders, their mirror, and keeping a task's layer, on plain files."""

import os
from pathlib import Path

import pytest

from boxd.errors import BoxError
from boxd.manager.folders import Folder, check_folder, check_folders, folder_workspace
from boxd.manager.keep import Places, apply, conflicts, layer_changes, take_manifest
from boxd.manager.mirror import sync_mirror, sync_tree

SOMEONE = 65534  # nobody: as root, folders must belong to someone else to be allowed


def owned(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, SOMEONE, SOMEONE)
    return path


def give_away(folder: Path) -> None:
    """As root, the files of a real folder must be someone else's, or the mirror leaves them out."""
    if os.geteuid() == 0:
        for path in [folder, *folder.rglob("*")]:
            os.lchown(path, SOMEONE, SOMEONE)


def refusal(asked: Path | str, home: Path, box: Path) -> str:
    with pytest.raises(BoxError) as caught:
        check_folder(str(asked), home, [], box)
    return caught.value.message


def test_folder_rules(tmp_path: Path) -> None:
    home, box = owned(tmp_path / "home"), tmp_path / "box"
    (box / "workspaces").mkdir(parents=True)
    project = owned(home / "project")
    assert check_folder(str(project) + "/", home, [], box) == project
    outside = owned(tmp_path / "outside")
    assert refusal(outside, home, box) == (
        f"folder {outside}: it is not in your home folder ({home}) or in Settings agentFolders"
    )
    assert check_folder(str(outside), home, [str(tmp_path / "outside")], box) == outside
    assert refusal(home, home, box).endswith("or in Settings agentFolders")
    assert refusal(home / "nope", home, box) == f"folder {home / 'nope'}: there is no such folder"
    (home / "file").write_text("x")
    assert refusal(home / "file", home, box) == f"folder {home / 'file'}: it is not a folder"
    (home / "link").symlink_to(box / "workspaces")
    assert refusal(home / "link", home, box) == (
        f"folder {home / 'link'}: it holds the box's own state (a link to "
        f"{box / 'workspaces'}); agents never work on that"
    )
    (home / "etc").symlink_to("/etc")
    assert "it is part of the system (a link to /etc)" in refusal(home / "etc", home, box)
    if os.geteuid() == 0:
        (home / "roots").mkdir()
        assert refusal(home / "roots", home, box).endswith(
            "it belongs to root; agents may not use root's folders"
        )


def test_several_folders(tmp_path: Path) -> None:
    home, box = owned(tmp_path / "home"), tmp_path / "box"
    notes, code = owned(home / "notes"), owned(home / "code")
    owned(home / "other" / "notes")
    folders = check_folders([str(notes), str(code)], home, [], box)
    assert [f.name for f in folders] == ["notes", "code"]
    assert folder_workspace(folders).startswith("owner-notes-and-1-")
    assert folder_workspace(folders) == folder_workspace(folders)
    assert folder_workspace(folders[:1]) != folder_workspace(folders[1:])
    with pytest.raises(BoxError, match="it overlaps"):
        check_folders([str(home), str(notes)], tmp_path, [], box)
    with pytest.raises(BoxError, match="it has the same name as"):
        check_folders([str(notes), str(home / "other" / "notes")], home, [], box)


def test_mirror_copies_only_what_changed(tmp_path: Path) -> None:
    real, base = tmp_path / "real", tmp_path / "base"
    (real / "sub").mkdir(parents=True)
    (real / "a.txt").write_text("a")
    (real / "sub" / "b.txt").write_text("b")
    (real / "link").symlink_to("a.txt")
    give_away(real)
    gid = os.getgid()
    assert sync_mirror([Folder(real, "real")], base, gid) == 4
    assert (base / "sub" / "b.txt").read_text() == "b"
    assert os.readlink(base / "link") == "a.txt"
    assert (base / "a.txt").stat().st_mtime_ns == (real / "a.txt").stat().st_mtime_ns
    assert (base / "a.txt").stat().st_mode & 0o060 == 0o060
    assert sync_tree(real, base, gid) == 0
    (real / "a.txt").write_text("changed")
    (real / "sub" / "b.txt").unlink()
    if os.geteuid() == 0:
        (real / "root.txt").write_text("root's")
    assert sync_tree(real, base, gid) == 2
    assert (base / "a.txt").read_text() == "changed"
    assert not (base / "sub" / "b.txt").exists()
    assert not (base / "root.txt").exists()


def test_keep_applies_a_layer_and_finds_conflicts(tmp_path: Path) -> None:
    real, view, layer = tmp_path / "real", tmp_path / "view", tmp_path / "layer"
    for folder in (real, view, layer):
        folder.mkdir()
    (real / "a.txt").write_text("old")
    (real / "b.txt").write_text("keep me")
    give_away(real)
    sync_tree(real, view, os.getgid())
    saw = take_manifest(view)
    # What the task's overlay would have put in its upper folder.
    (layer / "a.txt").write_text("new")
    (layer / "dir").mkdir()
    (layer / "dir" / "c.txt").write_text("c")
    places = Places([Folder(real, "real")])
    changes = layer_changes(layer)
    assert conflicts(changes, saw, places) == []
    assert apply(changes, layer, places) == 3
    assert (real / "a.txt").read_text() == "new"
    assert (real / "dir" / "c.txt").read_text() == "c"
    assert (real / "b.txt").read_text() == "keep me"
    # The owner changed a.txt since: keeping again would conflict.
    (real / "a.txt").write_text("the owner's")
    assert conflicts(changes, saw, places) == ["a.txt", "dir/c.txt"]
