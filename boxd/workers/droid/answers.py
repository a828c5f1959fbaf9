"""How the Droid worker answers Droid's own requests (boxd.workers.droid.rpc).

- AskUser: each question becomes an approval, `POST /ask` with key `droid.ask.<hash of the
  question as the owner reads it>`, so the same question is the same approval, also after a
  restart. A pending answer is asked again with the same key until the owner answers; the
  owner's yes or no goes back to Droid in plain words.
- Permissions: the session runs at the task's autonomy, so whatever Droid asks permission for
  is more than `--auto <level>` allows, and is refused, as `droid exec` refuses it; the refusal is
  remembered, and the task fails saying what Droid wanted. The one exception is the plan of a
  task that asked for one (`droid.plan`): it is accepted, and Droid carries on at the task's
  autonomy. (Plain `droid exec --use-spec` does not permit ExitSpecMode at all: the model's
  plan fails as a tool and it goes on without one. Until the plan is accepted, Droid itself
  refuses edits in spec mode, asking nobody.)
"""

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from boxd.reading.canonical_json import input_hash
from boxd.wire.approval import MAX_QUESTION
from boxd.workers.droid.rpc import PermissionRequest, Question, ToolUse

CANCEL = "cancel"
PLAN_CONFIRMATION = "exit_spec_mode"
# What a refusal shows of what Droid wanted to run.
MAX_SHOWN = 300
YES = "Yes: the box owner approved. (The box owner can answer only yes or no.)"
NO = "No: the box owner did not approve. (The box owner can answer only yes or no.)"

# POST to the broker: (path, body) -> its JSON answer.
Post = Callable[[str, Any], Awaitable[Any]]


def owner_question(question: Question) -> str:
    """The question as the owner reads it: Droid's words, with its suggested answers."""
    text = question.question.strip() or question.topic.strip() or "Droid has a question."
    if question.options:
        text += f" (Droid suggested: {' / '.join(question.options)})"
    text = f"Droid asks: {text}"
    return text if len(text) <= MAX_QUESTION else text[: MAX_QUESTION - 1] + "…"


def ask_key(text: str) -> str:
    return f"droid.ask.{input_hash(text)}"


def proceed_option(autonomy: str) -> str:
    """Droid's option that accepts a plan and goes on at `autonomy`."""
    return f"proceed_auto_run_{autonomy}"


def _wanted(use: ToolUse) -> str:
    details = use.details
    shown = (
        details.get("fullCommand")
        or details.get("filePath")
        or details.get("toolName")
        or json.dumps(use.input, ensure_ascii=False)
    )
    text = f"{use.name} {shown}" if isinstance(shown, str) else use.name
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


class Answers:
    """The worker's answers to Droid, for one task."""

    def __init__(self, post: Post, *, autonomy: str, plan: bool) -> None:
        self._post = post
        self.autonomy = autonomy
        self.plan = plan
        # What Droid wanted and was refused: why the task fails.
        self.refused: list[str] = []

    async def ask_user(self, questions: tuple[Question, ...]) -> list[str]:
        return list(await asyncio.gather(*(self._ask(q) for q in questions)))

    async def _ask(self, question: Question) -> str:
        text = owner_question(question)
        body = {"question": text, "key": ask_key(text)}
        while True:
            answer = await self._post("/ask", body)
            if not isinstance(answer, dict):
                raise ValueError(f"the broker answered /ask with {json.dumps(answer)[:200]}")
            if answer.get("approved") is True:
                return YES
            if answer.get("approved") is False:
                return NO
            if answer.get("pending") is not True:
                raise ValueError(f"the broker answered /ask with {json.dumps(answer)[:200]}")
            # Pending: the broker waited BOX_APPROVAL_WAIT_MS; the same key waits on.

    async def permission(self, request: PermissionRequest) -> str:
        uses = request.tool_uses
        if self.plan and uses and all(use.kind == PLAN_CONFIRMATION for use in uses):
            proceed = proceed_option(self.autonomy)
            if proceed in request.options:
                return proceed
            self.refused.append(
                f"Droid offered no way to carry on with its plan at autonomy {self.autonomy}"
            )
            return CANCEL
        wanted = ", ".join(_wanted(use) for use in uses) or "a tool"
        self.refused.append(
            f"Droid needed permission for {wanted}, which --auto {self.autonomy} does not allow; "
            "a task with a higher droid.autonomy may do it"
        )
        return CANCEL
