"""The MCP relay through the real stdio protocol: the official SDK's client (its conformance) or
raw lines (what no good client sends), against a scripted broker on a Unix socket; and against
the real broker app, where keys decide what is paid."""

import asyncio
import json
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from boxd.broker.app import make_broker
from boxd.reading.canonical_json import input_hash
from boxd.wire.approval import MAX_KEY
from boxd.workers.mcp.relay import lines
from boxd.workers.mcp.tools import KEY_TOOL_CHARS, ask_key, call_key
from boxd.workers.unix_http import MAX_ANSWER
from tests.support.app_serving import runners
from tests.support.broker_serving import serving as serving_broker
from tests.support.mcp_relay_fixtures import (
    ECHO_SAY,
    RELAY,
    WALLET_PAY,
    RawRelay,
    ScriptedBroker,
    ok_output,
    sdk_session,
    serving,
)
from tests.support.memory_log import MemoryLog, MemoryWaiter

ADA = {"to": "Ada", "cents": 30}


@pytest.fixture
async def scripted(tmp_path: Path) -> AsyncIterator[tuple[Path, ScriptedBroker]]:
    broker = ScriptedBroker([WALLET_PAY, ECHO_SAY])
    path = tmp_path / "broker.sock"
    async with serving(broker.app(), path):
        yield path, broker


def text_of(result: Any) -> str:
    [content] = result.content
    assert content.type == "text"
    return str(content.text)


# The keys


def test_keys_are_stable_distinct_and_within_the_brokers_cap() -> None:
    assert call_key("wallet__pay", ADA, 0) == f"mcp.wallet__pay.{input_hash(ADA)}.0"
    # Canonical JSON: the order Droid writes the input in does not make another call.
    assert call_key("wallet__pay", {"cents": 30, "to": "Ada"}, 0) == call_key("wallet__pay", ADA, 0)
    assert call_key("wallet__pay", {**ADA, "cents": 31}, 0) != call_key("wallet__pay", ADA, 0)
    assert call_key("wallet__pay", ADA, 1) != call_key("wallet__pay", ADA, 0)
    assert call_key("wallet__refund", ADA, 0) != call_key("wallet__pay", ADA, 0)
    assert ask_key("Send it?") == f"mcp.ask.{input_hash('Send it?')}"
    assert ask_key("Send it?") != ask_key("Send it!")
    # Tool names may be as long as a whole key; two that differ only past the part kept in the
    # key still get keys of their own.
    long_a, long_b = "a" * 198 + "_x", "a" * 198 + "_y"
    keys = {call_key(name, ADA, 2**53) for name in (long_a, long_b)}
    assert len(keys) == 2
    assert all(len(key) <= MAX_KEY for key in keys)
    assert all(len(key.split(".")[1]) == KEY_TOOL_CHARS for key in keys)


# Start-up


