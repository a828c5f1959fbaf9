"""`GET /api/events`, as an attacker and a slow browser would try it: only the owner listens
(an app's or a member's token is 403, no token 401), a revoked one stops hearing the box, a
stranger's forged signal never reaches a stream, streams and their queues are bounded."""

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from dbus_fast import Message, Variant

from boxd.dbus.client import GatewayClient
from boxd.dbus.interface import (
    APPROVAL_ASKED,
    BUS_NAME,
    GATEWAY,
    MANAGER,
    ROOT_PATH,
    TASK,
    Method,
    bound_on,
)
from boxd.dbus.server import check_admitted
from boxd.errors import Problem, die
from boxd.web.app import make_app
from boxd.web.event_stream import CHECK_METHOD, Timing
from boxd.web.live_events import RULE, TOO_MANY, LiveEvent, LiveEvents, Subscription, translate
from boxd.web.screen_session import NO_TOKEN, SESSION_ENDED
from boxd.wire.caller import OWNER_ONLY, Role
from tests.support.fake_bus import FakeBus, owner_changed, signal
from tests.support.signals import BOXD, NEW_BOXD, STRANGER, TASK_ID, event

PATH = f"{ROOT_PATH}/task/{TASK_ID}"


def changed(sender: str, **values: Any) -> Message:
    body = {name: Variant("s" if isinstance(v, str) else "d", v) for name, v in values.items()}
    return signal(
        sender, PATH, "org.freedesktop.DBus.Properties", "PropertiesChanged", "sa{sv}as",
        [TASK, body, []],
    )  # fmt: skip


def added(sender: str) -> Message:
    properties = {"Id": Variant("s", TASK_ID), "State": Variant("s", "queued")}
    return signal(
        sender, PATH, "org.freedesktop.DBus.ObjectManager", "InterfacesAdded", "oa{sa{sv}}",
        [PATH, {TASK: properties}],
    )  # fmt: skip


APPROVAL = '{"id":"t000000001.k","state":"pending","question":"pay?"}'


def asked(sender: str) -> Message:
    return signal(sender, ROOT_PATH, MANAGER, APPROVAL_ASKED, "s", [APPROVAL])


def test_boxd_s_signals_become_live_events() -> None:
    step = translate(event(BOXD, 3, "task.step", {"text": "hello"}))
    assert step is not None and step.name == "step"
    assert json.loads(step.data) == {
        "task": TASK_ID,
        "event": {
            "seq": 3, "task": TASK_ID, "kind": "task.step", "at": 1.0, "data": {"text": "hello"}
        },
    }  # fmt: skip
    state = translate(changed(BOXD, State="running", CostCents=12.5))
    assert state == LiveEvent(
        "task", json.dumps({"task": TASK_ID, "changed": {"State": "running", "CostCents": 12.5}})
    )
    new = translate(added(BOXD))
    assert new is not None and json.loads(new.data) == {
        "task": TASK_ID,
        "new": True,
        "changed": {"Id": TASK_ID, "State": "queued"},
    }
    # The approval's JSON goes on as boxd wrote it.
    assert translate(asked(BOXD)) == LiveEvent("approval", APPROVAL)
    # Anything else is no event: another interface's properties, another path, a method call.
    other = signal(BOXD, PATH, "org.freedesktop.DBus.Properties", "PropertiesChanged",
                   "sa{sv}as", ["org.example.Other", {}, []])  # fmt: skip
    assert translate(other) is None
    deeper = signal(BOXD, f"{PATH}/x", TASK, "Event", "tss", [1, "k", "{}"])
    assert translate(deeper) is None
    assert translate(signal(BOXD, ROOT_PATH, MANAGER, "Other", "s", ["{}"])) is None


async def _hub(fake: FakeBus, **limits: int) -> LiveEvents:
    hub = LiveEvents(**limits)
    await hub.start(fake.bus)
    return hub


