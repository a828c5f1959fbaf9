"""What an app's runner answers (boxd/wire/app_runner.py): its tools, an input checked, a tool run.

The runner is the only process that imports the app's code. It runs as the app's own user with
the app's own state directory and the app's own secrets (box-app@.service), so whatever that code
does, it reaches nothing of another app or of the box. A tool that declares a secret that is not
its app's is refused, and said so in the journal: the runner does not hold it anyway, and a tool
that counts on one would fail in ways harder to read.
"""

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boxd.errors import is_full
from boxd.reading.caps import MAX_DATA
from boxd.reading.strict_json import size
from boxd.wire.app_runner import too_large
from boxd.wire.secret_names import belongs_to

if TYPE_CHECKING:
    from boxd.sdk import App, Tool

log = logging.getLogger(__name__)

ReadSecrets = Callable[[tuple[str, ...]], dict[str, str]]


def tool_full(name: str) -> str:
    return (
        f"The box's disk is full: {name} could not write what it needed and did not finish. "
        "Call it again with the same key once the box has room (the owner can free space by "
        "undoing tasks or removing workspaces)."
    )


def refusal(app: "App", tool: "Tool[Any]") -> str | None:
    """Why a tool of `app` is not offered, or None: it declares secrets that are not its app's
    (another app's, or the box's model keys)."""
    foreign = [secret for secret in tool.secrets if belongs_to(secret) != app.name]
    if not foreign:
        return None
    return (
        f"{app.name}.{tool.verb} declares secrets that are not app {app.name}'s: "
        f"{', '.join(foreign)}; a tool may declare only its own app's ({app.name}.<name>)"
    )


class Runner:
    """One app's tools, answering the brokers' requests. `app` is None when its code could not
    be loaded, for the reason `why`: every tool is then refused in those words."""

    def __init__(
        self,
        name: str,
        app: "App | None",
        why: str,
        state_dir: Path,
        read_secrets: ReadSecrets,
    ) -> None:
        self.name = name
        self._why = why
        self._state_dir = state_dir
        self._read_secrets = read_secrets
        self._tools: dict[str, Tool[Any]] = {}
        self._refused: dict[str, str] = {}
        for tool in app.tools if app is not None else ():
            full = f"{name}.{tool.verb}"
            why_not = refusal(app, tool) if app is not None else None
            if why_not is None:
                self._tools[full] = tool
            else:
                log.error("%s: the tool is not offered", why_not)
                self._refused[full] = why_not

    async def answer(self, request: Mapping[str, Any]) -> dict[str, Any]:
        asked = request.get("do")
        if asked == "hello":
            return {"app": self.name}
        if asked == "tools":
            return {"tools": self.tools()}
        tool = request.get("tool")
        if asked not in ("check", "run") or not isinstance(tool, str):
            return {"refused": f"app {self.name}'s runner does not know what was asked"}
        found = self._tool(tool)
        if isinstance(found, str):
            return {"refused": found}
        value = self._valid(found, request.get("input"))
        if isinstance(value, str):
            return {"refused": value}
        if asked == "check":
            return self._checked(tool, found, value)
        key, task = request.get("key"), request.get("task")
        if not isinstance(key, str) or not isinstance(task, dict):
            return {"refused": f"a run of {tool} names its key and its task"}
        return await self._run(tool, found, value, key, task)

    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "description": tool.description,
                "input": tool.input.model_json_schema(),
                "needsOk": tool.needs_ok,
            }
            for name, tool in self._tools.items()
        ]

    def _tool(self, name: str) -> "Tool[Any] | str":
        if name in self._refused:
            return self._refused[name]
        tool = self._tools.get(name)
        if tool is not None:
            return tool
        if not self._tools and not self._refused:
            return (
                f"no tool {name}: app {self.name} could not be loaded ({self._why}); "
                f"the box's owner finds why in `journalctl -u box-app@{self.name}`"
            )
        return f"no tool {name}: app {self.name} has no such tool"

    @staticmethod
    def _valid(tool: "Tool[Any]", given: Any) -> Any:
        """The input as the tool's model holds it, or why it is not valid."""
        # Loaded with the app, whose input models are pydantic's.
        from pydantic import ValidationError

        from boxd.wire.models.plain_errors import describe

        try:
            return tool.input.model_validate(given if given is not None else {})
        except ValidationError as error:
            detail = error.errors()[0]
            detail["loc"] = ("input", *detail["loc"])
            return describe(detail)

    def _checked(self, name: str, tool: "Tool[Any]", value: Any) -> dict[str, Any]:
        try:
            cost = float(tool.cost(value))
        except Exception as error:
            log.exception("the cost of %s could not be worked out", name)
            return {"refused": f"{name} could not work out its cost: {type(error).__name__}"}
        return {
            "input": value.model_dump(mode="json"),
            "costCents": cost,
            "needsOk": tool.needs_ok,
        }

    async def _run(
        self, name: str, tool: "Tool[Any]", value: Any, key: str, task: dict[str, Any]
    ) -> dict[str, Any]:
        # Imported with the app, which imports the App SDK.
        from boxd.sdk import Context, ToolError

        # Read in a thread (files), unless the tool declares none, as most do not.
        secrets = await asyncio.to_thread(self._read_secrets, tool.secrets) if tool.secrets else {}
        context = Context(key=key, task=task, secrets=secrets, state_dir=self._state_dir)
        try:
            output = await tool.run(value, context)
            if size(output) > MAX_DATA:
                raise ToolError(too_large(name))
        except ToolError as error:
            return {"ok": False, "error": str(error)}
        except Exception as error:
            if is_full(error):
                # Not the call's answer: logged, it would be this key's result for good, and the
                # call could never happen once there is room. Left unanswered, the same key runs
                # again later with the same ctx.key, which keeps it to one booking.
                log.warning("%s could not write: the box's disk is full (%s)", name, error)
                return {"full": tool_full(name)}
            log.exception("%s failed", name)
            return {"ok": False, "error": f"{name} failed: {type(error).__name__}: {error}"}
        return {"ok": True, "output": output}
