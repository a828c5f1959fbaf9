"""Calls the manager: used by the gateway (with a bearer token), the broker and boxctl."""

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

from boxd.dbus.incoming_fds import guard, guarded
from boxd.dbus.interface import BUS_NAME, GATEWAY, ROOT_PATH, Method, bound_on
from boxd.errors import BoxError, Problem, die
from boxd.patches.dbus_fast import patient


async def connect_system_bus(fds: bool = False) -> MessageBus:
    """A connection to the system bus; with `fds`, one that passes file descriptors both ways,
    every incoming one guarded (boxd.dbus.incoming_fds). Only a process that calls a method
    passing one asks for that: a broker's connection does not, so none can be sent to it."""
    try:
        bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=fds).connect()
    except (OSError, ValueError) as error:
        die(Problem.FAILED, f"cannot reach the system bus: {error}")
    return patient(guarded(bus) if fds else bus)


def _check_carriable(names: tuple[str, ...], args: tuple[Any, ...]) -> None:
    """D-Bus carries text as UTF-8 without NUL; dbus-fast raises on anything else, which the
    caller would meet as a 500. Refused here instead, naming the argument."""
    for name, arg in zip(names, args, strict=False):
        if not isinstance(arg, str):
            continue
        if "\x00" in arg:
            die(Problem.INVALID, f"{name} holds a NUL character (\\u0000), which boxd cannot take")
        try:
            arg.encode()
        except UnicodeEncodeError:
            die(Problem.INVALID, f"{name} holds a lone surrogate, so it is not UTF-8 text")


class BoxClient:
    """One method call per manager method, on the interface it is made for (boxctl's on
    MANAGER, the broker's on BROKER); errors come back as BoxError with their problem."""

    def __init__(self, bus: MessageBus, interface: str) -> None:
        self.bus = bus
        self.interface = interface

    def _message(self, method: Method, args: tuple[Any, ...], fds: list[int]) -> Message:
        bound = bound_on(self.interface, method)
        _check_carriable(bound.names, args)
        return Message(
            destination=BUS_NAME,
            path=ROOT_PATH,
            interface=self.interface,
            member=method.name,
            signature=bound.signature,
            body=[*args, 0] if method.takes_fd else list(args),
            unix_fds=fds,
        )

    async def call(self, method: Method, *args: Any) -> Any:
        """The method's JSON answer."""
        if method.takes_fd:
            raise RuntimeError(f"{method.name} takes a descriptor: call_with_fd")
        return await self._call(method, args, [])

    async def call_with_fd(self, method: Method, fd: int, *args: Any) -> Any:
        """The JSON answer of a method declared `takes_fd`, given `fd` after `args`; the
        descriptor stays the caller's to close."""
        if not method.takes_fd:
            raise RuntimeError(f"{method.name} takes no descriptor")
        return await self._call(method, args, [fd])

    async def _call(self, method: Method, args: tuple[Any, ...], fds: list[int]) -> Any:
        if method.passes_fd:
            raise RuntimeError(f"{method.name} answers with a descriptor: call_for_fd")
        message = self._message(method, args, fds)
        reply = _answered(await self.bus.call(message))
        return json.loads(reply.body[0])

    async def call_for_fd(self, method: Method, *args: Any) -> tuple[Any, int]:
        """The JSON answer and the descriptor of a method declared `passes_fd`; the descriptor
        is the caller's to close. Cancelled, or given an answer it cannot read, it closes the
        descriptor itself, one that comes later included."""
        if not method.passes_fd:
            raise RuntimeError(f"{method.name} does not answer with a descriptor")
        message = self._message(method, args, [])
        message.serial = self.bus.next_serial()
        with guard(self.bus).awaiting(message.serial) as awaited:
            reply = _answered(await self.bus.call(message))
            try:
                fd = awaited.take(reply.body[0])
            except (IndexError, TypeError):
                die(Problem.FAILED, f"boxd answered {method.name} without a file descriptor")
            try:
                return json.loads(reply.body[1]), fd
            except (IndexError, TypeError, ValueError):
                os.close(fd)
                die(Problem.FAILED, f"boxd answered {method.name} with something not JSON")


class GatewayClient(BoxClient):
    """The gateway's calls carry the HTTP bearer token; the manager decides what it allows."""

    def __init__(self, bus: MessageBus) -> None:
        super().__init__(bus, GATEWAY)

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        return await self.call(method, token, *args)

    async def call_with_fd_as(self, token: str, method: Method, fd: int, *args: Any) -> Any:
        return await self.call_with_fd(method, fd, token, *args)

    async def call_for_fd_as(self, token: str, method: Method, *args: Any) -> tuple[Any, int]:
        return await self.call_for_fd(method, token, *args)


def _answered(reply: Message | None) -> Message:
    if reply is None:
        die(Problem.FAILED, "boxd gave no answer")
    if reply.message_type == MessageType.ERROR:
        raise error_from_reply(reply.error_name or "", reply.body)
    return reply


async def pages(ask: Callable[[str], Awaitable[Any]]) -> AsyncIterator[dict[str, Any]]:
    """Every page of a long answer (GetTask, ListTasks, ListApprovals), in order."""
    page = ""
    while True:
        answer = await ask(page)
        if not isinstance(answer, dict):
            die(Problem.FAILED, "boxd answered a page with something that is not a page")
        yield answer
        following = answer.get("next")
        if not isinstance(following, str) or not following:
            return
        page = following


async def whole(ask: Callable[[str], Awaitable[Any]], key: str) -> dict[str, Any]:
    """All pages put together: the first page's fields, with `key` holding every page's items."""
    answer: dict[str, Any] | None = None
    async for page in pages(ask):
        if answer is None:
            answer = {**page, key: list(page.get(key, []))}
        else:
            answer[key].extend(page.get(key, []))
    assert answer is not None
    answer.pop("next", None)
    return answer


def error_from_reply(name: str, body: list[Any]) -> BoxError:
    text = body[0] if body and isinstance(body[0], str) else name
    problem = Problem.from_dbus_name(name)
    if problem is not None:
        return BoxError(problem, text)
    if name in (
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoReply",
    ):
        return BoxError(
            Problem.UNAVAILABLE, "boxd is not running (no one owns org.boxd.Box1 on the system bus)"
        )
    if name == "org.freedesktop.DBus.Error.AccessDenied":
        return BoxError(Problem.FORBIDDEN, f"the system bus refused the call: {text}")
    return BoxError(Problem.FAILED, f"{name}: {text}")