def test_the_relay_imports_nothing_heavy() -> None:
    """Droid waits for the relay on every start: aiohttp, pydantic and the MCP SDK each take
    longer to import than the whole relay takes to answer (bench/mcp_relay.py)."""
    probe = (
        "import sys, boxd.workers.mcp.relay; "
        # A package's modules come with the package itself; boxd's stand-in for pydantic's
        # plugin loader (boxd/patches/pydantic.py) is kept under pydantic's name alone.
        "print(sorted(set(sys.modules) & {'aiohttp', 'pydantic', 'mcp'}))"
    )
    shown = subprocess.run([*RELAY[:2], "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout == "[]\n"


# Lines


@pytest.mark.parametrize("chunk", [1, 3, 64 * 1024])
async def test_lines_over_the_cap_are_dropped_as_they_come(chunk: int) -> None:
    stream = asyncio.StreamReader()
    data = b"12345\n123456\n\n1234567890123\nabc\n12345"
    for start in range(0, len(data), chunk):
        stream.feed_data(data[start : start + chunk])
    stream.feed_eof()
    assert [line async for line in lines(stream, cap=5)] == [
        b"12345",
        None,
        b"",
        None,
        b"abc",
        b"12345",
    ]


async def test_a_last_line_over_the_cap_without_a_newline_is_dropped() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(b"ok\n123456")
    stream.feed_eof()
    assert [line async for line in lines(stream, cap=5)] == [b"ok", None]


# The protocol, as the official client speaks it


async def test_the_sdk_client_lists_and_calls_the_tools(
    scripted: tuple[Path, ScriptedBroker], tmp_path: Path
) -> None:
    path, broker = scripted
    async with sdk_session(path, tmp_path / "relay.err") as session:
        await session.send_ping()
        listed = await session.list_tools()
        assert [tool.name for tool in listed.tools] == ["box_ask", "wallet__pay", "echo__say"]
        pay = listed.tools[1]
        assert pay.description == WALLET_PAY["description"]
        assert pay.input_schema == WALLET_PAY["input"]
        result = await session.call_tool("wallet__pay", ADA)
    assert result.is_error is False
    key = f"mcp.wallet__pay.{input_hash(ADA)}.0"
    assert json.loads(text_of(result)) == {"paid": ADA, "key": key}
    assert broker.requests == [("/call", {"tool": "wallet.pay", "input": ADA, "key": key})]


async def test_the_sdks_default_client_falls_back_to_the_handshake(
    scripted: tuple[Path, ScriptedBroker],
) -> None:
    """A newer client first probes `server/discover` (2026-07-28); -32601 tells it this server
    speaks the initialize handshake."""
    path, _ = scripted
    server = StdioServerParameters(command=RELAY[0], args=RELAY[1:], env={"BOX_SOCKET": str(path)})
    async with Client(server) as client:
        assert client.session.initialize_result is not None
        assert client.session.initialize_result.protocol_version == "2025-11-25"
        listed = await client.list_tools()
    assert [tool.name for tool in listed.tools] == ["box_ask", "wallet__pay", "echo__say"]


async def test_a_final_answer_counts_and_a_pending_one_keeps_the_key(
    scripted: tuple[Path, ScriptedBroker], tmp_path: Path
) -> None:
    path, broker = scripted
    waiting = {"ok": False, "pending": True, "error": "Waiting for the box owner."}
    async with sdk_session(path, tmp_path / "relay.err") as session:
        broker.answer = lambda path, body: web.json_response(waiting)
        first = await session.call_tool("wallet__pay", ADA)
        again = await session.call_tool("wallet__pay", ADA)
        assert first.is_error is False and again.is_error is False
        assert text_of(first).startswith("Waiting for the box owner. This is not an error: call ")
        assert "wallet__pay again with exactly the same input" in text_of(first)
        broker.answer = lambda path, body: web.json_response({"ok": True, "output": "paid"})
        paid = await session.call_tool("wallet__pay", ADA)
        assert text_of(paid) == "paid"
        # A second identical payment, meant: a new key.
        await session.call_tool("wallet__pay", ADA)
        # Another input has a count of its own.
        await session.call_tool("wallet__pay", {**ADA, "cents": 31})
    hashed = input_hash(ADA)
    assert broker.keys() == [
        f"mcp.wallet__pay.{hashed}.0",
        f"mcp.wallet__pay.{hashed}.0",
        f"mcp.wallet__pay.{hashed}.0",
        f"mcp.wallet__pay.{hashed}.1",
        f"mcp.wallet__pay.{input_hash({**ADA, 'cents': 31})}.0",
    ]
    # Started again (Droid resumed), the relay counts from 0: the same call is the same key.
    async with sdk_session(path, tmp_path / "relay.err") as session:
        await session.call_tool("wallet__pay", ADA)
    assert broker.keys()[-1] == f"mcp.wallet__pay.{hashed}.0"


async def test_a_tool_error_is_an_error_and_counts_a_refusal_does_not(
    scripted: tuple[Path, ScriptedBroker], tmp_path: Path
) -> None:
    path, broker = scripted
    async with sdk_session(path, tmp_path / "relay.err") as session:
        broker.answer = lambda path, body: web.json_response(
            {"error": "input.cents must be a whole number"}, status=400
        )
        refused = await session.call_tool("wallet__pay", ADA)
        assert refused.is_error is True
        assert text_of(refused) == "input.cents must be a whole number"
        broker.answer = lambda path, body: web.json_response(
            {"ok": False, "error": "the card was declined"}
        )
        failed = await session.call_tool("wallet__pay", ADA)
        assert failed.is_error is True
        assert text_of(failed) == "the card was declined"
        await session.call_tool("wallet__pay", ADA)
    hashed = input_hash(ADA)
    assert broker.keys() == [f"mcp.wallet__pay.{hashed}.{n}" for n in (0, 0, 1)]


async def test_box_ask_answers_in_sentences(
    scripted: tuple[Path, ScriptedBroker], tmp_path: Path
) -> None:
    path, broker = scripted
    answers = iter([{"pending": True}, {"approved": True}, {"approved": False}])
    broker.answer = lambda path, body: web.json_response(next(answers))
    async with sdk_session(path, tmp_path / "relay.err") as session:
        texts = [
            text_of(await session.call_tool("box_ask", {"question": "Send it?"})) for _ in range(3)
        ]
        missing = await session.call_tool("box_ask", {})
    assert texts == [
        "The box owner has not answered yet. Call box_ask again with the same question to keep "
        "waiting for the answer.",
        "Approved: the box owner said yes.",
        "Not approved: the box owner said no.",
    ]
    assert missing.is_error is True
    assert text_of(missing) == "box_ask needs question, a string: the question for the box owner"
    assert broker.requests == [("/ask", {"question": "Send it?", "key": ask_key("Send it?")})] * 3


async def test_an_unknown_tool_is_refused_by_name(
    scripted: tuple[Path, ScriptedBroker], tmp_path: Path
) -> None:
    path, broker = scripted
    async with sdk_session(path, tmp_path / "relay.err") as session:
        with pytest.raises(MCPError, match="there is no tool mail__send; this task's tools are "):
            await session.call_tool("mail__send", {"to": "x"})
    assert broker.requests == []


async def test_an_answer_over_the_cap_is_refused_and_the_relay_goes_on(
    scripted: tuple[Path, ScriptedBroker], tmp_path: Path
) -> None:
    path, broker = scripted
    huge = b'{"ok": true, "output": "' + b"x" * MAX_ANSWER + b'"}'
    broker.answer = lambda path, body: web.Response(body=huge, content_type="application/json")
    async with sdk_session(path, tmp_path / "relay.err") as session:
        result = await session.call_tool("echo__say", {"text": "hi"})
        assert result.is_error is True
        assert text_of(result) == f"the broker's answer is over {MAX_ANSWER:,} bytes"
        await session.send_ping()


# What no good client sends


async def test_malformed_messages_get_plain_errors_and_the_relay_goes_on(
    scripted: tuple[Path, ScriptedBroker],
) -> None:
    path, broker = scripted
    async with RawRelay.start(path) as relay:
        await relay.write(b"{not json\n")
        assert (await relay.receive())["error"]["code"] == -32700
        await relay.write(b"[]\n")
        assert (await relay.receive())["error"] == {
            "code": -32600,
            "message": "batches are not supported: send one message a line",
        }
        await relay.write(b'{"id": 7, "method": "ping"}\n')
        assert (await relay.receive())["id"] == 7
        unknown = await relay.request("resources/list")
        assert unknown["error"] == {
            "code": -32601,
            "message": "no method resources/list: this server answers initialize, ping, "
            "tools/list and tools/call",
        }
        not_object = await relay.request("tools/call", {"name": "echo__say", "arguments": [1]})
        assert not_object["error"] == {
            "code": -32602,
            "message": "the arguments of echo__say must be a JSON object",
        }
        # A notification gets no answer: the next line out is the ping's.
        await relay.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert (await relay.request("ping"))["result"] == {}
    assert broker.requests == []


async def test_a_line_over_the_cap_is_refused_without_dying(
    scripted: tuple[Path, ScriptedBroker],
) -> None:
    path, _ = scripted
    async with RawRelay.start(path) as relay:
        await relay.write(b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": "')
        for _ in range(17):
            await relay.write(b"x" * (1024 * 1024))
        await relay.write(b'"}\n')
        refused = await relay.receive()
        assert refused == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": -32700,
                "message": "the message is over 16 MiB; this server reads at most 16 MiB a "
                "line, and skipped it",
            },
        }
        assert (await relay.request("ping"))["result"] == {}


@pytest.mark.parametrize(
    ("asked", "answered"),
    [("2025-11-25", "2025-11-25"), ("2025-06-18", "2025-06-18"), ("2099-01-01", "2025-11-25")],
)
async def test_initialize_answers_the_clients_version_when_it_can(
    scripted: tuple[Path, ScriptedBroker], asked: str, answered: str
) -> None:
    path, _ = scripted
    async with RawRelay.start(path) as relay:
        params = {"protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t"}}
        result = (await relay.request("initialize", params))["result"]
    assert result["protocolVersion"] == answered
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["serverInfo"]["name"] == "box"


