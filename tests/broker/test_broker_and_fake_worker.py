"""The broker's HTTP API on a real Unix socket, driven by the real fake worker.

The manager behind the broker is an in-memory log here; the real one, over D-Bus with polkit
and systemd, is exercised in tests/vm.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from boxd.broker.app import make_broker
from boxd.broker.app_link import Apps
from boxd.workers import fake
from boxd.workers.broker_client import BrokerClient, BrokerRefused
from tests.support.app_serving import sockets
from tests.support.broker_serving import serving as serving_broker
from tests.support.memory_log import MemoryLog, MemoryWaiter, serving, until


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[tuple[str, MemoryLog]]:
    log = MemoryLog("", tools=("wallet.pay", "wallet.balance"), budget=100)
    async with serving(log, tmp_path) as path:
        yield path, log


async def test_runs_every_command(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "\n".join(
        [
            "step Planning",
            "write notes/a.txt hello there",
            "sh cat notes/a.txt",
            "",
            "# a comment",
            "write b.txt x",
            "delete b.txt",
            "sleep 0.01",
        ]
    )
    await fake.run(path)
    assert [(s["text"], s["data"]["line"]) for s in log.steps] == [
        ("Planning", 1),
        ("wrote notes/a.txt", 2),
        ("hello there", 3),
        ("wrote b.txt", 6),
        ("deleted b.txt", 7),
        ("slept 0.01 s", 8),
    ]
    assert (tmp_path / "notes/a.txt").read_text() == "hello there"
    assert not (tmp_path / "b.txt").exists()


async def test_resumes_after_the_last_logged_line(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "step one\nstep two\nstep three"
    log.steps = [{"text": "one", "data": {"line": 1}}, {"text": "two", "data": {"line": 2}}]
    await fake.run(path)
    assert [s["text"] for s in log.steps] == ["one", "two", "three"]


async def test_acknowledged_steps_are_written_down_also_after_a_resume(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`acks PATH` holds for the whole script: a worker that resumes past that line still
    writes each step the broker acknowledged, after the ones its first run wrote."""
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "acks w/acks.jsonl\nstep one\nstep two\nstep three"
    log.steps = [
        {"text": "acknowledging steps in w/acks.jsonl", "data": {"line": 1}},
        {"text": "one", "data": {"line": 2}},
    ]
    (tmp_path / "w").mkdir()
    (tmp_path / "w/acks.jsonl").write_text('{"line": 2, "text": "one"}\n')
    await fake.run(path)
    written = [json.loads(line) for line in (tmp_path / "w/acks.jsonl").read_text().splitlines()]
    assert written == [
        {"line": 2, "text": "one"},
        {"line": 3, "text": "two"},
        {"line": 4, "text": "three"},
    ]
    assert [s["text"] for s in log.steps][2:] == ["two", "three"]


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("step a\nfail the disk is full", "line 2: the disk is full"),
        ("dance wildly", "line 1: unknown command 'dance'"),
        ("sh exit 3", "line 1: sh 'exit 3' exited with status 3: "),
        ("delete nowhere.txt", "line 1: delete: there is no nowhere.txt"),
        ("sleep soon", "line 1: sleep needs a number of seconds, not 'soon'"),
        ("fetch", "line 1: fetch needs a URL: fetch URL"),
        ("acks", "line 1: acks needs a path: acks PATH"),
        ("call wallet.pay {}", "line 1: input.to is missing"),
    ],
)
async def test_failures_say_which_line(
    broker: tuple[str, MemoryLog],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    message: str,
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = script
    with pytest.raises(fake.ScriptFailed) as caught:
        await fake.run(path)
    assert str(caught.value) == message


async def test_fetch_shows_the_status_and_first_bytes_and_fails_on_a_refusal(
    broker: tuple[str, MemoryLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def page(request: web.Request) -> web.Response:
        if request.path == "/refused":
            return web.Response(status=403, text="boxd refused x.example:80: not in the hosts")
        return web.Response(text="hello " + "x" * 500)

    app = web.Application()
    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    path, log = broker
    log.prompt = f"fetch http://127.0.0.1:{port}/\nfetch http://127.0.0.1:{port}/refused"
    try:
        with pytest.raises(fake.ScriptFailed) as caught:
            await fake.run(path)
    finally:
        await runner.cleanup()
    assert log.steps[0]["text"] == "200 OK: hello " + "x" * 194
    assert str(caught.value) == (
        f"line 2: fetch http://127.0.0.1:{port}/refused: 403 Forbidden: "
        "boxd refused x.example:80: not in the hosts"
    )


async def test_broker_errors_are_json(broker: tuple[str, MemoryLog]) -> None:
    path, _ = broker
    async with BrokerClient(path) as client:
        tools = await client.get("/tools")
        assert [tool["name"] for tool in tools] == ["wallet.pay", "wallet.balance"]
        assert tools[0]["input"]["required"] == ["to", "cents"]
        with pytest.raises(BrokerRefused, match=r"^text is missing$"):
            await client.post("/step", {"data": 1})
        with pytest.raises(BrokerRefused, match=r"^unknown field colour$"):
            await client.post("/step", {"text": "a", "colour": "red"})
        with pytest.raises(BrokerRefused, match="no such request: GET /nothing"):
            await client.get("/nothing")
    connector = aiohttp.UnixConnector(path=path)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post("http://box/step", data=b"{not json") as response:
            assert response.status == 400
            assert (await response.json())["error"].startswith("the body is not valid JSON")
        async with session.post("http://box/step", data=b"x" * (10 * 1024 * 1024 + 1)) as response:
            assert response.status == 413
            assert await response.json() == {"error": "the body is over 10 MB"}


PAY = {"to": "Ada", "cents": 30, "memo": "books"}


async def test_a_key_is_required_and_inputs_are_checked(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    async with BrokerClient(path) as client:
        with pytest.raises(BrokerRefused, match=r"^a key is required$"):
            await client.post("/call", {"tool": "wallet.pay", "input": PAY})
        with pytest.raises(BrokerRefused, match=r"^a key is required$"):
            await client.post("/ask", {"question": "May I?"})
        with pytest.raises(BrokerRefused, match=r"^this task may not call mail.send"):
            await client.post("/call", {"tool": "mail.send", "input": {}, "key": "k"})
        with pytest.raises(BrokerRefused, match=r"^input.cents: "):
            await client.post(
                "/call", {"tool": "wallet.pay", "key": "k", "input": {"to": "Ada", "cents": "lots"}}
            )
        with pytest.raises(BrokerRefused, match=r"^unknown field input.tip$"):
            await client.post(
                "/call", {"tool": "wallet.pay", "key": "k", "input": {**PAY, "tip": 3}}
            )
    assert log.results == []


async def test_same_key_same_result(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    async with BrokerClient(path) as client:
        first = await client.post("/call", {"tool": "wallet.pay", "input": PAY, "key": "k1"})
        again = await client.post("/call", {"tool": "wallet.pay", "input": PAY, "key": "k1"})
        balance = await client.post("/call", {"tool": "wallet.balance", "key": "b"})
    assert first["ok"] is True and again == first
    assert first["output"]["booking"] == "k1"
    assert balance["output"] == {"paidCents": 30, "payments": 1}
    assert [r["key"] for r in log.results] == ["k1", "b"]
    assert log.spent == 30


async def test_over_budget_asks_and_identical_calls_share_one_run(
    broker: tuple[str, MemoryLog],
) -> None:
    path, log = broker
    big = {"to": "Bob", "cents": 150, "memo": ""}

    async def pay(key: str) -> Any:
        async with BrokerClient(path) as client:
            return await client.post("/call", {"tool": "wallet.pay", "input": big, "key": key})

    calls = [asyncio.create_task(pay(f"k{i}")) for i in range(20)]
    await until(lambda: bool(log.approvals))
    assert list(log.approvals) == ["t000000001.k0"]
    assert "over its budget of 100 cents" in log.approvals["t000000001.k0"]["question"]
    log.decide("t000000001.k0", "approved")
    results = await asyncio.gather(*calls)
    assert all(r == results[0] for r in results) and results[0]["ok"] is True
    ran = [r for r in log.results if r.get("sharedWith") is None]
    assert [r["key"] for r in ran] == ["k0"]
    assert len(log.results) == 20 and log.spent == 150
    async with BrokerClient(path) as client:
        balance = await client.post("/call", {"tool": "wallet.balance", "key": "b"})
    assert balance["output"] == {"paidCents": 150, "payments": 1}


async def test_denied_never_runs_and_pending_stays_open(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    big = {"tool": "wallet.pay", "input": {"to": "Bob", "cents": 500}, "key": "k"}
    async with BrokerClient(path) as client:
        assert await client.post("/call", big) == {
            "ok": False,
            "pending": True,
            "error": "Waiting for the box owner to approve this spend. Call this tool again "
            "to check.",
        }
        same_input = {**big, "key": "other"}
        assert (await client.post("/call", same_input))["pending"] is True
        assert list(log.approvals) == ["t000000001.k"]
        log.decide("t000000001.k", "denied")
        assert await client.post("/call", big) == {"ok": False, "error": "not approved"}
        assert await client.post("/call", big) == {"ok": False, "error": "not approved"}
    assert [r["ok"] for r in log.results] == [False]
    assert log.spent == 0


async def test_ask_cost_and_usage(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    async with BrokerClient(path) as client:
        assert await client.post("/ask", {"question": "Send it?", "key": "q"}) == {"pending": True}
        log.decide("t000000001.q", "approved")
        assert await client.post("/ask", {"question": "Send it?", "key": "q"}) == {"approved": True}
        await client.post("/cost", {"cents": 1.25, "what": "a map"})
        usage = {
            "model": "claude-sonnet-4-6",
            "tokens": {"input": 12000, "output": 900, "cacheWrite": 0, "cacheRead": 48000},
        }
        event = await client.post("/usage", usage)
        assert event["data"]["cents"] == pytest.approx(12000 * 3e-4 + 900 * 15e-4 + 48000 * 3e-5)
        with pytest.raises(BrokerRefused, match="unknown model gpt-5"):
            await client.post("/usage", {**usage, "model": "gpt-5"})
        with pytest.raises(BrokerRefused, match=r"^cents must be a number of US cents"):
            await client.post("/cost", {"cents": -1, "what": "refund"})
    assert log.spent == pytest.approx(1.25 + 12000 * 3e-4 + 900 * 15e-4 + 48000 * 3e-5)


async def test_fake_worker_calls_asks_and_costs(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "\n".join(
        [
            'call wallet.pay {"to": "Ada", "cents": 30}',
            "cost 2 stamps",
            "usage claude-haiku-4-5 1000 100",
            "ask Shall I go on?",
        ]
    )
    worker = asyncio.create_task(fake.run(path))
    await until(lambda: "t000000001.line-4" in log.approvals)
    await asyncio.sleep(0.4)  # the worker asks again while the answer is pending
    log.decide("t000000001.line-4", "approved")
    await worker
    texts = [step["text"] for step in log.steps]
    assert texts[0].startswith('wallet.pay: {"booking": "line-1"')
    assert texts[1:] == [
        "spent 2 cents on stamps",
        "claude-haiku-4-5 usage costs 0.15 cents",
        "approved",
    ]


async def test_the_worker_times_each_answered_step_and_call(
    broker: tuple[str, MemoryLog], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, log = broker
    monkeypatch.chdir(tmp_path)
    log.prompt = "\n".join(
        ["step one", 'call wallet.pay {"to": "Ada", "cents": 3}', "# a comment", "sleep 0.5"]
    )
    trips = await fake.run(path)
    # One step per line that ran, one call per call line; the sleep is not the broker's time.
    assert [len(trips.seconds["step"]), len(trips.seconds["call"])] == [3, 1]
    assert all(0 <= seconds < 0.5 for seconds in trips.seconds["step"])
    printed = trips.line()
    assert printed.startswith(fake.ROUND_TRIPS)
    assert json.loads(printed.removeprefix(fake.ROUND_TRIPS)) == trips.seconds


def pay(to: str, cents: int, key: str) -> dict[str, Any]:
    return {"tool": "wallet.pay", "input": {"to": to, "cents": cents}, "key": key}


async def test_an_answered_question_never_authorizes_a_call(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    async with BrokerClient(path) as client:
        assert await client.post("/ask", {"question": "News?", "key": "k"}) == {"pending": True}
        question_key = r"^key k was used for a question \(POST /ask\); a call needs a key of its"
        with pytest.raises(BrokerRefused, match=question_key):
            await client.post("/call", pay("Mallory", 100_000, "k"))
        log.decide("t000000001.k", "approved")
        with pytest.raises(BrokerRefused, match=question_key):
            await client.post("/call", pay("Mallory", 100_000, "k"))
        with pytest.raises(BrokerRefused, match=r"^key k was used for another question; "):
            await client.post("/ask", {"question": "May I pay Mallory?", "key": "k"})
        assert await client.post("/ask", {"question": "News?", "key": "k"}) == {"approved": True}
        balance = await client.post("/call", {"tool": "wallet.balance", "key": "b"})
    assert balance["output"] == {"paidCents": 0, "payments": 0}
    assert list(log.calls) == ["b"] and list(log.approvals) == ["t000000001.k"]


async def test_a_key_names_one_call(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    other_input = r"^key k was used for a call of wallet.pay with another input; a new call needs"
    async with BrokerClient(path) as client:
        assert (await client.post("/call", pay("Ada", 500, "k")))["pending"] is True
        with pytest.raises(BrokerRefused, match=other_input):
            await client.post("/call", pay("Mallory", 500, "k"))
        approval = log.approvals["t000000001.k"]
        assert (approval["tool"], approval["costCents"]) == ("wallet.pay", 500)
        assert approval["question"].startswith('Spend 500 cents on wallet.pay {"to": "Ada", ')
        log.decide("t000000001.k", "approved")
        with pytest.raises(BrokerRefused, match=other_input):
            await client.post("/call", pay("Mallory", 500, "k"))
        with pytest.raises(BrokerRefused, match=r"^key k was used for a call of wallet.pay; a q"):
            await client.post("/ask", {"question": "Pay Ada?", "key": "k"})
        with pytest.raises(BrokerRefused, match=r"^key k was used for a call of wallet.pay; a n"):
            await client.post("/call", {"tool": "wallet.balance", "key": "k"})
        paid = await client.post("/call", pay("Ada", 500, "k"))
        assert paid["ok"] is True and paid["output"]["to"] == "Ada"
        # Exactly the same call again: the logged result, as the key rules say.
        assert await client.post("/call", pay("Ada", 500, "k")) == paid
        with pytest.raises(BrokerRefused, match=other_input):
            await client.post("/call", pay("Ada", 501, "k"))
    assert [r["key"] for r in log.results] == ["k"]


async def test_a_shared_key_is_claimed_before_it_shares(broker: tuple[str, MemoryLog]) -> None:
    path, log = broker
    async with BrokerClient(path) as client:
        assert await client.post("/ask", {"question": "News?", "key": "q"}) == {"pending": True}
        first = asyncio.create_task(client.post("/call", pay("Bob", 150, "k1")))
        await until(lambda: "t000000001.k1" in log.approvals)
        # The same call under a question's key shares nothing: it is refused at once.
        with pytest.raises(BrokerRefused, match=r"^key q was used for a question"):
            await client.post("/call", pay("Bob", 150, "q"))
        log.decide("t000000001.k1", "approved")
        assert (await first)["ok"] is True
    assert [r["key"] for r in log.results] == ["k1"]


async def test_calls_waiting_for_an_ok_keep_their_cost_reserved(
    broker: tuple[str, MemoryLog], tmp_path: Path
) -> None:
    path, log = broker
    async with BrokerClient(path) as client:
        assert (await client.post("/call", pay("Ada", 150, "a")))["pending"] is True
        assert (await client.post("/call", pay("Bob", 150, "b")))["pending"] is True
        assert log.approvals["t000000001.b"]["question"].endswith(
            "That takes task t000000001 to 300 cents (150 of them for calls not yet finished), "
            "over its budget of 100 cents."
        )
        # Ten cents fit the budget alone, not with the 300 that wait for the owner.
        assert (await client.post("/call", pay("Cy", 10, "c")))["pending"] is True
        assert "to 310 cents (300 of them" in log.approvals["t000000001.c"]["question"]
    # A new broker (after a restart) knows the reservations from the record alone.
    again = make_broker(log, MemoryWaiter(log), log.task, Apps(sockets(tmp_path)), 0.3)
    async with (
        serving_broker(again, tmp_path / "again.sock"),
        BrokerClient(str(tmp_path / "again.sock")) as client,
    ):
        assert (await client.post("/call", pay("Dee", 5, "d")))["pending"] is True
        assert "to 315 cents" in log.approvals["t000000001.d"]["question"]
        for key in ("a", "b"):
            log.decide(f"t000000001.{key}", "denied")
        # c asked once, so it waits for its answer though it would fit now.
        assert (await client.post("/call", pay("Cy", 10, "c")))["pending"] is True
        log.decide("t000000001.c", "approved")
        # Approved and not yet run, c still counts: 10 + 5 (d waits) + 90 > 100.
        assert (await client.post("/call", pay("Eve", 90, "e")))["pending"] is True
        assert (await client.post("/call", pay("Cy", 10, "c")))["ok"] is True
        log.decide("t000000001.e", "denied")
        assert (await client.post("/call", pay("Fay", 5, "f")))["ok"] is True
    assert [r["key"] for r in log.results] == ["c", "f"]
    assert log.spent == 15


async def test_a_call_that_came_while_the_first_ran_shares_it(
    broker: tuple[str, MemoryLog],
) -> None:
    """k2 comes while k1 runs; k1 ends while k2's key is still being claimed: k2 shares k1's
    run all the same, and Ada is paid once."""
    path, log = broker
    log.holds = {("FinishCall", "k1"): asyncio.Event(), ("BeginCall", "k2"): asyncio.Event()}
    async with BrokerClient(path) as one, BrokerClient(path) as two:
        first = asyncio.create_task(one.post("/call", pay("Ada", 30, "k1")))
        await until(lambda: ("FinishCall", "k1") in log.held)
        second = asyncio.create_task(two.post("/call", pay("Ada", 30, "k2")))
        await until(lambda: ("BeginCall", "k2") in log.held)
        log.holds[("FinishCall", "k1")].set()
        paid = await first
        log.holds[("BeginCall", "k2")].set()
        assert await second == paid
    assert [(r["key"], r.get("sharedWith")) for r in log.results] == [("k1", None), ("k2", "k1")]
    # k2 told the manager whose run it shares as it began, so the record answers it with k1's
    # result even if this broker dies before k2's own FinishCall.
    assert log.calls["k2"].get("sharesWith") == "k1" and "sharesWith" not in log.calls["k1"]
