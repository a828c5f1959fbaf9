"""The token usage of a model reply, read as it passes through the gateway.

A streamed reply (Anthropic's SSE) says its usage twice: `message_start` carries the input and
cache counts (and the output so far), and each `message_delta` carries the output count so far,
cumulative, sometimes with the other counts again. The last value seen of each count is the
reply's, so a reply cut off mid-stream still has the usage it reported up to there. Only those
two events are parsed; everything else passes by unread. A non-streamed reply is one JSON
message with `usage`.

The gateway logs what `message_start` said as soon as it has passed, and the rest once the reply
ends (`since`). A reply is `final` once it has said its last usage (a streamed reply's
`message_delta`, a whole reply's `usage`): one that ended without it is charged the most it could
have cost (boxd.broker.model.cost_reports).
"""

import json
from typing import Any

from boxd.reading.caps import MAX_TOKENS
from boxd.wire.pricing import Tokens

# Anthropic's names for the counts, and ours (boxd.wire.pricing.Tokens).
_COUNTS = {
    "input_tokens": "input",
    "output_tokens": "output",
    "cache_creation_input_tokens": "cacheWrite",
    "cache_read_input_tokens": "cacheRead",
}
# A line longer than this is no usage event (message_start holds no content): it is skipped
# rather than kept whole, so a long text delta costs no memory.
MAX_LINE = 256 * 1024
_USAGE_EVENTS = (b'"message_start"', b'"message_delta"')


def _count(value: Any) -> int | None:
    if type(value) is int and 0 <= value <= MAX_TOKENS:
        return value
    return None


class Usage:
    """The counts seen so far; `tokens` is None until a reply has said any."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        # Whether the reply has said its last usage.
        self.final = False

    def counts(self) -> dict[str, int]:
        """The counts seen so far, by boxd.wire.pricing.Tokens' names."""
        return dict(self._counts)

    def since(self, logged: dict[str, int]) -> dict[str, int]:
        """What the counts have grown by since `logged`; a count seen lower later is not given
        back."""
        grown = {name: count - logged.get(name, 0) for name, count in self._counts.items()}
        return {name: count for name, count in grown.items() if count > 0}

    def take(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for theirs, ours in _COUNTS.items():
            count = _count(usage.get(theirs))
            if count is not None:
                self._counts[ours] = count
        # The cache writes by how long they are kept: the 1-hour ones cost twice the input.
        written = usage.get("cache_creation")
        if isinstance(written, dict):
            count = _count(written.get("ephemeral_1h_input_tokens"))
            if count is not None:
                self._counts["cacheWrite1h"] = count

    @property
    def tokens(self) -> Tokens | None:
        return tokens_of(self._counts)


def tokens_of(counts: dict[str, int]) -> Tokens | None:
    """The counts as Tokens, or None if there are none."""
    if not counts:
        return None
    written = counts.get("cacheWrite", 0)
    return Tokens(
        input=counts.get("input", 0),
        output=counts.get("output", 0),
        cacheWrite=written,
        cacheRead=counts.get("cacheRead", 0),
        # A count the reply says is part of another is never taken as more than it.
        cacheWrite1h=min(counts.get("cacheWrite1h", 0), written),
    )


class StreamUsage(Usage):
    """Reads usage out of SSE bytes fed in as they arrive, in chunks cut anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self._line = bytearray()
        self._skipping = False
        # The counts message_start said (the input and cache counts, the output so far), once
        # it is read: what the gateway logs first, whatever else came in the same chunk.
        self.at_start: dict[str, int] | None = None

    def feed(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                self._keep(chunk[start:])
                return
            self._keep(chunk[start:end])
            if not self._skipping:
                self._read_line(bytes(self._line))
            self._line.clear()
            self._skipping = False
            start = end + 1

    def _keep(self, part: bytes) -> None:
        if self._skipping:
            return
        if len(self._line) + len(part) > MAX_LINE:
            self._line.clear()
            self._skipping = True
            return
        self._line += part

    def _read_line(self, line: bytes) -> None:
        if not line.startswith(b"data:") or not any(e in line for e in _USAGE_EVENTS):
            return
        try:
            event = json.loads(line[5:])
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
            self.take(event["message"].get("usage"))
            if self.at_start is None:
                self.at_start = self.counts()
        elif event.get("type") == "message_delta" and isinstance(event.get("usage"), dict):
            self.take(event["usage"])
            self.final = True


class JsonUsage(Usage):
    """Reads the `usage` of a non-streamed reply, kept whole up to a cap (replies are small:
    a 128k-token answer is well under it)."""

    MAX_REPLY = 4 * 1024 * 1024

    def __init__(self) -> None:
        super().__init__()
        self._body = bytearray()
        self._over = False

    def feed(self, chunk: bytes) -> None:
        if self._over:
            return
        if len(self._body) + len(chunk) > self.MAX_REPLY:
            self._over = True
            self._body.clear()
            return
        self._body += chunk

    def finish(self) -> None:
        if self._over or not self._body:
            return
        try:
            message = json.loads(bytes(self._body))
        except ValueError:
            return
        if isinstance(message, dict) and isinstance(message.get("usage"), dict):
            self.take(message["usage"])
            self.final = True
