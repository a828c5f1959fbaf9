"""The reading doors of the workspace as it stands (boxd/manager/workspace_files.py), on a temp
home whose stack is two done layers over the base: who may read which workspace, the pages of a
listing, a link's target read and never followed, an opened file's descriptor and the task that
wrote it, a path's history, and the joins lock held until the reading thread is done."""

import asyncio
import os
import threading
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager import workspace_files
from boxd.manager.workspace_files import PAGE_ENTRIES, WorkspaceFiles, missing, whole_thread
from boxd.manager.workspaces.layers import Layers, layer_name
from boxd.manager.workspaces.workspaces import Workspaces
from boxd.paths import workspaces_dir
from boxd.wire.caller import Caller, Role
from boxd.wire.models.token_limits import TokenLimits

OWNER = Caller(Role.OWNER, ":1.1")


class Recorded:
    """The record's stack of each workspace: layer 2 (task t2) over layer 1 (task t1)."""

    async def stack(self, workspace: str) -> list[tuple[int, str]]:
        return [(2, "t2"), (1, "t1")] if workspace == "docs" else []


@pytest.fixture
def files(tmp_path: Path) -> WorkspaceFiles:
    layers = Layers(tmp_path)
    base = workspaces_dir(tmp_path) / "docs"
    base.mkdir(parents=True)
    (workspaces_dir(tmp_path) / "other").mkdir()
    (base / "notes.md").write_text("base notes")
    (base / "kept.txt").write_text("kept")
    older = layers.store("docs") / layer_name(1)
    newer = layers.store("docs") / layer_name(2)
    older.mkdir(parents=True)
    newer.mkdir(parents=True)
    (older / "notes.md").write_text("t1 notes")
    (newer / "notes.md").write_text("t2 notes")
    (newer / "shadow").symlink_to("/etc/shadow")
    os.mkfifo(newer / "pipe")
    return WorkspaceFiles(Recorded(), layers, Workspaces(tmp_path))


def app(*workspaces: str) -> Caller:
    return Caller(Role.APP, ":1.2", limits=TokenLimits(workspaces=list(workspaces)))


async def refused(call: "asyncio.Future[object] | object") -> BoxError:
    with pytest.raises(BoxError) as caught:
        await call  # type: ignore[misc]
    return caught.value


async def test_a_token_outside_its_limits_is_answered_as_for_a_missing_workspace(
    files: WorkspaceFiles,
) -> None:
    limited = app("other")
    outside = await refused(files.list_workspace_files(limited, "docs", "", ""))
    absent = await refused(files.list_workspace_files(OWNER, "nothing", "", ""))
    also_absent = await refused(files.list_workspace_files(app("nothing"), "nothing", "", ""))
    assert outside.problem == absent.problem == also_absent.problem == Problem.NOT_FOUND
    assert str(outside) == missing("docs") and str(absent) == missing("nothing")
    opened = await refused(files.open_workspace_file(limited, "docs", "notes.md"))
    history = await refused(files.get_workspace_file_history(limited, "docs", "notes.md"))
    assert opened.problem == history.problem == Problem.NOT_FOUND
    listing = await files.list_workspace_files(app("docs"), "docs", "", "")
    assert "notes.md" in {entry["name"] for entry in listing["entries"]}


async def test_a_listing_names_the_task_that_last_changed_each_entry_and_never_follows_links(
    files: WorkspaceFiles,
) -> None:
    listing = await files.list_workspace_files(OWNER, "docs", "", "")
    entries = {entry["name"]: entry for entry in listing["entries"]}
    assert entries["notes.md"]["task"] == "t2" and entries["kept.txt"]["task"] is None
    assert entries["shadow"]["kind"] == "link" and entries["shadow"]["target"] == "/etc/shadow"
    assert entries["pipe"]["kind"] == "other"
    assert listing["next"] is None and listing["truncated"] is False
    assert entries["notes.md"]["modified"].endswith("Z")


