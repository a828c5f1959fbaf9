"""The owner's screen as files: served from the wheel with a policy that lets no other origin's
code in, never from a path a request names, and built so task text can never become HTML."""

import re
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.dbus.client import GatewayClient
from boxd.web.app import make_app
from boxd.wire.models.task_request import Worker

SCREEN = resources.files("boxd.web").joinpath("screen")


def _texts() -> dict[str, str]:
    return {entry.name: entry.read_text() for entry in SCREEN.iterdir() if entry.is_file()}


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    # The page's files need no manager: a client that is never called stands for the bus.
    app = make_app(client=object.__new__(GatewayClient))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_the_page_is_at_the_root_with_a_strict_policy(
    client: TestClient[Any, Any],
) -> None:
    answer = await client.get("/")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/html")
    policy = answer.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert "<main" in await answer.text()


async def test_every_file_the_page_names_is_served_with_its_type(
    client: TestClient[Any, Any],
) -> None:
    named = set()
    for text in _texts().values():
        named |= set(re.findall(r"""(?:src|href)="(/screen/[^"]+)\"""", text))
        named |= {f"/screen/{m}" for m in re.findall(r"""from "\./([^"]+)\"""", text)}
    assert "/screen/main.js" in named and "/screen/tasks.js" in named
    for path in named:
        answer = await client.get(path)
        assert answer.status == 200, path
        if path.endswith(".js"):
            assert answer.headers["Content-Type"].startswith("text/javascript")


@pytest.mark.parametrize(
    "path",
    ["/screen/nothing.js", "/screen/..%2fapp.py", "/screen/%2e%2e/screen_page.py", "/screen/"],
)
async def test_no_path_from_a_request_reaches_the_file_system(
    client: TestClient[Any, Any], path: str
) -> None:
    answer = await client.get(path)
    assert answer.status == 404
    assert "error" in await answer.json()


def test_task_text_never_becomes_html() -> None:
    """Titles, steps, file names and diffs are written by tasks: the page only makes text
    nodes of them."""
    for name, text in _texts().items():
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, f"{name} uses {sink}"


def test_nothing_is_fetched_from_elsewhere() -> None:
    for name, text in _texts().items():
        for url in re.findall(r"https?://[^\s\"'<>)]+", text):
            assert url.startswith("http://www.w3.org/"), f"{name} names {url}"


def test_the_new_task_form_offers_every_worker_the_box_runs() -> None:
    """The form's list is written in start.js; the API's Worker is the one list it must match."""
    start = _texts()["start.js"]
    select = re.search(r'h\("select", \{ name: "worker" \}(.*?)\);', start)
    assert select is not None
    offered = re.findall(r'h\("option", \{ value: "([a-z]+)" \}', select.group(1))
    assert sorted(offered) == sorted(worker.value for worker in Worker)
