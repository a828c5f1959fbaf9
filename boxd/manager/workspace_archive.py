"""A folder of the workspace as it stands, or all of it, downloaded as a tar made as it is sent:
OpenWorkspaceArchive answers with the read end of a pipe that a thread of its own fills
(boxd.manager.workspaces.archive).

The workspace's joins lock is held only while the archive is begun (its stack read, the levels'
roots opened, the folder found or refused in words), never while it is written: a slow download
must not hold up a task's layer joining or an undo. What the walk then reads comes through the
roots it holds: a layer joined since is not in it, one undone since loses what is removed before
the walk reaches it (left out, as a file changed under the walk is).

The thread is not one of asyncio's: a reader that takes its time must not hold a worker every
other to_thread call of the manager waits for. It ends when the archive is written, when the
reader goes away (EPIPE, quietly), or when the reader has taken nothing for STALL_SECONDS; at
most ARCHIVES_AT_ONCE are written at once, and one more is refused in words; KEPT_FOR_OWNER of
them only for the owner, so tokens that never read cannot keep the owner from downloading.

An app's or a member's token reads only the workspaces its limits name; any other is answered
exactly as a missing one, so a token cannot learn which names exist.
"""

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
from typing import Any

from boxd.dbus.fd_reply import Opened
from boxd.errors import Problem, die
from boxd.manager.record.store import Store
from boxd.manager.workspace_files import missing, readable, whole_thread
from boxd.manager.workspaces import archive, stack_view
from boxd.manager.workspaces.layers import Layers, layer_name
from boxd.manager.workspaces.workspaces import Workspaces
from boxd.wire.caller import Caller

log = logging.getLogger(__name__)

ARCHIVES_AT_ONCE = 8
# Of those, kept for the owner: an app's or a member's token may read a workspace, but its
# downloads (each held up to STALL_SECONDS by a reader that never reads) must not take them all.
KEPT_FOR_OWNER = 2
# A pipe of 1 MiB (the kernel's default 64 KiB is a context switch per 64 KiB of archive).
PIPE_SIZE = 1 << 20


class WorkspaceArchives:
    def __init__(self, store: Store, layers: Layers, workspaces: Workspaces) -> None:
        self.store = store
        self.layers = layers
        self.workspaces = workspaces
        self.writing = 0  # archives whose threads run; changed on the event loop only
        self.writing_for_tokens = 0  # of those, asked by an app's or a member's token

    async def open_workspace_archive(self, caller: Caller, name: str, path: str) -> Opened:
        await readable(caller, name, self.workspaces)
        stack_view.checked(path)
        if self.writing >= ARCHIVES_AT_ONCE:
            die(
                Problem.UNAVAILABLE,
                f"{ARCHIVES_AT_ONCE} archives are being downloaded already: "
                "try again once one has finished",
            )
        token = not caller.acts_as_owner
        if token and self.writing_for_tokens >= ARCHIVES_AT_ONCE - KEPT_FOR_OWNER:
            die(
                Problem.UNAVAILABLE,
                f"{ARCHIVES_AT_ONCE - KEPT_FOR_OWNER} archives asked with tokens are being "
                "downloaded already: try again once one has finished",
            )
        async with self.layers.joins[name]:
            if not self.workspaces.exists(name):  # removed while the lock was awaited
                die(Problem.NOT_FOUND, missing(name))
            done = [layer_name(number) for number, _ in await self.store.stack(name)]
            stack = stack_view.stack_of(self.layers, name, done)
            # Cancelled meanwhile, the thread is waited for and what it opened closed.
            prepared = await whole_thread(
                lambda: archive.Prepared(stack, path), archive.Prepared.close
            )
        filename = archive.archive_name(name, path)
        try:
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
        except OSError as error:
            prepared.close()
            die(Problem.FAILED, f"the archive could not be begun ({error.strerror or error})")
        # Over the user's pipe quota the default size is kept: it only slows the archive down.
        with contextlib.suppress(OSError):
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        os.set_blocking(write_end, False)  # so a stalled reader is noticed (archive.Stalled)
        loop = asyncio.get_running_loop()
        self.writing += 1
        self.writing_for_tokens += token

        def write() -> None:
            try:
                summary = archive.write_prepared(prepared, filename.removesuffix(".tar"), write_end)
                log.info("archive of %r in %s written: %s", path, name, summary)
            except (BrokenPipeError, archive.Stalled) as gone:
                log.info("archive of %r in %s ended: the reader went away (%s)", path, name, gone)
            except Exception:
                log.exception("archive of %r in %s failed", path, name)
            finally:
                os.close(write_end)
                loop.call_soon_threadsafe(self._ended, token)

        try:
            threading.Thread(target=write, name=f"archive {name}", daemon=True).start()
        except BaseException:
            self._ended(token)
            prepared.close()
            os.close(write_end)
            os.close(read_end)
            raise
        answer: dict[str, Any] = {"workspace": name, "path": path, "filename": filename}
        return Opened(answer, read_end)

    def _ended(self, token: bool) -> None:
        self.writing -= 1
        self.writing_for_tokens -= token
