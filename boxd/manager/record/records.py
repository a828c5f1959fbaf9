"""The tasks as recorded. Every change is written to the store, shown on the task's D-Bus
object and announced by its Event signal, together; only a holder of the task's lock changes it."""

from collections.abc import Callable
from typing import TypeVar

from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.dbus.task_object import TaskObject
from boxd.errors import Problem, die
from boxd.manager.keyed_locks import KeyedLocks
from boxd.manager.record.ledger import Ledger, TaskSave
from boxd.manager.record.store import Store
from boxd.wire.ids import check_task_id
from boxd.wire.models.event_record import Event
from boxd.wire.models.task import Task

T = TypeVar("T")


def found(task_id: str, task: Task | None) -> Task:
    """The task read, or a 404 naming it."""
    if task is None:
        die(Problem.NOT_FOUND, f"no task {task_id}")
    return task


def running(task: Task) -> Task:
    """The task, or a 400 if it has ended."""
    if task.state.ended:
        die(Problem.INVALID, f"task {task.id} has ended ({task.state})")
    return task


class Records:
    def __init__(self, store: Store, bus: MessageBus) -> None:
        self.store = store
        self.bus = bus
        self.locks = KeyedLocks()
        self._objects: dict[str, TaskObject] = {}
        self._published = False

    async def task(self, task_id: str) -> Task:
        return found(task_id, await self.store.task(check_task_id(task_id)))

    async def running(self, task_id: str) -> Task:
        return running(await self.task(task_id))

    def export(self, task: Task) -> None:
        if task.id not in self._objects:
            self._objects[task.id] = TaskObject(task)
            if self._published:
                self.bus.export(api.task_path(task.id), self._objects[task.id])

    def publish(self) -> None:
        """Puts the task objects on the bus, once boxd owns org.boxd.Box1. Exporting one
        broadcasts its properties (InterfacesAdded, title included), and the D-Bus policy fences
        only the signals of the name's owner: before that, anyone listening would hear them."""
        self._published = True
        for task_id, task_object in self._objects.items():
            self.bus.export(api.task_path(task_id), task_object)

    async def record(self, save: TaskSave, *, show: bool = True) -> Event:
        """Writes the task and one event about it, with what the event decides (Store.save_task);
        `show` puts the task's new properties on D-Bus."""
        event = await self.store.save_task(save)
        if show:
            self._objects[save.task.id].update(save.task)
        self._objects[save.task.id].tell(event)
        return event

    async def transact(self, work: Callable[[Ledger], T], flush: str | None = None) -> T:
        """Runs `work` on the record in one trip to the store (Store.transact, which flushes the
        files of task `flush` first); then shows the tasks it saved on D-Bus and tells their
        events. Only a holder of each task's lock may change it."""
        value, saved = await self.store.transact(work, flush)
        for task, event in saved:
            self._objects[task.id].update(task)
            self._objects[task.id].tell(event)
        return value
