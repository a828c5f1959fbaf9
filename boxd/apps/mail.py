"""The mail app: sends one plain-text email through the owner's SMTP server.

The Message-ID comes from the call's idempotency key, so a message sent again after a cut-off
call carries the same id and mail clients and the owner can tell it is the same message.
"""

import asyncio
import ipaddress
import re
import smtplib
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

from boxd.reading.decimal_text import decimal
from boxd.sdk import App, Context, Tool, ToolError

DEFAULT_PORT = 587
# Port 465 speaks TLS from the first byte; plain SMTP there would just hang until the timeout.
IMPLICIT_TLS_PORT = 465
TIMEOUT_SECONDS = 30
_ADDRESS = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")
_UNSAFE_IN_ID = re.compile(r"[^A-Za-z0-9._-]")


def _address(value: str) -> str:
    if not _ADDRESS.fullmatch(value):
        raise ValueError("must be one email address like someone@example.com, without spaces")
    return value


def _one_line(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError("must be one line")
    return value


class Send(BaseModel):
    # Built on its tool's first call or GET /tools, not as the broker loads the apps.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    to: Annotated[
        StrictStr,
        Field(max_length=254, description="The recipient's email address."),
        AfterValidator(_address),
    ]
    subject: Annotated[StrictStr, Field(min_length=1, max_length=300), AfterValidator(_one_line)]
    body: Annotated[StrictStr, Field(max_length=100_000, description="Plain text.")]


@dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str | None
    password: str | None
    sender: str

    @property
    def login(self) -> str:
        return self.user or parseaddr(self.sender)[1]

    @property
    def where(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _host_port(text: str) -> tuple[str, int]:
    host, port = text.strip(), str(DEFAULT_PORT)
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        if rest:
            port = rest.removeprefix(":")
    elif host.count(":") == 1:
        host, _, port = host.partition(":")
    number = decimal(port, most_digits=5)
    if not host or number is None or not 1 <= number <= 65535:
        raise ToolError(
            f"the vault's mail.server {text!r} is not host or host:port, like smtp.example.com:587;"
            " set it with boxctl vault set mail.server"
        )
    return host, int(port)


def _secret(secrets: Mapping[str, str], name: str) -> str | None:
    # A secret set with `echo ... | boxctl vault set` ends in a newline nobody meant.
    return secrets.get(name, "").rstrip("\r\n") or None


def server_from(secrets: Mapping[str, str]) -> Server:
    """Reads the mail server settings from the vault secrets the tool declared."""
    text = _secret(secrets, "mail.server")
    if text is None:
        raise ToolError("the vault has no mail.server: set it with boxctl vault set mail.server")
    host, port = _host_port(text)
    user = _secret(secrets, "mail.user")
    sender = _secret(secrets, "mail.from") or (user if user and "@" in user else None)
    return Server(
        host=host,
        port=port,
        user=user,
        password=_secret(secrets, "mail.password"),
        sender=sender or f"boxd@{socket.gethostname()}",
    )


def message_id(task_id: str, key: str) -> str:
    # The task's id too: keys are unique within a task only, and mail servers drop a second
    # message with an id they have seen.
    return f"<{_UNSAFE_IN_ID.sub('-', f'{task_id}.{key}')}@boxd>"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connect(server: Server) -> smtplib.SMTP:
    try:
        if server.port == IMPLICIT_TLS_PORT:
            return smtplib.SMTP_SSL(
                server.host,
                server.port,
                timeout=TIMEOUT_SECONDS,
                context=ssl.create_default_context(),
            )
        return smtplib.SMTP(server.host, server.port, timeout=TIMEOUT_SECONDS)
    except (smtplib.SMTPException, OSError) as error:
        raise ToolError(f"cannot reach the mail server {server.where}: {_words(error)}") from None


def _secure_and_log_in(smtp: smtplib.SMTP, server: Server) -> None:
    smtp.ehlo()
    tls = isinstance(smtp, smtplib.SMTP_SSL)
    if not tls and smtp.has_extn("starttls"):
        smtp.starttls(context=ssl.create_default_context())
        smtp.ehlo()
        tls = True
    if server.password is None:
        return
    # Without TLS anyone on the path reads the password; only a server on this machine is safe.
    if not tls and not _is_loopback(server.host):
        raise ToolError(
            f"the mail server {server.where} offers no TLS, so the box will not send it the "
            "password; use a server that offers STARTTLS, or port 465"
        )
    if not smtp.has_extn("auth"):
        raise ToolError(
            f"the mail server {server.where} does not accept a login, but the vault has "
            "mail.password; remove mail.password from the vault"
        )
    smtp.login(server.login, server.password)


def _words(error: BaseException) -> str:
    if isinstance(error, smtplib.SMTPResponseException):
        text = error.smtp_error
        said = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
        return f"{error.smtp_code} {said}".strip()
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _refusal(error: Exception, server: Server, to: str) -> ToolError:
    where = server.where
    match error:
        case smtplib.SMTPAuthenticationError():
            what = f"refused the login as {server.login!r}"
            hint = "; check mail.user and mail.password in the vault"
        case smtplib.SMTPNotSupportedError():
            # smtplib's own words say what is missing, e.g. SMTPUTF8 for a non-ASCII address.
            what, hint = "cannot take this message", ""
        case smtplib.SMTPSenderRefused():
            what, hint = f"refused the sender {server.sender!r}", "; check mail.from in the vault"
        case smtplib.SMTPRecipientsRefused():
            codes = error.recipients.get(to)
            said = f"{codes[0]} {codes[1].decode(errors='replace')}" if codes else ""
            return ToolError(f"the mail server {where} refused the address {to!r}: {said}")
        case smtplib.SMTPServerDisconnected():
            what, hint = "closed the connection", ""
        case smtplib.SMTPException():
            what, hint = "refused the message", ""
        case ssl.SSLError():
            return ToolError(f"cannot start TLS with the mail server {where}: {_words(error)}")
        case _:
            return ToolError(f"lost the connection to the mail server {where}: {_words(error)}")
    return ToolError(f"the mail server {where} {what}: {_words(error)}{hint}")


def _send(server: Server, message: EmailMessage, to: str) -> None:
    smtp = _connect(server)
    try:
        with smtp:
            _secure_and_log_in(smtp, server)
            smtp.send_message(message, from_addr=server.sender, to_addrs=[to])
    except ToolError:
        raise
    except (smtplib.SMTPException, OSError) as error:
        raise _refusal(error, server, to) from None


async def send(send: Send, ctx: Context) -> dict[str, Any]:
    server = server_from(ctx.secrets)
    message = EmailMessage()
    message["From"] = server.sender
    message["To"] = send.to
    message["Subject"] = send.subject
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = sent_id = message_id(str(ctx.task["id"]), ctx.key)
    message.set_content(send.body)
    await asyncio.to_thread(_send, server, message, send.to)
    return {"sent": True, "messageId": sent_id, "to": send.to}


app = App(
    name="mail",
    tools=(
        Tool(
            verb="send",
            description=(
                "Send a plain-text email: `to` is one address, `subject` one line, `body` the "
                "text. It goes out from the owner's mail account."
            ),
            input=Send,
            run=send,
            secrets=("mail.server", "mail.user", "mail.password", "mail.from"),
        ),
    ),
)
