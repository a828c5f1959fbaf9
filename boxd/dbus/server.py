"""Serves `org.boxd.Box1` with a low-level message handler.

dbus-fast's ServiceInterface hides the sender of a call, and polkit needs it, so the manager's
methods are dispatched here: authorize the caller, run the method, answer with JSON or an error
whose name carries the problem and whose text a person can act on.
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dbus_fast import ErrorType, Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.caller import Caller
from boxd.dbus.interface import ROOT_PATH, Method, find_method, introspection_xml
from boxd.errors import BoxError, Problem

log = logging.getLogger(__name__)

Handler = Callable[[Caller, list[Any]], Awaitable[Any]]
Authorizer = Callable[[Message, Method], Awaitable[Caller]]


class Server:
    def __init__(self, bus: MessageBus, authorize: Authorizer) -> None:
        self._bus = bus
        self._authorize = authorize
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._running: set[asyncio.Task[None]] = set()
        bus.add_message_handler(self._on_message)

    def handle(self, interface: str, name: str, handler: Handler) -> None:
        if find_method(interface, name) is None:
            raise RuntimeError(f"{interface}.{name} is not in the interface definition")
        self._handlers[(interface, name)] = handler

    def _on_message(self, message: Message) -> Message | bool | None:
        if message.message_type != MessageType.METHOD_CALL or message.path != ROOT_PATH:
            return None
        if (
            message.interface in (None, "org.freedesktop.DBus.Introspectable")
            and message.member == "Introspect"
        ):
            return Message.new_method_return(message, "s", [introspection_xml(["task"])])
        method = find_method(message.interface, message.member)
        if method is None or (method.interface, method.name) not in self._handlers:
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

    async def _serve(self, message: Message, method: Method) -> None:
        try:
            caller = await self._authorize(message, method)
            result = await self._handlers[(method.interface, method.name)](caller, message.body)
            reply = Message.new_method_return(message, "s", [json.dumps(result)])
        except BoxError as error:
            reply = Message.new_error(message, error.problem.dbus_name, error.message)
        except Exception as error:
            log.exception("%s.%s failed", method.interface, method.name)
            reply = Message.new_error(
                message,
                Problem.FAILED.dbus_name,
                f"boxd failed on {method.name}: {type(error).__name__}: {error}. "
                "journalctl -u boxd tells more.",
            )
        if message.flags.value & 0x1 == 0:  # NO_REPLY_EXPECTED unset
            self._bus.send(reply)
