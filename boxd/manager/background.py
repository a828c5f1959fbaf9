"""The manager's jobs of their own (following a unit, clearing up an ended task, making a spare):
each held until it ends, since the event loop keeps only weak references to tasks."""

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class Background:
    def __init__(self) -> None:
        self.jobs: set[asyncio.Future[Any]] = set()

    def __call__(self, work: Awaitable[T]) -> "asyncio.Future[T]":
        """`work` as a job of its own, held until it ends."""
        job = asyncio.ensure_future(work)
        self.jobs.add(job)
        job.add_done_callback(self.jobs.discard)
        return job
