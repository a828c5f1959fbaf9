"""One D-Bus object per task, `/org/boxd/Box1/task/<id>`: its state as properties, with
PropertiesChanged when they change, and an `Event` signal for every log event, which is how
`boxctl follow` sees steps live."""

from typing import Annotated, Any

from dbus_fast.annotations import DBusDouble, DBusSignature, DBusStr
from dbus_fast.constants import PropertyAccess
from dbus_fast.service import ServiceInterface, dbus_property, dbus_signal

from boxd.dbus.carried_text import carried
from boxd.dbus.interface import TASK
from boxd.wire.models.event_record import Event
from boxd.wire.models.task import Task


def _properties(task: Task) -> dict[str, Any]:
    return {
        "Id": task.id,
        "Title": carried(task.title),
        "State": task.state.value,
        "Worker": task.worker,
        "User": task.user,
        "Workspace": task.workspace,
        "Step": carried(task.step or ""),
        "Error": carried(task.error or ""),
        "CostCents": float(task.costCents),
    }


class TaskObject(ServiceInterface):
    def __init__(self, task: Task) -> None:
        super().__init__(TASK)
        self._now = _properties(task)

    def update(self, task: Task) -> None:
        then, self._now = self._now, _properties(task)
        changed = {name: value for name, value in self._now.items() if then[name] != value}
        if changed:
            self.emit_properties_changed(changed)

    def tell(self, event: Event) -> None:
        self.Event(event)

    @dbus_signal()
    def Event(self, event: Event) -> Annotated[list[Any], DBusSignature("tss")]:
        return [event.seq, event.kind, event.model_dump_json()]

    @dbus_property(access=PropertyAccess.READ)
    def Id(self) -> DBusStr:
        return str(self._now["Id"])

    @dbus_property(access=PropertyAccess.READ)
    def Title(self) -> DBusStr:
        return str(self._now["Title"])

    @dbus_property(access=PropertyAccess.READ)
    def State(self) -> DBusStr:
        return str(self._now["State"])

    @dbus_property(access=PropertyAccess.READ)
    def Worker(self) -> DBusStr:
        return str(self._now["Worker"])

    @dbus_property(access=PropertyAccess.READ)
    def User(self) -> DBusStr:
        return str(self._now["User"])

    @dbus_property(access=PropertyAccess.READ)
    def Workspace(self) -> DBusStr:
        return str(self._now["Workspace"])

    @dbus_property(access=PropertyAccess.READ)
    def Step(self) -> DBusStr:
        return str(self._now["Step"])

    @dbus_property(access=PropertyAccess.READ)
    def Error(self) -> DBusStr:
        return str(self._now["Error"])

    @dbus_property(access=PropertyAccess.READ)
    def CostCents(self) -> DBusDouble:
        return float(self._now["CostCents"])
