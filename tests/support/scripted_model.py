"""A scripted stand-in for Anthropic's Messages API (SSE), for the real Droid to talk to: each
request that offers tools gets the next scripted turn, a list of blocks (`{"type": "text",
"text"}` or `{"type": "tool_use", "name", "input"}`); Droid's own side requests without tools
(the session's title) get a title and take no turn. Requests are kept for the test to read."""

import json
from typing import Any

from aiohttp import web

Block = dict[str, Any]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class ScriptedModel:
    def __init__(self, *turns: list[Block]) -> None:
        self.turns = list(turns)
        self.requests: list[dict[str, Any]] = []
        # Each request's anthropic-beta header, beside it.
        self.betas: list[str | None] = []
        self._next = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> "ScriptedModel":
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def tool_requests(self) -> list[dict[str, Any]]:
        return [body for body in self.requests if body.get("tools")]

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.betas.append(request.headers.get("anthropic-beta"))
        if not body.get("tools"):
            blocks: list[Block] = [{"type": "text", "text": "A title"}]
        elif self._next < len(self.turns):
            blocks = self.turns[self._next]
            self._next += 1
        else:
            blocks = [{"type": "text", "text": "Nothing more was scripted."}]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        message = {
            "id": f"msg_{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 100, "output_tokens": 1},
        }
        await response.write(_event("message_start", {"type": "message_start", "message": message}))
        stop = "end_turn"
        for index, block in enumerate(blocks):
            start: dict[str, Any]
            delta: dict[str, Any]
            if block["type"] == "text":
                start = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                stop = "tool_use"
                start = {
                    "type": "tool_use",
                    "id": f"toolu_{len(self.requests)}_{index}",
                    "name": block["name"],
                    "input": {},
                }
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            for name, data in (
                ("content_block_start", {"index": index, "content_block": start}),
                ("content_block_delta", {"index": index, "delta": delta}),
                ("content_block_stop", {"index": index}),
            ):
                await response.write(_event(name, {"type": name, **data}))
        await response.write(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop},
                    "usage": {"output_tokens": 5},
                },
            )
        )
        await response.write(_event("message_stop", {"type": "message_stop"}))
        return response
