"""The MCP relay inside a real task: run as the task's user in its sandbox with `python -I`, it
reaches the task's broker (socket-activated by systemd) and its keys decide what the wallet
pays. Droid itself drives the relay in the Droid worker's tests."""

import json
import shutil
from pathlib import Path

import testbed
from testbed.box_api import finish, start_fake
from testbed.machine import Machine
from testbed.wallet_calls import WALLET, bookings

DRIVER = Path(testbed.__file__).with_name("mcp_drive.py")
IN_MACHINE = "/opt/boxd-test/mcp_drive.py"


def test_pays_twice_when_asked_twice_and_not_again_after_a_restart(
    machine: Machine, token: str
) -> None:
    target = machine.root / IN_MACHINE.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(DRIVER, target)
    target.chmod(0o644)
    task = start_fake(
        machine,
        token,
        f"sh /usr/lib/boxd/venv/bin/python {IN_MACHINE}",
        tools=WALLET,
        budgetCents=100,
    )
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    answers = json.loads(ended["steps"][0]["text"])
    assert [error for error, _ in answers] == [False, False, False]
    first, second, resumed = (json.loads(text)["booking"] for _, text in answers)
    assert first.startswith("mcp.wallet__pay.") and first.endswith(".0")
    assert second == first[:-1] + "1"
    assert resumed == first
    assert bookings(machine, task["id"]) == sorted([(first, 30), (second, 30)])
    assert ended["costCents"] == 60
