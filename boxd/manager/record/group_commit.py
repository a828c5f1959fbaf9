"""The record's engine: one SQLite connection, on one thread of its own, and the group commit.
The record's tables and what is read and written in them are Store's (store.py).

All access runs on that thread: commits wait for fsync, and the event loop must not. A method
returns only after its transaction is on disk.

Writes commit in groups: the writes that arrive while a commit is under way are gathered and
committed together, in one transaction and one fsync, each in a SAVEPOINT of its own so one that
fails is undone alone and its caller alone gets the error. Every caller is answered only after
the commit that holds its write.

A write may ask for its task's files to be flushed first (a step: its files are on disk before
its log line is): before the group's BEGIN, the store flushes the file systems of those tasks'
directories, each once (boxd.manager.record.task_flush), and a write whose files could not be
flushed is refused alone, before it is written. The flush runs on the store's thread, in line with
the commit: a flush thread of its own, tried, overlapped a group's flush with the previous group's
commit but gained nothing (both wait for the same disk's journal) and, free sooner, took
smaller groups: about 0.67 syncfs a step against 0.2 to 0.3 with 20 tasks stepping at once.
"""

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from boxd.errors import BoxError, Problem, die, is_full
from boxd.manager.record.disk import give_up_reserve, make_reserve, reserve_path
from boxd.manager.units import at_rest

T = TypeVar("T")
log = logging.getLogger(__name__)

RECORD_FULL = (
    "The box's disk is full: boxd cannot add to its record until some space is freed "
    "(undo tasks or remove workspaces you no longer need)."
)


@dataclass
class _Write(Generic[T]):
    """One write waiting for its group's commit."""

    work: Callable[[sqlite3.Connection], T]
    # Run on the store's thread once the write is on disk and its caller answered (the journal).
    then: Callable[[T], None] | None
    answer: "asyncio.Future[T]"
    # The task whose files are flushed to disk before the write's group begins, if any.
    flush: str | None = None


