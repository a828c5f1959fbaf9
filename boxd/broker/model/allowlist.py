"""What the model gateway passes upstream: the parts of a Messages API request a client needs,
and nothing that would let a task reach past its network rules or spend in ways the box does not
price.

Anthropic's server tools (web search, web fetch, code execution, tool search), the MCP connector
(`mcp_servers`), a code-execution `container`, images and documents fetched from a URL or taken
from the Files API all make Anthropic's servers fetch or send data for the task: a task with no
`hosts`, or a Droid task at low autonomy ("its model, and nothing else"), would reach the
Internet through them. They are also billed by the search, the container hour or the file, which
`boxd.wire.pricing` does not price. Other service tiers and data residency are billed at other
rates, and so is fast mode (`speed`); the 1M-token context at long-context rates. So each
request is held to allowlists of top-level fields, tool kinds (tools the client runs), content
blocks and sources, and `anthropic-beta` values; what is refused is named in the refusal.

Values are checked as boxd.broker.model.request decoded them: its strings are the body's bytes
read as Latin-1 (every JSON name checked here is ASCII, so they compare as they should), and
`shown` turns one back into the text the client sent, for a refusal's words.
"""

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Top-level fields of a Messages API request a client sends that neither reach out nor change
# what the reply costs per token.
FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "context_management",
        "output_format",
        "output_config",
        "service_tier",
        # Automatic caching: the marker on the last cacheable block, priced as any other.
        "cache_control",
        # Asks the reply to say why the prompt cache missed; reaches nothing, costs nothing.
        "diagnostics",
        "speed",
    }
)
# Fast mode is billed at premium rates the box does not price: only the standard speed passes.
STANDARD_SPEED = "standard"
# The service tier is passed only when it asks for the standard one: "auto" (the default, when
# the field is left out) may use Priority Tier capacity, which the owner's contract prices.
STANDARD_TIER = "standard_only"
# Tools the client runs, by `type`: a tool with no type (or "custom") is the client's own; the
# others are Anthropic-defined tools whose every action the client carries out.
CLIENT_TOOL_PREFIXES = ("bash_", "text_editor_", "computer_", "memory_")
# Content blocks a client sends: in messages, in system, and in a tool result's content.
BLOCKS = frozenset(
    {
        "text",
        "image",
        "document",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "search_result",
    }
)
# Where an image or a document comes from: from the request itself only.
SOURCES = frozenset({"base64", "text", "content"})
# `anthropic-beta` values that change neither where data goes nor the price per token.
BETAS = frozenset(
    {
        "interleaved-thinking-2025-05-14",
        "fine-grained-tool-streaming-2025-05-14",
        "token-efficient-tools-2025-02-19",
        "prompt-caching-2024-07-31",
        "extended-cache-ttl-2025-04-11",
        "context-management-2025-06-27",
        "output-128k-2025-02-19",
        "pdfs-2024-09-25",
        "search-results-2025-06-09",
        "structured-outputs-2025-11-13",
        "effort-2025-11-24",
        "model-context-window-exceeded-2025-08-26",
        "claude-code-20250219",
        "computer-use-2025-01-24",
        "computer-use-2025-11-24",
    }
)
# Tokens Anthropic bills per image at most: a larger image is scaled down first.
IMAGE_TOKENS = 1_600


class Refused(ValueError):
    """Something in the request the gateway does not pass; the message names it."""


def shown(value: object, limit: int = 80) -> str:
    """A value of the request as its sender wrote it, short enough for a refusal's words."""
    if isinstance(value, str):
        with contextlib.suppress(UnicodeEncodeError, UnicodeDecodeError):
            value = value.encode("latin-1").decode("utf-8")
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_betas(header: str | None) -> None:
    """The `anthropic-beta` header: a comma-separated list, each on the allowlist."""
    if header is None:
        return
    for value in (part.strip() for part in header.split(",")):
        if value and value not in BETAS:
            raise Refused(
                f"the model gateway does not pass the beta {shown(value)}: it may reach "
                "beyond the task's network rules or be billed in ways the box does not price; "
                f"it passes {', '.join(sorted(BETAS))}"
            )


