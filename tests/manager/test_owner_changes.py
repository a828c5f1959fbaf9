"""The owner's changes as entries of the stack (boxd/manager/owner_changes.py), on a Box with a
real store and stand-ins for systemd: an upload recorded as a done task of worker "owner" whose
layer joins the stack, shown by DiffTask and listed, undone as a task is; a refused one leaves
nothing, on the disk or in the record; CreateTask refuses worker "owner"."""

import errno
import io
import json
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from dbus_fast.aio import MessageBus

from boxd.errors import BoxError, Problem
from boxd.manager.box import Box
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import Systemd
from boxd.manager.units.task_os import TaskOS
from boxd.manager.workspaces import owner_layer
from boxd.manager.workspaces.layers import STAGING, layer_name
from boxd.paths import workspaces_dir
from boxd.wire.caller import Caller, Role
from tests.support.machine_checks import fit_machine


class FakeSystemd:
    """No task of these runs: undo's ending lets go of units that are not there."""

    reloads = 0

    def unwatch(self, name: str) -> None:
        pass

    async def stop_unit(self, name: str) -> None:
        pass

    async def reset_failed(self, name: str) -> None:
        pass


# The task users the box was asked to remove: an owner's change never had one.
USERS_REMOVED: list[str] = []
OWNER = Caller(Role.OWNER, "alice", user="alice", uid=1000)


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    async def nothing(*args: Any) -> None:
        return None

    async def remove_user(name: str) -> None:
        USERS_REMOVED.append(name)

    USERS_REMOVED.clear()
    store = Store(tmp_path / "box.db")
    await store.open()
    task_os = TaskOS(remove_user=remove_user, remove_netns=nothing)
    made = Box(
        tmp_path,
        store,
        cast(MessageBus, None),
        cast(Systemd, FakeSystemd()),
        task_os,
        check_machine=fit_machine,
    )
    made.workspaces.open()
    made.layers.open()
    (workspaces_dir(tmp_path) / "home" / "base.md").write_text("base\n")
    yield made
    await store.close()


def a_tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return out.getvalue()


async def upload(box: Box, tmp_path: Path, files: dict[str, bytes], folder: str = "") -> Any:
    path = tmp_path / "upload.tar"
    path.write_bytes(a_tar(files))
    fd = os.open(path, os.O_RDONLY)
    try:
        return await box.changes.add_to_workspace(OWNER, "home", folder, fd)
    finally:
        os.close(fd)


def staged(box: Box) -> list[str]:
    return [p.name for p in box.layers.store("home").iterdir() if p.name.startswith(STAGING)]


async def test_an_upload_is_a_done_task_whose_layer_joins_the_stack(
    box: Box, tmp_path: Path
) -> None:
    first = await upload(box, tmp_path, {"a.md": b"a\n", "b.md": b"b\n"}, "docs")
    assert first["worker"] == "owner" and first["state"] == "done"
    assert first["title"] == "Added 2 files to docs/"
    assert first["source"] == "boxctl" and first["user"] == "alice"
    assert first["saw"] == []
    second = await upload(box, tmp_path, {"c.md": b"c\n"})
    assert second["title"] == "Added c.md" and second["saw"] == [first["id"]]
    assert await box.store.stack("home") == [(2, second["id"]), (1, first["id"])]
    listed = await box.list_tasks(OWNER, "")
    assert [t["id"] for t in listed["tasks"]][:2] == [second["id"], first["id"]]
    diff = await box.review.diff_task(OWNER, first["id"], "")
    assert [(f["path"], f["change"]) for f in diff["files"]] == [
        ("docs", "added"),
        ("docs/a.md", "added"),
        ("docs/b.md", "added"),
    ]
    assert staged(box) == []


