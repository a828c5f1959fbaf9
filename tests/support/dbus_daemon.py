"""A private dbus-daemon (a session bus) for tests that need a real bus on any machine."""

import shutil
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def bus_address() -> Iterator[str]:
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        pytest.skip("no dbus-daemon on this machine")
    process = subprocess.Popen(
        [daemon, "--session", "--nofork", "--print-address"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        process.terminate()
        process.wait(timeout=10)
