"""A new approval: recorded, so its task waits for the owner, and told to whoever follows the box
(the screen, `boxctl follow`) by the ApprovalAsked signal once it is on disk."""

from dbus_fast import Message
from dbus_fast.aio import MessageBus

from boxd.dbus import interface as api
from boxd.manager.record.ledger import Ledger, TaskSave
from boxd.wire.event import EventKind
from boxd.wire.models.approval_record import Approval
from boxd.wire.models.task import Task, TaskState


def record_approval(ledger: Ledger, task: Task, approval: Approval) -> None:
    """Records a new approval: the task waits for it."""
    if task.state == TaskState.RUNNING:
        task = task.model_copy(update={"state": TaskState.WAITING})
    ledger.save_task(TaskSave(task, EventKind.APPROVAL, approval.public(), approvals=(approval,)))


def tell_asked(bus: MessageBus, approval: Approval) -> None:
    """Tells whoever follows the box (the screen, `boxctl follow`) that the owner is asked."""
    bus.send(
        Message.new_signal(
            api.ROOT_PATH,
            api.MANAGER,
            api.APPROVAL_ASKED,
            "s",
            [approval.model_dump_json(exclude_none=True)],
        )
    )
