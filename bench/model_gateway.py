"""What the model gateway costs a model request: time to first byte, streamed throughput and
the time a whole small request takes, through the gateway next to the same local server reached
directly.

Run from the repository: `python -m bench.model_gateway` (no root, no systemd; a minute or so).

Three processes on this machine, so no two share an event loop: a local Anthropic-compatible
upstream (aiohttp on 127.0.0.1) that answers every `POST /v1/messages` with SSE, the broker's
real `ModelGateway` in front of it (its manager in memory: budget, approvals and cost logging
answer at once, so what is measured is the gateway's own work: reading and parsing the body,
checking it against the allowlists, hashing it, replacing the model and key, forwarding, reading
usage from the stream), and the client that times both paths one request at a time.

- Time to first byte: a request of 40 KB (a first Droid turn) or 2 MB (a long conversation),
  answered with message_start at once and then 64 text deltas; from sending the request to
  the first byte of the reply. 200 requests each way; p50, p99.
- Added latency: the whole exchange of those requests, through the gateway minus directly
  (p50, p99 of each and the difference of the p50s and p99s).
- Throughput: one reply of 100 MB of SSE (16 KB text deltas), read to the end; MB/s each way,
  best of 3.
"""

import argparse
import asyncio
import json
import multiprocessing
import time
from typing import Any

import aiohttp
from aiohttp import web

from boxd.broker.model.gateway import ModelGateway
from boxd.broker.model.key import ModelKey
from boxd.dbus.interface import BROKER, Method, bound_on

MODEL = "claude-sonnet-4-6"
COUNT = 200
WARM_UP = 10
DELTAS = 64
BIG_REPLY = 100 * 1024 * 1024
BIG_DELTA = 16 * 1024
TRIES = 3
SIZES = {"40 KB": 40 * 1024, "2 MB": 2 * 1024 * 1024}


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def start_event() -> bytes:
    usage = {"input_tokens": 1000, "output_tokens": 1}
    message = {"id": "msg", "type": "message", "role": "assistant", "usage": usage}
    return sse("message_start", {"type": "message_start", "message": message})


def delta(text: str) -> bytes:
    body = {"type": "text_delta", "text": text}
    return sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": body})


def end_events(output: int) -> bytes:
    usage = {"output_tokens": output}
    return sse("message_delta", {"type": "message_delta", "delta": {}, "usage": usage}) + sse(
        "message_stop", {"type": "message_stop"}
    )


