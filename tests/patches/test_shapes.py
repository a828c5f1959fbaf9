"""The patched libraries still have the shape boxd's patches were written for (boxd/patches/).

Each patch replaces or relies on another project's private names: dbus-fast's message writer,
pydantic's plugin loader, asyncio's `ssl` globals, aiohttp's request handler. A release that
renames, moves or calls them otherwise would leave a patch doing nothing, or the wrong thing,
with no error of its own; these tests fail first, and each failure names the patch to revisit.
What each patch does is tested beside it in tests/patches/ (test_patient_writes.py,
test_gathered_writes.py, test_pydantic_plugins.py, test_late_ssl.py) and in
tests/web/test_garbage_found.py; here only what it relies on.
"""

import ast
import asyncio
import inspect
import re
import socket
from collections import deque
from importlib.util import find_spec, module_from_spec, spec_from_file_location
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from dbus_fast import Message
from dbus_fast.aio import MessageBus, message_bus

from tests.support.dbus_daemon import bus_address

__all__ = ["bus_address"]

DBUS_FAST = "dbus-fast changed: revisit boxd/patches/dbus_fast.py ({})"
PYDANTIC = "pydantic changed its plugin loader: revisit boxd/patches/pydantic.py ({})"
ASYNCIO = "asyncio changed how it takes ssl: revisit boxd/patches/asyncio.py ({})"
AIOHTTP = "aiohttp changed its request handler: revisit boxd/doors/http_refusals.py ({})"


def _parameters(function: Any) -> list[tuple[str, Any]]:
    return [
        (name, parameter.default)
        for name, parameter in inspect.signature(function).parameters.items()
    ]


# dbus-fast: patient() swaps the writer's socket, gathered() its schedule_write.


async def test_a_connected_bus_has_the_writer_both_dbus_fast_patches_take_over(
    bus_address: str,
) -> None:
    bus = await MessageBus(bus_address=bus_address).connect()
    try:
        writer = getattr(bus, "_writer", None)
        assert isinstance(writer, message_bus._MessageWriter), DBUS_FAST.format(
            "MessageBus._writer is no _MessageWriter"
        )
        assert isinstance(writer.sock, socket.socket), DBUS_FAST.format("patient: writer.sock")
        assert isinstance(writer.messages, deque), DBUS_FAST.format("gathered: writer.messages")
        for name in ("loop", "fd", "negotiate_unix_fd", "buf"):
            assert hasattr(writer, name), DBUS_FAST.format(f"gathered: writer.{name}")
        assert writer.loop is asyncio.get_running_loop(), DBUS_FAST.format("gathered: loop")
        assert writer.buf is None, DBUS_FAST.format("gathered: writer.buf once Hello is done")
        assert bus.unique_name, DBUS_FAST.format("gathered: bus.unique_name")
        assert bus._user_disconnect is False, DBUS_FAST.format("gathered: bus._user_disconnect")
        assert _parameters(bus._finalize) == [("err", None)], DBUS_FAST.format(
            "gathered: bus._finalize(error)"
        )

        # MessageBus.send hands every message to its writer's schedule_write, which
        # gathered() replaces: a send that went another way would skip the gathering.
        called: list[tuple[Any, Any]] = []
        writer.schedule_write = lambda msg=None, future=None: called.append((msg, future))  # type: ignore[method-assign]
        message = Message.new_signal("/o", "org.t.T", "Said", "s", ["hi"])
        future = bus.send(message)
        assert called == [(message, future)], DBUS_FAST.format(
            "gathered: MessageBus.send calls writer.schedule_write(msg, future)"
        )
    finally:
        bus.disconnect()


def test_dbus_fast_s_writer_methods_take_what_the_patches_give_them() -> None:
    writer = message_bus._MessageWriter
    assert _parameters(writer.schedule_write) == [
        ("self", inspect.Parameter.empty),
        ("msg", None),
        ("future", None),
    ], DBUS_FAST.format("gathered: schedule_write(msg=None, future=None)")
    assert _parameters(writer.buffer_message) == [
        ("self", inspect.Parameter.empty),
        ("msg", inspect.Parameter.empty),
        ("future", None),
    ], DBUS_FAST.format("gathered: buffer_message(msg, future=None)")
    assert _parameters(writer.write_callback) == [
        ("self", inspect.Parameter.empty),
        ("remove_writer", True),
    ], DBUS_FAST.format("gathered: write_callback()")


class _FullSocket:
    """A socket that takes nothing, as PatientSocket reads a full one."""

    def send(self, data: Any) -> int:
        return 0


async def test_dbus_fast_s_writer_waits_on_a_socket_that_took_nothing() -> None:
    finalized: list[Exception | None] = []
    added: list[int] = []
    bus = SimpleNamespace(
        _negotiate_unix_fd=False,
        _sock=_FullSocket(),
        _loop=SimpleNamespace(add_writer=lambda fd, _: added.append(fd)),
        _fd=7,
        _user_disconnect=False,
        _finalize=finalized.append,
        unique_name=":1.1",
    )
    writer = message_bus._MessageWriter(bus)  # type: ignore[arg-type]
    writer.schedule_write(Message.new_signal("/o", "org.t.T", "Said", "s", ["hi"]))
    assert finalized == [], DBUS_FAST.format("patient: 0 bytes sent is no broken connection")
    assert writer.buf is not None and writer.offset == 0, DBUS_FAST.format(
        "patient: a message the socket did not take waits"
    )
    assert added == [7], DBUS_FAST.format("patient: the writer waits for the socket")
    writer.buffer_message(Message.new_signal("/o", "org.t.T", "Said", "s", ["again"]))
    queued = writer.messages[0]
    assert isinstance(queued[0], bytearray) and queued[1:] == (None, None), DBUS_FAST.format(
        "gathered: writer.messages holds (bytes, fds, future)"
    )


