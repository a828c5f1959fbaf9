"""A task's record as tests make one: the manager's store, the broker's methods and the signals take
it."""

import time

from boxd.wire.models.task import Task, TaskState


def a_task(task_id: str = "t000000001") -> Task:
    return Task(
        id=task_id,
        title="t",
        prompt="step a",
        state=TaskState.QUEUED,
        user=f"box-{task_id}",
        workspace="home",
        worker="fake",
        tools=[],
        hosts=[],
        source="api",
        budgetCents=100,
        createdAt=time.time(),
    )
