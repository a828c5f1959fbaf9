"""The least MCP server the official SDK makes: the lowlevel Server over its stdio transport,
listing one fixed tool. bench/mcp_relay.py times its start next to the relay's; it talks to no
broker, so it is a floor for any relay built on the SDK."""

from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

TOOL = types.Tool(name="box_ask", description="Ask the owner.", input_schema={"type": "object"})


async def list_tools(
    ctx: Any, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL])


async def main() -> None:
    server: Server[Any] = Server("box", on_list_tools=list_tools)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
