"""The Claude Code worker's reading of its stream: a line too long to read fails the task in
words, not with a traceback."""

import asyncio
from typing import cast

import pytest

from boxd.workers.broker_client import BrokerClient
from boxd.workers.claude.events import Events
from boxd.workers.claude.worker import MAX_EVENT_LINE, ClaudeFailed, follow
from boxd.workers.droid.worker import Steps


async def test_a_line_over_the_reader_s_limit_fails_the_task_in_words() -> None:
    stdout = asyncio.StreamReader(limit=MAX_EVENT_LINE)
    stdout.feed_data(b"x" * (MAX_EVENT_LINE + 1) + b"\n")
    stdout.feed_eof()
    steps = Steps(cast(BrokerClient, None))
    with pytest.raises(ClaudeFailed, match="event line over 64 MiB"):
        await follow(stdout, Events("m", "low", resumed=False), steps)
