"""The owner's doors on the gateway (settings, vault, pairing, removing a workspace), as an
attacker would try them: an owner's, an app's or a member's token is refused each in the seed's
words; the screen's session is let in as the header it is sent in, and as a cookie it is nothing;
a paired device is let in.

The fake manager admits as the real one does: by the interface table and the server's check."""

from collections.abc import AsyncIterator
from typing import Any

import pytest
import segno
from aiohttp.test_utils import TestClient, TestServer

from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import GATEWAY, Method, bound_on
from boxd.dbus.server import check_admitted
from boxd.errors import Problem, die
from boxd.web.app import make_app
from boxd.web.screen_session import NO_TOKEN
from boxd.wire.caller import OWNER_ONLY, Role
from boxd.wire.pairing_qr import qr_svg, qr_text
from tests.support.qr_modules import dark_modules

SESSION = "boxscreen_s"
TOKENS = {
    "box_owner": Role.OWNER,
    "box_app": Role.APP,
    "box_member": Role.MEMBER,
    "box_device": Role.DEVICE,
    SESSION: Role.SCREEN,
}
CODE = "ABCDE-FGHIJ"
ANSWERS: dict[str, Any] = {
    "GetSettings": {"defaultBudgetCents": 100},
    "SetSettings": {"defaultBudgetCents": 250},
    "ListSecrets": ["ANTHROPIC_API_KEY"],
    "SetSecret": {"name": "GITHUB_TOKEN"},
    "RemoveSecret": {"name": "GITHUB_TOKEN"},
    "CreatePairing": {"device": "phone", "code": CODE, "expiresInSeconds": 600},
    "RemoveWorkspace": {"name": "notes", "trash": "/var/lib/box/trash/notes-1/base"},
}
# (method, path, body, what the manager is asked)
ROUTES: list[tuple[str, str, Any, tuple[Any, ...]]] = [
    ("GET", "/api/settings", None, ("GetSettings",)),
    (
        "PATCH",
        "/api/settings",
        {"defaultBudgetCents": 250},
        ("SetSettings", '{"defaultBudgetCents":250}'),
    ),
    ("GET", "/api/vault", None, ("ListSecrets",)),
    (
        "PUT",
        "/api/vault/GITHUB_TOKEN",
        {"value": "ghp_x"},
        ("SetSecret", "GITHUB_TOKEN", "ghp_x"),
    ),
    ("DELETE", "/api/vault/GITHUB_TOKEN", None, ("RemoveSecret", "GITHUB_TOKEN")),
    ("POST", "/api/pairings", {"name": "phone"}, ("CreatePairing", "phone")),
    ("DELETE", "/api/workspaces/notes", None, ("RemoveWorkspace", "notes")),
]


class FakeManager(GatewayClient):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        bound = bound_on(GATEWAY, method)
        member = bound.name
        role = TOKENS.get(token)
        if role is None:
            die(Problem.UNAUTHORIZED, "a valid bearer token is required (boxctl token create)")
        check_admitted(bound, role)
        self.calls.append((token, member, *args))
        return ANSWERS[member]


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[TestClient[Any, Any], FakeManager]]:
    manager = FakeManager()
    async with TestClient(TestServer(make_app(manager))) as client:
        yield client, manager


async def _ask(
    client: TestClient[Any, Any], method: str, path: str, body: Any, headers: dict[str, str]
) -> tuple[int, Any]:
    response = await client.request(method, path, json=body, headers=headers)
    return response.status, await response.json()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(("method", "path", "body", "asked"), ROUTES)
async def test_owner_app_and_member_tokens_are_refused(
    gateway: tuple[TestClient[Any, Any], FakeManager],
    method: str,
    path: str,
    body: Any,
    asked: tuple[Any, ...],
) -> None:
    client, manager = gateway
    for token in ("box_owner", "box_app", "box_member"):
        status, answer = await _ask(client, method, path, body, _bearer(token))
        assert (status, answer) == (403, {"error": OWNER_ONLY}), (token, path)
    assert await _ask(client, method, path, body, {}) == (401, {"error": NO_TOKEN})
    assert manager.calls == []


