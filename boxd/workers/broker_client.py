"""A worker's client for its broker: HTTP with JSON bodies over the Unix socket $BOX_SOCKET
(unix_http: standard library only, so a worker's start does not wait for aiohttp's import).

A broker that went away mid-request (killed, restarted by its socket) or whose manager is away
(503) is asked again, for up to broker_patience.PATIENCE_SECONDS. Asking again is safe:
- /call and /ask carry a key: the same key gets the logged answer, never a second run;
- GET /task and GET /tools change nothing;
- /step has no key, so a step whose answer was lost is looked for in GET /task first and sent
  again only if it is not there (`step`): the worker is its task's only writer of steps;
- /cost and /usage are sent again: a cost recorded twice stops the task early, one lost lets it
  spend past its budget unseen.

A broker that answers 507 (the box's disk is full) did nothing: the step was not logged, the
call's key was not answered. That lasts until someone frees space, which may take the owner
hours, so the worker waits for room as long as it takes, without patience's time limit: the
task goes on by itself once there is room, and the owner can still stop it meanwhile.
"""

import asyncio
import json
import sys
from types import TracebackType
from typing import Any

from boxd.workers import unix_http
from boxd.workers.broker_patience import FULL_PAUSE_SECONDS, Patience
from boxd.workers.unix_http import DISK_FULL, MANAGER_AWAY, BrokerGarbled, BrokerRefused

__all__ = ["BrokerClient", "BrokerGarbled", "BrokerGone", "BrokerRefused"]


class BrokerGone(Exception):
    """The broker did not answer, or its manager was away, for longer than the worker waits."""


class _Full(Exception):
    """A 507: the box's disk is full and nothing was done; `words` are the broker's."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


class _Lost(Exception):
    """One try that got no answer; `words` says what happened."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


def _as_logged(text: str, data: Any) -> dict[str, Any]:
    """A step as GET /task lists it: JSON both ways, so equal steps compare equal."""
    loaded: dict[str, Any] = json.loads(json.dumps({"text": text, "data": data}))
    return loaded


class BrokerClient:
    def __init__(self, socket_path: str, patience_seconds: float | None = None) -> None:
        self._socket_path = socket_path
        self._patience_seconds = patience_seconds
        self._connections = unix_http.Connections(socket_path)
        # How many steps the log holds that this worker knows of (from GET /task, then its own).
        self._steps_known = 0
        # Whether the worker said it waits for room on the full disk (it says so once).
        self._waiting_for_room = False

    async def __aenter__(self) -> "BrokerClient":
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._connections.close()

    def _patience(self) -> Patience:
        return Patience(self._patience_seconds)

    async def _wait_for_room(self, doing: str, words: str) -> Patience:
        """One pause while the disk is full; then a new patience, as the broker was there."""
        if not self._waiting_for_room:
            self._waiting_for_room = True
            print(f"{doing}: {words} Waiting for room.", file=sys.stderr, flush=True)
        await asyncio.sleep(FULL_PAUSE_SECONDS)
        return self._patience()

    def _gone(self, doing: str, patience: Patience, words: str) -> BrokerGone:
        return BrokerGone(
            f"{doing}: the task's broker at {self._socket_path} gave no answer for "
            f"{patience.seconds:g} s, over {patience.tries} tries (last: {words})"
        )

    async def _once(self, method: str, path: str, body: Any) -> Any:
        payload = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        try:
            status, answer = await self._connections.exchange(method, path, payload)
        except unix_http.LOST as error:
            raise _Lost(str(error) or type(error).__name__) from None
        if status == MANAGER_AWAY:
            raise _Lost(unix_http.error_words(answer, status))
        if status == DISK_FULL:
            raise _Full(unix_http.error_words(answer, status))
        if status >= 400:
            raise BrokerRefused(unix_http.error_words(answer, status))
        self._waiting_for_room = False
        return answer

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """The broker's answer, asking again while it is away (see the module's note)."""
        return await self._patiently(method, path, body, self._patience(), f"{method} {path}")

    async def _patiently(
        self, method: str, path: str, body: Any, patience: Patience, doing: str
    ) -> Any:
        while True:
            try:
                return await self._once(method, path, body)
            except _Full as full:
                patience = await self._wait_for_room(doing, full.words)
            except _Lost as lost:
                if not await patience.pause():
                    raise self._gone(doing, patience, lost.words) from None

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    async def task(self) -> dict[str, Any]:
        """GET /task: the task and the steps it logged, which `step` counts from."""
        state: dict[str, Any] = await self.get("/task")
        self._steps_known = len(state["steps"])
        return state

    async def step(self, text: str, data: Any = None) -> Any:
        """POST /step, once: a step whose answer was lost is sent again only if GET /task does
        not show it after the ones this worker knew of. Returns the task.step event, or None
        when the step was found logged (its answer is what was lost)."""
        body: dict[str, Any] = {"text": text}
        if data is not None:
            body["data"] = data
        wanted = _as_logged(text, data)
        patience = self._patience()
        while True:
            try:
                event = await self._once("POST", "/step", body)
            except _Full as full:
                # Not logged (a 507 writes nothing): sent again as it is.
                patience = await self._wait_for_room("POST /step", full.words)
                continue
            except _Lost as lost:
                if not await patience.pause():
                    raise self._gone("POST /step", patience, lost.words) from None
                # Within the same patience: this is still sending the step.
                state = await self._patiently("GET", "/task", None, patience, "POST /step")
                steps = state["steps"]
                if wanted in steps[self._steps_known :]:
                    self._steps_known = len(steps)
                    return None
                continue
            self._steps_known += 1
            return event