async def test_only_the_owner_of_the_name_is_heard() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake)
    stream = await hub.subscribe(lambda: None)
    assert RULE in fake.rules
    fake.deliver(event(STRANGER, 1, "task.step", {"text": "forged"}))
    fake.deliver(asked(STRANGER))
    assert stream.queue.empty()
    fake.deliver(event(BOXD, 1, "task.step", {"text": "real"}))
    assert "real" in stream.queue.get_nowait().data
    # boxd restarted: its old unique name is no one now.
    fake.deliver(owner_changed(BUS_NAME, BOXD, NEW_BOXD))
    fake.deliver(event(BOXD, 2, "task.step", {"text": "old"}))
    fake.deliver(owner_changed(BUS_NAME, BOXD, NEW_BOXD, sender=STRANGER))
    assert stream.queue.empty()
    fake.deliver(event(NEW_BOXD, 3, "task.step", {"text": "new"}))
    assert "new" in stream.queue.get_nowait().data


async def test_streams_and_their_queues_are_bounded() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake, max_streams=2, queue_length=3)
    dropped: list[str] = []
    slow = await hub.subscribe(lambda: dropped.append("slow"))
    quick = await hub.subscribe(lambda: dropped.append("quick"))
    with pytest.raises(Exception) as third:
        await hub.subscribe(lambda: None)
    assert getattr(third.value, "problem", None) == Problem.UNAVAILABLE
    for seq in range(1, 5):
        fake.deliver(event(BOXD, seq, "task.step", {}))
        quick.queue.get_nowait()
    # The one that did not read is dropped once, and holds no more than its queue.
    assert dropped == ["slow"] and slow.dropped and slow.queue.qsize() == 3
    fake.deliver(event(BOXD, 5, "task.step", {}))
    assert dropped == ["slow"] and slow.queue.qsize() == 3 and not quick.dropped
    hub.unsubscribe(slow)
    assert hub.open_streams == 1
    await hub.subscribe(lambda: None)


def test_a_subscription_overflowing_calls_its_drop_once() -> None:
    calls: list[int] = []
    subscription = Subscription(lambda: calls.append(1), 1)
    for _ in range(3):
        subscription.offer(LiveEvent("step", "{}"))
    assert calls == [1] and subscription.queue.qsize() == 1


class FakeManager(GatewayClient):
    """Admits as the manager does; `revoked` tokens are no one from then on."""

    def __init__(self) -> None:
        self.tokens = {
            "box_owner": Role.OWNER,
            "box_app": Role.APP,
            "box_member": Role.MEMBER,
            "box_device": Role.DEVICE,
            "boxscreen_s": Role.SCREEN,
        }
        self.checks: list[str] = []
        self.checked = asyncio.Event()
        # boxd not answering (restarting, or too busy to reply in time).
        self.silent = False

    async def call_as(self, token: str, method: Method, *args: Any) -> Any:
        bound = bound_on(GATEWAY, method)
        assert method == CHECK_METHOD
        self.checks.append(token)
        self.checked.set()
        if self.silent:
            die(Problem.UNAVAILABLE, "boxd is not running (no one owns org.boxd.Box1)")
        role = self.tokens.get(token)
        if role is None:
            die(Problem.UNAUTHORIZED, "a valid bearer token is required (boxctl token create)")
        check_admitted(bound, role)
        return {"paused": False}


Gateway = tuple[TestClient[Any, Any], FakeManager, FakeBus, LiveEvents]


@contextlib.asynccontextmanager
async def _gateway(timing: Timing, **limits: int) -> AsyncIterator[Gateway]:
    manager = FakeManager()
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake, **limits)
    async with TestClient(TestServer(make_app(manager, hub, timing))) as client:
        yield client, manager, fake, hub


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    # Heartbeats far apart and a check before every event: what each test sees is its own doing.
    async with _gateway(Timing(heartbeat=3600, check_every=0), max_streams=2) as made:
        yield made


async def _frame(response: ClientResponse) -> str:
    """The next event or comment, its lines without the blank line that ends it."""
    lines: list[str] = []
    while True:
        line = (await asyncio.wait_for(response.content.readline(), 10)).decode()
        if line in ("\n", ""):
            return "".join(lines)
        lines.append(line)


