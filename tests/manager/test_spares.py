"""Task ids made ahead (boxd.manager.spares), with fakes for making and removing a spare's user
and namespace: a task takes a ready one, the next is made once asked, a failed making is undone
and stops there, and what an earlier manager left is found for removal, never a task's user."""

import asyncio

from boxd.manager.spares import Spares, leftovers
from boxd.manager.units.users import FIRST_UID
from boxd.wire.ids import is_task_id


class Made:
    def __init__(self, fail_after: int | None = None) -> None:
        self.made: list[str] = []
        self.dropped: list[str] = []
        self.fail_after = fail_after

    async def make(self, task_id: str) -> None:
        if self.fail_after is not None and len(self.made) >= self.fail_after:
            raise OSError("useradd: cannot lock /etc/passwd")
        self.made.append(task_id)

    async def drop(self, task_id: str) -> None:
        self.dropped.append(task_id)


async def test_a_task_takes_a_ready_id_and_the_next_is_made_when_asked() -> None:
    made = Made()
    spares = Spares(made.make, made.drop, count=2)
    assert spares.take() is None
    spares.fill_soon()
    await spares.filled()
    assert len(made.made) == 2 and all(is_task_id(i) for i in made.made)
    first = spares.take()
    assert first == made.made[0]
    # Nothing is made until the task that took one has started and asks.
    await asyncio.sleep(0)
    assert len(made.made) == 2
    spares.fill_soon()
    await spares.filled()
    assert len(made.made) == 3
    assert spares.take() == made.made[1]
    assert spares.take() == made.made[2]
    assert spares.take() is None


async def test_an_id_given_back_is_taken_next() -> None:
    made = Made()
    spares = Spares(made.make, made.drop, count=1)
    spares.fill_soon()
    await spares.filled()
    taken = spares.take()
    assert taken is not None
    spares.give_back(taken)
    assert spares.take() == taken


async def test_a_spare_that_could_not_be_made_is_undone_and_making_stops() -> None:
    made = Made(fail_after=1)
    spares = Spares(made.make, made.drop, count=3)
    spares.fill_soon()
    await spares.filled()
    # The second failed: what it made is removed, and no third is tried in a loop.
    assert len(made.made) == 1
    assert len(made.dropped) == 1 and made.dropped[0] not in made.made
    assert spares.take() == made.made[0]
    assert spares.take() is None


def test_leftovers_are_task_users_groups_and_namespaces_of_boxd_with_no_task() -> None:
    accounts = [
        ("root", 0),
        ("box-t000000001", FIRST_UID),  # a task's: kept
        ("box-t000000002", FIRST_UID + 1),  # no task: a spare left behind
        ("box-t000000003", 1003),  # not a uid of boxd's
        ("box-web", FIRST_UID + 2),  # not a task id
        ("boxd-broker", 999),
        # A group whose useradd was cut off, and a spare's group beside its user.
        ("box-t000000004", FIRST_UID + 3),
        ("box-t000000002", FIRST_UID + 1),
    ]
    # A namespace whose spare was cut off before its user was made; a task's.
    namespaces = ["t000000005", "t000000001", "not-a-task"]
    assert leftovers(accounts, namespaces, {"t000000001"}) == [
        "t000000002",
        "t000000004",
        "t000000005",
    ]
