import asyncio

from boxd.broker.egress.http_proxy import tunnel_reason
from boxd.broker.egress.proxies import Egress
from boxd.broker.egress.proxy_request import parse_request
from boxd.doors.connection_limits import TURNED_AWAY
from boxd.net.egress_target import IPAddress
from tests.support.egress_fixtures import LOOPBACK, echo, egress, free_port, listening, server


async def ask(port: int, request: bytes, then: bytes = b"") -> tuple[bytes, bytes]:
    """Sends a request to the proxy; returns the answer's head and whatever follows it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if then:
            writer.write(then)
            writer.write_eof()
        rest = await asyncio.wait_for(reader.read(), 10)
        return head, rest
    finally:
        writer.close()
        await writer.wait_closed()


def connect(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


async def test_connect_tunnels_bytes_both_ways() -> None:
    async with server(echo) as origin, egress(["example.com"]) as proxy:
        head, rest = await ask(proxy.port, connect(f"example.com:{origin}"), then=b"hello")
    assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
    # "bye" comes after the end of stream, so the half-close went through too.
    assert rest == b"hellobye"
    assert proxy.refusals == []


async def test_bytes_sent_with_the_connect_are_not_lost() -> None:
    async with server(echo) as origin, egress(["example.com"]) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(connect(f"example.com:{origin}") + b"early")
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nearlybye"


async def test_a_megabyte_each_way() -> None:
    payload = bytes(range(256)) * 4096
    async with server(echo) as origin, egress(["example.com"]) as proxy:
        _head, rest = await ask(proxy.port, connect(f"example.com:{origin}"), then=payload)
    assert rest == payload + b"bye"


async def test_plain_http_goes_to_the_origin_in_origin_form() -> None:
    seen: list[bytes] = []

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.readexactly(4)
        seen.append(head + body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()

    async with server(origin) as port, egress(["example.com"]) as proxy:
        request = (
            f"POST http://example.com:{port}/path?q=1#frag HTTP/1.1\r\n"
            f"Host: example.com:{port}\r\n"
            "Proxy-Authorization: Basic c2VjcmV0\r\n"
            "Proxy-Connection: keep-alive\r\n"
            "Connection: keep-alive, X-Hop\r\n"
            "X-Hop: 1\r\n"
            "Content-Length: 4\r\n"
            "User-Agent: test\r\n\r\nbody"
        ).encode()
        head, rest = await ask(proxy.port, request)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest == b"ok"
    assert seen == [
        (
            "POST /path?q=1 HTTP/1.1\r\n"
            f"Host: example.com:{port}\r\n"
            "Content-Length: 4\r\n"
            "User-Agent: test\r\n"
            "Connection: close\r\n\r\nbody"
        ).encode()
    ]


async def refused(
    hosts: list[str],
    request: bytes,
    *,
    production_check: bool = False,
    own: set[IPAddress] | None = None,
) -> tuple[bytes, list[str]]:
    """The body of the proxy's 403 answer, and the refusal it reported."""
    async with egress(hosts, production_check=production_check, own=own) as proxy:
        head, body = await ask(proxy.port, request)
    assert b"Content-Type: text/plain; charset=utf-8\r\n" in head
    assert len(proxy.refusals) == 1
    target, reason = proxy.refusals[0]
    assert body.decode() == f"boxd refused {target}: {reason}\n"
    status_line = head.split(b"\r\n", 1)[0].decode()
    if request.startswith(b"CONNECT "):
        # A client shows a refused tunnel by its status line alone: the words are there too.
        assert status_line == f"HTTP/1.1 403 {tunnel_reason(403, body.decode().strip())}"
        assert status_line.startswith(f"HTTP/1.1 403 Forbidden: boxd refused {target}: ")
    else:
        assert status_line == "HTTP/1.1 403 Forbidden", head
    return body, [target, reason]


async def test_an_unlisted_host_gets_403_with_the_reason() -> None:
    body, refusal = await refused(["example.com"], connect("other.example.org:443"))
    assert body == b"boxd refused other.example.org:443: it is not in this task's hosts\n"
    assert refusal == ["other.example.org:443", "it is not in this task's hosts"]


async def test_plain_http_to_an_unlisted_host_gets_403() -> None:
    request = b"GET http://other.example.org/ HTTP/1.1\r\nHost: other.example.org\r\n\r\n"
    body, _ = await refused(["example.com"], request)
    assert body == b"boxd refused other.example.org:80: it is not in this task's hosts\n"


async def test_a_name_with_a_port_allows_only_that_port() -> None:
    async with server(echo) as origin, egress([f"example.com:{origin}"]) as proxy:
        head, rest = await ask(proxy.port, connect(f"example.com:{origin}"), then=b"x")
    assert head.startswith(b"HTTP/1.1 200")
    assert rest == b"xbye"
    body, _ = await refused([f"example.com:{origin}"], connect("example.com:443"))
    assert body.endswith(f"allow example.com on port {origin} only\n".encode())