async def _open(client: TestClient[Any, Any], headers: dict[str, str]) -> ClientResponse:
    response = await client.get("/api/events", headers=headers)
    if response.status == 200:
        assert await _frame(response) == ": live\n"
    return response


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    "headers",
    [_bearer("box_owner"), _bearer("box_device"), _bearer("boxscreen_s")],
)
async def test_the_owner_hears_steps_tasks_and_approvals(
    gateway: Gateway, headers: dict[str, str]
) -> None:
    client, _, fake, _ = gateway
    response = await _open(client, headers)
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Accel-Buffering"] == "no"
    fake.deliver(added(BOXD))
    fake.deliver(event(STRANGER, 1, "task.step", {"text": "forged"}))
    fake.deliver(event(BOXD, 1, "task.step", {"text": "hello"}))
    fake.deliver(changed(BOXD, State="waiting"))
    fake.deliver(asked(BOXD))
    new = await _frame(response)
    assert new.startswith("event: task\ndata: ") and '"new": true' in new
    step = await _frame(response)
    assert step.startswith("event: step\ndata: ") and "hello" in step and "forged" not in step
    assert await _frame(response) == (
        f'event: task\ndata: {{"task": "{TASK_ID}", "changed": {{"State": "waiting"}}}}\n'
    )
    assert await _frame(response) == f"event: approval\ndata: {APPROVAL}\n"
    response.close()


async def test_apps_members_and_strangers_are_refused(gateway: Gateway) -> None:
    client, _, _, hub = gateway
    for token in ("box_app", "box_member"):
        response = await client.get("/api/events", headers=_bearer(token))
        assert (response.status, await response.json()) == (403, {"error": OWNER_ONLY})
    response = await client.get("/api/events")
    assert (response.status, await response.json()) == (401, {"error": NO_TOKEN})
    # The screen's session as a cookie is no credential at all.
    response = await client.get("/api/events", headers={"Cookie": "boxd_screen=boxscreen_s"})
    assert (response.status, await response.json()) == (401, {"error": NO_TOKEN})
    response = await client.get("/api/events", headers=_bearer("boxscreen_forged"))
    assert (response.status, await response.json()) == (401, {"error": SESSION_ENDED})
    assert hub.open_streams == 0


async def test_a_revoked_token_s_stream_ends_before_the_next_event(gateway: Gateway) -> None:
    client, manager, fake, hub = gateway
    response = await _open(client, _bearer("box_owner"))
    del manager.tokens["box_owner"]
    fake.deliver(event(BOXD, 1, "task.step", {"text": "secret"}))
    ended = await _frame(response)
    assert ended.startswith("event: end\ndata: ") and "valid bearer token" in ended
    assert await response.content.read() == b""
    assert hub.open_streams == 0


async def test_no_event_passes_while_no_one_can_say_the_caller_may_hear_it(
    gateway: Gateway,
) -> None:
    client, manager, fake, hub = gateway
    response = await _open(client, _bearer("box_owner"))
    # Revoked while boxd's answer does not come in time: its signal may still reach the gateway.
    del manager.tokens["box_owner"]
    manager.silent = True
    fake.deliver(event(BOXD, 1, "task.step", {"text": "secret"}))
    # Closed with no end event: the screen connects again by itself, and is asked again then.
    rest = await asyncio.wait_for(response.content.read(), 10)
    assert b"secret" not in rest and b"event: end" not in rest
    assert hub.open_streams == 0


async def test_a_revoked_session_s_stream_ends_on_a_heartbeat() -> None:
    async with _gateway(Timing(heartbeat=0.05, check_every=3600)) as (client, manager, _, hub):
        response = await _open(client, _bearer("boxscreen_s"))
        assert await _frame(response) == ": heartbeat\n"
        del manager.tokens["boxscreen_s"]
        ended = await _frame(response)
        assert ended == f"event: end\ndata: {json.dumps({'error': SESSION_ENDED})}\n"
        assert hub.open_streams == 0


async def _until(condition: Callable[[], bool]) -> None:
    """Nothing tells when a client's going is noticed; callers bound this with wait_for."""
    while not condition():  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def test_the_stream_after_the_last_is_refused_in_plain_words(gateway: Gateway) -> None:
    client, _, _, hub = gateway
    first = await _open(client, _bearer("box_owner"))
    await _open(client, _bearer("box_device"))
    third = await client.get("/api/events", headers=_bearer("box_owner"))
    assert (third.status, await third.json()) == (503, {"error": TOO_MANY})
    first.close()
    # The gateway is not told the client went; it looks, and the place comes free.
    await asyncio.wait_for(_until(lambda: hub.open_streams == 1), 10)
    again = await _open(client, _bearer("box_owner"))
    assert again.status == 200


