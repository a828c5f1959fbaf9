import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session
from pydantic import ValidationError

from boxd.apps import mail
from boxd.apps.mail import Send, app, message_id, send, server_from
from boxd.sdk import Context, ToolError

USER, PASSWORD = "box", "s3cret"


@dataclass
class Inbox:
    port: int
    messages: list[tuple[Envelope, EmailMessage]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, _: list[str]
    ) -> str:
        if address.startswith("nobody@"):
            return "550 5.1.1 no such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        content = cast(bytes, envelope.original_content)
        self.messages.append((envelope, message_from_bytes(content, policy=policy.default)))
        return "250 Message accepted"

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        login = cast(LoginPassword, data)
        if (login.login, login.password) != (USER.encode(), PASSWORD.encode()):
            return AuthResult(success=False, handled=False)
        self.logins.append(login.login.decode())
        return AuthResult(success=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return cast(int, probe.getsockname()[1])


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    inbox = Inbox(port=free_port())
    # aiosmtpd refuses AUTH on a connection without TLS unless told otherwise; the box's own
    # rule (no password in clear except to this machine) is what these tests check.
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=inbox.port,
        authenticator=inbox.authenticate,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()


def context(tmp_path: Path, secrets: dict[str, str], key: str = "line.3") -> Context:
    return Context(key=key, task={"id": "t000000001"}, secrets=secrets, state_dir=tmp_path)


def vault(inbox: Inbox, **more: str) -> dict[str, str]:
    return {
        "mail.server": f"127.0.0.1:{inbox.port}",
        "mail.user": USER,
        "mail.password": PASSWORD,
        "mail.from": "box@example.com",
        **more,
    }


LETTER = Send(to="ann@example.com", subject="Your invoice", body="Hello Ann,\n\nit is paid.\n")


def test_app_declares_send() -> None:
    tool = app.tool("send")
    assert app.name == "mail"
    assert tool is not None
    assert tool.cost(LETTER) == 0
    assert tool.needs_ok is False
    assert tool.secrets == ("mail.server", "mail.user", "mail.password", "mail.from")


async def test_sends_through_a_real_smtp_server(inbox: Inbox, tmp_path: Path) -> None:
    key = "mcp.mail__send.9f3a/b c.1"
    result = await send(LETTER, context(tmp_path, vault(inbox), key=key))
    assert result == {
        "sent": True,
        "messageId": "<t000000001.mcp.mail__send.9f3a-b-c.1@boxd>",
        "to": "ann@example.com",
    }
    assert inbox.logins == [USER]
    [(envelope, message)] = inbox.messages
    assert envelope.mail_from == "box@example.com"
    assert envelope.rcpt_tos == ["ann@example.com"]
    assert message["To"] == "ann@example.com"
    assert message["From"] == "box@example.com"
    assert message["Subject"] == "Your invoice"
    assert message["Message-ID"] == "<t000000001.mcp.mail__send.9f3a-b-c.1@boxd>"
    assert message["Date"]
    # The message arrives as it went over the wire, with CRLF line ends.
    assert message.get_content().replace("\r\n", "\n") == "Hello Ann,\n\nit is paid.\n"


async def test_a_resend_carries_the_same_message_id(inbox: Inbox, tmp_path: Path) -> None:
    for _ in range(2):
        await send(LETTER, context(tmp_path, vault(inbox)))
    ids = [message["Message-ID"] for _, message in inbox.messages]
    assert ids == ["<t000000001.line.3@boxd>", "<t000000001.line.3@boxd>"]


async def test_no_login_without_a_password(inbox: Inbox, tmp_path: Path) -> None:
    secrets = {"mail.server": f"127.0.0.1:{inbox.port}", "mail.from": "box@example.com"}
    await send(LETTER, context(tmp_path, secrets))
    assert inbox.logins == []
    assert len(inbox.messages) == 1


async def test_a_wrong_password_is_refused_in_plain_words(inbox: Inbox, tmp_path: Path) -> None:
    secrets = vault(inbox, **{"mail.password": "wrong"})
    with pytest.raises(ToolError) as caught:
        await send(LETTER, context(tmp_path, secrets))
    message = str(caught.value)
    assert message.startswith(f"the mail server 127.0.0.1:{inbox.port} refused the login as 'box'")
    assert "check mail.user and mail.password" in message
    assert inbox.messages == []


async def test_a_refused_recipient_is_named(inbox: Inbox, tmp_path: Path) -> None:
    letter = Send(to="nobody@example.com", subject="Hi", body="")
    with pytest.raises(ToolError, match=r"refused the address 'nobody@example.com': 550"):
        await send(letter, context(tmp_path, vault(inbox)))


async def test_no_password_in_clear_to_another_machine(
    inbox: Inbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mail, "_is_loopback", lambda host: False)
    with pytest.raises(ToolError, match="offers no TLS, so the box will not send it the password"):
        await send(LETTER, context(tmp_path, vault(inbox)))
    assert inbox.messages == []


async def test_a_password_for_a_server_without_login(tmp_path: Path) -> None:
    inbox = Inbox(port=free_port())
    # aiosmtpd's default: no AUTH offered on a connection without TLS.
    controller = Controller(inbox, hostname="127.0.0.1", port=inbox.port)
    controller.start()
    try:
        with pytest.raises(ToolError, match="does not accept a login, but the vault has mail"):
            await send(LETTER, context(tmp_path, vault(inbox)))
    finally:
        controller.stop()
    assert inbox.messages == []


async def test_missing_server_secret(tmp_path: Path) -> None:
    with pytest.raises(ToolError) as caught:
        await send(LETTER, context(tmp_path, {"mail.password": PASSWORD}))
    assert str(caught.value) == (
        "the vault has no mail.server: set it with boxctl vault set mail.server"
    )


async def test_unreachable_server(tmp_path: Path) -> None:
    port = free_port()
    with pytest.raises(ToolError) as caught:
        await send(LETTER, context(tmp_path, {"mail.server": f"127.0.0.1:{port}"}))
    assert str(caught.value) == (
        f"cannot reach the mail server 127.0.0.1:{port}: Connection refused"
    )


async def test_a_bad_server_secret(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"mail\.server 'smtp\.example\.com:smtp' is not host"):
        await send(LETTER, context(tmp_path, {"mail.server": "smtp.example.com:smtp"}))


def test_server_defaults() -> None:
    server = server_from({"mail.server": "smtp.example.com\n", "mail.user": "me@example.com"})
    assert (server.host, server.port) == ("smtp.example.com", 587)
    assert server.sender == "me@example.com"
    assert server.password is None
    named = server_from({"mail.server": "smtp.example.com", "mail.from": "Box <box@example.com>"})
    assert (named.sender, named.login) == ("Box <box@example.com>", "box@example.com")
    six = server_from({"mail.server": "[2001:db8::1]:2525", "mail.from": "box@example.com"})
    assert (six.host, six.port, six.where) == ("2001:db8::1", 2525, "[2001:db8::1]:2525")
    assert six.user is None


def test_message_id_keeps_only_safe_characters() -> None:
    assert message_id("t1", "a.b_c-D9") == "<t1.a.b_c-D9@boxd>"
    assert message_id("t1", "x y<z>@\n") == "<t1.x-y-z---@boxd>"


@pytest.mark.parametrize(
    ("body", "name"),
    [
        ({"to": "ann example.com", "subject": "s", "body": ""}, "to"),
        ({"to": "ann@example", "subject": "s", "body": ""}, "to"),
        ({"to": "ann smith@example.com", "subject": "s", "body": ""}, "to"),
        ({"to": "ann@example.com\nBcc: eve@example.com", "subject": "s", "body": ""}, "to"),
        ({"to": "ann@example.com", "subject": "", "body": ""}, "subject"),
        ({"to": "ann@example.com", "subject": "a\r\nBcc: eve@x.org", "body": ""}, "subject"),
        ({"to": "ann@example.com", "subject": "s" * 301, "body": ""}, "subject"),
        ({"to": "ann@example.com", "subject": "s", "body": "b" * 100_001}, "body"),
        ({"to": "ann@example.com", "subject": "s"}, "body"),
        ({"to": "ann@example.com", "subject": "s", "body": "", "cc": "x"}, "cc"),
    ],
)
def test_bad_letters_are_refused_by_the_model(body: dict[str, Any], name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Send.model_validate(body)
    assert [error["loc"] for error in caught.value.errors()] == [(name,)]
