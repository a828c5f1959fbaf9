"""Serves `org.boxd.Box1` with a low-level message handler.

dbus-fast's ServiceInterface hides the sender of a call, and polkit needs it, so the manager's
methods are dispatched here: identify the caller, refuse a role the method's declaration does not
admit, run the method, answer with JSON or an error whose name carries the problem and whose text
a person can act on.
"""

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dbus_fast import ErrorType, Message, MessageFlag, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.carried_text import carried
from boxd.dbus.interface import GATEWAY, ROOT_PATH, Bound, Method, find_method, introspection_xml
from boxd.errors import BoxError, Problem, die
from boxd.wire.caller import OWNER_ONLY, Caller, Role

log = logging.getLogger(__name__)

# Called as handler(caller, **arguments), each argument by its name in Method.params.
Handler = Callable[..., Awaitable[Any]]
Authorizer = Callable[[Message, Bound], Awaitable[Caller]]


def check_admitted(method: Bound, role: Role) -> None:
    """Refuses a caller the method's declaration does not admit, in the seed's words where the
    caller is a token's: an owner's token (a script's) is refused what needs the owner in
    person, and an app's or a member's what is the owner's."""
    if not method.method.admits(method.interface, role):
        if role in (Role.APP, Role.MEMBER, Role.OWNER):
            die(Problem.FORBIDDEN, OWNER_ONLY)
        die(Problem.FORBIDDEN, f"{method.name} is not open to {role} callers here")


def check_handler(method: Method, handler: Handler) -> None:
    """Refuses, once at start-up rather than at a call, a handler whose parameters after the
    caller are not the method's arguments by name and type: renaming one on only one side of
    the table fails here."""
    wanted = [("caller", Caller), *zip(method.params, method.param_types, strict=True)]
    found = [
        (param.name, param.annotation)
        for param in inspect.signature(handler, eval_str=True).parameters.values()
    ]
    if found != wanted:
        name = getattr(handler, "__qualname__", repr(handler))
        raise RuntimeError(
            f"the handler {name} of {method.name} takes "
            f"({', '.join(_shown(p) for p in found)}), but the method table says "
            f"({', '.join(_shown(p) for p in wanted)})"
        )


def _shown(param: tuple[str, Any]) -> str:
    name, kind = param
    return f"{name}: {getattr(kind, '__name__', kind)}"


class Server:
    def __init__(self, bus: MessageBus, authorize: Authorizer) -> None:
        self._bus = bus
        self._authorize = authorize
        self._handlers: dict[Method, tuple[Handler, tuple[str, ...]]] = {}
        self._running: set[asyncio.Task[None]] = set()
        bus.add_message_handler(self._on_message)

    def handle(self, method: Method, handler: Handler) -> None:
        check_handler(method, handler)
        self._handlers[method] = (handler, method.params)

    def _on_message(self, message: Message) -> Message | bool | None:
        if message.message_type != MessageType.METHOD_CALL or message.path != ROOT_PATH:
            return None
        if (
            message.interface in (None, "org.freedesktop.DBus.Introspectable")
            and message.member == "Introspect"
        ):
            return Message.new_method_return(message, "s", [introspection_xml(["task"])])
        method = find_method(message.interface, message.member)
        if method is None or method.method not in self._handlers:
            return None
        if message.signature != method.signature:
            return Message.new_error(
                message,
                ErrorType.INVALID_ARGS.value,
                f"{method.name} takes ({method.signature}): {', '.join(method.names)}",
            )
        task = asyncio.create_task(self._serve(message, method))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return True

    async def _serve(self, message: Message, method: Bound) -> None:
        try:
            caller = await self._authorize(message, method)
            check_admitted(method, caller.role)
            args = message.body[1:] if method.interface == GATEWAY else message.body
            handler, params = self._handlers[method.method]
            result = await handler(caller, **dict(zip(params, args, strict=True)))
            reply = Message.new_method_return(message, "s", [json.dumps(result)])
        except BoxError as error:
            # Its words may quote what the caller sent, NUL or lone surrogate included.
            reply = Message.new_error(message, error.problem.dbus_name, carried(error.message))
        except Exception as error:
            log.exception("%s.%s failed", method.interface, method.name)
            reply = Message.new_error(
                message,
                Problem.FAILED.dbus_name,
                carried(
                    f"boxd failed on {method.name}: {type(error).__name__}: {error}. "
                    "journalctl -u boxd tells more."
                ),
            )
        if not message.flags & MessageFlag.NO_REPLY_EXPECTED:
            self._bus.send(reply)