async def test_a_wildcard_allows_subdomains_only() -> None:
    async with server(echo) as origin, egress(["*.example.com"]) as proxy:
        for name in ("a.example.com", "b.a.example.com"):
            head, rest = await ask(proxy.port, connect(f"{name}:{origin}"), then=b"x")
            assert head.startswith(b"HTTP/1.1 200"), name
            assert rest == b"xbye"
    body, _ = await refused(["*.example.com"], connect(f"example.com:{origin}"))
    assert body.endswith(b"it is not in this task's hosts\n")


async def test_ip_literals_are_refused_unless_listed() -> None:
    body, _ = await refused(["example.com"], connect("93.184.216.34:443"))
    assert body == (
        b"boxd refused 93.184.216.34:443: "
        b"it is an IP address, and this task's hosts do not list that address\n"
    )
    body, _ = await refused(["example.com"], connect("[2001:db8::1]:443"))
    assert body.startswith(b"boxd refused [2001:db8::1]:443: it is an IP address")
    body, _ = await refused(["example.com"], b"GET http://[2001:db8::1]/ HTTP/1.1\r\n\r\n")
    assert body.startswith(b"boxd refused [2001:db8::1]:80: it is an IP address")


async def test_a_name_resolving_to_loopback_is_refused_with_the_production_check() -> None:
    _body, refusal = await refused(
        ["example.com"], connect("example.com:443"), production_check=True
    )
    assert refusal == [
        "example.com:443",
        "example.com resolves to 127.0.0.1, a loopback address: tasks never reach the box itself",
    ]


async def test_a_name_resolving_to_the_box_own_address_is_refused() -> None:
    _body, refusal = await refused(["example.com"], connect("example.com:443"), own={LOOPBACK})
    assert "this box's own address" in refusal[1]


async def test_low_autonomy_reaches_nothing() -> None:
    body, _ = await refused([], connect("example.com:443"))
    assert body.endswith(b"this task may not reach the network: its hosts list is empty\n")


async def answer_to(request: bytes, hosts: list[str] | None = None) -> tuple[bytes, bytes]:
    async with egress(hosts or ["example.com"]) as proxy:
        head, body = await ask(proxy.port, request)
    assert proxy.refusals == []
    return head, body