# pydantic: boxd/__init__.py puts boxd.patches.pydantic where pydantic's plugin loader would be.


def test_pydantic_takes_from_its_plugin_loader_only_what_boxd_s_stands_in_for() -> None:
    from boxd.patches import pydantic as no_plugins_loader

    plugin = find_spec("pydantic.plugin")
    assert plugin is not None and plugin.submodule_search_locations is not None
    folder = Path(next(iter(plugin.submodule_search_locations)))
    assert (folder / "_loader.py").is_file(), PYDANTIC.format("pydantic/plugin/_loader.py")
    users = [
        path.name
        for path in folder.parent.rglob("*.py")
        if "_loader" in path.read_text(encoding="utf-8")
    ]
    assert users == ["_schema_validator.py"], PYDANTIC.format(f"its loader is used by {users}")
    source = (folder / "_schema_validator.py").read_text(encoding="utf-8")
    assert re.findall(r".*\b_loader\b.*", source) == ["    from ._loader import get_plugins"], (
        PYDANTIC.format("what is taken from the loader")
    )
    assert re.findall(r"\bget_plugins\(.*", source) == ["get_plugins()"], PYDANTIC.format(
        "how get_plugins is called"
    )

    spec = spec_from_file_location("pydantic_s_own_loader", folder / "_loader.py")
    assert spec is not None and spec.loader is not None
    own = module_from_spec(spec)
    spec.loader.exec_module(own)
    # Both are called with nothing, and answer an iterable of plugins.
    assert not inspect.signature(own.get_plugins).parameters, PYDANTIC.format("get_plugins()")
    assert not inspect.signature(no_plugins_loader.get_plugins).parameters
    assert list(no_plugins_loader.get_plugins()) == []


# asyncio: its modules that take ssl as they are imported, and what they set from it.


def _takes_ssl(tree: ast.Module) -> tuple[bool, set[str]]:
    """Whether a module imports ssl at its top in a try that sets `ssl = None` when it fails,
    and the names it sets under `if ssl is not None:` at its top."""
    guarded = False
    derived: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Try):
            imports = [
                alias.name
                for node in statement.body
                if isinstance(node, ast.Import)
                for alias in node.names
            ]
            nulled = any(
                isinstance(node, ast.Assign)
                and [ast.unparse(target) for target in node.targets] == ["ssl"]
                and ast.unparse(node.value) == "None"
                for handler in statement.handlers
                for node in handler.body
            )
            guarded = guarded or ("ssl" in imports and nulled)
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "ssl is not None":
            for node in ast.walk(statement):
                if isinstance(node, ast.Assign):
                    derived.update(ast.unparse(target) for target in node.targets)
    return guarded, derived


def test_asyncio_s_modules_take_ssl_where_the_patch_hands_it_to_them() -> None:
    folder = Path(asyncio.__file__).parent
    taking: dict[str, set[str]] = {}
    for path in sorted(folder.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        if not re.search(r"^\s*import ssl\b", source, re.MULTILINE):
            continue
        guarded, derived = _takes_ssl(ast.parse(source))
        assert guarded, ASYNCIO.format(f"asyncio.{path.stem} imports ssl with no fallback")
        taking[path.stem] = derived
    assert taking == {
        "base_events": set(),
        "selector_events": set(),
        "sslproto": {"SSLAgainErrors"},
    }, ASYNCIO.format(f"the modules that take ssl, and what they set from it: {taking}")
    from asyncio import sslproto

    assert "__init__" in vars(sslproto.SSLProtocol), ASYNCIO.format("SSLProtocol.__init__")


# aiohttp: boxd/doors/http_refusals.py wraps RequestHandler.handle_error.


def test_aiohttp_calls_the_request_handler_s_handle_error_as_boxd_wraps_it() -> None:
    from aiohttp import web_protocol
    from aiohttp.http_writer import StreamWriter

    assert _parameters(web_protocol.RequestHandler.handle_error) == [
        ("self", inspect.Parameter.empty),
        ("request", inspect.Parameter.empty),
        ("status", 500),
        ("exc", None),
        ("message", None),
    ], AIOHTTP.format("handle_error(request, status, exc, message)")
    source = Path(web_protocol.__file__).read_text(encoding="utf-8")
    calls = re.findall(r"self\.handle_error\(\s*([^)]*)\)", source)
    assert calls, AIOHTTP.format("it calls handle_error no more")
    for arguments in calls:
        assert "=" not in arguments, AIOHTTP.format(f"handle_error({arguments}) by keyword")
    loop = asyncio.new_event_loop()
    try:
        writer = StreamWriter(SimpleNamespace(), loop)  # type: ignore[arg-type]
        assert writer.output_size == 0, AIOHTTP.format("request.writer.output_size")
    finally:
        loop.close()
