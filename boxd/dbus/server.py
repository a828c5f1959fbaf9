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
import os
from collections.abc import Awaitable, Callable
from typing import Any

from dbus_fast import ErrorType, Message, MessageFlag, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.carried_text import carried
from boxd.dbus.fd_reply import Opened
from boxd.dbus.incoming_fds import close_all, guard
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
        # A connection that negotiates descriptors: the calls served here keep theirs.
        self._fds = bus._negotiate_unix_fd
        if self._fds:
            guard(bus).takes = self._takes_fd
        bus.add_message_handler(self._on_message)

    def handle(self, method: Method, handler: Handler) -> None:
        check_handler(method, handler)
        if (method.takes_fd or method.passes_fd) and not self._fds:
            raise RuntimeError(f"{method.name} passes descriptors, but the bus does not")
        self._handlers[method] = (handler, method.params)

    def _served(self, message: Message) -> Bound | None:
        if message.message_type != MessageType.METHOD_CALL or message.path != ROOT_PATH:
            return None
        method = find_method(message.interface, message.member)
        if method is None or method.method not in self._handlers:
            return None
        return method

    def _takes_fd(self, message: Message) -> bool:
        """Whether this call is one _on_message hands to _serve with its descriptors, which
        closes them once the handler returns."""
        method = self._served(message)
        return (
            method is not None
            and method.method.takes_fd
            and message.signature == method.signature
            and _fd_index(message) is not None
        )

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
        if method.method.takes_fd and not self._takes_fd(message):
            # The guard closed whatever came with it.
            return Message.new_error(
                message, ErrorType.INVALID_ARGS.value, f"{method.name} takes a file descriptor"
            )
        task = asyncio.create_task(self._serve(message, method))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        if message.unix_fds:
            # Once the handler has returned, failed or been cancelled, even before it began.
            fds = message.unix_fds
            task.add_done_callback(lambda _: close_all(fds))
        return True

    async def _serve(self, message: Message, method: Bound) -> None:
        opened: Opened | None = None
        try:
            caller = await self._authorize(message, method)
            check_admitted(method, caller.role)
            args = list(message.body[1:] if method.interface == GATEWAY else message.body)
            if method.method.takes_fd:
                args[-1] = message.unix_fds[args[-1]]
            handler, params = self._handlers[method.method]
            result = await handler(caller, **dict(zip(params, args, strict=True)))
            if method.method.passes_fd:
                if not isinstance(result, Opened):
                    raise TypeError(f"the handler of {method.name} gave no file descriptor")
                opened = result
                reply = Message.new_method_return(
                    message, "hs", [0, json.dumps(opened.answer)], unix_fds=[opened.fd]
                )
            else:
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
        except BaseException:
            # Cancelled (the manager stops): the descriptor goes nowhere.
            if opened is not None:
                opened.close()
            raise
        if reply.message_type == MessageType.ERROR and opened is not None:
            opened.close()
            opened = None
        if message.flags & MessageFlag.NO_REPLY_EXPECTED:
            if opened is not None:
                opened.close()
            return
        written = self._bus.send(reply)
        if opened is not None:
            # The writer holds the descriptor's number until it sends the reply, maybe turns
            # later: closed once written, or once the bus gave up on it.
            fd = opened.fd
            written.add_done_callback(lambda _: os.close(fd))


def _fd_index(message: Message) -> int | None:
    """The descriptor a call's last argument names, if the call carries it."""
    index = message.body[-1] if message.body else None
    if isinstance(index, int) and 0 <= index < len(message.unix_fds):
        return index
    return None