async def test_a_client_that_does_not_read_is_dropped_not_buffered() -> None:
    async with _gateway(Timing(heartbeat=3600), queue_length=2) as (client, _, fake, hub):
        # A raw socket that asks and then never reads: the gateway's writes come to wait.
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.setblocking(False)
        await asyncio.get_running_loop().sock_connect(raw, (client.host, client.port))
        asking = (
            "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer box_owner\r\n\r\n"
        )
        await asyncio.get_running_loop().sock_sendall(raw, asking.encode())
        await asyncio.wait_for(_until(lambda: hub.open_streams == 1), 10)
        (stream,) = hub._streams
        big = {"text": "x" * 1_000_000}
        for seq in range(1, 200):
            fake.deliver(event(BOXD, seq, "task.step", big))
            # Each is taken while the socket's buffers have room; then the gateway's write
            # waits, and the queue fills behind it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_until(stream.queue.empty), 0.5)
            if stream.dropped:
                break
        assert stream.dropped
        await asyncio.wait_for(_until(lambda: hub.open_streams == 0), 10)
        raw.close()


async def test_no_signal_is_read_while_no_stream_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake)
    read: list[Message] = []

    def reading(message: Message) -> LiveEvent | None:
        read.append(message)
        return None

    monkeypatch.setattr("boxd.web.live_events.translate", reading)
    fake.deliver(event(BOXD, 1, "task.step", {"text": "no one is looking"}))
    assert read == []
    stream = await hub.subscribe(lambda: None)
    monkeypatch.undo()
    fake.deliver(event(BOXD, 2, "task.step", {"text": "someone is"}))
    assert "someone is" in stream.queue.get_nowait().data
    assert stream.queue.empty()


async def settled(hub: LiveEvents) -> None:
    """Lets a rule's removal, which runs after the last stream closes, take its turn."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_bus_sends_boxd_s_signals_here_only_while_a_stream_is_open() -> None:
    """A box whose screen no one looks at pays nothing for it per step: no rule, no signal."""
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake)
    assert RULE not in fake.rules
    first = await hub.subscribe(lambda: None)
    second = await hub.subscribe(lambda: None)
    assert fake.rules.count(RULE) == 1
    hub.unsubscribe(first)
    await settled(hub)
    assert fake.rules.count(RULE) == 1
    hub.unsubscribe(second)
    await settled(hub)
    assert RULE not in fake.rules
    again = await hub.subscribe(lambda: None)
    assert fake.rules.count(RULE) == 1
    fake.deliver(event(BOXD, 1, "task.step", {"text": "back"}))
    assert "back" in again.queue.get_nowait().data


async def test_a_stream_opened_as_the_last_one_closes_keeps_the_rule() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake)
    hub.unsubscribe(await hub.subscribe(lambda: None))
    # Before the removal has had its turn.
    stream = await hub.subscribe(lambda: None)
    await settled(hub)
    assert fake.rules.count(RULE) == 1
    fake.deliver(event(BOXD, 1, "task.step", {"text": "still heard"}))
    assert "still heard" in stream.queue.get_nowait().data


async def test_a_stream_whose_rule_the_bus_refused_is_not_kept() -> None:
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake)
    real_call = fake.call

    async def refusing(message: Message) -> Message:
        if message.member == "AddMatch":
            die(Problem.FAILED, "the system bus refused AddMatch: no")
        return await real_call(message)

    fake.call = refusing  # type: ignore[method-assign]
    with pytest.raises(Exception) as refused:
        await hub.subscribe(lambda: None)
    assert getattr(refused.value, "problem", None) == Problem.FAILED
    assert hub.open_streams == 0 and RULE not in fake.rules


async def test_a_stream_that_goes_away_while_its_rule_is_added_leaves_no_rule() -> None:
    """As the real bus does, the rule is held from the moment AddMatch is sent, before its
    answer comes back: a caller cancelled meanwhile must not leave it held for good."""
    fake = FakeBus({BUS_NAME: BOXD})
    hub = await _hub(fake)
    real_call = fake.call
    answer = asyncio.Event()

    async def slow_answer(message: Message) -> Message:
        reply = await real_call(message)
        if message.member == "AddMatch":
            await answer.wait()
        return reply

    fake.call = slow_answer  # type: ignore[method-assign]
    opening = asyncio.create_task(hub.subscribe(lambda: None))
    await settled(hub)
    assert RULE in fake.rules
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    answer.set()
    await settled(hub)
    assert hub.open_streams == 0 and RULE not in fake.rules
