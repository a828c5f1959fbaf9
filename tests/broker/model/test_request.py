"""A model request as the gateway reads it (boxd.broker.model.request, model_allowlist): the
task's model spliced in and nothing else changed, what is refused and in which words, the
estimate its reservation is made from, and the memory it takes to read."""

import json
import tracemalloc
from typing import Any

import pytest

from boxd.broker.model.allowlist import BETAS, Refused, check_betas
from boxd.broker.model.request import (
    CONTEXT_TOKENS,
    MAX_VALUES,
    ModelRequest,
    NotAnObject,
    TooDense,
    count_values,
    read_request,
    values_outside_strings,
)

MODEL = "claude-sonnet-4-6"
MIB = 1024 * 1024


def sent(request: ModelRequest) -> bytes:
    return b"".join(request.parts)


@pytest.mark.parametrize(
    "body",
    [
        '{"model":"claude-opus-4-6","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}',
        ' {\n "messages" : [] ,\n "model" : "x" , "stream":true, "max_tokens": 1 }\n',
        '{"messages":[],"stream":false,"max_tokens":1}',
        '{"max_tokens":1}',
        '{"model":{"nested":["claude"]},"max_tokens":1}',
        '{"messages":[{"role":"user","content":"\\"model\\": \\"opus\\""}],"model":"a",'
        '"max_tokens":1}',
        '{"model":null,"max_tokens":1,"metadata":{"user_id":"é ü 😀"}}',
    ],
)
def test_the_model_is_spliced_in_and_nothing_else_changes(body: str) -> None:
    request = read_request(body.encode(), MODEL)
    assert json.loads(sent(request)) == {**json.loads(body), "model": MODEL}
    assert request.length == len(sent(request))


def test_a_key_named_twice_anywhere_is_refused() -> None:
    """Readers differ on which of two values counts; the upstream must read what was checked.
    The attacker's tool says `custom` to a reader that keeps the last value and a server tool
    to one that keeps the first."""
    twice = [
        b'{"max_tokens":1,"model":"a","m\\u006fdel":"b"}',
        b'{"max_tokens":1,"max_tokens":64000}',
        b'{"max_tokens":1,"tools":[{"type":"web_search_20250305","name":"w","type":"custom"}]}',
    ]
    for body in twice:
        with pytest.raises(Refused, match="twice"):
            read_request(body, MODEL)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[1, 2]", NotAnObject),
        (b'"model"', NotAnObject),
        (b"{not json", ValueError),
        (b'{"max_tokens":1,}', ValueError),
        (b'{"max_tokens":1} {}', ValueError),
        (b'{"max_tokens" 1}', ValueError),
        (b'{"a":1', ValueError),
        (b"", ValueError),
        (b'\xff{"max_tokens":1}', ValueError),
        (b'{"max_tokens":1,"x":"\xc3"}', ValueError),
        (b'{"a":' + b"[" * 100_000 + b"}", RecursionError),
    ],
)
def test_what_is_not_a_json_object_is_refused(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        read_request(body, MODEL)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "max_tokens is required"),
        (0, "max_tokens must be a whole number of tokens, 1 or more, not 0"),
        (1.5, "max_tokens must be a whole number of tokens, 1 or more, not 1.5"),
        (True, "max_tokens must be a whole number of tokens, 1 or more, not True"),
        ("100", "max_tokens must be a whole number of tokens, 1 or more, not '100'"),
    ],
)
def test_max_tokens_is_a_whole_number(value: object, words: str) -> None:
    body: dict[str, Any] = {"messages": []}
    if value is not None:
        body["max_tokens"] = value
    with pytest.raises(Refused) as refused:
        read_request(json.dumps(body).encode(), MODEL)
    assert str(refused.value).startswith(words)


def test_a_stream_flag_is_true_or_false() -> None:
    assert read_request(b'{"max_tokens":1,"stream":true}', MODEL).stream
    assert not read_request(b'{"max_tokens":1}', MODEL).stream
    with pytest.raises(Refused, match="stream must be true or false"):
        read_request(b'{"max_tokens":1,"stream":"yes"}', MODEL)


