"""This computer's own screen, as an attacker would try it: a link used twice or too late, a
forged or revoked session cookie, a change without the CSRF token or from another origin."""

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from boxd.caller import LINK_USED, SCREEN_SESSION_SECONDS, Caller, Role
from boxd.cli import open_screen
from boxd.dbus.client import GatewayClient
from boxd.errors import BoxError, Problem, die
from boxd.manager.screen_sessions import LINK_SECONDS, ScreenSessions
from boxd.manager.store import Store
from boxd.manager.tokens import token_hash
from boxd.web.app import make_app
from boxd.web.screen_session import (
    CSRF_COOKIE,
    CSRF_HEADER,
    NO_CSRF,
    SESSION_COOKIE,
    SESSION_ENDED,
    csrf_token,
)

OWNER = Caller(Role.OWNER, "alice", user="alice")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = Store(tmp_path / "box.db")
    await opened.open()
    yield opened
    await opened.close()


async def _open(screen: ScreenSessions, code: str) -> dict[str, Any]:
    """As the manager's server does: the code is the caller, and the handler takes the link."""
    caller = screen.link_caller(code)
    if caller is None:
        die(Problem.UNAUTHORIZED, "a valid bearer token is required (boxctl token create)")
    return await screen.open_session(caller, [])


async def test_a_link_opens_one_session_once(store: Store, tmp_path: Path) -> None:
    screen = ScreenSessions(store, Clock())
    link = await screen.create_link(OWNER, [])
    assert link["expiresInSeconds"] == LINK_SECONDS
    session = (await _open(screen, link["code"]))["session"]
    found = await store.token(token_hash(session))
    assert found is not None
    assert (found.name, found.role, found.user) == ("screen", "screen", "alice")
    with pytest.raises(BoxError) as used:
        await _open(screen, link["code"])
    assert used.value.problem == Problem.UNAUTHORIZED
    # Kept as tokens are: by its hash only.
    assert session not in (tmp_path / "box.db").read_bytes().decode("latin-1")
    assert link["code"] not in (tmp_path / "box.db").read_bytes().decode("latin-1")


async def test_a_session_is_over_after_its_hours_and_removed(store: Store) -> None:
    wall = Clock()
    screen = ScreenSessions(store, Clock(), wall)
    code = (await screen.create_link(OWNER, []))["code"]
    caller = screen.link_caller(code)
    assert caller is not None
    wall.now = 5000.0
    session = (await screen.open_session(caller, []))["session"]
    found = await store.token(token_hash(session))
    assert found is not None
    found = replace(found, created=5000.0)
    wall.now = 5000.0 + SCREEN_SESSION_SECONDS - 1
    await screen.refuse_if_over(found)
    wall.now = 5000.0 + SCREEN_SESSION_SECONDS
    with pytest.raises(BoxError) as over:
        await screen.refuse_if_over(found)
    assert over.value.problem == Problem.UNAUTHORIZED
    assert "boxctl open" in over.value.message
    assert await store.tokens() == []


async def test_two_callers_racing_with_one_link_get_one_session(store: Store) -> None:
    screen = ScreenSessions(store, Clock())
    code = (await screen.create_link(OWNER, []))["code"]
    first, second = screen.link_caller(code), screen.link_caller(code)
    assert first is not None and second is not None
    await screen.open_session(first, [])
    with pytest.raises(BoxError) as lost:
        await screen.open_session(second, [])
    assert lost.value.message == LINK_USED
    assert len(await store.tokens()) == 1


async def test_a_link_is_dead_after_a_minute(store: Store) -> None:
    clock = Clock()
    screen = ScreenSessions(store, clock)
    code = (await screen.create_link(OWNER, []))["code"]
    caller = screen.link_caller(code)
    clock.now += LINK_SECONDS
    assert screen.link_caller(code) is None
    # Even a caller let in just before the minute ended gets nothing after it.
    assert caller is not None
    with pytest.raises(BoxError) as late:
        await screen.open_session(caller, [])
    assert late.value.message == LINK_USED
    assert await store.tokens() == []


async def test_a_forged_code_is_no_caller(store: Store) -> None:
    screen = ScreenSessions(store, Clock())
    await screen.create_link(OWNER, [])
    assert screen.link_caller("boxlink_forged") is None
    assert screen.link_caller("") is None


class FakeManager(GatewayClient):
    """The manager's side of the gateway's calls: one link, and the sessions it opened."""

    def __init__(self) -> None:
        self.links = {"boxlink_good"}
        self.sessions: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    async def call_as(self, token: str, member: str, *args: Any) -> Any:
        self.calls.append((token, member))
        if member == "OpenScreenSession":
            if token not in self.links:
                die(Problem.UNAUTHORIZED, "a valid bearer token is required (boxctl token create)")
            self.links.remove(token)
            session = f"boxscreen_{len(self.sessions)}"
            self.sessions.add(session)
            return {"session": session}
        if token not in self.sessions and token != "box_owner":
            die(Problem.UNAUTHORIZED, "a valid bearer token is required (boxctl token create)")
        return {"id": "t", "state": "stopped"}


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[TestClient[Any, Any], FakeManager]]:
    manager = FakeManager()
    async with TestClient(TestServer(make_app(manager))) as client:
        yield client, manager


async def _login(client: TestClient[Any, Any]) -> tuple[str, list[str]]:
    response = await client.get("/login?code=boxlink_good", allow_redirects=False)
    assert response.status == 303, await response.text()
    assert response.headers["Location"] == "/"
    cookies = response.headers.getall("Set-Cookie")
    session = response.cookies[SESSION_COOKIE].value
    return session, cookies


