"""Signals on a machine's system bus as VM tests send and hear them: a stranger's forged signal, the
manager's main PID, an ear that records what a process hears."""

import json
from pathlib import Path

from testbed.machine import Machine

PYTHON = "/usr/lib/boxd/venv/bin/python"
STRANGER_SCRIPT = Path(__file__).with_name("bus_stranger.py").read_text()


def as_stranger(machine: Machine, *args: str) -> str:
    return machine.run(PYTHON, "-c", STRANGER_SCRIPT, *args, user="nobody").stdout.strip()


def forge(machine: Machine, to: str, path: str, member: str, signature: str, body: object) -> None:
    interface, _, member = member.rpartition(".")
    as_stranger(machine, "forge", to, path, interface, member, signature, json.dumps(body))


def main_pid(machine: Machine, unit: str) -> int:
    return int(machine.run("systemctl", "show", "-p", "MainPID", "--value", unit).stdout)


class Ear:
    """A listener in the machine, as `user`, writing what it hears to a file there (a pipe
    would fill up with systemd's chatter and stop it listening)."""

    def __init__(self, machine: Machine, name: str, user: str, *argv: str) -> None:
        self.machine = machine
        self.file = f"/tmp/ear-{name}"
        machine.run("rm", "-f", self.file)
        redirect = f'exec "$@" >{self.file} 2>&1'
        self.process = machine.spawn("sh", "-c", redirect, "sh", *argv, user=user)

    def ready(self, text: str, timeout: float = 30) -> None:
        until = f"until grep -q {text} {self.file} 2>/dev/null; do sleep 0.05; done"
        self.machine.run("timeout", str(timeout), "sh", "-c", until)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def heard(self) -> str:
        self.stop()
        return self.machine.run("cat", self.file).stdout
