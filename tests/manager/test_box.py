"""Box, the manager's methods: a start refused while a check of the machine that blocks tasks
fails says why to the owner alone."""

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from dbus_fast.aio import MessageBus

from boxd.errors import BoxError, Problem
from boxd.manager.box import Box
from boxd.manager.record.store import Store
from boxd.manager.units.systemd import Systemd
from boxd.wire.caller import Caller, Role
from boxd.wire.doctor import NO_TASK_STARTS, Finding, failed

# As the check's words would be: a path of the machine's, the manager's process id.
NO_BPF = failed(
    "IPAddressDeny (BPF)",
    "systemd does not enforce IPAddressDeny= here.",
    "journalctl -u boxd-doctor-bpf-4242-0badc0de.service says why.",
    blocks=True,
)
REQUEST = json.dumps({"title": "t", "prompt": "step hello", "worker": "fake"})


class NoSystemd:
    """No unit is started: the start is refused first."""

    reloaded: object = None


async def no_bpf() -> list[Finding]:
    return [NO_BPF]


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    store = Store(tmp_path / "box.db")
    await store.open()
    yield Box(
        tmp_path, store, cast(MessageBus, None), cast(Systemd, NoSystemd()), check_machine=no_bpf
    )
    await store.close()


async def _refused(box: Box, caller: Caller) -> str:
    with pytest.raises(BoxError) as refused:
        await box.create_task(caller, REQUEST)
    assert refused.value.problem == Problem.UNAVAILABLE
    return refused.value.message


@pytest.mark.parametrize("role", [Role.OWNER, Role.SCREEN, Role.DEVICE])
async def test_the_owner_is_told_which_check_failed_and_how_to_fix_it(box: Box, role: Role) -> None:
    words = await _refused(box, Caller(role, "alice"))
    assert words.startswith(NO_TASK_STARTS) and NO_BPF.words in words


@pytest.mark.parametrize("role", [Role.APP, Role.MEMBER])
async def test_an_apps_or_a_members_token_is_told_only_that_no_task_starts(
    box: Box, role: Role
) -> None:
    """What the machine lacks is the owner's to know: a token handed to an app or a person
    learns neither that the box's network filter is not enforced, nor the machine's paths,
    versions or processes the checks' words name."""
    words = await _refused(box, Caller(role, "someone"))
    assert words.startswith(NO_TASK_STARTS)
    assert "IPAddressDeny" not in words and "4242" not in words and "owner" in words
