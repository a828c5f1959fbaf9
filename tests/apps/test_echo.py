from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from boxd.apps.echo import MAX_TEXT, Say, app, say
from boxd.apps.registry import installed, load
from boxd.sdk import Context


def context(tmp_path: Path) -> Context:
    return Context(key="k", task={"id": "t000000001"}, secrets={}, state_dir=tmp_path)


def test_app_declares_a_free_say() -> None:
    tool = app.tool("say")
    assert app.name == "echo"
    assert tool is not None
    assert tool.input is Say
    assert tool.cost(Say(text="hi")) == 0
    assert tool.needs_ok is False
    assert tool.secrets == ()
    assert tool.description


def test_echo_is_installed() -> None:
    assert "echo" in installed()
    assert load("echo") is app


@pytest.mark.parametrize("text", ["hi", "", "two\nlines, ünïcode", "x" * MAX_TEXT])
async def test_say_returns_the_text(tmp_path: Path, text: str) -> None:
    assert await say(Say(text=text), context(tmp_path)) == {"text": text}


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({}, "missing"),
        ({"text": 5}, "string_type"),
        ({"text": None}, "string_type"),
        ({"text": "x" * (MAX_TEXT + 1)}, "string_too_long"),
        ({"text": "hi", "loud": True}, "extra_forbidden"),
    ],
)
def test_say_refuses_bad_input(body: dict[str, Any], kind: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Say.model_validate(body)
    assert raised.value.errors()[0]["type"] == kind


def test_schema_shows_the_limit() -> None:
    schema = Say.model_json_schema()
    assert schema["required"] == ["text"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["text"]["maxLength"] == MAX_TEXT
