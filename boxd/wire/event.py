"""Log events: the durable story of a task, in SQLite and, for reading, in the journal.

Their kinds; an event's model is boxd.wire.models.event_record's, which a task's broker does not
need.
"""

from enum import StrEnum


class EventKind(StrEnum):
    TASK_STATE = "task.state"
    TASK_STEP = "task.step"
    TOOL_CALL = "tool.call"
    TOOL_RESULT = "tool.result"
    COST = "cost"
    APPROVAL = "approval"
    NET_REFUSED = "net.refused"