@dataclass
class Shape:
    """What the checks saw that the reservation needs: the images (billed by their pixels, not
    their bytes), the PDFs (by their pages), and whether anything is written to the 1-hour
    cache."""

    images: int = 0
    image_bytes: int = 0
    # Documents sent as base64 (PDFs), billed by their pages.
    pdfs: int = 0
    hour_cache: bool = False


def check_fields(fields: dict[str, Any], shape: Shape) -> None:
    """Every top-level field, with what the request's tools and content hold."""
    for name in fields:
        if name not in FIELDS:
            raise Refused(_field_refusal(name))
    tier = fields.get("service_tier")
    if "service_tier" in fields and tier != STANDARD_TIER:
        raise Refused(
            f"the model gateway passes service_tier only as {STANDARD_TIER!r}, not "
            f"{shown(tier)}: other tiers are billed at rates the box does not price"
        )
    speed = fields.get("speed")
    if speed is not None and speed != STANDARD_SPEED:
        raise Refused(
            f"the model gateway passes speed only as {STANDARD_SPEED!r}, not {shown(speed)}: "
            "fast mode is billed at rates the box does not price"
        )
    _cache(fields, shape)
    tools = fields.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise Refused("tools must be a list of tools")
        for tool in tools:
            _check_tool(tool, shape)
    system = fields.get("system")
    if isinstance(system, list):
        _check_blocks(system, "system", shape)
    messages = fields.get("messages")
    if messages is not None:
        if not isinstance(messages, list):
            raise Refused("messages must be a list of messages")
        for number, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                _check_blocks(content, f"messages[{number}]", shape)


def _field_refusal(name: str) -> str:
    if name == "mcp_servers":
        why = (
            "the MCP connector has Anthropic's servers reach MCP servers on the Internet, "
            "beyond the task's network rules"
        )
    elif name == "container":
        why = "code execution runs in Anthropic's containers, billed by the hour"
    elif name == "inference_geo":
        why = "inference in a chosen region is billed at rates the box does not price"
    else:
        why = "it is not on the box's list of fields a client model request needs"
    return (
        f"the model gateway does not pass the field {shown(name)}: {why}; it passes "
        f"{', '.join(sorted(FIELDS))}"
    )


def _check_tool(tool: object, shape: Shape) -> None:
    if not isinstance(tool, dict):
        raise Refused("each tool must be an object")
    kind = tool.get("type")
    _cache(tool, shape)
    if kind is None or kind == "custom":
        return
    if isinstance(kind, str) and kind.startswith(CLIENT_TOOL_PREFIXES):
        return
    raise Refused(
        f"the model gateway does not pass the tool type {shown(kind)}: Anthropic's server "
        "tools (web search, web fetch, code execution, tool search) reach beyond the task's "
        "network rules and are billed in ways the box does not price; tools the client runs "
        f"pass (no type, custom, {', '.join(p + '*' for p in CLIENT_TOOL_PREFIXES)})"
    )


def _check_blocks(blocks: Iterable[object], where: str, shape: Shape) -> None:
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind not in BLOCKS:
            raise Refused(
                f"the model gateway does not pass a content block of type {shown(kind)} "
                f"({where}): it passes {', '.join(sorted(BLOCKS))}"
            )
        _cache(block, shape)
        source = block.get("source")
        if kind in ("image", "document") and isinstance(source, dict):
            _check_source(source, kind, where, shape)
        inner = block.get("content")
        if kind in ("tool_result", "search_result", "document") and isinstance(inner, list):
            _check_blocks(inner, where, shape)


def _check_source(source: dict[str, Any], kind: str, where: str, shape: Shape) -> None:
    origin = source.get("type")
    if origin not in SOURCES:
        raise Refused(
            f"the model gateway does not pass an {kind} whose source is {shown(origin)} "
            f"({where}): Anthropic would fetch it from a URL or the Files API, beyond the "
            "task's network rules; send it in the request (base64)"
        )
    if kind == "image" and origin == "base64":
        data = source.get("data")
        shape.images += 1
        shape.image_bytes += len(data) if isinstance(data, str) else 0
    if kind == "document" and origin == "base64":
        shape.pdfs += 1
    if origin == "content" and isinstance(source.get("content"), list):
        _check_blocks(source["content"], where, shape)


def _cache(part: dict[str, Any], shape: Shape) -> None:
    control = part.get("cache_control")
    if isinstance(control, dict) and control.get("ttl") == "1h":
        shape.hour_cache = True