async def test_bad_requests_get_400_in_plain_words() -> None:
    head, body = await answer_to(b"GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert body == (
        b"boxd's proxy cannot serve this: '/index.html' is a path alone; this is the task's "
        b"egress proxy: send CONNECT host:port, or a request with a full http:// URL, like "
        b"GET http://example.com/ HTTP/1.1\n"
    )
    head, body = await answer_to(b"GET https://example.com/ HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"is https: send CONNECT host:443 and speak TLS" in body
    head, body = await answer_to(b"CONNECT example.com HTTP/1.1\r\n\r\n")
    assert b"'example.com' needs a port, like example.com:443" in body
    head, body = await answer_to(b"hello\r\n\r\n")
    assert b"'hello' is not an HTTP request line" in body
    head, body = await answer_to(b"GET http://example.com/ HTTP/1.1\r\nno colon\r\n\r\n")
    assert b"the header line 'no colon' is not a header" in body
    head, body = await answer_to(b"GET http://example.com/a\rX: y HTTP/1.1\r\n\r\n")
    assert b"the request head has control characters in it" in body
    head, body = await answer_to(b"GET http://u:p@example.com/ HTTP/1.1\r\n\r\n")
    assert b"a user name or password in the URL is not passed on" in body


async def test_a_huge_head_is_cut_off() -> None:
    request = b"GET http://example.com/ HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    head, body = await answer_to(request)
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert body == b"boxd's proxy cannot serve this: the request head is over 64 KiB\n"
    many = b"".join(b"X-H%d: %s\r\n" % (n, b"b" * 100) for n in range(1000))
    head, _ = await answer_to(b"GET http://example.com/ HTTP/1.1\r\n" + many + b"\r\n")
    assert head.startswith(b"HTTP/1.1 431")


async def test_an_allowed_target_that_does_not_answer_gets_502() -> None:
    port = await free_port()
    head, body = await answer_to(connect(f"example.com:{port}"))
    assert head.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert body == (f"boxd could not connect to example.com:{port}: connection refused\n").encode()
    head, body = await answer_to(connect("nowhere.example.com:443"), ["*.example.com"])
    assert body == (
        b"boxd could not connect to nowhere.example.com:443: "
        b"nowhere.example.com cannot be looked up: name or service not known\n"
    )


def test_forwarded_head_drops_what_the_connection_named() -> None:
    request = parse_request(
        ["GET http://example.com HTTP/1.0", "Connection: Foo", "Foo: 1", "Accept: */*"]
    )
    assert request.forward_head() == (
        b"GET / HTTP/1.0\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


async def test_closing_the_egress_ends_open_tunnels() -> None:
    async with server(echo) as origin, egress(["example.com"]) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(connect(f"example.com:{origin}"))
        await reader.readuntil(b"\r\n\r\n")
    # The egress closed while the tunnel was open: the task's side sees the end of stream.
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_connections_over_the_limit_get_503() -> None:
    async with server(echo) as origin, egress(["example.com"]) as proxy:
        proxy.egress.max_connections = 1
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(connect(f"example.com:{origin}"))
        await reader.readuntil(b"\r\n\r\n")
        head, body = await ask(proxy.port, connect(f"example.com:{origin}"))
        writer.close()
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert body == b"boxd's proxy has 1 connections of this task open, its most; close some\n"


async def test_connections_over_the_limit_are_turned_away_a_few_at_a_time() -> None:
    """A task at its cap that keeps connecting: each connection turned away was held while it
    was told so, without bound, so a task connecting fast enough took its broker past
    LimitNOFILE, and every door of the broker stopped accepting (found by an attacker's
    review). Beyond TURNED_AWAY being told at once, a connection is closed as it comes."""
    async with server(echo) as origin, egress(["example.com"]) as proxy:
        proxy.egress.max_connections = 1
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(connect(f"example.com:{origin}"))
        await reader.readuntil(b"\r\n\r\n")
        crowd = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(192)]

        async def closed_at_once(crowd_reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(crowd_reader.read(), 2) == b""
            except TimeoutError:
                return False  # still being told, as the first TURNED_AWAY are

        closed = await asyncio.gather(*(closed_at_once(r) for r, _ in crowd))
        assert proxy.egress.open_connections <= 1 + TURNED_AWAY
        assert sum(closed) >= len(crowd) - TURNED_AWAY
        for _, crowd_writer in crowd:
            crowd_writer.close()
        # The tunnel within the cap still works.
        writer.write(b"still here")
        assert await reader.readexactly(10) == b"still here"
        writer.close()


async def test_a_refused_request_with_a_body_still_reads_its_403() -> None:
    # Unread bytes at close would make the kernel reset the connection over the answer.
    body = b"x" * 200_000
    request = (
        b"POST http://other.example.org/upload HTTP/1.1\r\nHost: other.example.org\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    answer, _ = await refused(["example.com"], request)
    assert answer == b"boxd refused other.example.org:80: it is not in this task's hosts\n"


async def test_a_refusal_that_cannot_be_logged_is_still_answered() -> None:
    async def broken(target: str, reason: str) -> None:
        raise RuntimeError("the manager is away")

    proxy = Egress(["example.com"], broken)
    sock = listening()
    await proxy.serve_http(sock)
    try:
        head, body = await ask(sock.getsockname()[1], connect("other.example.org:443"))
    finally:
        await proxy.close()
    assert head.startswith(
        b"HTTP/1.1 403 Forbidden: boxd refused other.example.org:443: it is not in this task's "
        b"hosts\r\n"
    )
    assert body == b"boxd refused other.example.org:443: it is not in this task's hosts\n"


def test_a_tunnel_s_reason_phrase_holds_printable_ascii_only() -> None:
    assert tunnel_reason(403, "boxd refused b\u00fccher.example:443: no\r\nX: y") == (
        "Forbidden: boxd refused b?cher.example:443: no??X: y"
    )


async def test_a_refused_tunnel_s_status_line_is_one_short_line_whatever_the_host() -> None:
    """The task writes the host a refused CONNECT's status line repeats: bytes of any kind, and
    as many as the head holds, make one line of printable ASCII, of a bounded length."""
    for host in ("b\xfccher\x7f.example", "a" * 60_000, "x\x00y", "[::1"):
        request = b"CONNECT " + host.encode("latin-1") + b":443 HTTP/1.1\r\n\r\n"
        async with egress(["example.com"]) as proxy:
            head, _ = await ask(proxy.port, request)
        status_line, rest = head.split(b"\r\n", 1)
        assert all(0x20 <= byte <= 0x7E for byte in status_line), status_line
        assert len(status_line) < 1024, len(status_line)
        assert rest.startswith(b"Content-Type: text/plain; charset=utf-8\r\n"), head


async def test_a_port_of_digits_that_are_not_ascii_gets_400() -> None:
    """Latin-1's superscript digits are digits to str.isdigit but not to int(): the head, read
    as Latin-1, must not make the proxy fail without an answer (and log a traceback a task
    could repeat at will)."""
    for port in (b"\xb2", b"4\xb3", b"\xb9"):
        head, body = await answer_to(b"CONNECT example.com:" + port + b" HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), head
        assert b"a port that is not a number from 1 to 65535" in body, body
        head, body = await answer_to(b"GET http://example.com:" + port + b"/ HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), head


async def test_a_connection_closed_before_asking_gets_no_answer() -> None:
    async with egress(["example.com"]) as proxy:
        for sent in (b"", b"GET http://example.com/ HTTP/1.1\r\nHost: x"):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(sent)
            writer.write_eof()
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            if not sent:
                assert answer == b""
    assert answer.startswith(b"HTTP/1.1 400")
    assert answer.endswith(b"the connection closed in the middle of the request\n")
