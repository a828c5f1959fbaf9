"""Droid's settings, MCP servers and command line, as the Droid worker writes them."""

import json
from pathlib import Path
from typing import Any

from boxd.workers.agent_config import PLACEHOLDER_KEY
from boxd.workers.droid.config import (
    DISABLED_TOOLS,
    MODEL_CHOICE,
    command,
    mcp_servers,
    settings,
    task_options,
)
from boxd.workers.droid.worker import Steps, prepare_home, share_with_later_tasks

DROID = Path("/var/lib/boxd/droid/0.225.2/droid")


def test_the_model_is_the_tasks_through_the_gateway_with_no_key() -> None:
    written = settings("claude-haiku-4-5", "http://127.0.0.1:3130")
    (model,) = written["customModels"]
    assert model["model"] == "claude-haiku-4-5"
    assert model["baseUrl"] == "http://127.0.0.1:3130"
    assert model["provider"] == "anthropic"
    assert model["apiKey"] == PLACEHOLDER_KEY
    assert written["blockOnMcpLoad"] is True
    assert written["mcpAutonomyOverrides"] == {"box": {"defaultLevel": "low"}}


def test_the_relay_gets_the_broker_socket_and_nothing_else() -> None:
    server = mcp_servers("/usr/lib/boxd/venv/bin/python", "/var/lib/box/tasks/t1/broker.sock")
    box = server["mcpServers"]["box"]
    assert box["type"] == "stdio"
    assert box["args"] == ["-I", "-m", "boxd.workers.mcp.relay"]
    assert box["env"] == {"BOX_SOCKET": "/var/lib/box/tasks/t1/broker.sock"}


def test_command_is_droid_exec_driven_over_json_rpc() -> None:
    argv = command(DROID, autonomy="medium", work_dir=Path("/w"))
    assert argv[:2] == [str(DROID), "exec"]
    assert argv[argv.index("--input-format") + 1] == "stream-jsonrpc"
    assert argv[argv.index("--output-format") + 1] == "stream-jsonrpc"
    assert argv[argv.index("--auto") + 1] == "medium"
    assert argv[argv.index("--model") + 1] == MODEL_CHOICE
    assert argv[argv.index("--cwd") + 1] == "/w"


def test_the_command_names_no_prompt_session_or_plan() -> None:
    """The prompt, the session to carry on and the plan go over JSON-RPC (worker.py): a
    session id from a step never reaches argv."""
    argv = command(DROID, autonomy="low", work_dir=Path("/w"))
    for flag in ("--file", "--fork", "-s", "--use-spec", "--skip-permissions-unsafe"):
        assert flag not in argv


def test_no_tool_outlives_the_turn_the_worker_waits_for() -> None:
    assert {"Task", "TaskOutput", "TaskStop", "Loop"} <= set(DISABLED_TOOLS)


def test_task_options() -> None:
    assert task_options({"droid": {"autonomy": "high", "plan": True}}) == ("high", True)
    assert task_options({"droid": None}) == ("low", False)
    assert task_options({"droid": {"autonomy": "root"}}) == ("low", False)


def test_home_files_are_private(tmp_path: Path) -> None:
    prepare_home(tmp_path, {"model": "claude-sonnet-4-6"}, "http://g", "/s")
    factory = tmp_path / ".factory"
    for name in ("settings.json", "mcp.json"):
        assert (factory / name).stat().st_mode & 0o777 == 0o600
    assert json.loads((factory / "mcp.json").read_text())["mcpServers"]["box"]["env"] == {
        "BOX_SOCKET": "/s"
    }


def test_files_droid_made_private_are_shared_with_the_group(tmp_path: Path) -> None:
    made = tmp_path / "sub" / "a.txt"
    made.parent.mkdir()
    made.write_text("hello")
    made.chmod(0o600)
    made.parent.chmod(0o700)
    script = tmp_path / "run.sh"
    script.write_text("x")
    script.chmod(0o750)
    (tmp_path / "link").symlink_to("/etc/passwd")
    share_with_later_tasks(tmp_path)
    assert made.stat().st_mode & 0o777 == 0o660
    assert made.parent.stat().st_mode & 0o777 == 0o770
    assert script.stat().st_mode & 0o777 == 0o770


class FakeBroker:
    def __init__(self) -> None:
        self.posted: list[dict[str, Any]] = []

    async def step(self, text: str, data: Any = None) -> None:
        self.posted.append({"text": text, "data": data})


def _step(text: str, kind: str) -> dict[str, Any]:
    return {"text": text, "data": {"session": "s", "kind": kind}}


async def test_the_summary_does_not_repeat_the_last_message() -> None:
    broker = FakeBroker()
    steps = Steps(broker)  # type: ignore[arg-type]
    for step in (
        _step("started", "started"),
        _step("Looking at notes.md", "message"),
        _step("Read {}", "tool"),
        _step("Wrote summary.md", "message"),
        _step("Wrote summary.md", "summary"),
    ):
        await steps.log(step)
    await steps.flush()
    assert [(s["text"], s["data"]["kind"]) for s in broker.posted] == [
        ("started", "started"),
        ("Looking at notes.md", "message"),
        ("Read {}", "tool"),
        ("Wrote summary.md", "summary"),
    ]


async def test_a_last_message_without_a_summary_is_still_logged() -> None:
    broker = FakeBroker()
    steps = Steps(broker)  # type: ignore[arg-type]
    await steps.log(_step("half way", "message"))
    await steps.flush()
    assert [s["text"] for s in broker.posted] == ["half way"]