async def upstream_messages(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    big = json.loads(body).get("metadata", {}).get("user_id") == "big"
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await response.write(start_event())
    if big:
        chunk = delta("x" * BIG_DELTA)
        for _ in range(BIG_REPLY // len(chunk)):
            await response.write(chunk)
    else:
        for number in range(DELTAS):
            await response.write(delta(f"word {number} "))
    await response.write(end_events(DELTAS))
    await response.write_eof()
    return response


async def serve_forever(app: web.Application, ports: Any) -> None:
    """Serves `app` on a free port of 127.0.0.1, which goes to the parent on `ports`."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    ports.put(runner.addresses[0][1])
    await asyncio.Event().wait()


def run_upstream(ports: Any) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/messages", upstream_messages)
    asyncio.run(serve_forever(app, ports))


class InstantManager:
    """The manager's side, answering at once: within budget, costs taken and forgotten."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    async def call(self, method: Method, *args: str) -> Any:
        member = bound_on(BROKER, method).name
        if member == "BeginModelRequest":
            return {"admitted": True, "upstream": self.upstream}
        return {"logged": True}


class NoWaiter:
    async def wait(self, approval: dict[str, Any], seconds: float) -> str:
        return "approved"


def run_gateway(upstream: str, ports: Any) -> None:
    task = {"id": "t000000001", "model": MODEL, "budgetCents": 100_000, "costCents": 0}
    gateway = ModelGateway(
        InstantManager(upstream),
        NoWaiter(),
        task,
        1.0,
        dict,
        read_key=lambda: ModelKey("ANTHROPIC_API_KEY", "sk-ant-bench"),
    )
    asyncio.run(serve_forever(gateway.app(), ports))


def request_body(size: int, big: bool = False) -> bytes:
    """A Messages request of about `size` bytes: a conversation of tool results."""
    turn = {"role": "user", "content": [{"type": "text", "text": "y" * 4000}]}
    messages = [turn] * max(1, size // 4100)
    body: dict[str, Any] = {
        "model": "claude-opus-4-6",
        "max_tokens": 8192,
        "messages": messages,
        "stream": True,
    }
    if big:
        body["metadata"] = {"user_id": "big"}
    return json.dumps(body).encode()


async def one(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, int]:
    """Seconds to the first byte of the reply and to its end, and its length."""
    started = time.perf_counter()
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    async with session.post(f"{url}/v1/messages", data=body, headers=headers) as reply:
        first = await reply.content.readany()
        first_at = time.perf_counter()
        length = len(first)
        while chunk := await reply.content.readany():
            length += len(chunk)
        assert reply.status == 200, reply.status
    return first_at - started, time.perf_counter() - started, length


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.2f} ms"


async def measure(direct: str, gateway: str, count: int) -> None:
    connector = aiohttp.TCPConnector(limit=1)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for name, size in SIZES.items():
            body = request_body(size)
            results: dict[str, tuple[list[float], list[float]]] = {}
            for path, url in (("direct", direct), ("gateway", gateway)):
                for _ in range(WARM_UP):
                    await one(session, url, body)
                firsts, wholes = [], []
                for _ in range(count):
                    first, whole, _ = await one(session, url, body)
                    firsts.append(first)
                    wholes.append(whole)
                results[path] = (firsts, wholes)
            print(f"request of {name} ({len(body):,} bytes), {count} each way, one at a time:")
            for path, (firsts, wholes) in results.items():
                print(
                    f"  {path:8} first byte p50 {ms(percentile(firsts, 0.5))}  "
                    f"p99 {ms(percentile(firsts, 0.99))}   whole p50 "
                    f"{ms(percentile(wholes, 0.5))}  p99 {ms(percentile(wholes, 0.99))}"
                )
            direct_whole, gateway_whole = results["direct"][1], results["gateway"][1]
            p50 = percentile(gateway_whole, 0.5) - percentile(direct_whole, 0.5)
            p99 = percentile(gateway_whole, 0.99) - percentile(direct_whole, 0.99)
            print(f"  added by the gateway: p50 {ms(p50)}  p99 {ms(p99)}")
        body = request_body(40 * 1024, big=True)
        rates: dict[str, float] = {}
        for path, url in (("direct", direct), ("gateway", gateway)):
            best = 0.0
            for _ in range(TRIES):
                _, whole, length = await one(session, url, body)
                best = max(best, length / whole / 1e6)
            rates[path] = best
        print(f"streamed reply of {BIG_REPLY // 2**20} MiB, best of {TRIES}:")
        for path, rate in rates.items():
            print(f"  {path:8} {rate:8.1f} MB/s")
        print(f"  gateway / direct: {rates['gateway'] / rates['direct']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--count", type=int, default=COUNT)
    arguments = parser.parse_args()
    spawn = multiprocessing.get_context("spawn")
    ports = spawn.Queue()
    processes = [spawn.Process(target=run_upstream, args=(ports,), daemon=True)]
    processes[0].start()
    try:
        direct = f"http://127.0.0.1:{ports.get(timeout=30)}"
        processes.append(spawn.Process(target=run_gateway, args=(direct, ports), daemon=True))
        processes[1].start()
        gateway = f"http://127.0.0.1:{ports.get(timeout=30)}"
        asyncio.run(measure(direct, gateway, arguments.count))
    finally:
        for process in processes:
            process.terminate()
            process.join(10)


if __name__ == "__main__":
    main()
