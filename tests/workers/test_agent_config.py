"""What the box gives Droid and Claude Code alike (boxd.workers.agent_config)."""

from boxd.workers.agent_config import relay_server


def test_the_relay_reaches_the_task_s_broker_and_is_told_no_more_than_it_is_given() -> None:
    assert relay_server("/py", "/run/b.sock") == {
        "type": "stdio",
        "command": "/py",
        "args": ["-I", "-m", "boxd.workers.mcp.relay"],
        "env": {"BOX_SOCKET": "/run/b.sock"},
    }
    told = relay_server("/py", "/run/b.sock", {"BOX_CLAUDE_PLAN": "1"})["env"]
    assert told == {"BOX_SOCKET": "/run/b.sock", "BOX_CLAUDE_PLAN": "1"}
