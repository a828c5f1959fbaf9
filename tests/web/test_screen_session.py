"""This computer's own screen, as an attacker would try it: a link used twice or too late, a
forged, revoked or logged-out session, a session sent as a cookie (what another port of
127.0.0.1 could have the browser send), a session handed out as a cookie before."""

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

import boxd.web
from boxd.cli import open_screen
from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import CREATE_SCREEN_LINK, GATEWAY, MANAGER, Method, bound_on
from boxd.errors import BoxError, Problem, die
from boxd.manager.access.screen_sessions import LINK_SECONDS, SESSION_NAME, ScreenSessions
from boxd.manager.access.tokens import token_hash
from boxd.manager.record.store import Store
from boxd.web.app import make_app
from boxd.web.openapi import ROUTES
from boxd.web.screen_session import NO_TOKEN, SESSION_ENDED, SESSION_PATH
from boxd.wire.caller import LINK_USED, SCREEN_SESSION_SECONDS, Caller, Role

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
    return await screen.open_session(caller)


async def test_a_link_opens_one_session_once(store: Store, tmp_path: Path) -> None:
    screen = ScreenSessions(store, Clock())
    link = await screen.create_link(OWNER)
    assert link["expiresInSeconds"] == LINK_SECONDS
    session = (await _open(screen, link["code"]))["session"]
    found = await store.token(token_hash(session))
    assert found is not None
    assert (found.name, found.role, found.user) == (SESSION_NAME, "screen", "alice")
    with pytest.raises(BoxError) as used:
        await _open(screen, link["code"])
    assert used.value.problem == Problem.UNAUTHORIZED
    # Kept as tokens are: by its hash only.
    assert session not in (tmp_path / "box.db").read_bytes().decode("latin-1")
    assert link["code"] not in (tmp_path / "box.db").read_bytes().decode("latin-1")


async def test_a_session_is_over_after_its_hours_and_removed(store: Store) -> None:
    wall = Clock()
    screen = ScreenSessions(store, Clock(), wall)
    code = (await screen.create_link(OWNER))["code"]
    caller = screen.link_caller(code)
    assert caller is not None
    wall.now = 5000.0
    session = (await screen.open_session(caller))["session"]
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


async def test_a_session_handed_out_as_a_cookie_before_ends_at_its_next_use(
    store: Store,
) -> None:
    """Kept under the name "screen", it went to every port of 127.0.0.1: it may be another's."""
    wall = Clock()
    screen = ScreenSessions(store, Clock(), wall)
    await store.add_token(token_hash("boxscreen_old"), "screen", "screen", "alice")
    found = await store.token(token_hash("boxscreen_old"))
    assert found is not None
    wall.now = found.created
    with pytest.raises(BoxError) as ended:
        await screen.refuse_if_over(found)
    assert ended.value.problem == Problem.UNAUTHORIZED
    assert await store.tokens() == []


async def test_logging_out_ends_the_session_and_nothing_else(store: Store) -> None:
    screen = ScreenSessions(store, Clock())
    code = (await screen.create_link(OWNER))["code"]
    caller = screen.link_caller(code)
    assert caller is not None
    session = (await screen.open_session(caller))["session"]
    await store.add_token(token_hash("box_owner"), "scripts", "owner", "alice")
    as_screen = Caller(Role.SCREEN, SESSION_NAME, user="alice")
    # Only a screen's session is ended this way, not a token its caller happens to know.
    with pytest.raises(BoxError) as refused:
        await screen.close_session(as_screen, "box_owner")
    assert refused.value.problem == Problem.NOT_FOUND
    assert await screen.close_session(as_screen, session) == {"ended": True}
    assert [t.name for t in await store.tokens()] == ["scripts"]
    with pytest.raises(BoxError):
        await screen.close_session(as_screen, session)


async def test_two_callers_racing_with_one_link_get_one_session(store: Store) -> None:
    screen = ScreenSessions(store, Clock())
    code = (await screen.create_link(OWNER))["code"]
    first, second = screen.link_caller(code), screen.link_caller(code)
    assert first is not None and second is not None
    await screen.open_session(first)
    with pytest.raises(BoxError) as lost:
        await screen.open_session(second)
    assert lost.value.message == LINK_USED
    assert len(await store.tokens()) == 1


async def test_a_link_is_dead_after_a_minute(store: Store) -> None:
    clock = Clock()
    screen = ScreenSessions(store, clock)
    code = (await screen.create_link(OWNER))["code"]
    caller = screen.link_caller(code)
    clock.now += LINK_SECONDS
    assert screen.link_caller(code) is None
    # Even a caller let in just before the minute ended gets nothing after it.
    assert caller is not None
    with pytest.raises(BoxError) as late:
        await screen.open_session(caller)
    assert late.value.message == LINK_USED
    assert await store.tokens() == []


async def test_a_forged_code_is_no_caller(store: Store) -> None:
    screen = ScreenSessions(store, Clock())
    await screen.create_link(OWNER)
    assert screen.link_caller("boxlink_forged") is None
    assert screen.link_caller("") is None


class FakeManager(GatewayClient):
    """The manager's side of the gateway's calls: one link, and the sessions it opened."""

    def __init__(self) -> None:
        self.links = {"boxlink_good"}
        self.sessions: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        member = bound_on(GATEWAY, method).name
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
        if member == "CloseScreenSession":
            assert args == (token,)
            self.sessions.remove(token)
            return {"ended": True}
        return {"id": "t", "state": "stopped"}


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[TestClient[Any, Any], FakeManager]]:
    manager = FakeManager()
    async with TestClient(TestServer(make_app(manager))) as client:
        yield client, manager


