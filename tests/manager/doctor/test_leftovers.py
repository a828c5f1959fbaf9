"""What a run of the checks cut off left goes at the next run, and only that: a trial of a
process still running (a `boxd doctor` beside the manager's) stays."""

import os
from pathlib import Path

from boxd.manager.doctor import leftovers

# Above the kernel's largest pid_max (2**22): no process has it.
GONE = 2**22 + 7


class Units:
    def __init__(self, *loaded: str) -> None:
        self.loaded = list(loaded)
        self.did: list[str] = []

    async def loaded_units(self, pattern: str) -> list[str]:
        assert pattern == "boxd-doctor-bpf-*"
        return self.loaded

    async def stop_unit(self, name: str) -> None:
        self.did.append(f"stop {name}")

    async def reset_failed(self, name: str) -> None:
        self.did.append(f"reset {name}")


def test_a_token_names_this_process() -> None:
    pid, _, random = leftovers.token().partition("-")
    assert int(pid) == os.getpid() and len(random) == 8


async def test_only_the_trials_of_processes_gone_are_cleared(tmp_path: Path) -> None:
    home, netns = tmp_path / "home", tmp_path / "netns"
    for place in (home / f".doctor-{GONE}-aa" / "view", home / f".doctor-{os.getpid()}-bb"):
        place.mkdir(parents=True)
    netns.mkdir()
    for name in (f"boxd-doctor-{GONE}-cc", f"boxd-doctor-{os.getpid()}-dd", f"box-t{GONE}"):
        (netns / name).touch()
    units = Units(f"boxd-doctor-bpf-{GONE}-ee.service", f"boxd-doctor-bpf-{os.getpid()}-ff.service")
    ran: list[tuple[str, ...]] = []

    async def command(*argv: str) -> str | None:
        ran.append(argv)
        return None

    await leftovers.clear(home, units, command, netns_dir=netns)
    assert units.did == [
        f"stop boxd-doctor-bpf-{GONE}-ee.service",
        f"reset boxd-doctor-bpf-{GONE}-ee.service",
    ]
    # The view was no mount here, so it was not unmounted, only removed.
    assert ran == [("ip", "netns", "delete", f"boxd-doctor-{GONE}-cc")]
    assert [p.name for p in home.iterdir()] == [f".doctor-{os.getpid()}-bb"]
