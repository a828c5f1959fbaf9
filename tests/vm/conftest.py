"""Fixtures for tests that need a real systemd: one machine per session with boxd installed."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from testbed.box_api import busctl_call, busctl_result
from testbed.folders import owner_token  # noqa: F401  (a fixture several modules ask for)
from testbed.machine import Machine, MachineError, booted_box
from testbed.screen_driver import screen  # noqa: F401  (a fixture several modules ask for)

VM_TESTS = Path(__file__).resolve().parent
OWNER = "owner"
# How long a test waits for a boxd that a test before it killed to be up again.
BOXD_BACK_SECONDS = 120


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(
        reason="tests/vm boots systemd-nspawn machines and mounts file systems: run as root"
    )
    for item in items:
        if VM_TESTS in Path(item.path).resolve().parents:
            item.add_marker(skip)


# Seconds spent per test module (setup, call and teardown, so a module's own machine counts where
# it is booted): printed at the end, to show where the VM suite's time goes (docs/testing.md).
_SECONDS_BY_MODULE: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.partition("::")[0]
    _SECONDS_BY_MODULE[module] = _SECONDS_BY_MODULE.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS_BY_MODULE:
        return
    total = sum(_SECONDS_BY_MODULE.values())
    terminalreporter.section(f"where the VM suite's {total:.0f} s went, by module")
    ranked = sorted(_SECONDS_BY_MODULE.items(), key=lambda item: item[1], reverse=True)
    for module, seconds in ranked[:20]:
        terminalreporter.write_line(f"{seconds:7.1f} s {seconds / total:6.1%}  {module}")
    rest = ranked[20:]
    if rest:
        seconds = sum(seconds for _, seconds in rest)
        terminalreporter.write_line(
            f"{seconds:7.1f} s {seconds / total:6.1%}  the other {len(rest)} modules"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        # A failed assertion about the box is usually explained by what its units logged.
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            if isinstance(value, Machine) and value.running:
                try:
                    journal = value.journal(200)
                except MachineError as e:
                    journal = f"could not read the journal: {e}"
                report.sections.append((f"journal of machine {value.name}", journal))
    return report


@pytest.fixture(scope="session")
def machine() -> Iterator[Machine]:
    yield from booted_box()


@pytest.fixture(scope="module")
def owner(machine: Machine) -> str:
    """The name of a Linux user in the machine who owns the box (group boxd-owner); of the
    module's own machine where it has one."""
    if machine.run("id", OWNER, check=False).returncode != 0:
        machine.run("useradd", "-m", "-G", "boxd-owner", OWNER)
    return OWNER


@pytest.fixture
def token(machine: Machine) -> str:
    """A new API token, made by root once boxd is up: a test before may have killed it, and
    systemd starts it again in its own time (RestartSec, recovery). Asked over D-Bus with busctl,
    as `boxctl token create` asks it (CreateToken "owner" "owner" "{}"): in about 0.03 s, where
    boxctl's Python takes 0.4 s to start, for each of some 265 tests (tests that are about
    boxctl's own token commands run boxctl)."""
    machine.run(
        "timeout",
        str(BOXD_BACK_SECONDS),
        "sh",
        "-c",
        "until systemctl is-active -q boxd.service; do sleep 0.05; done",
        timeout=BOXD_BACK_SECONDS + 10,
    )
    made = busctl_result(busctl_call(machine, "CreateToken", "owner", "owner", "{}"))
    assert isinstance(made, str) and made.startswith("box_"), made
    return made
