"""Talking to Droid over JSON-RPC: `droid exec --input-format stream-jsonrpc --output-format
stream-jsonrpc`, one JSON message a line each way (Droid 0.225.2, observed against a scripted
model).

Every message carries `jsonrpc: "2.0"`, `type` (`request`, `response` or `notification`) and
`factoryApiVersion: "1.0.0"`. The client sends requests (`droid.initialize_session`,
`droid.load_session`, `droid.add_user_message`, ...); Droid answers each by id and sends
`droid.session_notification`s with the session's progress. Droid also sends requests of its own,
which the client must answer: `droid.ask_user` when the model calls its AskUser tool (only
offered to the model in this mode, never in plain `droid exec`) and `droid.request_permission`
when a tool needs more than the session's autonomy allows (or, in spec mode, to approve the
plan). An error answered to either counts as the user cancelling.
"""

import asyncio
import json
import sys
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

JSONRPC = "2.0"
FACTORY_API_VERSION = "1.0.0"
ASK_USER = "droid.ask_user"
REQUEST_PERMISSION = "droid.request_permission"
SESSION_NOTIFICATION = "droid.session_notification"
# Droid ignores `machineId` offline, but requires it.
MACHINE_ID = "box"
# Droid's limit for a session's title.
MAX_TITLE = 500
# JSON-RPC's "internal error", for a request the client could not answer.
INTERNAL_ERROR = -32603


class DroidRpcError(Exception):
    """Droid answered a request with an error, or stopped before it answered."""


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...


@dataclass(frozen=True)
class Question:
    """One question of an AskUser questionnaire; `options` are its suggested answers."""

    index: int
    question: str
    topic: str
    options: tuple[str, ...]
    multi: bool


@dataclass(frozen=True)
class ToolUse:
    """A tool use Droid wants permission for: `kind` is Droid's confirmation type (`exec`,
    `create`, `edit`, `mcp_tool`, `exit_spec_mode`, ...); `details` its account of it."""

    id: str
    name: str
    input: dict[str, Any]
    kind: str
    details: dict[str, Any]


@dataclass(frozen=True)
class PermissionRequest:
    tool_uses: tuple[ToolUse, ...]
    # The values Droid offers (`proceed_once`, `proceed_auto_run_low`, `cancel`, ...).
    options: tuple[str, ...]


class Answerer(Protocol):
    """What the client says to Droid's own requests."""

    async def ask_user(self, questions: tuple[Question, ...]) -> list[str]:
        """One answer per question, in order, in plain words."""
        ...

    async def permission(self, request: PermissionRequest) -> str:
        """One of `request.options`."""
        ...


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def read_questions(params: dict[str, Any]) -> tuple[Question, ...]:
    questions = params.get("questions")
    found = []
    for number, entry in enumerate(questions if isinstance(questions, list) else [], 1):
        entry = _dict(entry)
        options = entry.get("options")
        index = entry.get("index")
        found.append(
            Question(
                index=index if isinstance(index, int) else number,
                question=_str(entry.get("question")),
                topic=_str(entry.get("topic")),
                options=tuple(o for o in options if isinstance(o, str))
                if isinstance(options, list)
                else (),
                multi=entry.get("multiSelect") is True,
            )
        )
    return tuple(found)


def read_permission(params: dict[str, Any]) -> PermissionRequest:
    uses = params.get("toolUses")
    options = params.get("options")
    tool_uses = []
    for entry in uses if isinstance(uses, list) else []:
        entry = _dict(entry)
        use = _dict(entry.get("toolUse"))
        tool_uses.append(
            ToolUse(
                id=_str(use.get("id")),
                name=_str(use.get("name")),
                input=_dict(use.get("input")),
                kind=_str(entry.get("confirmationType")),
                details=_dict(entry.get("details")),
            )
        )
    return PermissionRequest(
        tool_uses=tuple(tool_uses),
        options=tuple(
            _str(_dict(option).get("value"))
            for option in (options if isinstance(options, list) else [])
        ),
    )


