"""`org.boxd.Box1`: every method declared once, with its arguments and the callers it admits.

Which interfaces a method appears on follows from its callers: the owner by polkit calls on
`Manager`; the owner's and an app's bearer tokens call on `Gateway`, the token first; a task's
broker calls on `Broker`. Introspection, dispatch, the signature check and the role check are
all derived from this table, so no method can be reachable by a caller it does not name.

Bodies are JSON strings checked by the same pydantic models the HTTP API uses, so a `busctl` or
`boxctl` caller meets exactly the rules and messages an HTTP caller does.
"""

import re
from dataclasses import dataclass
from enum import StrEnum

from dbus_fast import introspection as intr
from dbus_fast.constants import ArgDirection

from boxd.wire.caller import Role

BUS_NAME = "org.boxd.Box1"
ROOT_PATH = "/org/boxd/Box1"
TASKS_PATH = f"{ROOT_PATH}/task"
MANAGER = "org.boxd.Box1.Manager"
GATEWAY = "org.boxd.Box1.Gateway"
BROKER = "org.boxd.Box1.Broker"
TASK = "org.boxd.Box1.Task"
MANAGE_ACTION = "org.boxd.Box1.manage"
# Emitted on the root object whenever a task asks the owner for an OK.
APPROVAL_ASKED = "ApprovalAsked"


def task_path(task_id: str) -> str:
    return f"{TASKS_PATH}/{task_id}"


class Door(StrEnum):
    """How a caller comes in, which is what a method admits or not."""

    POLKIT = "the owner, by polkit"
    OWNER_TOKEN = "the owner's token"
    APP_TOKEN = "an app's token"
    MEMBER_TOKEN = "a member's token"
    PAIRING_CODE = "anyone, with a pairing code"
    BROKER = "a task's broker"
    SCREEN = "this computer's own screen"
    LOGIN_LINK = "a one-time login link"
    DEVICE = "the owner's paired device"


def door(interface: str, role: Role) -> Door | None:
    """The door a caller identified as `role` came in by, on `interface`."""
    if interface == MANAGER and role == Role.OWNER:
        return Door.POLKIT
    if interface == GATEWAY and role == Role.OWNER:
        return Door.OWNER_TOKEN
    if interface == GATEWAY and role == Role.APP:
        return Door.APP_TOKEN
    if interface == GATEWAY and role == Role.MEMBER:
        return Door.MEMBER_TOKEN
    if interface == GATEWAY and role == Role.PAIRING:
        return Door.PAIRING_CODE
    if interface == GATEWAY and role == Role.SCREEN:
        return Door.SCREEN
    if interface == GATEWAY and role == Role.LOGIN_LINK:
        return Door.LOGIN_LINK
    if interface == GATEWAY and role == Role.DEVICE:
        return Door.DEVICE
    if interface == BROKER and role == Role.BROKER:
        return Door.BROKER
    return None


# The Python type a handler takes each D-Bus type as: a file descriptor (`h`) as its number,
# which stays open while the handler runs and is closed by the server once it returns.
_PYTHON_TYPES: dict[str, type] = {"s": str, "b": bool, "h": int}
# The argument a method declared `takes_fd` takes its file descriptor by, always the last.
FD_ARG = "fd:h"


@dataclass(frozen=True)
class Method:
    name: str
    # Each argument is a string unless its name says otherwise: `approved:b`.
    args: tuple[str, ...]
    returns: str
    callers: frozenset[Door]
    # What an argument named `id` is the id of: its handler's parameter is `<this>_id`.
    id_of: str = "task"
    # Answers with a file descriptor before its JSON (`hs`): the handler returns an Opened
    # (boxd.dbus.fd_reply), and the server closes the descriptor once the reply is sent.
    passes_fd: bool = False
    # Takes a file descriptor as its last argument (`fd`, `h`). Every other message's
    # descriptors are closed on arrival (boxd.dbus.incoming_fds), so only these can hand one in.
    takes_fd: bool = False

    @property
    def all_args(self) -> tuple[str, ...]:
        """The arguments as carried, the file descriptor last if it takes one."""
        return (*self.args, FD_ARG) if self.takes_fd else self.args

    @property
    def reply_signature(self) -> str:
        return "hs" if self.passes_fd else "s"

    @property
    def params(self) -> tuple[str, ...]:
        """The names the handler takes the arguments by, after the caller: the D-Bus name in
        snake_case (`waitMs` is `wait_ms`, `approved:b` is `approved`), `id` named for what it
        is the id of (`task_id`, `approval_id`)."""
        return tuple(_param(arg.partition(":")[0], self.id_of) for arg in self.all_args)

    @property
    def param_types(self) -> tuple[type, ...]:
        return tuple(_PYTHON_TYPES[arg.partition(":")[2] or "s"] for arg in self.all_args)

    @property
    def interfaces(self) -> tuple[str, ...]:
        found = []
        if Door.POLKIT in self.callers:
            found.append(MANAGER)
        if self.callers & {
            Door.OWNER_TOKEN,
            Door.APP_TOKEN,
            Door.MEMBER_TOKEN,
            Door.PAIRING_CODE,
            Door.SCREEN,
            Door.LOGIN_LINK,
            Door.DEVICE,
        }:
            found.append(GATEWAY)
        if Door.BROKER in self.callers:
            found.append(BROKER)
        return tuple(found)

    def admits(self, interface: str, role: Role) -> bool:
        return door(interface, role) in self.callers


