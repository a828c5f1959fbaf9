"""Claude Code's command line and environment: the gateway, no settings files, the relay."""

import json
import os
import subprocess
from pathlib import Path

from boxd.workers.agent_config import PLACEHOLDER_KEY
from boxd.workers.claude.config import command, environment, mcp_config


def test_the_model_is_the_gateway_with_a_placeholder_key_and_nothing_calls_home() -> None:
    env = environment(Path("/h"), "http://127.0.0.1:7/x")
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:7/x"
    assert env["ANTHROPIC_API_KEY"] == PLACEHOLDER_KEY
    assert env["CLAUDE_CONFIG_DIR"] == "/h/.claude"
    for flag in (
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
        "DISABLE_TELEMETRY",
        "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS",
    ):
        assert env[flag] == "1"


def test_no_settings_file_and_only_the_box_s_relay() -> None:
    mcp = mcp_config("/py", "/run/b.sock", "medium", True, home=Path("/h"), work=Path("/w"))
    args = command(Path("/c"), model="claude-x", autonomy="medium", plan=True, mcp=mcp, resume=None)
    assert args[:2] == ["/c", "-p"]
    assert args[args.index("--setting-sources") + 1] == ""
    assert "--strict-mcp-config" in args
    server = json.loads(args[args.index("--mcp-config") + 1])["mcpServers"]["box"]
    assert server["env"] == {
        "BOX_SOCKET": "/run/b.sock",
        "BOX_CLAUDE_AUTONOMY": "medium",
        "BOX_CLAUDE_PLAN": "1",
        "BOX_CLAUDE_HOME": "/h",
        "BOX_CLAUDE_WORK": "/w",
    }
    # The prompt is never a slash command or a skill.
    assert "--disable-slash-commands" in args
    assert args[args.index("--permission-prompt-tool") + 1] == "mcp__box__box_permission"
    assert args[args.index("--permission-mode") + 1] == "plan"
    assert "--resume" not in args


def test_a_restart_resumes_the_session() -> None:
    mcp = mcp_config("/py", "/s", "low", False, home=Path("/h"), work=Path("/w"))
    args = command(Path("/c"), model="m", autonomy="low", plan=False, mcp=mcp, resume="abc")
    assert args[-2:] == ["--resume", "abc"]


def test_git_runs_no_fsmonitor_command_or_hook_from_the_workspace(tmp_path: Path) -> None:
    repo = tmp_path / "ws"
    ran = tmp_path / "ran"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    hook = f"touch {ran}; false"
    subprocess.run(["git", "-C", str(repo), "config", "core.fsmonitor", hook], check=True)
    plain = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    subprocess.run(["git", "-C", str(repo), "status"], env=plain, capture_output=True)
    assert ran.exists()  # the trap works on this git
    ran.unlink()
    env = {**plain, **environment(tmp_path, "http://127.0.0.1:7/x")}
    subprocess.run(["git", "-C", str(repo), "status"], env=env, capture_output=True, check=True)
    assert not ran.exists()