class DroidRpc:
    """One Droid process's JSON-RPC: `serve()` reads what Droid says until it closes its output;
    `request()` asks and waits for the answer; notifications come out of `notification()`, None
    once Droid's output has ended."""

    def __init__(self, reader: asyncio.StreamReader, writer: Writer, answerer: Answerer) -> None:
        self._reader = reader
        self._writer = writer
        self._answerer = answerer
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._notifications: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        # Droid's requests, answered beside the reading: an owner may take hours to answer.
        self._answering: set[asyncio.Task[None]] = set()
        self._ended = False

    async def _send(self, message: dict[str, Any]) -> None:
        line = json.dumps(
            {"jsonrpc": JSONRPC, "factoryApiVersion": FACTORY_API_VERSION, **message},
            ensure_ascii=False,
        )
        self._writer.write(line.encode() + b"\n")
        await self._writer.drain()

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self._ended:
            raise DroidRpcError(f"Droid stopped before {method} could be sent")
        ident = str(uuid.uuid4())
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = answer
        try:
            await self._send({"type": "request", "id": ident, "method": method, "params": params})
            return await answer
        finally:
            self._waiting.pop(ident, None)

    async def notification(self) -> dict[str, Any] | None:
        """The next `droid.session_notification`'s `notification` with its `sessionId`."""
        return await self._notifications.get()

    async def serve(self) -> None:
        try:
            async for line in self._reader:
                try:
                    message = json.loads(line)
                except json.JSONDecodeError:
                    print(f"droid said: {line.decode(errors='replace').rstrip()}", file=sys.stderr)
                    continue
                if isinstance(message, dict):
                    self._take(message)
        finally:
            self._ended = True
            # Nobody is left to hear these answers; the broker keeps what was asked, by key.
            for task in list(self._answering):
                task.cancel()
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(DroidRpcError("Droid stopped before it answered"))
            await self._notifications.put(None)

    def _take(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "response":
            answer = self._waiting.get(_str(message.get("id")))
            if answer is None or answer.done():
                return
            error = message.get("error")
            if error is not None:
                why = _str(_dict(error).get("message")) or json.dumps(error)[:500]
                data = _str(_dict(error).get("data"))
                answer.set_exception(DroidRpcError(f"{why}: {data}" if data else why))
            else:
                answer.set_result(_dict(message.get("result")))
        elif kind == "request":
            task = asyncio.create_task(self._answer(message))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        elif kind == "notification" and message.get("method") == SESSION_NOTIFICATION:
            params = _dict(message.get("params"))
            notification = _dict(params.get("notification"))
            session = params.get("sessionId") or notification.get("sessionId")
            self._notifications.put_nowait({**notification, "sessionId": session})

    async def _answer(self, message: dict[str, Any]) -> None:
        ident = message.get("id")
        method = message.get("method")
        params = _dict(message.get("params"))
        reply: dict[str, Any]
        try:
            if method == ASK_USER:
                questions = read_questions(params)
                answers = await self._answerer.ask_user(questions)
                reply = {
                    "result": {
                        "answers": [
                            {"index": q.index, "question": q.question, "answer": a}
                            for q, a in zip(questions, answers, strict=True)
                        ]
                    }
                }
            elif method == REQUEST_PERMISSION:
                chosen = await self._answerer.permission(read_permission(params))
                reply = {"result": {"selectedOption": chosen}}
            else:
                reply = {"error": {"code": -32601, "message": f"the box does not answer {method}"}}
        # Droid must get an answer whatever failed, or its tool waits for good.
        except Exception as failure:
            print(f"droid worker: could not answer {method}: {failure}", file=sys.stderr)
            reply = {"error": {"code": INTERNAL_ERROR, "message": str(failure) or "failed"}}
        if not self._ended:
            await self._send({"type": "response", "id": ident, **reply})

    async def initialize_session(
        self,
        *,
        title: str,
        cwd: str,
        model: str,
        autonomy: str,
        spec: bool,
        disabled: tuple[str, ...],
    ) -> dict[str, Any]:
        """A new session without the `disabled` tools; its id is `sessionId` in the result.
        Given a title, Droid does not ask the model for one (a request the task would pay for)."""
        return await self.request(
            "droid.initialize_session",
            {
                "machineId": MACHINE_ID,
                "title": title[:MAX_TITLE].strip() or "box task",
                "cwd": cwd,
                "modelId": model,
                "autonomyLevel": autonomy,
                "interactionMode": "spec" if spec else "auto",
                "disabledToolIds": list(disabled),
            },
        )

    async def load_session(
        self, session: str, *, autonomy: str, disabled: tuple[str, ...]
    ) -> dict[str, Any]:
        """Carries on an earlier session (its messages are Droid's own files in HOME); its
        settings are set again, so they are this task's, not what the session last had."""
        loaded = await self.request(
            "droid.load_session", {"sessionId": session, "disabledToolIds": list(disabled)}
        )
        await self.request(
            "droid.update_session_settings",
            {
                "autonomyLevel": autonomy,
                "interactionMode": "auto",
                "disabledToolIds": list(disabled),
            },
        )
        return loaded

    async def add_user_message(self, text: str) -> None:
        await self.request("droid.add_user_message", {"text": text})
