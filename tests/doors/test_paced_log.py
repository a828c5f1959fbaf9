"""PacedLog: a line a task can cause without end is logged at most once a minute, with a count."""

import asyncio
import logging

import pytest

from boxd.doors.paced_log import PacedLog

log = logging.getLogger("tests.paced")


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == log.name]


async def test_the_first_is_said_at_once_and_the_rest_counted_after_the_pace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    paced = PacedLog(log, logging.INFO, seconds=0.05)
    for _ in range(5):
        paced.say("closed")
    paced.say("refused")
    assert _said(caplog) == ["closed"]
    # The timer is due before this sleep ends, so it has run when the sleep returns.
    await asyncio.sleep(0.2)
    assert _said(caplog) == [
        "closed",
        "closed (4 more since the last such line)",
        "refused (1 more since the last such line)",
    ]
    # Nothing waits: no line is logged for nothing.
    await asyncio.sleep(0.2)
    assert len(_said(caplog)) == 3
    # A pace after the last line, the next is said at once again.
    paced.say("closed")
    assert _said(caplog)[3:] == ["closed"]
    paced.close()


async def test_what_waits_is_said_when_it_closes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=log.name)
    paced = PacedLog(log, logging.INFO)
    for _ in range(3):
        paced.say("closed")
    paced.close()
    assert _said(caplog) == ["closed", "closed (2 more since the last such line)"]
