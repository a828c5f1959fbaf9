"""maxRunningTasks: places go to queued tasks in the order they came."""

from boxd.manager.admission import next_to_start
from boxd.wire.models.task import Task
from tests.support.tasks import a_task


def queued(task_id: str, at: float) -> Task:
    return a_task(task_id).model_copy(update={"createdAt": at})


def test_oldest_first_up_to_the_free_places() -> None:
    tasks = [queued("t000000003", 3.0), queued("t000000001", 1.0), queued("t000000002", 2.0)]
    chosen = next_to_start(tasks, holding={"t00000000a"}, limit=3)
    assert [t.id for t in chosen] == ["t000000001", "t000000002"]


def test_none_when_every_place_is_taken() -> None:
    tasks = [queued("t000000001", 1.0)]
    assert next_to_start(tasks, holding={"t00000000a", "t00000000b"}, limit=2) == []
    # A lowered limit leaves more running than it allows: still none, never a negative count.
    assert next_to_start(tasks, holding={"t00000000a", "t00000000b"}, limit=1) == []


def test_a_task_already_starting_is_not_chosen_twice() -> None:
    tasks = [queued("t000000001", 1.0), queued("t000000002", 2.0)]
    chosen = next_to_start(tasks, holding={"t000000001"}, limit=3)
    assert [t.id for t in chosen] == ["t000000002"]
