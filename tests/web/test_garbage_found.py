"""What the fuzzing (tests/test_fuzz_*.py) found, each kept as a plain test that stays.

- A NUL character or a lone surrogate in a path parameter or a field the gateway passes on
  (`PUT /api/vault/{name}` {"value": "a\\u0000b"}, `POST /api/approvals/%00`) made dbus-fast raise
  while marshalling the call: a 500. Refused in words naming the argument (boxd/dbus/client.py).
- A request line over 8190 bytes (a long task id) got aiohttp's own text/plain 400 with the
  parser's insides ("bytearray(b'/aaa...')"), not {"error": "..."} (boxd/doors/http_refusals.py).
- A body that is not in the Content-Encoding it names (gzip, deflate) raised while it was read:
  a 500. A 400 in words now, and the connection closes, its rest unread (boxd/doors/json_errors.py).
- A key given twice in a JSON object was read as its last value:
  tests/reading/test_strict_json.py."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from boxd.broker.app import make_broker
from boxd.broker.app_link import Apps
from boxd.dbus.client import GatewayClient
from boxd.doors.json_errors import json_errors
from boxd.web.app import make_app as make_gateway
from tests.support.broker_serving import serving as serving_broker
from tests.support.manager_on_the_bus import OWNER, ManagerOnTheBus
from tests.support.memory_log import MemoryLog, MemoryWaiter

HEADERS = {"Authorization": f"Bearer {OWNER}"}


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    app: web.Application = make_gateway(GatewayClient(ManagerOnTheBus()))  # type: ignore[arg-type]
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        yield session, str(server.make_url("")).rstrip("/")


async def _ask(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with session.request(
        method, URL(url, encoded=True), json=body, headers=HEADERS
    ) as answer:
        assert answer.content_type == "application/json"
        return answer.status, await answer.json()


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("PUT", "/api/vault/GITHUB_TOKEN", {"value": "a\u0000b"}, "value holds a NUL character"),
        ("POST", "/api/approvals/%00", {"approved": True}, "id holds a NUL character"),
        ("GET", "/api/tasks/t%00", None, "id holds a NUL character"),
        ("POST", "/api/pairings", {"name": "ph\u0000one"}, "name holds a NUL character"),
    ],
)
async def test_what_d_bus_cannot_carry_is_a_400_in_words(
    gateway: tuple[aiohttp.ClientSession, str], method: str, path: str, body: Any, words: str
) -> None:
    session, root = gateway
    status, answer = await _ask(session, method, root + path, body)
    assert status in (400, 404), answer
    assert answer["error"].startswith(words), answer


LONG_LINE = "the request's address or one of its headers is over 8190 bytes: send a shorter one"


async def test_a_request_line_too_long_is_refused_in_the_api_s_shape(
    gateway: tuple[aiohttp.ClientSession, str], tmp_path: Path
) -> None:
    session, root = gateway
    assert await _ask(session, "GET", f"{root}/api/tasks/{'a' * 10_000}") == (
        400,
        {"error": LONG_LINE},
    )
    log = MemoryLog("")
    served = make_broker(log, MemoryWaiter(log), log.task, Apps(tmp_path), 0.01)
    async with serving_broker(served, tmp_path / "broker.sock"):
        connector = aiohttp.UnixConnector(path=str(tmp_path / "broker.sock"))
        async with aiohttp.ClientSession(connector=connector) as broker:
            assert await _ask(broker, "GET", f"http://box/{'a' * 10_000}") == (
                400,
                {"error": LONG_LINE},
            )
            assert (await _ask(broker, "GET", "http://box/task"))[0] == 200


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
async def test_a_body_not_in_its_content_encoding_is_a_400_in_words(
    gateway: tuple[aiohttp.ClientSession, str], encoding: str
) -> None:
    session, root = gateway
    headers = {**HEADERS, "Content-Encoding": encoding, "Content-Type": "application/json"}
    async with session.post(f"{root}/api/tasks", data=b"not so", headers=headers) as answer:
        assert answer.status == 400
        assert await answer.json() == {
            "error": "the body cannot be decompressed as its Content-Encoding says: "
            "send it as it is"
        }
    async with session.get(f"{root}/api/pause", headers=HEADERS) as answer:
        assert answer.status == 200


@pytest.mark.parametrize("encoding", ["br", "gzip"])
async def test_a_body_that_cannot_be_read_leaves_no_traceback_in_the_log(
    gateway: tuple[aiohttp.ClientSession, str], caplog: pytest.LogCaptureFixture, encoding: str
) -> None:
    session, root = gateway
    headers = {**HEADERS, "Content-Encoding": encoding}
    async with session.post(f"{root}/api/tasks", data=b"x" * 100, headers=headers) as answer:
        assert answer.status == 400
    async with session.get(f"{root}/api/pause", headers=HEADERS) as answer:
        assert answer.status == 200
    assert [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"] == []


@pytest.mark.parametrize(("method", "path"), [("GET", "/api/tasks"), ("POST", "/api/pause")])
async def test_a_body_a_route_does_not_read_leaves_no_traceback_in_the_log(
    gateway: tuple[aiohttp.ClientSession, str],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
) -> None:
    session, root = gateway
    headers = {**HEADERS, "Content-Encoding": "gzip"}
    async with session.request(method, root + path, data=b"x" * 100, headers=headers) as answer:
        assert answer.status == 200
        await answer.read()
    async with session.get(f"{root}/api/pause", headers=HEADERS) as answer:
        assert answer.status == 200
    assert [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"] == []


async def test_an_answer_cut_off_mid_way_leaves_no_traceback_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A long answer written page by page (GET /task, boxd.doors.json_pages) whose connection breaks
    once it has begun: the client hung up, or the answer was cut off on purpose. No fault of the
    server's, yet aiohttp logged each as "Error handling request" with a traceback, which the VM
    fuzz (tests/vm/test_fuzz.py) found in a broker's journal."""

    async def long_answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'{"steps": [')
        raise ConnectionResetError("the answer was cut off: the manager went away")

    app = web.Application(middlewares=[json_errors(lambda failure: 400, "GET /")])
    app.router.add_get("/", long_answer)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientPayloadError):
            async with session.get(server.make_url("/")) as answer:
                await answer.read()
    assert [r for r in caplog.records if r.exc_info or r.levelname == "ERROR"] == []
