"""A line a task can make the broker log as often as it likes (a connection it opened past its
cap, closed), logged at most once a minute: the first at once, those after it counted and said
in one line a minute after it, with how many. So a task cannot flood the journal, and nothing it
did goes unsaid. The pace of connection_guard's line about the connections it drops."""

import asyncio
import logging
from collections import Counter

LOG_SECONDS = 60.0


class PacedLog:
    def __init__(
        self, logger: logging.Logger, level: int = logging.WARNING, seconds: float = LOG_SECONDS
    ) -> None:
        self._logger = logger
        self._level = level
        self._seconds = seconds
        self._waiting: Counter[str] = Counter()
        self._logged_at: float | None = None
        self._later: asyncio.TimerHandle | None = None

    def say(self, words: str) -> None:
        """Logs `words` now if no line was logged in the last minute; else counts them for the
        line a minute after the last."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._logged_at is None or (
            self._later is None and now - self._logged_at >= self._seconds
        ):
            self._logger.log(self._level, "%s", words)
            self._logged_at = now
            return
        self._waiting[words] += 1
        if self._later is None:
            self._later = loop.call_at(self._logged_at + self._seconds, self._say_waiting)

    def close(self) -> None:
        """Says what is waiting now: the broker is stopping."""
        if self._later is not None:
            self._later.cancel()
            self._say_waiting()

    def _say_waiting(self) -> None:
        self._later = None
        self._logged_at = asyncio.get_running_loop().time()
        for words, count in self._waiting.items():
            self._logger.log(self._level, "%s (%s more since the last such line)", words, count)
        self._waiting.clear()