async def test_the_login_sets_a_strict_http_only_cookie(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, _ = gateway
    session, cookies = await _login(client)
    (cookie,) = [c for c in cookies if c.startswith(f"{SESSION_COOKIE}=")]
    flags = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/", f"max-age={SCREEN_SESSION_SECONDS}"} <= flags
    (csrf,) = [c for c in cookies if c.startswith(f"{CSRF_COOKIE}=")]
    assert f"Max-Age={SCREEN_SESSION_SECONDS}" in csrf
    (csrf,) = [c for c in cookies if c.startswith(f"{CSRF_COOKIE}=")]
    assert csrf.split(";")[0] == f"{CSRF_COOKIE}={csrf_token(session)}"
    assert "samesite=strict" in csrf.lower()


async def test_the_link_used_twice_is_refused(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, _ = gateway
    await _login(client)
    again = await client.get("/login?code=boxlink_good", allow_redirects=False)
    assert again.status == 401
    assert await again.json() == {"error": LINK_USED}
    assert "Set-Cookie" not in again.headers


async def _post(
    client: TestClient[Any, Any], session: str, headers: dict[str, str]
) -> tuple[int, Any]:
    response = await client.post(
        "/api/tasks/t/stop", headers={"Cookie": f"{SESSION_COOKIE}={session}", **headers}
    )
    return response.status, await response.json()


async def test_a_change_needs_the_csrf_token_and_this_origin(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    session, _ = await _login(client)
    own = f"http://{client.host}:{client.port}"
    good = {CSRF_HEADER: csrf_token(session)}
    assert await _post(client, session, {}) == (403, {"error": NO_CSRF})
    assert (await _post(client, session, {CSRF_HEADER: "0" * 64}))[0] == 403
    # Another session's token does not do for this one.
    assert (await _post(client, session, {CSRF_HEADER: csrf_token("boxscreen_9")}))[0] == 403
    for foreign in (
        {"Origin": "http://evil.example"},
        {"Origin": "http://127.0.0.1:8080"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site"},
    ):
        status, body = await _post(client, session, {**good, **foreign})
        assert status == 403, foreign
        assert "this box's own address" in body["error"]
    assert [m for _, m in manager.calls] == ["OpenScreenSession"]
    headers = {**good, "Origin": own, "Sec-Fetch-Site": "same-origin"}
    assert await _post(client, session, headers) == (200, {"id": "t", "state": "stopped"})
    assert manager.calls[-1] == (session, "StopTask")


async def test_reading_needs_no_csrf_token(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    session, _ = await _login(client)
    response = await client.get("/api/droid", headers={"Cookie": f"{SESSION_COOKIE}={session}"})
    assert response.status == 200
    assert manager.calls[-1] == (session, "GetDroid")


async def test_a_forged_or_revoked_session_is_401_in_plain_words(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    session, _ = await _login(client)
    manager.sessions.clear()
    for cookie in (session, "boxscreen_forged"):
        response = await client.get("/api/droid", headers={"Cookie": f"{SESSION_COOKIE}={cookie}"})
        assert response.status == 401
        assert await response.json() == {"error": SESSION_ENDED}


async def test_a_bearer_token_needs_no_csrf_and_wins_over_a_cookie(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    headers = {"Authorization": "Bearer box_owner", "Cookie": f"{SESSION_COOKIE}=boxscreen_x"}
    response = await client.post("/api/tasks/t/stop", headers=headers)
    assert response.status == 200
    assert manager.calls[-1] == ("box_owner", "StopTask")


class FakeOwnerClient(GatewayClient):
    def __init__(self) -> None:
        pass

    async def call(self, member: str, *args: Any) -> Any:
        assert member == "CreateScreenLink"
        return {"code": "boxlink_a+b", "expiresInSeconds": LINK_SECONDS}


@pytest.mark.parametrize(
    ("display", "found", "opened"),
    [
        ({"DISPLAY": ":0"}, "/usr/bin/xdg-open", True),
        ({"WAYLAND_DISPLAY": "wayland-0"}, "/usr/bin/xdg-open", True),
        ({}, "/usr/bin/xdg-open", False),
        ({"DISPLAY": ":0"}, None, False),
    ],
)
async def test_boxctl_open_uses_a_browser_only_on_a_desktop(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    display: dict[str, str],
    found: str | None,
    opened: bool,
) -> None:
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in display.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("boxd.cli.open_screen.shutil.which", lambda name: found)
    launched: list[tuple[str, str]] = []

    def launch(opener: str, url: str) -> bool:
        launched.append((opener, url))
        return True

    monkeypatch.setattr(open_screen, "_launch", launch)
    assert await open_screen.open_screen(FakeOwnerClient()) == 0
    url = "http://127.0.0.1:7700/login?code=boxlink_a%2Bb"
    assert url in capsys.readouterr().out.splitlines()
    assert launched == ([("/usr/bin/xdg-open", url)] if opened else [])


def test_the_browser_gets_a_private_page_never_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command line is in /proc for every local user: the link's code must not be in it."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    argv: list[list[str]] = []
    monkeypatch.setattr(
        "boxd.cli.open_screen.subprocess.Popen", lambda args, **_: argv.append(list(args))
    )
    url = "http://127.0.0.1:7700/login?code=boxlink_secret"
    assert open_screen._launch("/usr/bin/xdg-open", url)
    (launched,) = argv
    assert "boxlink_secret" not in " ".join(launched)
    page = Path(launched[1])
    assert page.parent == tmp_path
    assert page.stat().st_mode & 0o777 == 0o600
    assert 'content="0;url=http://127.0.0.1:7700/login?code=boxlink_secret"' in page.read_text()