def request_with(**fields: Any) -> bytes:
    return json.dumps({"max_tokens": 100, "messages": [], **fields}).encode()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"mcp_servers": []}, "the model gateway does not pass the field 'mcp_servers'"),
        ({"container": "c"}, "the model gateway does not pass the field 'container'"),
        (
            {"inference_geo": "us"},
            "the model gateway does not pass the field 'inference_geo': inference in a chosen "
            "region is billed at rates the box does not price",
        ),
        ({"speed": "fast"}, "the model gateway passes speed only as 'standard', not 'fast'"),
        ({"service_tier": "priority"}, "the model gateway passes service_tier only as"),
        ({"tools": {"a": 1}}, "tools must be a list of tools"),
        ({"tools": ["x"]}, "each tool must be an object"),
        (
            {"tools": [{"type": "tool_search_tool_regex_20251119", "name": "s"}]},
            "the model gateway does not pass the tool type 'tool_search_tool_regex_20251119'",
        ),
        (
            {"tools": [{"type": "mcp_toolset", "mcp_server_name": "s"}]},
            "the model gateway does not pass the tool type 'mcp_toolset'",
        ),
        (
            {"tools": [{"type": 7, "name": "s"}]},
            "the model gateway does not pass the tool type 7",
        ),
        ({"messages": "hi"}, "messages must be a list of messages"),
        (
            {"system": [{"type": "document", "source": {"type": "url", "url": "https://x"}}]},
            "the model gateway does not pass an document whose source is 'url' (system)",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {
                                    "type": "content",
                                    "content": [
                                        {
                                            "type": "image",
                                            "source": {"type": "file", "file_id": "f"},
                                        }
                                    ],
                                },
                            }
                        ],
                    }
                ]
            },
            "the model gateway does not pass an image whose source is 'file' (messages[0])",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]},
            "the model gateway does not pass a content block of type 'server_tool_use'",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "mcp_tool_use"}]}]},
            "the model gateway does not pass a content block of type 'mcp_tool_use'",
        ),
    ],
)
def test_what_the_gateway_does_not_pass_is_named(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(Refused) as refused:
        read_request(request_with(**fields), MODEL)
    assert str(refused.value).startswith(words)


def test_what_a_client_sends_passes() -> None:
    """Droid 0.225.2's own request, as the VM tests record it, in the parts the checks read."""
    body = request_with(
        system=[
            {"type": "text", "text": "You are Droid.", "cache_control": {"type": "ephemeral"}},
            {
                "type": "text",
                "text": "Harness.",
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            },
        ],
        tools=[
            {"name": "Read", "description": "Reads.", "input_schema": {"type": "object"}},
            {"type": "custom", "name": "Mine", "input_schema": {}},
            {"type": "bash_20250124", "name": "bash"},
            {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        ],
        thinking={"type": "adaptive"},
        output_config={"effort": "high"},
        service_tier="standard_only",
        messages=[
            {"role": "user", "content": "Write a.txt"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "…", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {"type": "x"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "ok"},
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": "A" * 3000,
                                },
                            },
                        ],
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
    )
    request = read_request(body, MODEL)
    assert request.hour_cache
    # The image is billed by its pixels, not its bytes: 1,600 tokens at most.
    assert request.input_tokens == -(-(len(body) - 3000) // 3) + 1600


def test_every_ordinary_field_of_the_current_sdk_passes() -> None:
    """What Anthropic's Python SDK 2.17 sends beyond Droid's fields (issue 36): automatic
    caching's top-level cache_control (its 1-hour form reserved as such), diagnostics, a
    standard speed, metadata, stop_sequences and a tool_choice."""
    body = request_with(
        model="claude-sonnet-4-6",
        system="Be brief.",
        metadata={"user_id": "owner-1"},
        stop_sequences=["END"],
        tools=[{"name": "lookup", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024},
        cache_control={"type": "ephemeral"},
        diagnostics={"previous_message_id": None},
        speed="standard",
        stream=True,
    )
    request = read_request(body, MODEL)
    assert json.loads(sent(request)) == {**json.loads(body), "model": MODEL}
    assert not request.hour_cache
    assert read_request(request_with(cache_control={"type": "ephemeral", "ttl": "1h"}), MODEL)
    assert read_request(
        request_with(cache_control={"type": "ephemeral", "ttl": "1h"}), MODEL
    ).hour_cache


def test_speed_and_the_hour_cache_are_read_as_the_upstream_reads_them() -> None:
    """The attacker's spellings: fast mode in another case or type, or behind a JSON escape, is
    refused; a 1-hour TTL behind an escape is reserved as one (written at twice the input
    price), at the top level as in a block."""
    for speed in ('"Fast"', '"STANDARD"', '" standard"', "1", '["standard"]', '{"a":1}'):
        with pytest.raises(Refused, match="passes speed only as 'standard'"):
            read_request(b'{"max_tokens":1,"speed":%s}' % speed.encode(), MODEL)
    with pytest.raises(Refused, match="not 'fast'"):
        read_request(b'{"max_tokens":1,"sp\\u0065ed":"f\\u0061st"}', MODEL)
    assert read_request(b'{"max_tokens":1,"speed":"st\\u0061ndard"}', MODEL)
    escaped = b'{"type":"ephemeral","ttl":"\\u0031h"}'
    top = b'{"max_tokens":1,"messages":[],"cache_control":%s}' % escaped
    assert read_request(top, MODEL).hour_cache
    block = (
        b'{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"text","text":"x",'
        b'"cache_control":%s}]}]}' % escaped
    )
    assert read_request(block, MODEL).hour_cache


def test_the_input_estimate_is_capped_at_the_context() -> None:
    body = request_with(messages=[{"role": "user", "content": "x" * (2 * MIB)}])
    assert read_request(body, MODEL).input_tokens == CONTEXT_TOKENS


def test_betas_off_the_list_are_refused_by_name() -> None:
    check_betas(None)
    check_betas(", ".join(sorted(BETAS)))
    for beta in (
        "mcp-client-2025-04-04",
        "code-execution-2025-08-25",
        "files-api-2025-04-14",
        "context-1m-2025-08-07",
        "web-fetch-2025-09-10",
        "skills-2025-10-02",
    ):
        with pytest.raises(Refused) as refused:
            check_betas(f"interleaved-thinking-2025-05-14,{beta}")
        assert str(refused.value).startswith(f"the model gateway does not pass the beta '{beta}'")


def test_values_are_counted_outside_strings() -> None:
    assert values_outside_strings(b'{"a":[1,2,{"b":"x,y,[z{"}]}') == 6
    assert values_outside_strings(b'{"a":"\\",[{"}') == 2
    # A bound found at once, the strings set aside only when it is past the cap.
    assert count_values(b'{"a":[1,2,{"b":"x,y,[z{"}]}') == 10
    commas = b'{"a":"' + b"," * MAX_VALUES + b'"}'
    assert count_values(commas) == 2


def peak_of(body: bytes) -> tuple[str, int]:
    """How reading `body` ended, and the most memory it took while it did."""
    tracemalloc.start()
    try:
        read_request(body, MODEL)
        ended = "read"
    except TooDense:
        ended = "too dense"
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return ended, peak


def test_the_largest_bodies_are_read_in_memory_bounded_by_their_size() -> None:
    """The attacker's 32 MiB: before, decoded whole (an empty object is 64 bytes of Python for 2
    of JSON), some 25 times its size, past the broker's MemoryMax with replies in flight."""
    size = 32 * MIB - 100
    head = b'{"max_tokens":1,"messages":'
    dense = head + b"[" + b"{}," * (size // 3) + b"{}]}"
    ended, peak = peak_of(dense)
    assert ended == "too dense" and peak < 2.2 * len(dense)
    # One string of emoji: as UTF-8 text, four bytes a character in Python's memory.
    emoji = (
        head
        + json.dumps([{"role": "user", "content": "😀" * (size // 4)}], ensure_ascii=False).encode()
        + b"}"
    )
    ended, peak = peak_of(emoji)
    assert ended == "read" and peak < 2.2 * len(emoji)
    # As many values as a model's context may take, each an object.
    blocks = b",".join([b'{"type":"text","text":"' + b"y" * 90 + b'"}'] * (MAX_VALUES // 3 - 10))
    wide = head + b'[{"role":"user","content":[' + blocks + b"]}]}"
    ended, peak = peak_of(wide)
    assert ended == "read" and peak < 100 * MIB


def test_an_unclosed_string_of_escaped_quotes_is_counted_in_one_pass() -> None:
    """The attacker's body past 4 MiB with many marks, ending in a string that never closes,
    made of escaped quotes: before, the search for strings began again at each of them, a time
    that grew with their square (hours for 4 MiB), holding the broker's only thread."""
    marks = b"[" + b"0," * (MAX_VALUES + 10) + b"0]"
    body = b'{"max_tokens":1,"pad":' + marks + b',"b":"' + b'\\"' * (2 * MIB)
    assert values_outside_strings(body) > MAX_VALUES
    with pytest.raises(TooDense):
        read_request(body, MODEL)


def test_a_key_named_twice_among_many_is_found_in_one_pass() -> None:
    """131,072 keys in one object and the last one twice: before, each key was counted among
    all of them to find it (minutes, on the broker's event loop)."""
    names = [f"k{n}" for n in range(131_072)]
    schema = "{" + ",".join(f'"{name}":0' for name in [*names, names[0]]) + "}"
    body = ('{"max_tokens":1,"tools":[{"name":"t","input_schema":' + schema + "}]}").encode()
    with pytest.raises(Refused, match="'k0' twice in one object"):
        read_request(body, MODEL)


def test_a_pdf_is_reserved_as_the_whole_context() -> None:
    """A hundred pages fit in a few kilobytes of PDF and are billed by the page: estimated by its
    bytes, eight such requests passed a dollar's budget together without a yes."""
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x" * 1000}
    body = request_with(
        messages=[{"role": "user", "content": [{"type": "document", "source": pdf}]}]
    )
    assert read_request(body, MODEL).input_tokens == CONTEXT_TOKENS