async def _login(client: TestClient[Any, Any], code: str = "boxlink_good") -> str:
    response = await client.post(SESSION_PATH, json={"code": code})
    assert response.status == 201, await response.text()
    assert response.headers["Cache-Control"] == "no-store"
    assert "Set-Cookie" not in response.headers
    answer = await response.json()
    assert answer["expiresInSeconds"] == SCREEN_SESSION_SECONDS
    return str(answer["session"])


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_the_link_s_code_is_traded_once_for_a_session_and_no_cookie(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    session = await _login(client)
    assert manager.calls == [("boxlink_good", "OpenScreenSession")]
    again = await client.post(SESSION_PATH, json={"code": "boxlink_good"})
    assert (again.status, await again.json()) == (401, {"error": LINK_USED})
    assert "Set-Cookie" not in again.headers
    assert manager.sessions == {session}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({}, "code is missing"),
        ({"code": 5}, "code: input should be a valid string"),
        ({"code": "x", "also": 1}, "unknown field also"),
        ({"code": "x" * 101}, "code: string should have at most 100 characters"),
    ],
)
async def test_a_login_body_is_checked_in_words(
    gateway: tuple[TestClient[Any, Any], FakeManager], body: Any, words: str
) -> None:
    client, manager = gateway
    response = await client.post(SESSION_PATH, json=body)
    assert (response.status, await response.json()) == (400, {"error": words})
    assert manager.calls == []


async def test_the_session_acts_as_a_header_with_no_csrf_token(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    session = await _login(client)
    response = await client.post("/api/tasks/t/stop", headers=_bearer(session))
    assert (response.status, await response.json()) == (200, {"id": "t", "state": "stopped"})
    assert manager.calls[-1] == (session, "StopTask")


def _cookie_routes(app: web.Application) -> list[tuple[str, str]]:
    """Every route of the gateway that acts for a caller, its placeholders filled in."""
    open_to_all = {(route.method, route.path) for route in ROUTES if route.open_to_all}
    found = []
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if route.method in ("HEAD", "*") or (route.method, path) in open_to_all:
            continue
        found.append((route.method, path.replace("{id}", "t").replace("{name}", "n")))
    return found


async def test_no_route_takes_the_session_as_a_cookie(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    """What another port's page could have had the browser send, or could read and send
    itself: the session and a CSRF token as cookies, with the header the old page sent."""
    client, manager = gateway
    session = await _login(client)
    cookie = {"Cookie": f"boxd_screen={session}; boxd_csrf=x", "X-CSRF-Token": "x"}
    routes = _cookie_routes(client.app)
    assert len(routes) > 25 and ("GET", "/api/vault") in routes
    for method, path in routes:
        response = await client.request(method, path, headers=cookie, json={})
        assert (response.status, await response.json()) == (401, {"error": NO_TOKEN}), path
    assert [member for _, member in manager.calls] == ["OpenScreenSession"]


async def test_a_forged_revoked_or_logged_out_session_is_401_in_plain_words(
    gateway: tuple[TestClient[Any, Any], FakeManager],
) -> None:
    client, manager = gateway
    session, other = await _login(client), "boxscreen_forged"
    response = await client.delete(SESSION_PATH, headers=_bearer(session))
    assert (response.status, await response.json()) == (200, {"ended": True})
    assert manager.calls[-1] == (session, "CloseScreenSession")
    for token in (session, other):
        response = await client.get("/api/droid", headers=_bearer(token))
        assert (response.status, await response.json()) == (401, {"error": SESSION_ENDED})
    response = await client.delete(SESSION_PATH)
    assert (response.status, await response.json()) == (401, {"error": NO_TOKEN})


def test_no_script_of_the_screen_reads_a_cookie_or_opens_an_event_source() -> None:
    """Every request the page makes goes through api.js, with the session as its header, but
    the login's (session.js); neither lets the browser add its cookies."""
    screen = Path(boxd.web.__file__).parent / "screen"
    scripts = {path.name: path.read_text() for path in screen.glob("*.js")}
    assert "session.js" in scripts and "api.js" in scripts
    for name, text in scripts.items():
        assert "document.cookie" not in text, name
        assert "EventSource(" not in text and "localStorage" not in text, name
        calls = text.count("fetch(")
        assert calls == {"api.js": 1, "session.js": 1}.get(name, 0), name
    assert 'credentials: "omit"' in scripts["api.js"]
    assert 'credentials: "omit"' in scripts["session.js"]


class FakeOwnerClient(GatewayClient):
    def __init__(self) -> None:
        pass

    async def call(self, method: Method, *args: Any) -> Any:
        assert bound_on(MANAGER, method) and method == CREATE_SCREEN_LINK
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
    url = "http://127.0.0.1:7700/#login=boxlink_a%2Bb"
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
    url = "http://127.0.0.1:7700/#login=boxlink_secret"
    assert open_screen._launch("/usr/bin/xdg-open", url)
    (launched,) = argv
    assert "boxlink_secret" not in " ".join(launched)
    page = Path(launched[1])
    assert page.parent == tmp_path
    assert page.stat().st_mode & 0o777 == 0o600
    assert 'content="0;url=http://127.0.0.1:7700/#login=boxlink_secret"' in page.read_text()