async def test_an_owner_change_is_undone_as_a_task(box: Box, tmp_path: Path) -> None:
    change = await upload(box, tmp_path, {"a.md": b"a\n"})
    layer = box.layers.store("home") / layer_name(1)
    assert (layer / "a.md").read_bytes() == b"a\n"
    undone = await box.review.undo_task(OWNER, change["id"])
    assert undone["state"] == "undone"
    assert await box.store.stack("home") == []
    # No unfinished task stacks it: its files are gone, and no user is looked for.
    assert not layer.exists()
    assert USERS_REMOVED == []


async def test_a_refused_upload_leaves_nothing(box: Box, tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("ok.md"), io.BytesIO(b""))
        link = tarfile.TarInfo("evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc"
        archive.addfile(link)
    path = tmp_path / "evil.tar"
    path.write_bytes(out.getvalue())
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BoxError, match="symbolic link"):
            await box.changes.add_to_workspace(OWNER, "home", "", fd)
    finally:
        os.close(fd)
    assert staged(box) == [] and await box.store.stack("home") == []
    assert (await box.list_tasks(OWNER, ""))["tasks"] == []


async def test_a_full_disk_refuses_in_words_and_records_nothing(
    box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(owner_layer, "KEEP_FREE", 1 << 62)
    with pytest.raises(BoxError) as caught:
        await upload(box, tmp_path, {"a.md": b"a\n"})
    assert caught.value.problem == Problem.FULL
    assert "nothing was added" in caught.value.message
    assert staged(box) == [] and await box.store.stack("home") == []


async def test_a_rename_and_a_deletion(box: Box, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("overlayfs's whiteout is a character device, which root alone makes")
    renamed = await box.changes.rename_in_workspace(OWNER, "home", "base.md", "moved.md")
    assert renamed["title"] == "Renamed base.md to moved.md"
    diff = await box.review.diff_task(OWNER, renamed["id"], "")
    assert {(f["path"], f["change"]) for f in diff["files"]} == {
        ("base.md", "deleted"),
        ("moved.md", "added"),
    }
    deleted = await box.changes.delete_from_workspace(OWNER, "home", "moved.md")
    assert deleted["title"] == "Deleted moved.md" and deleted["saw"] == [renamed["id"]]
    diff = await box.review.diff_task(OWNER, deleted["id"], "")
    assert [(f["path"], f["change"]) for f in diff["files"]] == [("moved.md", "deleted")]


async def test_no_such_workspace(box: Box, tmp_path: Path) -> None:
    with pytest.raises(BoxError) as caught:
        await box.changes.delete_from_workspace(OWNER, "nope", "a")
    assert caught.value.problem == Problem.NOT_FOUND


async def test_a_staged_layer_left_by_a_cut_off_change_is_removed_at_open(box: Box) -> None:
    left = box.layers.store("home") / f"{STAGING}cut"
    (left / "half").mkdir(parents=True)
    box.layers.open()
    assert not left.exists()


async def test_create_task_refuses_worker_owner(box: Box) -> None:
    request = json.dumps({"title": "t", "prompt": "p", "worker": "owner"})
    with pytest.raises(BoxError) as caught:
        await box.create_task(OWNER, request)
    assert caught.value.problem == Problem.INVALID
    assert "unknown worker 'owner'" in caught.value.message


async def test_a_disk_that_fills_while_an_upload_is_written_loses_nothing(
    box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC from a write half-way (the disk filled by something else meanwhile): a 507 in
    words, the staged layer gone, nothing recorded, the stack as it was."""
    kept = await upload(box, tmp_path, {"kept.md": b"k"})
    written: list[int] = []

    def fills(fd: int, data: bytes) -> None:
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(len(data))
        os.write(fd, data)

    monkeypatch.setattr(owner_layer, "_write_all", fills)
    with pytest.raises(BoxError) as caught:
        await upload(box, tmp_path, {"a.md": b"a", "b.md": b"b"})
    assert caught.value.problem == Problem.FULL
    assert "nothing was added, and the workspace is as it was" in caught.value.message
    assert staged(box) == []
    assert await box.store.stack("home") == [(1, kept["id"])]
    assert [t["id"] for t in (await box.list_tasks(OWNER, ""))["tasks"]] == [kept["id"]]
