"""Names and signatures of `org.boxd.Box1`, the one definition both sides use.

Bodies are JSON strings checked by the same pydantic models the HTTP API uses, so a `busctl` or
`boxctl` caller meets exactly the rules and messages an HTTP caller does.
"""

from dataclasses import dataclass

BUS_NAME = "org.boxd.Box1"
ROOT_PATH = "/org/boxd/Box1"
TASKS_PATH = f"{ROOT_PATH}/task"
MANAGER = "org.boxd.Box1.Manager"
GATEWAY = "org.boxd.Box1.Gateway"
BROKER = "org.boxd.Box1.Broker"
TASK = "org.boxd.Box1.Task"
MANAGE_ACTION = "org.boxd.Box1.manage"


def task_path(task_id: str) -> str:
    return f"{TASKS_PATH}/{task_id}"


@dataclass(frozen=True)
class Method:
    interface: str
    name: str
    # Each argument is a string unless its name says otherwise: `approved:b`.
    args: tuple[str, ...]
    returns: str

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(arg.partition(":")[2] or "s" for arg in self.args)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(arg.partition(":")[0] for arg in self.args)

    @property
    def signature(self) -> str:
        return "".join(self.types)


def _methods(interface: str, token: bool = False) -> list[Method]:
    first = ("token",) if token else ()
    return [
        Method(interface, "CreateTask", (*first, "request"), "task"),
        # Long answers come in pages: "" asks for the first, an answer's `next` for the one
        # after it (boxd.manager.pages).
        Method(interface, "GetTask", (*first, "id", "page"), "task"),
        Method(interface, "ListTasks", (*first, "page"), "tasks"),
        Method(interface, "StopTask", (*first, "id"), "task"),
        Method(interface, "UndoTask", (*first, "id"), "task"),
        Method(interface, "KeepTask", (*first, "id"), "task"),
        Method(interface, "ListApprovals", (*first, "page"), "approvals"),
        Method(interface, "AnswerApproval", (*first, "id", "approved:b"), "approval"),
        Method(interface, "ListWorkspaces", first, "workspaces"),
        Method(interface, "CreateWorkspace", (*first, "name"), "workspace"),
    ]


METHODS: tuple[Method, ...] = (
    *_methods(MANAGER),
    Method(MANAGER, "RemoveWorkspace", ("name",), "removed"),
    Method(MANAGER, "GetSettings", (), "settings"),
    Method(MANAGER, "SetSettings", ("changes",), "settings"),
    Method(MANAGER, "CreateToken", ("name", "app:b"), "token"),
    # The vault: the owner's only, like everything on this interface. Values go in, never out.
    Method(MANAGER, "SetSecret", ("name", "value"), "secret"),
    Method(MANAGER, "RemoveSecret", ("name",), "secret"),
    Method(MANAGER, "ListSecrets", (), "names"),
    *_methods(GATEWAY, token=True),
    Method(BROKER, "GetTask", ("id", "page"), "task"),
    Method(BROKER, "LogStep", ("id", "step"), "event"),
    Method(BROKER, "BeginCall", ("id", "call"), "begun"),
    Method(BROKER, "FinishCall", ("id", "result"), "finished"),
    Method(BROKER, "Ask", ("id", "ask"), "approval"),
    Method(BROKER, "LogCost", ("id", "cost"), "event"),
    Method(BROKER, "LogRefusal", ("id", "refusal"), "event"),
)
# Emitted on the root object whenever a task asks the owner for an OK.
APPROVAL_ASKED = "ApprovalAsked"


def find_method(interface: str | None, name: str | None) -> Method | None:
    for method in METHODS:
        if method.interface == interface and method.name == name:
            return method
    return None


def introspection_xml(children: list[str]) -> str:
    """The XML `busctl introspect` shows for the root object."""
    parts = ['<node name="/org/boxd/Box1">']
    for interface in (MANAGER, GATEWAY, BROKER):
        parts.append(f' <interface name="{interface}">')
        for method in METHODS:
            if method.interface != interface:
                continue
            parts.append(f'  <method name="{method.name}">')
            parts.extend(
                f'   <arg name="{name}" type="{kind}" direction="in"/>'
                for name, kind in zip(method.names, method.types, strict=True)
            )
            parts.append(f'   <arg name="{method.returns}" type="s" direction="out"/>')
            parts.append("  </method>")
        if interface == MANAGER:
            parts.append(
                f'  <signal name="{APPROVAL_ASKED}"><arg name="approval" type="s"/></signal>'
            )
        parts.append(" </interface>")
    parts.append(
        ' <interface name="org.freedesktop.DBus.Introspectable">'
        '<method name="Introspect"><arg name="xml" type="s" direction="out"/></method>'
        "</interface>"
    )
    parts.extend(f' <node name="{child}"/>' for child in children)
    parts.append("</node>")
    return "\n".join(parts)
