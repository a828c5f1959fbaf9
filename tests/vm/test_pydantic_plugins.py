"""An installed distribution that declares a `pydantic` plugin, as an app could, gets no code run
by the real units: not in the manager (root), nor in the broker of a task that calls a tool. Its
module says so on stderr, which is the journal for a unit."""

import json
from collections.abc import Iterator

import pytest

from testbed.box_api import finish, start_fake
from testbed.installed_module import installed_module
from testbed.machine import Machine

PYTHON = "/usr/lib/boxd/venv/bin/python"
SAID = "spy plugin loaded as uid"
SPY = f"""
import os
import sys

print("{SAID}", os.getuid(), sys.argv, file=sys.stderr, flush=True)


class Plugin:
    def new_schema_validator(self, *args, **kwargs):
        return None, None, None


plugin = Plugin()
"""


@pytest.fixture
def spy(machine: Machine) -> Iterator[None]:
    """The spy in boxd's own environment; after, it is gone and boxd started again without it."""
    try:
        with installed_module(machine, "spy_plugin", SPY, "[pydantic]\nspy = spy_plugin:plugin\n"):
            yield
    finally:
        machine.run("systemctl", "restart", "boxd.service")


def spoken_since(machine: Machine, since: str) -> list[str]:
    journal = machine.run("journalctl", "--since", f"@{since}", "-o", "json", "--no-pager")
    lines = [json.loads(line) for line in journal.stdout.splitlines() if line.strip()]
    return [
        f"{line.get('_SYSTEMD_UNIT')}: {line['MESSAGE']}"
        for line in lines
        if isinstance(line.get("MESSAGE"), str) and SAID in line["MESSAGE"]
    ]


def test_a_pydantic_plugin_runs_in_no_boxd_unit(machine: Machine, token: str, spy: None) -> None:
    # The spy works: a Python of boxd's environment that is not boxd loads it.
    plain = machine.run(PYTHON, "-c", "import pydantic\nclass M(pydantic.BaseModel):\n x: int")
    assert SAID in plain.stderr, plain.stderr
    since = machine.run("date", "+%s").stdout.strip()
    # The manager meets the spy at its first model, as it starts.
    machine.run("systemctl", "restart", "boxd.service")
    task = start_fake(machine, token, 'call echo.say {"text": "hi"}', tools=["echo.say"])
    ended = finish(machine, task["id"])
    assert ended["state"] == "done", ended
    assert [step["text"] for step in ended["steps"]] == ['echo.say: {"text": "hi"}']
    assert spoken_since(machine, since) == []