async def test_a_long_listing_comes_in_pages(files: WorkspaceFiles, tmp_path: Path) -> None:
    many = workspaces_dir(tmp_path) / "docs" / "many"
    many.mkdir()
    for number in range(PAGE_ENTRIES + 5):
        (many / f"{number:05}").write_text("")
    first = await files.list_workspace_files(OWNER, "docs", "many", "")
    assert len(first["entries"]) == PAGE_ENTRIES and first["next"] == str(PAGE_ENTRIES)
    second = await files.list_workspace_files(OWNER, "docs", "many", first["next"])
    assert second["entries"][0]["name"] == f"{PAGE_ENTRIES:05}"
    assert len(second["entries"]) == 5 and second["next"] is None
    bad = await refused(files.list_workspace_files(OWNER, "docs", "many", "x" * 30))
    assert bad.problem == Problem.INVALID


async def test_an_opened_file_is_the_newest_layers_and_a_fifo_or_link_is_refused(
    files: WorkspaceFiles,
) -> None:
    opened = await files.open_workspace_file(OWNER, "docs", "notes.md")
    try:
        assert os.read(opened.fd, 100) == b"t2 notes"
        assert opened.answer["task"] == "t2" and opened.answer["size"] == 8
    finally:
        os.close(opened.fd)
    for path in ("pipe", "shadow"):
        error = await refused(files.open_workspace_file(OWNER, "docs", path))
        assert error.problem == Problem.INVALID and "not a plain file" in str(error)
    error = await refused(files.open_workspace_file(OWNER, "docs", "../other/x"))
    assert error.problem == Problem.INVALID


async def test_history_is_newest_first_naming_tasks(files: WorkspaceFiles) -> None:
    history = await files.get_workspace_file_history(OWNER, "docs", "notes.md")
    assert history["tasks"] == [
        {"task": "t2", "change": "changed", "diff": "/api/tasks/t2/diff"},
        {"task": "t1", "change": "changed", "diff": "/api/tasks/t1/diff"},
    ]
    assert history["inBase"] is True
    added = await files.get_workspace_file_history(OWNER, "docs", "shadow")
    assert added["tasks"][0]["change"] == "added" and added["inBase"] is False


async def test_a_cancelled_read_holds_the_lock_until_its_thread_is_done_and_undoes_it() -> None:
    lock = asyncio.Lock()
    release = threading.Event()
    undone: list[int] = []

    def work() -> int:
        release.wait(10)
        return 7

    async def read() -> int:
        async with lock:
            return await whole_thread(work, undone.append)

    reading = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    reading.cancel()
    await asyncio.sleep(0.05)
    # Cancelled, but its thread still runs: the lock is still held.
    assert lock.locked() and not reading.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert undone == [7] and not lock.locked()


def test_the_page_size_fits_a_d_bus_message() -> None:
    # Each name at most 255 bytes, shown as up to 4 characters a byte, plus its fields.
    assert PAGE_ENTRIES * (255 * 4 + 300) < 32 * 1024 * 1024 // 4
    assert workspace_files.modified(0) == "1970-01-01T00:00:00Z"


async def test_a_members_personal_copy_is_read_by_root_alone(tmp_path: Path) -> None:
    """bob, also in boxd-owner, must not read alice's personal folders' copy through root (the
    view leaves it out and only the asker or root reviews such a task): listing, opening,
    history and the archive are refused him; root reads it."""
    from boxd.manager.workspace_archive import WorkspaceArchives

    base = workspaces_dir(tmp_path) / "owner-alice-0123456789"
    base.mkdir(parents=True)
    (base / "id_ed25519").write_text("alice's key")
    files = WorkspaceFiles(Recorded(), Layers(tmp_path), Workspaces(tmp_path))
    archives = WorkspaceArchives(Recorded(), Layers(tmp_path), Workspaces(tmp_path))  # type: ignore[arg-type]
    name = base.name
    bob = Caller(Role.OWNER, ":1.5", uid=1001)
    screen = Caller(Role.SCREEN, ":1.6", user="root-less-nobody-here")
    for caller in (bob, screen):
        for call in (
            files.list_workspace_files(caller, name, "", ""),
            files.open_workspace_file(caller, name, "id_ed25519"),
            files.get_workspace_file_history(caller, name, "id_ed25519"),
            archives.open_workspace_archive(caller, name, ""),
        ):
            error = await refused(call)
            assert error.problem == Problem.FORBIDDEN, error
    root = Caller(Role.OWNER, ":1.7", uid=0)
    opened = await files.open_workspace_file(root, name, "id_ed25519")
    os.close(opened.fd)
