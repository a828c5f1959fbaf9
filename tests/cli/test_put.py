"""`boxctl put` and `workspace create --from` (boxd/cli/put.py): the caller's files as a tar stream
through a pipe, read on the other end by the manager's own reader (tar_upload.add_tar) as
AddToWorkspace would. A link and a FIFO are left out and named, the FIFO never opened; a manager
that refuses before reading leaves no writer stuck on a full pipe."""

import asyncio
import os
from pathlib import Path
from typing import Any, cast

import pytest

from boxd.cli import put
from boxd.dbus import interface as api
from boxd.dbus.client import BoxClient
from boxd.errors import BoxError, Problem, die
from boxd.manager.workspaces.owner_layer import Made, stage, throw_away
from boxd.manager.workspaces.stack_view import Level, Stack
from boxd.manager.workspaces.tar_upload import add_tar
from tests.support.layer_marks import MARKS


class Manager:
    """AddToWorkspace's reading end, and CreateWorkspace."""

    def __init__(self, tmp_path: Path, refuse: bool = False) -> None:
        base = tmp_path / "base"
        base.mkdir()
        self.stack = Stack([Level(None, base)], MARKS)
        self.made: Made = stage(tmp_path / "store", -1)
        self.refuse = refuse
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    async def call(self, method: api.Method, *args: Any) -> Any:
        self.calls.append((method.name, args))
        return {"name": args[0], "path": f"/w/{args[0]}"}

    async def call_with_fd(self, method: api.Method, fd: int, *args: Any) -> Any:
        self.calls.append((method.name, args))
        if self.refuse:
            die(Problem.NOT_FOUND, f"no workspace {args[0]}")
        _, folder = args
        await asyncio.to_thread(add_tar, self.made, self.stack, folder, fd)
        return {"id": "t000000001", "worker": "owner", "title": "Added"}


@pytest.fixture
def mine(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    (folder / "inner").mkdir(parents=True)
    (folder / "a.md").write_text("a")
    (folder / "inner" / "b.md").write_text("b")
    (folder / "shadow").symlink_to("/etc/shadow")
    os.mkfifo(folder / "pipe")
    return folder


def test_destination() -> None:
    assert put.destination("home") == ("home", "")
    assert put.destination("home:docs/x/") == ("home", "docs/x")
    with pytest.raises(BoxError):
        put.destination(":docs")


async def test_put_leaves_out_links_and_fifos_and_names_them(
    tmp_path: Path, mine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = Manager(tmp_path)
    try:
        await put.put(cast(BoxClient, manager), [str(mine)], "home:docs")
        made = manager.made.path
        assert (made / "docs/mine/inner/b.md").read_text() == "b"
        assert (made / "docs/mine/a.md").read_text() == "a"
        assert sorted(p.name for p in (made / "docs/mine").iterdir()) == ["a.md", "inner"]
        err = capsys.readouterr().err
        assert "left out mine/shadow: a link" in err and "left out mine/pipe" in err
    finally:
        throw_away(manager.made)


async def test_create_from_puts_the_contents_at_the_top(tmp_path: Path, mine: Path) -> None:
    manager = Manager(tmp_path)
    try:
        made = await put.create_from(cast(BoxClient, manager), "papers", str(mine))
        assert made["name"] == "papers" and made["change"]["worker"] == "owner"
        assert [name for name, _ in manager.calls] == ["CreateWorkspace", "AddToWorkspace"]
        assert (manager.made.path / "inner/b.md").read_text() == "b"
    finally:
        throw_away(manager.made)


async def test_a_refusal_before_reading_leaves_no_writer_stuck(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (8 << 20))
    manager = Manager(tmp_path, refuse=True)
    try:
        with pytest.raises(BoxError, match="no workspace nope"):
            await put.put(cast(BoxClient, manager), [str(big)], "nope")
    finally:
        throw_away(manager.made)


def test_a_link_named_on_the_command_line_is_refused(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(BoxError, match="is a link"):
        put._sources([str(tmp_path / "link")], contents=False)
