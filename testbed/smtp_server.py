"""A real SMTP server (aiosmtpd) that VM tests run inside the test machine, from the tests' own
venv (`image.TEST_VENV`), as a `Type=notify` service:

    smtp_server.py PORT USER PASSWORD_FILE INBOX

It listens on 127.0.0.1 only, offers AUTH without TLS (aiosmtpd's `auth_require_tls=False`),
takes mail only after a login as USER with the password in PASSWORD_FILE, and appends each
message to INBOX as one JSON line: the login, the envelope and the message as received.
"""

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


class Inbox:
    def __init__(self, user: str, password: str, path: Path) -> None:
        self.user = user
        self.password = password
        self.path = path
        self.lock = threading.Lock()

    def authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        login = cast(LoginPassword, data)
        if (login.login, login.password) != (self.user.encode(), self.password.encode()):
            return AuthResult(success=False, handled=False)
        return AuthResult(success=True, auth_data=login.login.decode())

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        record = {
            "login": session.auth_data,
            "from": envelope.mail_from,
            "to": envelope.rcpt_tos,
            "message": cast(bytes, envelope.original_content).decode(errors="replace"),
        }
        with self.lock, self.path.open("a") as inbox:
            inbox.write(json.dumps(record) + "\n")
        return "250 Message accepted"


def main() -> None:
    port, user, password_file, inbox_file = sys.argv[1:5]
    inbox = Inbox(user, Path(password_file).read_text(), Path(inbox_file))
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=int(port),
        authenticator=inbox.authenticate,
        auth_required=True,
        auth_require_tls=False,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    controller.start()
    # Its unit is started with NotifyAccess=all: the message comes from systemd-notify.
    subprocess.run(["systemd-notify", "--ready"], check=True)
    stop.wait()
    controller.stop()


if __name__ == "__main__":
    main()