class _GroupFailed(Exception):
    """What the whole group's transaction met (a full disk, a failed COMMIT): every write in it
    is undone, and every caller gets `error`."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


# Flushes the files of the tasks named, and returns those that could not be, with why.
Flush = Callable[[Iterable[str]], dict[str, BoxError]]


class GroupCommit:
    def __init__(self, path: Path, flush: Flush | None = None) -> None:
        """`flush` is what writes that ask for it flush first (boxd.manager.record.task_flush); a
        store without one refuses them."""
        self._path = path
        self._flush = flush
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self._db: sqlite3.Connection | None = None
        # Writes waiting for the next group commit, and whether one is queued on the thread to
        # take them; both shared by the event loop and the store's thread.
        self._waiting: list[_Write[Any]] = []
        self._commit_queued = False
        self._waiting_lock = threading.Lock()
        # Whether the reserve is missing: given up since it was last made, or never made (boxd
        # started on a full disk).
        self.reserve_used = False
        # Called on the event loop when the reserve is given up.
        self.on_full: Callable[[], None] | None = None

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()

        def on_thread() -> T:
            if self._db is None:
                raise RuntimeError("the store is not open")
            try:
                done = work(self._db)
            except (sqlite3.OperationalError, OSError) as error:
                if not is_full(error):
                    raise
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                if self._use_reserve(loop):
                    try:
                        return work(self._db)
                    except (sqlite3.OperationalError, OSError) as again:
                        if not is_full(again):
                            raise
                die(Problem.FULL, RECORD_FULL)
            if self.reserve_used:
                # The record could grow again: space was freed, so the reserve is made again
                # at once, before the disk fills anew, with no task's end needed to notice.
                self._remake_reserve()
            return done

        return await loop.run_in_executor(self._thread, on_thread)

    async def _write(
        self,
        work: Callable[[sqlite3.Connection], T],
        then: Callable[[T], None] | None = None,
        flush: str | None = None,
    ) -> T:
        """Runs `work` in the next group commit and returns its result once that commit is on
        disk; with `flush`, once that task's files are on disk too, flushed before the commit
        began. `work` must not begin or end a transaction of its own: the group's is open."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        write = _Write(work, then, answer, flush)
        with self._waiting_lock:
            self._waiting.append(write)
            queue = not self._commit_queued
            self._commit_queued = True
        if queue:
            # One commit queued at a time: the writes that come while it waits or runs go in
            # the one after it.
            try:
                self._thread.submit(self._commit_waiting, loop)
            except RuntimeError:
                # The store was closed: no commit will come for the writes waiting.
                with self._waiting_lock:
                    group, self._waiting = self._waiting, []
                    self._commit_queued = False
                closed = RuntimeError("the store is closed")
                _answer(group, [(None, closed)] * len(group))
        return await answer

    def _commit_waiting(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the store's thread: commits every write waiting now, in one transaction."""
        with self._waiting_lock:
            group, self._waiting = self._waiting, []
            self._commit_queued = False
        try:
            # The files first: a step whose log line is on disk has its files there too.
            refused = self._flush_files(group)
            flushed = [write for write in group if id(write) not in refused]
            committed = iter(self._commit_group(flushed, loop))
            outcomes = [
                (None, refused[id(write)]) if id(write) in refused else next(committed)
                for write in group
            ]
        except Exception as unexpected:
            # Whatever happened, no caller waits for ever.
            log.exception("a group commit failed")
            outcomes = [(None, unexpected)] * len(group)
        # One wake-up of the event loop answers the whole group.
        loop.call_soon_threadsafe(_answer, group, outcomes)
        for write, (value, error) in zip(group, outcomes, strict=True):
            if error is None and write.then is not None:
                try:
                    write.then(value)
                except Exception:
                    log.exception("after a write was committed")

    def _flush_files(self, group: list[_Write[Any]]) -> dict[int, BaseException]:
        """Flushes the files of the tasks the group's writes name, each file system once; the
        writes whose files could not be flushed, by id(), with their refusals."""
        wanted = {write.flush for write in group if write.flush is not None}
        if not wanted:
            return {}
        if self._flush is None:
            missing = RuntimeError("this store was opened with no way to flush tasks' files")
            return {id(write): missing for write in group if write.flush is not None}
        failed = self._flush(wanted)
        return {
            id(write): failed[write.flush]
            for write in group
            if write.flush is not None and write.flush in failed
        }

    def _commit_group(
        self, group: list[_Write[Any]], loop: asyncio.AbstractEventLoop
    ) -> list[tuple[Any, BaseException | None]]:
        """Each write's (result, None) or (None, error)."""
        if not group:
            return []
        if self._db is None:
            return [(None, RuntimeError("the store is not open"))] * len(group)
        try:
            try:
                outcomes = _commit_once(self._db, group)
            except _GroupFailed as failed:
                if not is_full(failed.error):
                    raise
                if not self._use_reserve(loop):
                    raise _GroupFailed(BoxError(Problem.FULL, RECORD_FULL)) from None
                try:
                    outcomes = _commit_once(self._db, group)
                except _GroupFailed as again:
                    if is_full(again.error):
                        raise _GroupFailed(BoxError(Problem.FULL, RECORD_FULL)) from None
                    raise
        except _GroupFailed as failed:
            return [(None, failed.error)] * len(group)
        if self.reserve_used:
            # The record could grow again: space was freed, so the reserve is made again
            # at once, before the disk fills anew, with no task's end needed to notice.
            self._remake_reserve()
        return outcomes

    def _use_reserve(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The disk is full: the reserve gives the record room to say so, once. Whether it was
        there to give up (on the store's thread; on_full runs on the loop)."""
        self.reserve_used = True
        if not give_up_reserve(self._path):
            return False
        log.warning(
            "The box's disk is full: boxd gave up the space it keeps in reserve "
            "(%s) to go on recording",
            reserve_path(self._path),
        )
        if self.on_full is not None:
            loop.call_soon_threadsafe(self.on_full)
        return True

    def _remake_reserve(self) -> None:
        try:
            made = make_reserve(self._path)
        except OSError as error:
            log.warning("could not make %s: %s", reserve_path(self._path), error)
            return
        if made and self.reserve_used:
            log.warning("The box's disk has room again: boxd made its reserve again")
        self.reserve_used = not made

    async def keep_reserve(self) -> None:
        """Makes the reserve again once the disk has room for it."""

        def make(db: sqlite3.Connection) -> None:
            self._remake_reserve()

        await self._run(make)

    async def _connect(self, prepare: Callable[[sqlite3.Connection], None]) -> None:
        """Opens the database, then `prepare`s it (its tables) on the store's thread."""

        def connect() -> None:
            # Every prompt, step and tool output is in it: root's alone. SQLite gives the -wal
            # and -shm it makes the database's mode; those of a database from before are closed
            # here too.
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(self._path, flags, at_rest.DATABASE))
            for path in (self._path, *(Path(f"{self._path}{end}") for end in ("-wal", "-shm"))):
                if path.exists():
                    at_rest.restrict(path, at_rest.DATABASE)
            db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=5000")
            prepare(db)
            self._db = db
            self._remake_reserve()

        await asyncio.get_running_loop().run_in_executor(self._thread, connect)

    async def close(self) -> None:
        def disconnect(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        if self._db is not None:
            await self._run(disconnect)
        self._thread.shutdown(wait=True)


def _commit_once(
    db: sqlite3.Connection, group: list[_Write[Any]]
) -> list[tuple[Any, BaseException | None]]:
    """One transaction for the group, a SAVEPOINT for each write: a write that raises is rolled
    back alone and keeps its error; one that meets a full disk, or that SQLite answered by
    rolling back the whole transaction, fails the group (_GroupFailed)."""
    outcomes: list[tuple[Any, BaseException | None]] = []
    try:
        db.execute("BEGIN IMMEDIATE")
        for write in group:
            db.execute("SAVEPOINT write")
            try:
                value = write.work(db)
            except Exception as error:
                if is_full(error) or not db.in_transaction:
                    raise
                db.execute("ROLLBACK TO write")
                db.execute("RELEASE write")
                outcomes.append((None, error))
            else:
                db.execute("RELEASE write")
                outcomes.append((value, None))
        db.execute("COMMIT")
    except Exception as error:
        # SQLite rolls back by itself on some errors (SQLITE_FULL among them); a second
        # ROLLBACK would fail and hide the first error.
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise _GroupFailed(error) from error
    return outcomes


def _answer(group: list[_Write[Any]], outcomes: list[tuple[Any, BaseException | None]]) -> None:
    """On the event loop: every caller of the group gets its own outcome."""
    for write, (value, error) in zip(group, outcomes, strict=True):
        if write.answer.done():
            # The caller went away (cancelled); its write stands.
            continue
        if error is None:
            write.answer.set_result(value)
        elif isinstance(error, BoxError):
            # Each caller raises its own, so one's traceback is not added to another's.
            write.answer.set_exception(BoxError(error.problem, error.message))
        else:
            write.answer.set_exception(error)
