"""The npm registry as boxd-droid-install.service meets it in a test machine: a stand-in served
from the host's cached package (npm_registry_server.py), and a drop-in pointing
BOX_NPM_REGISTRY at it. Without it, a test machine has no network and the install that boxd
starts at boot fails at once, quietly: most tests never run Droid and never pay for unpacking
its 254 MB.

    install_droid(machine)   # Droid installed in the machine, the way boxd installs it
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from boxd.droid.release import droid_binary

from .box_api import boxctl
from .droid_cache import MACHINE_DIR
from .machine import Machine

PORT = 4873
ADDRESS = f"http://127.0.0.1:{PORT}"
UNIT = "npm-registry-test.service"
INSTALL_UNIT = "boxd-droid-install.service"
DROP_IN = f"/etc/systemd/system/{INSTALL_UNIT}.d/test-registry.conf"
SERVER_DIR = "/run/npm-registry-test"


class NpmRegistry:
    """The stand-in in one machine. Steer it with `mode`, then `release` what it holds."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.drop_in = DROP_IN

    def start(
        self, serve: str = "good", hold: bool = False, unit: str = INSTALL_UNIT
    ) -> NpmRegistry:
        self.drop_in = f"/etc/systemd/system/{unit}.d/test-registry.conf"
        folder = self.machine.root / SERVER_DIR.lstrip("/")
        folder.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(Path(__file__).with_name("npm_registry_server.py"), folder / "server.py")
        if self.machine.run("systemctl", "is-active", UNIT, check=False).returncode != 0:
            self.machine.run("systemctl", "reset-failed", UNIT, check=False)
            self.machine.run(
                "systemd-run",
                f"--unit={UNIT}",
                "--property=Type=notify",
                "--property=NotifyAccess=all",
                "python3",
                f"{SERVER_DIR}/server.py",
                str(PORT),
                MACHINE_DIR,
            )
        self.mode(serve, hold)
        drop_in = self.machine.root / self.drop_in.lstrip("/")
        drop_in.parent.mkdir(exist_ok=True)
        drop_in.write_text(f"[Service]\nEnvironment=BOX_NPM_REGISTRY={ADDRESS}\n")
        self.machine.run("systemctl", "daemon-reload")
        return self

    def stop(self) -> None:
        (self.machine.root / self.drop_in.lstrip("/")).unlink(missing_ok=True)
        self.machine.run("systemctl", "daemon-reload")
        self.release()
        self.machine.run("systemctl", "stop", UNIT, check=False)

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        argv = ["curl", "-sS", "--fail", "-X", method, f"{ADDRESS}/-/test/{path}"]
        if body is not None:
            argv += ["--data-binary", json.dumps(body)]
        return json.loads(self.machine.run(*argv).stdout)

    def mode(self, serve: str, hold: bool = False) -> None:
        """serve: good, wrong (another package of the same name) or missing (404)."""
        self._control("POST", "mode", {"serve": serve, "hold": hold})

    def release(self) -> None:
        if self.machine.run("systemctl", "is-active", UNIT, check=False).returncode == 0:
            self._control("POST", "release", {})

    def state(self) -> dict[str, Any]:
        found = self._control("GET", "state")
        assert isinstance(found, dict)
        return found

    def wait_until_held(self, timeout: float = 30) -> None:
        """Until the install's download has reached the stand-in and waits there."""
        deadline = time.monotonic() + timeout
        while self.state()["waiting"] < 1:
            assert time.monotonic() < deadline, "the install never asked for the package"
            time.sleep(0.05)


def droid_state(machine: Machine) -> dict[str, Any]:
    found = json.loads(boxctl(machine, "droid", "--json").stdout)
    assert isinstance(found, dict)
    return found


def wait_for_droid(machine: Machine, timeout: float = 120) -> dict[str, Any]:
    """Until boxd says the install is over, one way or the other; returns what it says."""
    deadline = time.monotonic() + timeout
    while (state := droid_state(machine))["installing"]:
        assert time.monotonic() < deadline, f"Droid still installing after {timeout:g} s"
        time.sleep(0.1)
    return state


def restart_boxd(machine: Machine) -> None:
    """boxd's next start, which tries the install again if Droid is missing."""
    machine.run("systemctl", "restart", "boxd.service")


def install_droid(machine: Machine) -> None:
    """Droid installed in the machine by boxd's own unit, from the host's cache; a few seconds.
    Restarts boxd if Droid was missing (tasks run on in their own units meanwhile)."""
    there = machine.run("test", "-x", str(droid_binary()), check=False).returncode == 0
    if there and droid_state(machine)["installed"]:
        return
    registry = NpmRegistry(machine).start()
    try:
        restart_boxd(machine)
        state = wait_for_droid(machine)
        assert state["installed"], state
        machine.run("test", "-x", str(droid_binary()))
    finally:
        registry.stop()