def _param(name: str, id_of: str) -> str:
    if name == "id":
        return f"{id_of}_id"
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


@dataclass(frozen=True)
class Bound:
    """A method as it appears on one interface: on the gateway's, the bearer token comes first."""

    interface: str
    method: Method

    @property
    def args(self) -> tuple[str, ...]:
        token = ("token",) if self.interface == GATEWAY else ()
        return (*token, *self.method.all_args)

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(arg.partition(":")[2] or "s" for arg in self.args)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(arg.partition(":")[0] for arg in self.args)

    @property
    def signature(self) -> str:
        return "".join(self.types)


# The owner's own account only: a login link for this computer's screen is never a token's to
# make.
_POLKIT = frozenset({Door.POLKIT})
# The owner in person: at this computer (polkit, or its own screen, whose session only a
# polkit-checked `boxctl open` makes) or on the device they paired. The vault, settings,
# pairing and removing workspaces are theirs; an owner's token (made for scripts) is not let in.
_IN_PERSON = frozenset({Door.POLKIT, Door.SCREEN, Door.DEVICE})
_OWNER = frozenset({Door.POLKIT, Door.OWNER_TOKEN, Door.SCREEN, Door.DEVICE})
_OWNER_OR_APP = frozenset(
    {Door.POLKIT, Door.OWNER_TOKEN, Door.SCREEN, Door.DEVICE, Door.APP_TOKEN, Door.MEMBER_TOKEN}
)
_BROKER = frozenset({Door.BROKER})