@pytest.mark.parametrize(("method", "path", "body", "asked"), ROUTES)
async def test_the_screen_s_session_opens_them_as_a_header_never_as_a_cookie(
    gateway: tuple[TestClient[Any, Any], FakeManager],
    method: str,
    path: str,
    body: Any,
    asked: tuple[Any, ...],
) -> None:
    client, manager = gateway
    # What a page on another port of 127.0.0.1 could have the browser send, or read itself.
    for cookie in (f"boxd_screen={SESSION}", f"boxd_screen={SESSION}; boxd_csrf=x"):
        assert await _ask(client, method, path, body, {"Cookie": cookie}) == (
            401,
            {"error": NO_TOKEN},
        )
    assert manager.calls == []
    status, answer = await _ask(client, method, path, body, _bearer(SESSION))
    assert status in (200, 201), answer
    assert manager.calls == [(SESSION, *asked)]


@pytest.mark.parametrize(("method", "path", "body", "asked"), ROUTES)
async def test_a_paired_device_is_let_in(
    gateway: tuple[TestClient[Any, Any], FakeManager],
    method: str,
    path: str,
    body: Any,
    asked: tuple[Any, ...],
) -> None:
    client, manager = gateway
    status, answer = await _ask(client, method, path, body, _bearer("box_device"))
    assert status == (201 if method == "POST" else 200), answer
    assert manager.calls == [("box_device", *asked)]
    if path != "/api/pairings":
        assert answer == ANSWERS[asked[0]]


async def test_a_pairing_answer_holds_the_code_as_a_qr_code(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, _ = gateway
    status, answer = await _ask(
        client, "POST", "/api/pairings", {"name": "phone"}, _bearer("box_device")
    )
    assert status == 201
    assert {k: v for k, v in answer.items() if k != "qrSvg"} == ANSWERS["CreatePairing"]
    assert answer["qrSvg"] == qr_svg(CODE)


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("PATCH", "/api/settings", [1], "the body must be a JSON object"),
        ("PUT", "/api/vault/A", {"value": 5}, "value: input should be a valid string"),
        ("PUT", "/api/vault/A", {}, "value is missing"),
        ("PUT", "/api/vault/A", {"value": "x", "also": 1}, "unknown field also"),
        ("POST", "/api/pairings", {}, "name is missing"),
        ("POST", "/api/pairings", {"name": ["phone"]}, "name: input should be a valid string"),
    ],
)
async def test_bodies_are_refused_in_words_naming_the_field(
    gateway: tuple[TestClient[Any, Any], FakeManager],
    method: str,
    path: str,
    body: Any,
    words: str,
) -> None:
    client, manager = gateway
    assert await _ask(client, method, path, body, _bearer("box_device")) == (400, {"error": words})
    assert manager.calls == []


def test_the_qr_code_is_the_code_s_text_and_nothing_else() -> None:
    expected = segno.make_qr(CODE, error="m")
    # A regular QR code, not a Micro one most phone cameras do not read.
    assert not expected.is_micro
    border = 4
    dark = {
        (x + border, y + border)
        for y, row in enumerate(expected.matrix)
        for x, bit in enumerate(row)
        if bit
    }
    assert dark_modules(qr_svg(CODE)) == dark
    assert dark_modules(qr_svg("ABCDE-FGHIK")) != dark
    lines = qr_text(CODE).splitlines()
    # Two rows of modules a line, with the quiet zone around them.
    assert len(lines) == (len(expected.matrix) + 2 * border + 1) // 2


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        ("PATCH", "/api/settings", b'{"defaultBudgetCents": 1e999}'),
        ("PATCH", "/api/settings", b'{"defaultBudgetCents": NaN}'),
        ("PATCH", "/api/settings", b"[1, 2]"),
        ("PUT", "/api/vault/GITHUB_TOKEN", b'{"value": Infinity}'),
        ("PUT", "/api/vault/GITHUB_TOKEN", b'{"value": "x", "also": 1}'),
        ("PUT", "/api/vault/GITHUB_TOKEN", b'{"value": "\xff"}'),
        ("POST", "/api/pairings", b'{"name": 12}'),
    ],
)
async def test_a_broken_body_is_a_400_in_words_and_reaches_no_one(
    gateway: tuple[TestClient[Any, Any], FakeManager], method: str, path: str, raw: bytes
) -> None:
    """Non-finite numbers, wrong shapes, unknown fields and broken UTF-8 from the
    screen itself: refused before the manager hears anything."""
    client, manager = gateway
    response = await client.request(method, path, data=raw, headers=_bearer("box_device"))
    answer = await response.json()
    assert response.status == 400, answer
    assert isinstance(answer["error"], str) and answer["error"].strip()
    assert manager.calls == []
