"""A worker's client for its broker: HTTP with JSON bodies over the Unix socket $BOX_SOCKET."""

from types import TracebackType
from typing import Any

import aiohttp


class BrokerRefused(Exception):
    """The broker answered with an error; its text says why."""


class BrokerClient:
    def __init__(self, socket_path: str) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )

    async def __aenter__(self) -> "BrokerClient":
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self._session.close()

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        async with self._session.request(method, f"http://box{path}", json=body) as response:
            answer = await response.json(content_type=None)
            if response.status >= 400:
                text = answer.get("error") if isinstance(answer, dict) else None
                raise BrokerRefused(text or f"the broker answered {response.status}")
            return answer

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)
