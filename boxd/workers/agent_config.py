"""What the box gives Droid and Claude Code alike: its relay as their one MCP server, the key
they send (a placeholder), and the prompt a worker started again carries on with.

Each agent's own settings and command are beside its worker (boxd.workers.droid.config,
boxd.workers.claude.config).
"""

from typing import Any

# The name both agents know the box's relay by; its tools reach the model under it (Droid's
# `box___<tool>`, Claude Code's `mcp__box__<tool>`).
MCP_SERVER = "box"
# Not a secret: the gateway replaces it with the vault's key.
PLACEHOLDER_KEY = "the-box-gateway-adds-the-key"
RESUME_PROMPT = (
    "The box restarted your work on this task (a restart or a power cut cut it off). Carry on "
    "from where you stopped. Tool calls you already made are remembered: calling one again "
    "with the same input returns its result without running it twice."
)


def relay_server(python: str, socket: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The box's relay, started by the agent over stdio, as an entry of its `mcpServers`. It
    holds no secrets; it reaches only the task's broker, at `socket`; `env` is what else the
    agent's relay is told."""
    return {
        "type": "stdio",
        "command": python,
        "args": ["-I", "-m", "boxd.workers.mcp.relay"],
        "env": {"BOX_SOCKET": socket, **(env or {})},
    }
