"""What Droid reads when it starts, and the command that starts it.

Everything lives in the task's own HOME (`BOX_HOME/tasks/<id>/home`), never in the workspace
view that tasks share: Droid's settings, its MCP servers, its sessions and caches. Droid runs
airgapped (`FACTORY_AIRGAP_ENABLED=true`) with one custom model whose base URL is the task's
model gateway, so the only model it reaches is the one its broker forwards to, with the key the
broker adds; the `apiKey` Droid sends is a placeholder the gateway throws away.
"""

from pathlib import Path
from typing import Any

from boxd.workers.agent_config import MCP_SERVER, PLACEHOLDER_KEY, relay_server

# Droid names a custom model `custom:<displayName>-<index>`.
MODEL_DISPLAY_NAME = "Box"
MODEL_CHOICE = f"custom:{MODEL_DISPLAY_NAME}-0"
MAX_OUTPUT_TOKENS = 32_000
# Droid shows the box's MCP tools to the model as `box___<tool>`.
MCP_PREFIX = f"{MCP_SERVER}___"
AIRGAP_ENVIRONMENT = {"FACTORY_AIRGAP_ENABLED": "true"}
# Work that outlives the turn that started it, which the worker (one turn, then Droid's input
# closes) would cut off: Droid's subagents, which plain `droid exec` does not permit either (a
# background one's report starts a turn of its own), and Loop's runs scheduled for later.
DISABLED_TOOLS = ("Task", "TaskOutput", "TaskStop", "Loop")


def factory_dir(own_home: Path) -> Path:
    return own_home / ".factory"


def settings(model: str, gateway_url: str) -> dict[str, Any]:
    """`~/.factory/settings.json`."""
    return {
        "customModels": [
            {
                "model": model,
                "displayName": MODEL_DISPLAY_NAME,
                "baseUrl": gateway_url,
                "apiKey": PLACEHOLDER_KEY,
                "provider": "anthropic",
                "maxOutputTokens": MAX_OUTPUT_TOKENS,
            }
        ],
        # The box's tools are there from the first model request, or Droid would start without.
        "blockOnMcpLoad": True,
        # Droid rates an MCP tool it knows nothing about as high impact and refuses it below
        # `--auto high`. The box's tools are safe at any autonomy because the broker holds them
        # to the task's budget and asks the owner first wherever the autonomy says to.
        "mcpAutonomyOverrides": {MCP_SERVER: {"defaultLevel": "low"}},
    }


def mcp_servers(python: str, socket: str) -> dict[str, Any]:
    """`~/.factory/mcp.json`: the box's relay, started by Droid over stdio. It holds no secrets;
    it reaches only the task's broker."""
    return {"mcpServers": {MCP_SERVER: relay_server(python, socket)}}


def command(droid: Path, *, autonomy: str, work_dir: Path) -> list[str]:
    """`droid exec` driven over JSON-RPC on its stdin and stdout (boxd.workers.droid.rpc), the
    only mode in which Droid asks its user (AskUser). Droid still checks the flags, but the
    session's model, autonomy and mode come from the worker's requests: these say the same."""
    return [
        str(droid),
        "exec",
        "--input-format",
        "stream-jsonrpc",
        "--output-format",
        "stream-jsonrpc",
        "--auto",
        autonomy,
        "--model",
        MODEL_CHOICE,
        "--cwd",
        str(work_dir),
    ]


def task_options(task: dict[str, Any]) -> tuple[str, bool]:
    """The task's autonomy and whether Droid writes a plan first (`droid` in
    docs/spec/start-a-task.txt)."""
    droid = task.get("droid")
    if not isinstance(droid, dict):
        return "low", False
    autonomy = droid.get("autonomy", "low")
    if autonomy not in ("low", "medium", "high"):
        autonomy = "low"
    return autonomy, droid.get("plan") is True
