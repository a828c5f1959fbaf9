"""A session of the owner's screen in a machine, as the page gets it from `boxctl open`'s link."""

import json
import re
from typing import Any

from boxd.web.screen_session import SESSION_PATH
from testbed.box_api import API, boxctl
from testbed.machine import Machine

LINK = re.compile(r"^http://127\.0\.0\.1:7700/#login=(\S+)$", re.MULTILINE)


def _code(machine: Machine, owner: str) -> str:
    """The one-time code of the link `boxctl open` prints (after #login=)."""
    printed = boxctl(machine, "open", user=owner).stdout
    found = LINK.search(printed)
    assert found is not None, printed
    return found.group(1)


def _trade(machine: Machine, code: str) -> tuple[int, str, Any]:
    """Status, headers and answer of the page's POST /api/session, as curl sends it."""
    done = machine.run(
        "curl",
        "-sS",
        "-D",
        "-",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        "@-",
        f"{API}{SESSION_PATH}",
        input=json.dumps({"code": code}),
    )
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    return int(head.split()[1]), head.lower(), json.loads(body)


def session(machine: Machine, owner: str) -> str:
    """A new session of the screen, as the page gets it from `boxctl open`'s link."""
    status, _, answer = _trade(machine, _code(machine, owner))
    assert status == 201, answer
    return str(answer["session"])
