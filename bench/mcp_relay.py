"""How long Droid waits for the box's MCP server: from spawning it to the answer of `tools/list`,
after `initialize` and `notifications/initialized`, sent at once as Droid sends them. Droid
waits for its MCP servers before its first model request (blockOnMcpLoad), on every start and
every resume.

Run from the repository, no root: `python -m bench.mcp_relay [--runs N]`. Timed, in turns:

- relay: `python -I -m boxd.workers.mcp.relay`, which asks a broker (served by this process on a
  Unix socket, with the real tools wallet.pay, wallet.balance, echo.say) for `GET /tools`;
- sdk: bench/mcp_sdk_server.py, the least server the official `mcp` SDK makes (lowlevel Server,
  stdio transport, one fixed tool, no broker at all): a floor for any relay built on the SDK;
- and, to see where time goes, processes that only import and exit: Python with json and
  asyncio (the floor of any Python server), aiohttp (what the workers' broker client uses),
  boxd.wire.models.key_use (pydantic), and the SDK's server modules.

Printed: median, p10 and p90 in milliseconds of each, and the SDK's median over the relay's.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from boxd.apps import echo, wallet
from boxd.apps.runner import Runner

PYTHON = [sys.executable, "-I"]
SDK_SERVER = str(Path(__file__).with_name("mcp_sdk_server.py"))
SERVERS = {
    "relay": [*PYTHON, "-m", "boxd.workers.mcp.relay"],
    "sdk": [*PYTHON, SDK_SERVER],
}
IMPORTS = {
    "import json, asyncio": "json, asyncio",
    "import aiohttp": "aiohttp",
    "import boxd.wire.models.key_use": "boxd.wire.models.key_use",
    "import mcp.server.lowlevel, .stdio": "mcp.server.lowlevel, mcp.server.stdio",
}
TOOLS = ("wallet.pay", "wallet.balance", "echo.say")
HELLO = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "factory-cli", "version": "0.225.2"},
        },
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
]
PROCESS_SECONDS = 60.0


async def tools(request: web.Request) -> web.Response:
    # As a broker shows them (GET /tools), from what the apps' runners say.
    offered = {
        tool["name"]: tool
        for app in (wallet.app, echo.app)
        for tool in Runner(app.name, app, "", Path(), lambda _: {}).tools()
    }
    listed = [
        {key: offered[name][key] for key in ("name", "description", "input")} for name in TOOLS
    ]
    return web.json_response(listed)


async def time_server(command: list[str], socket_path: Path) -> float:
    """Seconds from spawn to the answer of tools/list."""
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={"BOX_SOCKET": str(socket_path)},
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in HELLO))
    await process.stdin.drain()
    listed: dict[str, Any] = {}
    async with asyncio.timeout(PROCESS_SECONDS):
        while listed.get("id") != 2:
            listed = json.loads(await process.stdout.readline())
        took = time.perf_counter() - began
        process.stdin.close()
        await process.wait()
    assert len(listed["result"]["tools"]) >= 1, listed
    return took


async def time_import(modules: str) -> float:
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(*PYTHON, "-c", f"import {modules}")
    async with asyncio.timeout(PROCESS_SECONDS):
        assert await process.wait() == 0, f"import {modules} failed"
    return time.perf_counter() - began


def row(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p10 = ms[round(0.1 * (len(ms) - 1))]
    p90 = ms[round(0.9 * (len(ms) - 1))]
    return f"{name:<40} {statistics.median(ms):8.0f} {p10:8.0f} {p90:8.0f}"


async def main(runs: int) -> None:
    app = web.Application()
    app.router.add_get("/tools", tools)
    runner = web.AppRunner(app)
    await runner.setup()
    with tempfile.TemporaryDirectory() as directory:
        socket_path = Path(directory) / "broker.sock"
        await web.UnixSite(runner, str(socket_path)).start()
        timed: dict[str, list[float]] = {name: [] for name in [*SERVERS, *IMPORTS]}
        # One warm-up of each, not counted: the first start reads files the others find cached.
        for command in SERVERS.values():
            await time_server(command, socket_path)
        # In turns, so a machine busy for a while slows all of them alike.
        for _ in range(runs):
            for name, command in SERVERS.items():
                timed[name].append(await time_server(command, socket_path))
            for name, modules in IMPORTS.items():
                timed[name].append(await time_import(modules))
        await runner.cleanup()
    print(f"spawn to tools/list answered, {runs} runs each (ms)")
    print(f"{'':<40} {'median':>8} {'p10':>8} {'p90':>8}")
    for name in SERVERS:
        print(row(f"{name}: initialize + tools/list", timed[name]))
    print("processes that import and exit (ms)")
    for name in IMPORTS:
        print(row(name, timed[name]))
    ratio = statistics.median(timed["sdk"]) / statistics.median(timed["relay"])
    print(f"sdk / relay (medians): {ratio:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(main(parser.parse_args().runs))