# An app's or a member's token starts tasks, and sees, follows and stops the ones it started.
CREATE_TASK = Method("CreateTask", ("request",), "task", _OWNER_OR_APP)
# Long answers come in pages: "" asks for the first, an answer's `next` for the one after it
# (boxd.manager.pages), so none depends on fitting in one D-Bus message.
GET_TASK = Method("GetTask", ("id", "page"), "task", _OWNER_OR_APP)
LIST_TASKS = Method("ListTasks", ("page",), "tasks", _OWNER_OR_APP)
STOP_TASK = Method("StopTask", ("id",), "task", _OWNER_OR_APP)
# Everything else is the owner's.
UNDO_TASK = Method("UndoTask", ("id",), "task", _OWNER)
KEEP_TASK = Method("KeepTask", ("id",), "task", _OWNER)
# The review of what a task changed, in pages (boxd.manager.workspaces.diffs): read by the owner
# only, since a task's files may hold what the owner's folders hold.
DIFF_TASK = Method("DiffTask", ("id", "page"), "diff", _OWNER)
# The workspace as it stands (boxd.manager.workspace_files), read by the owner, and by an app's
# or a member's token for the workspaces its limits name: a folder's entries in pages, a path's
# history, a plain file opened read-only and its descriptor passed, never its bytes.
LIST_WORKSPACE_FILES = Method(
    "ListWorkspaceFiles", ("name", "path", "page"), "listing", _OWNER_OR_APP
)
GET_WORKSPACE_FILE_HISTORY = Method(
    "GetWorkspaceFileHistory", ("name", "path"), "history", _OWNER_OR_APP
)
OPEN_WORKSPACE_FILE = Method(
    "OpenWorkspaceFile", ("name", "path"), "file", _OWNER_OR_APP, passes_fd=True
)
LIST_APPROVALS = Method("ListApprovals", ("page",), "approvals", _OWNER)
ANSWER_APPROVAL = Method(
    "AnswerApproval", ("id", "approved:b"), "approval", _OWNER, id_of="approval"
)
LIST_WORKSPACES = Method("ListWorkspaces", (), "workspaces", _OWNER)
CREATE_WORKSPACE = Method("CreateWorkspace", ("name",), "workspace", _OWNER)
REMOVE_WORKSPACE = Method("RemoveWorkspace", ("name",), "removed", _IN_PERSON)
# The owner's changes to a workspace, each an entry of its stack of its own, answered as a task
# (boxd.manager.owner_changes): a path deleted, or renamed (`fromPath` to `toPath`).
# `fd` reads a tar stream (boxctl's or the web process's) whose entries go under folder `path`.
ADD_TO_WORKSPACE = Method("AddToWorkspace", ("name", "path"), "task", _OWNER, takes_fd=True)
DELETE_FROM_WORKSPACE = Method("DeleteFromWorkspace", ("name", "path"), "task", _OWNER)
RENAME_IN_WORKSPACE = Method("RenameInWorkspace", ("name", "fromPath", "toPath"), "task", _OWNER)
# A folder of the workspace as it stands ("" all of it) as a tar, made as it is read: the answer
# is the read end of a pipe the manager fills (boxd.manager.workspace_archive). Whoever may read
# the workspace's files may: the owner, an app's or a member's token for the workspaces it names.
OPEN_WORKSPACE_ARCHIVE = Method(
    "OpenWorkspaceArchive", ("name", "path"), "archive", _OWNER_OR_APP, passes_fd=True
)
GET_SETTINGS = Method("GetSettings", (), "settings", _IN_PERSON)
SET_SETTINGS = Method("SetSettings", ("changes",), "settings", _IN_PERSON)
# The role is owner, app or member; a member's token is named by the member's id. An app's or
# a member's carries limits, JSON (boxd.wire.models.token_limits; "" for the defaults), its tasks
# are held to. The owner in person makes them, as they pair devices; no token of a script, an app or
# a member can.
CREATE_TOKEN = Method("CreateToken", ("name", "role", "limits"), "token", _IN_PERSON)
LIST_TOKENS = Method("ListTokens", (), "tokens", _OWNER)
REVOKE_TOKEN = Method("RevokeToken", ("id",), "token", _OWNER, id_of="token")
# Pairing: the owner makes a code for a device's name; a device exchanges it, once, within ten
# minutes, for a token of its own (boxd.manager.access.pairing). On the gateway, the token is "".
CREATE_PAIRING = Method("CreatePairing", ("name",), "pairing", _IN_PERSON)
PAIR = Method("Pair", ("code",), "paired", frozenset({Door.PAIRING_CODE}))
# Which Droid release the box runs and whether its install is under way or failed; the same of
# Claude Code, whose install starts with the first Claude task.
GET_DROID = Method("GetDroid", (), "droid", _OWNER)
GET_CLAUDE = Method("GetClaude", (), "claude", _OWNER)
# What boxd needs of this machine, checked anew (boxd.manager.doctor): while a check that
# blocks fails, no task starts, and the answer says why.
CHECK_MACHINE = Method("CheckMachine", (), "findings", _OWNER)
# Whether the agents are paused ({paused}); while they are, every new task stays queued.
GET_AGENTS = Method("GetAgents", (), "agents", _OWNER)
PAUSE_AGENTS = Method("PauseAgents", (), "agents", _OWNER)
RESUME_AGENTS = Method("ResumeAgents", (), "agents", _OWNER)
# The vault: values go in, never out.
SET_SECRET = Method("SetSecret", ("name", "value"), "secret", _IN_PERSON)
REMOVE_SECRET = Method("RemoveSecret", ("name",), "secret", _IN_PERSON)
LIST_SECRETS = Method("ListSecrets", (), "names", _IN_PERSON)
# This computer's own screen: `boxctl open` asks for a one-time link (the owner by polkit
# only, so no token can make one); the gateway exchanges the link, passed as its token, for a
# session once (boxd.manager.access.screen_sessions).
CREATE_SCREEN_LINK = Method("CreateScreenLink", (), "link", _POLKIT)
OPEN_SCREEN_SESSION = Method("OpenScreenSession", (), "session", frozenset({Door.LOGIN_LINK}))
# Logging out: the screen ends the session it passes (its own, which is also its token).
CLOSE_SCREEN_SESSION = Method("CloseScreenSession", ("session",), "ended", frozenset({Door.SCREEN}))
# A task's broker, for its own task only (the first argument is the task's id).
BROKER_GET_TASK = Method("GetTask", ("id", "page"), "task", _BROKER)
LOG_STEP = Method("LogStep", ("id", "step"), "event", _BROKER)
BEGIN_CALL = Method("BeginCall", ("id", "call"), "begun", _BROKER)
FINISH_CALL = Method("FinishCall", ("id", "result"), "finished", _BROKER)
ASK = Method("Ask", ("id", "ask"), "approval", _BROKER)
# Answered once the task's approval is answered, or after waitMs (milliseconds, as text) with
# its state still pending: the answer goes to the caller alone.
WAIT_APPROVAL = Method("WaitApproval", ("id", "approval", "waitMs"), "state", _BROKER)
LOG_COST = Method("LogCost", ("id", "cost"), "event", _BROKER)
LOG_REFUSAL = Method("LogRefusal", ("id", "refusal"), "event", _BROKER)
# The model gateway (boxd.manager.model_requests): before a request, its worst case reserved or
# the owner asked; what each reply cost, at its start and its end; and when the upstream refused
# the vault's model key (the task ends failed, saying so).
BEGIN_MODEL_REQUEST = Method("BeginModelRequest", ("id", "request"), "begun", _BROKER)
LOG_MODEL_COST = Method("LogModelCost", ("id", "cost"), "logged", _BROKER)
MODEL_KEY_REFUSED = Method("ModelKeyRefused", ("id",), "task", _BROKER)