async def test_a_broker_away_for_a_moment_is_asked_again(tmp_path: Path) -> None:
    """Refused while systemd starts the broker again: the call waits for it, with its key."""
    path = tmp_path / "broker.sock"
    down = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    down.bind(str(path))  # bound and not listening: connections are refused
    broker = ScriptedBroker([WALLET_PAY])
    runner = web.AppRunner(broker.app())
    await runner.setup()
    try:
        async with RawRelay.start(path) as relay:
            params = {"name": "box_ask", "arguments": {"question": "Go?"}}
            await relay.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
            logged = await relay.stderr_line("trying again")
            assert "the broker did not answer POST /ask" in logged
            await web.SockSite(runner, down).start()
            answer = await relay.receive()
        assert answer["result"]["content"][0]["text"] == "Approved: the box owner said yes."
        assert broker.keys("/ask") == [ask_key("Go?")]
    finally:
        await runner.cleanup()
        down.close()


async def test_a_broker_that_stays_away_is_an_error_in_words(tmp_path: Path) -> None:
    async with RawRelay.start(tmp_path / "nothing.sock", patience_ms=2000) as relay:
        await relay.request("ping")
        listing = asyncio.create_task(relay.request("tools/list"))
        answer = await listing
    assert answer["error"]["code"] == -32603
    assert answer["error"]["message"].startswith(
        f"the box's tools could not be listed: the box's broker did not answer at "
        f"{tmp_path / 'nothing.sock'} for 2 s"
    )


