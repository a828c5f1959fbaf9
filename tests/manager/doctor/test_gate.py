"""The manager's doctor: no task starts while a check that blocks fails, those who ask before
the first checks answered wait for them, and checks that pass again let the queue go."""

import asyncio

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.doctor.gate import Doctor
from boxd.wire.doctor import NO_TASK_STARTS, Finding, failed, passed

NO_BPF = failed("IPAddressDeny (BPF)", "not enforced.", "allow bpf().", blocks=True)
NO_DROID = failed("Droid", "not installed.", "wait.", blocks=False)


class Machine:
    """Checks that answer what the test sets, counting the runs; `hold` keeps them running."""

    def __init__(self, *findings: Finding) -> None:
        self.findings = list(findings)
        self.runs = 0
        self.hold = asyncio.Event()
        self.hold.set()
        # Set as a run begins.
        self.began = asyncio.Event()

    async def __call__(self) -> list[Finding]:
        self.runs += 1
        self.began.set()
        # What the machine is as the checks begin is what they find.
        found = list(self.findings)
        await self.hold.wait()
        return found


def _doctor(machine: Machine, cleared: list[str]) -> Doctor:
    """A doctor that runs the checks anew each time it is asked (no least interval)."""
    return Doctor(machine, lambda: cleared.append("cleared"), min_interval=0)


class Clock:
    """A clock the test moves, and a sleep that moves it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _spaced(machine: Machine, clock: Clock) -> Doctor:
    return Doctor(machine, lambda: None, min_interval=10, clock=clock, sleep=clock.sleep)


async def test_a_start_asked_before_the_first_checks_answered_waits_for_them() -> None:
    machine = Machine(NO_BPF)
    machine.hold.clear()
    doctor = _doctor(machine, [])
    doctor.begin()
    asking = asyncio.create_task(doctor.refusal())
    await asyncio.sleep(0)
    assert not asking.done()
    machine.hold.set()
    words = await asking
    assert words is not None and words.startswith(NO_TASK_STARTS)
    assert "IPAddressDeny (BPF): not enforced. To fix it: allow bpf()." in words
    assert machine.runs == 1


async def test_a_failed_check_that_blocks_refuses_a_start_with_a_503_in_its_words() -> None:
    doctor = _doctor(Machine(NO_BPF, NO_DROID), [])
    with pytest.raises(BoxError) as refused:
        await doctor.refuse_if_failing(to_owner=True)
    assert refused.value.problem == Problem.UNAVAILABLE
    assert "IPAddressDeny (BPF)" in refused.value.message
    assert "Droid" not in refused.value.message


async def test_advice_alone_lets_tasks_start() -> None:
    doctor = _doctor(Machine(passed("overlayfs", blocks=True), NO_DROID), [])
    await doctor.refuse_if_failing(to_owner=True)
    assert await doctor.refusal() is None


async def test_checks_asked_for_at_once_run_once() -> None:
    machine = Machine(NO_DROID)
    machine.hold.clear()
    doctor = _doctor(machine, [])
    both = asyncio.gather(doctor.check_again(), doctor.check_again(), doctor.refusal())
    await asyncio.sleep(0)
    machine.hold.set()
    first, second, words = await both
    assert first == second == [NO_DROID] and words is None
    assert machine.runs == 1
    await doctor.check_again()
    assert machine.runs == 2


async def test_checks_asked_for_while_a_run_is_under_way_get_one_begun_after_they_asked() -> None:
    """The owner fixes the machine and runs boxctl doctor while a run begun before the fix (a
    page of the screen loaded) is under way: joined, it would say the fix did not work, and
    leave the queue waiting. Those who ask meanwhile share one more run, after it."""
    machine = Machine(NO_BPF)
    machine.hold.clear()
    cleared: list[str] = []
    doctor = _doctor(machine, cleared)
    before = asyncio.create_task(doctor.check_again())
    await machine.began.wait()
    fixed = [passed("IPAddressDeny (BPF)", blocks=True)]
    machine.findings = fixed
    after = asyncio.gather(doctor.check_again(), doctor.check_again())
    await asyncio.sleep(0)
    machine.hold.set()
    assert await before == [NO_BPF]
    assert list(await after) == [fixed, fixed]
    assert machine.runs == 2
    assert doctor.findings == fixed and cleared == ["cleared"]


async def test_checks_that_pass_after_a_fix_let_the_queue_go_once() -> None:
    machine = Machine(NO_BPF)
    cleared: list[str] = []
    doctor = _doctor(machine, cleared)
    assert await doctor.refusal() is not None
    machine.findings = [passed("IPAddressDeny (BPF)", blocks=True)]
    await doctor.check_again()
    assert cleared == ["cleared"] and await doctor.refusal() is None
    await doctor.check_again()
    assert cleared == ["cleared"]


async def test_a_first_pass_clears_nothing_since_no_one_was_refused() -> None:
    cleared: list[str] = []
    doctor = _doctor(Machine(NO_DROID), cleared)
    await doctor.check_again()
    assert cleared == []


async def test_checks_that_cannot_run_at_all_refuse_tasks() -> None:
    async def broken() -> list[Finding]:
        raise OSError("no system bus")

    doctor = Doctor(broken, lambda: None)
    words = await doctor.refusal()
    assert words is not None and "could not check this machine: no system bus" in words


async def test_checks_that_never_answer_refuse_tasks_in_time_saying_so() -> None:
    """A hanging check must not keep every start waiting: past the run's time it is stopped,
    and tasks are refused in words that say the checks did not answer (fail closed)."""
    stopped = asyncio.Event()

    async def hanging() -> list[Finding]:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("a check that never answers answered")

    doctor = Doctor(hanging, lambda: None, limit=0.05)
    words = await doctor.refusal()
    assert words is not None and "the checks: the check did not answer in 0.05 s" in words
    assert "journalctl -u boxd" in words
    await stopped.wait()


async def test_checks_asked_for_again_within_the_interval_answer_the_last_run_and_its_age() -> None:
    """An owner (or a paired device) asking in a loop makes no run back to back with another."""
    machine, clock = Machine(NO_DROID), Clock()
    doctor = _spaced(machine, clock)
    assert await doctor.check_again() == [NO_DROID] and doctor.age() == 0
    machine.findings = [NO_BPF]
    clock.now += 4
    for _ in range(50):
        assert await doctor.check_again() == [NO_DROID]
    assert machine.runs == 1 and doctor.age() == 4
    clock.now += 6
    assert await doctor.check_again() == [NO_BPF]
    assert machine.runs == 2 and doctor.age() == 0


async def test_checks_asked_for_during_a_run_get_the_next_begun_the_interval_after_it() -> None:
    machine, clock = Machine(NO_DROID), Clock()
    machine.hold.clear()
    doctor = _spaced(machine, clock)
    first = asyncio.create_task(doctor.check_again())
    await machine.began.wait()
    machine.findings = [NO_BPF]
    during = asyncio.gather(*(doctor.check_again() for _ in range(20)))
    await asyncio.sleep(0)
    clock.now += 3
    machine.hold.set()
    assert await first == [NO_DROID]
    assert list(await during) == [[NO_BPF]] * 20
    assert machine.runs == 2 and clock.slept == [10]
