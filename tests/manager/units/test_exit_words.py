import pytest

from boxd.manager.units.exit_words import why_failed
from boxd.manager.units.systemd import UnitStatus, unit_path


def status(result: str, code: int, number: int, active: str = "failed") -> UnitStatus:
    return UnitStatus(active, "failed", result, code, number)


@pytest.mark.parametrize(
    ("unit", "words", "sentence"),
    [
        (status("exit-code", 1, 3), None, "The worker exited with status 3."),
        (
            status("exit-code", 1, 1),
            "line 2: boom",
            "The worker exited with status 1: line 2: boom",
        ),
        (status("signal", 2, 9), None, "The worker was killed by SIGKILL."),
        (status("core-dump", 3, 11), None, "The worker crashed with SIGSEGV and dumped core."),
        (status("oom-kill", 2, 9), None, "The worker ran out of memory and the kernel killed it."),
        (
            status("exit-code", 1, 217),
            None,
            "The worker could not start: its user does not exist (exit status 217).",
        ),
        (
            status("success", 0, 0, active="inactive"),
            None,
            "The worker unit was stopped from outside boxd (systemctl stop?).",
        ),
    ],
)
def test_plain_words(unit: UnitStatus, words: str | None, sentence: str) -> None:
    assert why_failed(unit, words) == sentence


def test_finished() -> None:
    assert UnitStatus("active", "exited", "success", 1, 0).finished
    assert UnitStatus("failed", "failed", "signal", 2, 9).finished
    assert not UnitStatus("active", "running", "success", 0, 0).finished
    assert not UnitStatus("activating", "start", "success", 0, 0).finished
    # Queued to start and not run yet: inactive, but not ended.
    assert not UnitStatus("inactive", "dead", "success", 0, 0, job_pending=True).finished
    assert UnitStatus("inactive", "dead", "success", 0, 0).finished


def test_judged_by_exit_not_by_active_state() -> None:
    # A worker that exits 0 before its start job completes lands inactive in spite of
    # RemainAfterExit: still a success.
    assert UnitStatus("inactive", "dead", "success", 1, 0).succeeded
    assert UnitStatus("active", "exited", "success", 1, 0).succeeded
    assert not UnitStatus("inactive", "dead", "success", 2, 15).succeeded  # systemctl stop
    assert not UnitStatus("inactive", "dead", "success", 0, 0).succeeded  # never ran
    assert not UnitStatus("failed", "failed", "exit-code", 1, 3).succeeded
    assert not UnitStatus("active", "running", "success", 0, 0).succeeded


def test_unit_path_escapes_like_systemd() -> None:
    assert unit_path("box-task-t123.service") == (
        "/org/freedesktop/systemd1/unit/box_2dtask_2dt123_2eservice"
    )
    assert unit_path("box-broker@t1.socket").endswith("box_2dbroker_40t1_2esocket")