METHODS: tuple[Method, ...] = (
    CREATE_TASK,
    GET_TASK,
    LIST_TASKS,
    STOP_TASK,
    UNDO_TASK,
    KEEP_TASK,
    DIFF_TASK,
    LIST_WORKSPACE_FILES,
    GET_WORKSPACE_FILE_HISTORY,
    OPEN_WORKSPACE_FILE,
    LIST_APPROVALS,
    ANSWER_APPROVAL,
    LIST_WORKSPACES,
    CREATE_WORKSPACE,
    REMOVE_WORKSPACE,
    ADD_TO_WORKSPACE,
    DELETE_FROM_WORKSPACE,
    RENAME_IN_WORKSPACE,
    OPEN_WORKSPACE_ARCHIVE,
    GET_SETTINGS,
    SET_SETTINGS,
    CREATE_TOKEN,
    LIST_TOKENS,
    REVOKE_TOKEN,
    CREATE_PAIRING,
    PAIR,
    GET_DROID,
    GET_CLAUDE,
    CHECK_MACHINE,
    GET_AGENTS,
    PAUSE_AGENTS,
    RESUME_AGENTS,
    SET_SECRET,
    REMOVE_SECRET,
    LIST_SECRETS,
    CREATE_SCREEN_LINK,
    OPEN_SCREEN_SESSION,
    CLOSE_SCREEN_SESSION,
    BROKER_GET_TASK,
    LOG_STEP,
    BEGIN_CALL,
    FINISH_CALL,
    ASK,
    WAIT_APPROVAL,
    LOG_COST,
    LOG_REFUSAL,
    BEGIN_MODEL_REQUEST,
    LOG_MODEL_COST,
    MODEL_KEY_REFUSED,
)


def _bind() -> dict[tuple[str, str], Bound]:
    table: dict[tuple[str, str], Bound] = {}
    for method in METHODS:
        for interface in method.interfaces:
            if (interface, method.name) in table:
                raise RuntimeError(f"{interface}.{method.name} is declared twice")
            table[(interface, method.name)] = Bound(interface, method)
    return table


_BOUND = _bind()


def find_method(interface: str | None, name: str | None) -> Bound | None:
    return _BOUND.get((interface or "", name or ""))


def bound_on(interface: str, method: Method) -> Bound:
    """The method as `interface` declares it. Calling one the table does not put there is a
    mistake in boxd's own code (the manager's GetTask on the broker's interface, say), so it
    is raised as one, before anything is sent."""
    bound = _BOUND.get((interface, method.name))
    if bound is None or bound.method != method:
        raise RuntimeError(f"{interface} does not declare {method.name} as called here")
    return bound


def bound_methods() -> tuple[Bound, ...]:
    return tuple(_BOUND.values())


def _out_args(method: Method) -> list[intr.Arg]:
    answer = intr.Arg("s", ArgDirection.OUT, method.returns)
    return [intr.Arg("h", ArgDirection.OUT, "fd"), answer] if method.passes_fd else [answer]


def introspection_xml(children: list[str]) -> str:
    """The XML `busctl introspect` shows for the root object."""
    interfaces = []
    for name in (MANAGER, GATEWAY, BROKER):
        methods = [
            intr.Method(
                bound.name,
                in_args=[
                    intr.Arg(kind, ArgDirection.IN, arg)
                    for arg, kind in zip(bound.names, bound.types, strict=True)
                ],
                out_args=_out_args(bound.method),
            )
            for bound in _BOUND.values()
            if bound.interface == name
        ]
        signals = (
            [intr.Signal(APPROVAL_ASKED, [intr.Arg("s", name="approval")])]
            if name == MANAGER
            else []
        )
        interfaces.append(intr.Interface(name, methods=methods, signals=signals))
    interfaces.append(
        intr.Interface(
            "org.freedesktop.DBus.Introspectable",
            methods=[intr.Method("Introspect", out_args=[intr.Arg("s", ArgDirection.OUT, "xml")])],
        )
    )
    node = intr.Node(ROOT_PATH, interfaces=interfaces)
    node.nodes = [intr.Node(child, is_root=False) for child in children]
    return str(node.tostring())
