"""Every rule of docs/spec/start-a-task.txt that the request model enforces, with its words."""

import base64
import json
from typing import Any

import pytest

from boxd.errors import BoxError, Problem
from boxd.wire.models.task_request import Autonomy, parse_task_request


def body(**fields: Any) -> str:
    return json.dumps({"title": "Summarise", "prompt": "step hi", **fields})


def refused(text: str | bytes) -> str:
    with pytest.raises(BoxError) as caught:
        parse_task_request(text)
    assert caught.value.problem == Problem.INVALID
    return caught.value.message


def test_defaults() -> None:
    request = parse_task_request(body())
    assert request.workspace == "home"
    assert request.worker == "droid"
    assert request.tools == []
    assert request.hosts is None
    assert request.source == "api"
    assert request.budgetCents is None
    assert request.droid.autonomy == Autonomy.LOW


def test_seed_example() -> None:
    request = parse_task_request(
        '{"title":"Summarise the meeting notes","prompt":"Read notes.md and write a five-line '
        'summary to summary.md.","workspace":"home","budgetCents":50}'
    )
    assert request.budgetCents == 50


@pytest.mark.parametrize("field", ["title", "prompt"])
def test_missing_title_or_prompt(field: str) -> None:
    fields = {"title": "t", "prompt": "p"}
    del fields[field]
    assert refused(json.dumps(fields)) == f"{field} is missing"
    assert refused(json.dumps({**fields, field: "  "})) == f"{field} is missing"


def test_limits() -> None:
    assert parse_task_request(body(title="x" * 200)).title == "x" * 200
    assert refused(body(title="x" * 201)) == "title is over 200 characters"
    assert len(parse_task_request(body(prompt="x" * 100_000)).prompt) == 100_000
    assert refused(body(prompt="x" * 100_001)) == "prompt is over 100,000 characters"


@pytest.mark.parametrize("value", [-1, 100_001, 1.5, 50.0, "50", True, None])
def test_budget_must_be_a_whole_number_in_range(value: object) -> None:
    if value is None:
        assert parse_task_request(body(budgetCents=None)).budgetCents is None
        return
    assert refused(body(budgetCents=value)) == (
        "budgetCents must be a whole number from 0 to 100000"
    )


@pytest.mark.parametrize("value", [0, 100_000])
def test_budget_bounds(value: int) -> None:
    assert parse_task_request(body(budgetCents=value)).budgetCents == value


def test_unknown_field_is_named() -> None:
    assert refused(body(colour="red")) == "unknown field colour"
    assert refused(body(droid={"autonomy": "low", "speed": 3})) == "unknown field droid.speed"


def test_worker() -> None:
    assert parse_task_request(body(worker="fake")).worker == "fake"
    assert refused(body(worker="robot")) == (
        "unknown worker 'robot'; this box has droid, claude and fake"
    )
    assert parse_task_request(body(worker="claude")).worker == "claude"


def test_model_is_recorded_as_full_id() -> None:
    assert parse_task_request(body(model="haiku")).model == "claude-haiku-4-5"
    assert parse_task_request(body(model="sonnet")).model == "claude-sonnet-4-6"
    assert parse_task_request(body(model="opus")).model == "claude-opus-4-6"
    assert parse_task_request(body(model="claude-3-7-sonnet")).model == "claude-3-7-sonnet"
    assert refused(body(model="gpt-5")).startswith("model: unknown model 'gpt-5'")
    assert refused(body(model=5)) == "model must be a string"


def test_hosts() -> None:
    assert parse_task_request(body(hosts=["Example.com", "*.example.org", "a.b:8080"])).hosts == [
        "example.com",
        "*.example.org",
        "a.b:8080",
    ]
    assert refused(body(hosts=["localhost"])).startswith("hosts: 'localhost' is the box itself")
    assert refused(body(hosts=["com"])) == "hosts: 'com' is a whole top-level domain, not a host"
    assert refused(body(hosts=[f"h{i}.example.com" for i in range(51)])) == (
        "hosts has 51 names; at most 50 are allowed"
    )
    assert refused(body(hosts="example.com")) == "hosts must be a list of host names"


def test_body_must_be_a_json_object() -> None:
    assert refused("[1, 2]") == "the body must be a JSON object"
    assert refused("{nope").startswith("the body is not valid JSON")
    assert refused("").startswith("the body is not valid JSON")


def test_types_are_named() -> None:
    assert refused(body(tools="wallet.pay")) == "tools: input should be a valid array"
    assert refused(body(title=7)) == "title: input should be a valid string"
    assert refused(body(droid={"autonomy": "max"})) == (
        "droid.autonomy: input should be 'low', 'medium' or 'high'"
    )


def test_personal_folders_shape() -> None:
    request = parse_task_request(body(folder="/home/owner/notes"))
    assert request.personal == ["/home/owner/notes"]
    assert parse_task_request(body(folders=["/a/b", "/c"])).personal == ["/a/b", "/c"]
    assert parse_task_request(body()).personal is None
    assert refused(body(folder="notes")) == "folder: 'notes' is not an absolute path to a folder"
    assert refused(body(folders=[])) == "folders: name 1 to 10 folders, not 0"
    assert refused(body(folders=[f"/f{n}" for n in range(11)])) == (
        "folders: name 1 to 10 folders, not 11"
    )
    assert refused(body(folders=["/ok", "rel"])) == (
        "folders: 'rel' is not an absolute path to a folder"
    )
    assert refused(body(folder="/a", folders=["/b"])) == "send folder or folders, not both"
    assert refused(body(folder="/a", workspace="home")) == (
        "folder replaces workspace: send one of them, not both"
    )
    assert refused(body(folders=["/a"], workspace="home")) == (
        "folders replaces workspace: send one of them, not both"
    )


def shared(name: str = "notes.md", content: bytes = b"hello") -> dict[str, str]:
    return {"name": name, "content": base64.b64encode(content).decode()}


def test_shared_files() -> None:
    request = parse_task_request(body(files=[shared(), shared("b.txt", b"")]))
    assert request.files is not None
    assert [(f.name, f.content) for f in request.files] == [("notes.md", b"hello"), ("b.txt", b"")]


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ([], "files: share 1 to 8 files, not 0"),
        ([shared(f"f{i}") for i in range(9)], "files: share 1 to 8 files, not 9"),
        ([shared("a/b")], "files: 'a/b' is not a plain file name"),
        ([shared("..")], "files: '..' is not a plain file name"),
        ([shared("")], "files: '' is not a plain file name"),
        ([{"name": "a", "content": "not base64!"}], "files: content is not valid base64"),
        ([shared("a"), shared("a")], "files: two files are named 'a'"),
        (
            [shared("a", b"x" * (3 * 1024 * 1024)), shared("b", b"y" * (2 * 1024 * 1024 + 1))],
            "files: the files are over 5 MB in all",
        ),
        ([{"name": "a"}], "files.0.content is missing"),
    ],
)
def test_shared_files_refused(files: list[dict[str, str]], words: str) -> None:
    assert refused(body(files=files)) == words


def test_shared_files_bring_their_own_workspace() -> None:
    assert refused(body(files=[shared()], workspace="home")) == (
        "files go to a new workspace of their own, so a task with files cannot also name workspace"
    )
