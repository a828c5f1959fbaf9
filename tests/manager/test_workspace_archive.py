"""OpenWorkspaceArchive's cap on archives written at once (boxd/manager/workspace_archive.py):
an app's or a member's token, which may read a workspace its limits name, must not be able to
take every one of them with downloads it never reads (each held up to STALL_SECONDS) and so
keep the owner from downloading anything."""

import asyncio
import os
from pathlib import Path

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.workspace_archive import ARCHIVES_AT_ONCE, WorkspaceArchives
from boxd.manager.workspaces.layers import Layers
from boxd.manager.workspaces.workspaces import Workspaces
from boxd.paths import workspaces_dir
from boxd.wire.caller import Caller, Role
from boxd.wire.models.token_limits import TokenLimits

OWNER = Caller(Role.OWNER, ":1.1")


class Recorded:
    async def stack(self, workspace: str) -> list[tuple[int, str]]:
        return []


@pytest.fixture
def archives(tmp_path: Path) -> WorkspaceArchives:
    base = workspaces_dir(tmp_path) / "docs"
    base.mkdir(parents=True)
    # More than the pipe holds: each archive's thread waits on a reader that never reads.
    (base / "big.bin").write_bytes(os.urandom(3 << 20))
    return WorkspaceArchives(Recorded(), Layers(tmp_path), Workspaces(tmp_path))  # type: ignore[arg-type]


def app(number: int) -> Caller:
    return Caller(Role.APP, f":1.{number + 10}", limits=TokenLimits(workspaces=["docs"]))


async def test_tokens_that_never_read_leave_the_owner_room_to_download(
    archives: WorkspaceArchives,
) -> None:
    held: list[int] = []
    try:
        refused: BoxError | None = None
        for number in range(ARCHIVES_AT_ONCE):
            try:
                opened = await archives.open_workspace_archive(app(number), "docs", "")
            except BoxError as error:
                refused = error
                break
            held.append(opened.fd)
        assert refused is not None and refused.problem == Problem.UNAVAILABLE
        assert held, "a token may still download"
        mine = await archives.open_workspace_archive(OWNER, "docs", "")
        held.append(mine.fd)
    finally:
        for fd in held:
            os.close(fd)  # the writers end on EPIPE
    for _ in range(500):
        if archives.writing == 0:
            break
        await asyncio.sleep(0.01)
    assert archives.writing == 0
