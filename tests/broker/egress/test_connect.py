import asyncio
import errno
import socket
from collections.abc import Iterator
from contextlib import closing, contextmanager

import pytest

from boxd.broker.egress import dial as egress_dial
from boxd.broker.egress.connect import connect
from boxd.broker.egress.dial import Dialer, Unreachable
from boxd.broker.egress.pipe import FirstWords, tcp_socket
from boxd.net.egress_target import parse_authority
from boxd.net.host_rules import HostRules
from tests.support.egress_fixtures import LOOPBACK, loopback_allowed, no_own_addresses, resolver_to


@contextmanager
def listening() -> Iterator[tuple[str, int]]:
    with closing(socket.socket()) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()


def unused_port() -> tuple[str, int]:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        host, port = sock.getsockname()
        return str(host), int(port)


async def test_what_follows_the_connection_runs_before_the_waiting_coroutine_wakes() -> None:
    loop = asyncio.get_running_loop()
    events: list[str] = []

    def on_open() -> None:
        events.append("open")
        loop.call_soon(events.append, "a turn later")

    with listening() as address, closing(tcp_socket(socket.socket())) as sock:
        await connect(sock, address, on_open)
        events.append("resumed")
        assert sock.getpeername() == address
    # A loopback connect is still in progress when connect(2) returns: the readiness callback
    # made it, and told on_open before the coroutine's own wake-up was even queued.
    assert events == ["open", "a turn later", "resumed"]


async def test_a_refused_connection_raises_its_errno_and_tells_nobody() -> None:
    loop = asyncio.get_running_loop()
    told: list[str] = []
    with closing(tcp_socket(socket.socket())) as sock:
        with pytest.raises(ConnectionRefusedError) as refused:
            await connect(sock, unused_port(), lambda: told.append("open"))
        assert refused.value.errno == errno.ECONNREFUSED
        assert not loop.remove_writer(sock.fileno())
    assert told == []


async def test_a_failing_on_open_fails_the_connect_rather_than_leave_it_waiting() -> None:
    def on_open() -> None:
        raise RuntimeError("a bug in what follows")

    with listening() as address, closing(tcp_socket(socket.socket())) as sock:
        async with asyncio.timeout(5):
            with pytest.raises(RuntimeError, match="a bug in what follows"):
                await connect(sock, address, on_open)


def dialer() -> Dialer:
    resolve = resolver_to({"example.com": [LOOPBACK]})
    return Dialer(HostRules(["example.com"]), resolve, no_own_addresses, loopback_allowed)


async def test_a_connection_made_as_its_time_ran_out_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Told open in the very turn the timeout fired: the task already has its 200, so the
    tunnel must not be answered with a 504 after it."""

    async def made_then_timed_out(
        sock: socket.socket, address: tuple[str, int], on_open: object
    ) -> None:
        assert callable(on_open)
        on_open()
        raise TimeoutError

    monkeypatch.setattr(egress_dial, "connect", made_then_timed_out)
    told: list[str] = []
    sock = await dialer().open(parse_authority("example.com:9"), lambda: told.append("open"))
    sock.close()
    assert told == ["open"]


async def test_a_connection_that_timed_out_unmade_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def timed_out(sock: socket.socket, address: tuple[str, int], on_open: object) -> None:
        raise TimeoutError

    monkeypatch.setattr(egress_dial, "connect", timed_out)
    with pytest.raises(Unreachable, match="did not answer within") as failure:
        await dialer().open(parse_authority("example.com:9"), lambda: None)
    assert failure.value.code == errno.ETIMEDOUT


def test_first_words_a_full_socket_does_not_take_stay_for_the_pipe() -> None:
    task, other = socket.socketpair()
    with closing(task), closing(other):
        task.setblocking(False)
        while True:
            try:
                task.send(b"x" * 65536)
            except BlockingIOError:
                break
        told = FirstWords(task, b"HTTP/1.1 200 Connection established\r\n\r\n")
        told.send()
        assert told.unsent == b"HTTP/1.1 200 Connection established\r\n\r\n"


def test_first_words_to_a_task_that_hung_up_stay_and_raise_nothing() -> None:
    task, other = socket.socketpair()
    with closing(task):
        other.close()
        told = FirstWords(task, b"\x05\x00")
        told.send()
        assert told.unsent == b"\x05\x00"


def test_first_words_sent_at_once_leave_nothing() -> None:
    task, other = socket.socketpair()
    with closing(task), closing(other):
        told = FirstWords(task, b"\x05\x00\x00")
        told.send()
        assert told.unsent == b""
        assert other.recv(16) == b"\x05\x00\x00"