async def test_a_full_disk_is_waited_out_with_the_same_key(
    scripted: tuple[Path, ScriptedBroker],
) -> None:
    """A 507 did nothing: the relay asks again, with the same key, once there is room, rather
    than tell Droid its tool failed (the fake worker's steps wait the same way)."""
    path, broker = scripted
    full = 2

    def full_then_ok(asked: str, body: dict[str, Any]) -> web.StreamResponse:
        nonlocal full
        if full:
            full -= 1
            return web.json_response({"error": "The box's disk is full."}, status=507)
        return ok_output(asked, body)

    broker.answer = full_then_ok
    async with RawRelay.start(path) as relay:
        params = {"name": "wallet__pay", "arguments": ADA}
        await relay.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
        logged = await relay.stderr_line("Waiting for room")
        assert "POST /call: The box's disk is full." in logged
        answer = await relay.receive()
    assert answer["result"]["isError"] is False, answer
    assert len(set(broker.keys())) == 1 and len(broker.keys()) == 3


# Against the real broker: what the keys mean for what is paid


@pytest.fixture
async def real_broker(tmp_path: Path) -> AsyncIterator[tuple[Path, MemoryLog]]:
    log = MemoryLog("", tools=("wallet.pay", "wallet.balance"), budget=100)
    path = tmp_path / "broker.sock"
    async with runners(tmp_path) as apps:
        broker = make_broker(log, MemoryWaiter(log), log.task, apps, wait_seconds=0.3)
        async with serving_broker(broker, path):
            yield path, log


async def test_pays_twice_when_meant_and_once_after_a_restart(
    real_broker: tuple[Path, MemoryLog], tmp_path: Path
) -> None:
    path, log = real_broker
    async with sdk_session(path, tmp_path / "relay.err") as session:
        first = await session.call_tool("wallet__pay", ADA)
        second = await session.call_tool("wallet__pay", ADA)
    async with sdk_session(path, tmp_path / "relay.err") as session:
        resumed = await session.call_tool("wallet__pay", ADA)
        balance = await session.call_tool("wallet__balance", {})
    hashed = input_hash(ADA)
    assert json.loads(text_of(first))["booking"] == f"mcp.wallet__pay.{hashed}.0"
    assert json.loads(text_of(second))["booking"] == f"mcp.wallet__pay.{hashed}.1"
    assert text_of(resumed) == text_of(first)
    assert json.loads(text_of(balance)) == {"paidCents": 60, "payments": 2}
    assert log.spent == 60


async def test_an_approval_waited_for_across_pending_answers(
    real_broker: tuple[Path, MemoryLog], tmp_path: Path
) -> None:
    path, log = real_broker
    big = {"to": "Bob", "cents": 150}
    key = f"mcp.wallet__pay.{input_hash(big)}.0"
    async with sdk_session(path, tmp_path / "relay.err") as session:
        for _ in range(2):
            waiting = await session.call_tool("wallet__pay", big)
            assert waiting.is_error is False
            assert "call wallet__pay again with exactly the same input" in text_of(waiting)
        assert list(log.approvals) == [f"t000000001.{key}"]
        log.decide(f"t000000001.{key}", "approved")
        paid = await session.call_tool("wallet__pay", big)
        asked = await session.call_tool("box_ask", {"question": "Shall I go on?"})
        log.decide(f"t000000001.{ask_key('Shall I go on?')}", "denied")
        denied = await session.call_tool("box_ask", {"question": "Shall I go on?"})
    assert json.loads(text_of(paid))["booking"] == key
    assert text_of(asked).startswith("The box owner has not answered yet.")
    assert text_of(denied) == "Not approved: the box owner said no."
    assert log.spent == 150
