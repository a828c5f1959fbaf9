"""What an app's runner answers (boxd/apps/runner.py): its tools, a call's input checked and
priced, a run with the secrets its tool declared; a tool that declares what is not its app's is
refused, in words, in the journal and to the task that calls it."""

import errno
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, StrictInt

from boxd.apps import app_server
from boxd.apps.runner import Runner, tool_full
from boxd.reading.caps import MAX_DATA
from boxd.sdk import App, Context, Tool, ToolError

TASK = {"id": "t000000001"}


class Number(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: StrictInt


async def show(given: Number, ctx: Context) -> dict[str, Any]:
    return {"n": given.n, "key": ctx.key, "secrets": dict(ctx.secrets), "state": str(ctx.state_dir)}


async def refuse(given: Number, ctx: Context) -> None:
    raise ToolError(f"no {given.n}")


async def crash(given: Number, ctx: Context) -> None:
    raise KeyError("oops")


async def fill(given: Number, ctx: Context) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


async def huge(given: Number, ctx: Context) -> str:
    return "x" * MAX_DATA


def priced(given: Number) -> float:
    if given.n < 0:
        raise ValueError("negative")
    return given.n * 2


def tool(verb: str, run: Any, secrets: tuple[str, ...] = (), **more: Any) -> Tool[Any]:
    return Tool(verb=verb, description=verb, input=Number, run=run, secrets=secrets, **more)


APP = App(
    name="shop",
    tools=(
        tool("show", show, ("shop.key", "shop.user"), cost=priced, needs_ok=True),
        tool("refuse", refuse),
        tool("crash", crash),
        tool("fill", fill),
        tool("huge", huge),
        tool("steal", show, ("mail.password", "ANTHROPIC_API_KEY", "shop.key")),
        tool("model", show, ("FACTORY_API_KEY",)),
    ),
)
VAULT = {
    "shop.key": "k",
    "shop.user": "u",
    "shop.other": "not declared",
    "mail.password": "pw",
    "ANTHROPIC_API_KEY": "sk",
}


@pytest.fixture
def runner(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Runner:
    asked: list[tuple[str, ...]] = []

    def read(names: tuple[str, ...]) -> dict[str, str]:
        asked.append(names)
        return {name: VAULT[name] for name in names if name in VAULT}

    with caplog.at_level(logging.ERROR, logger="boxd.apps.runner"):
        return Runner("shop", APP, "", tmp_path, read)


async def test_a_tool_that_declares_another_owners_secret_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="boxd.apps.runner"):
        runner = Runner("shop", APP, "", tmp_path, lambda names: {})
    steal = (
        "shop.steal declares secrets that are not app shop's: mail.password, "
        "ANTHROPIC_API_KEY; a tool may declare only its own app's (shop.<name>)"
    )
    model = (
        "shop.model declares secrets that are not app shop's: FACTORY_API_KEY; a tool may "
        "declare only its own app's (shop.<name>)"
    )
    assert caplog.messages == [
        f"{steal}: the tool is not offered",
        f"{model}: the tool is not offered",
    ]
    assert [t["name"] for t in runner.tools()] == [
        "shop.show",
        "shop.refuse",
        "shop.crash",
        "shop.fill",
        "shop.huge",
    ]
    for asked in ("check", "run"):
        request = {"do": asked, "tool": "shop.steal", "input": {"n": 1}, "key": "k", "task": TASK}
        assert await runner.answer(request) == {"refused": steal}


async def test_a_tool_gets_the_secrets_it_declared_and_its_state(
    runner: Runner, tmp_path: Path
) -> None:
    request = {"do": "run", "tool": "shop.show", "input": {"n": 3}, "key": "k1", "task": TASK}
    assert await runner.answer(request) == {
        "ok": True,
        "output": {
            "n": 3,
            "key": "k1",
            "secrets": {"shop.key": "k", "shop.user": "u"},
            "state": str(tmp_path),
        },
    }


async def test_tools_show_their_input_and_whether_they_ask(runner: Runner) -> None:
    [shown, *_] = (await runner.answer({"do": "tools"}))["tools"]
    assert shown["name"] == "shop.show" and shown["needsOk"] is True
    assert shown["input"]["properties"]["n"]["type"] == "integer"


async def test_a_check_gives_the_input_as_validated_and_its_cost(runner: Runner) -> None:
    checked = await runner.answer({"do": "check", "tool": "shop.show", "input": {"n": 4}})
    assert checked == {"input": {"n": 4}, "costCents": 8.0, "needsOk": True}
    assert await runner.answer({"do": "check", "tool": "shop.show", "input": {"n": "4"}}) == {
        "refused": "input.n: input should be a valid integer"
    }
    assert await runner.answer({"do": "check", "tool": "shop.show", "input": {"n": -1}}) == {
        "refused": "shop.show could not work out its cost: ValueError"
    }
    assert await runner.answer({"do": "check", "tool": "shop.nothing", "input": {}}) == {
        "refused": "no tool shop.nothing: app shop has no such tool"
    }


async def test_a_runs_failure_is_its_answer_and_a_full_disk_is_not(runner: Runner) -> None:
    def run(verb: str) -> dict[str, Any]:
        return {"do": "run", "tool": f"shop.{verb}", "input": {"n": 2}, "key": "k", "task": TASK}

    assert await runner.answer(run("refuse")) == {"ok": False, "error": "no 2"}
    assert await runner.answer(run("crash")) == {
        "ok": False,
        "error": "shop.crash failed: KeyError: 'oops'",
    }
    assert await runner.answer(run("fill")) == {"full": tool_full("shop.fill")}
    assert await runner.answer(run("huge")) == {
        "ok": False,
        "error": "shop.huge answered with more than 1 MB of JSON, more than the box keeps of a "
        "tool's output",
    }
    assert await runner.answer({**run("show"), "key": 5}) == {
        "refused": "a run of shop.show names its key and its task"
    }


async def test_an_app_that_could_not_be_loaded_refuses_every_tool(tmp_path: Path) -> None:
    why = "ModuleNotFoundError: No module named 'shop'"
    broken = Runner("shop", None, why, tmp_path, lambda names: {})
    assert broken.tools() == []
    assert await broken.answer({"do": "check", "tool": "shop.show", "input": {}}) == {
        "refused": "no tool shop.show: app shop could not be loaded (ModuleNotFoundError: No "
        "module named 'shop'); the box's owner finds why in `journalctl -u box-app@shop`"
    }


def test_the_runners_idle_time_setting_names_the_runner() -> None:
    assert app_server.idle_seconds({}) == 60.0
    assert app_server.idle_seconds({app_server.IDLE_VARIABLE: "0"}) is None
    with pytest.raises(ValueError, match=r"BOX_APP_IDLE_MS must be 0 or at least 500 ms.*runner"):
        app_server.idle_seconds({app_server.IDLE_VARIABLE: "20"})
