"""The manager's methods for brokers on a real store, with a bus where no one listens: a task, its
broker and its owner, and a payment."""

import json
from pathlib import Path
from typing import cast

from dbus_fast import Message
from dbus_fast.aio import MessageBus

from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.record.group_commit import Flush
from boxd.manager.record.ledger import TaskSave
from boxd.manager.record.records import Records
from boxd.manager.record.store import Store
from boxd.wire.caller import Caller, Role
from boxd.wire.event import EventKind
from boxd.wire.models.task import TaskState
from tests.support.tasks import a_task

BROKER = Caller(Role.BROKER, ":1.7", task="t000000001")
OWNER = Caller(Role.OWNER, "owner")
TASK = "t000000001"


class QuietBus:
    """Takes exports and signals, and tells no one."""

    def export(self, path: str, interface: object) -> None:
        pass

    def send(self, message: Message) -> None:
        pass


async def open_methods(
    path: Path, flush: Flush | None = None
) -> tuple[BrokerMethods, ApprovalAnswers, Store]:
    store = Store(path, flush)
    await store.open()
    records = Records(store, cast(MessageBus, QuietBus()))
    task = await store.task(TASK)
    if task is None:
        task = a_task().model_copy(update={"state": TaskState.RUNNING})
        records.export(task)
        await records.record(TaskSave(task, EventKind.TASK_STATE, {"state": "running"}))
    records.export(task)
    return BrokerMethods(records), ApprovalAnswers(records), store


def pay(to: str, cents: int, key: str) -> str:
    return json.dumps(
        {"key": key, "tool": "wallet.pay", "input": {"to": to, "cents": cents}, "costCents": cents}
    )
