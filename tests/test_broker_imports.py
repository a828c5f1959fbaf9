"""A broker starts with every task and on the first request after it exited idle, so what it
imports is on that path: the manager's models, the App SDK and the tool models are not imported or
built as it starts, and its request models are built on their first request."""

import json
import subprocess
import sys

_LOOK = """
import json, sys
import boxd.broker.main
from boxd.approval import AskRequest
from boxd.broker.app import CostRequest, UsageRequest
from boxd.broker.calls import CallRequest
from boxd.step import Step
from boxd.plain_errors import parse

models = {"AskRequest": AskRequest, "CallRequest": CallRequest, "Step": Step,
          "CostRequest": CostRequest, "UsageRequest": UsageRequest}
built = {name: model.__pydantic_complete__ for name, model in models.items()}
step = parse(Step, b'{"text": "read the files"}').model_dump(mode="json")
print(json.dumps({
    "modules": sorted(sys.modules),
    "built": built,
    "step": step,
    "built_after": Step.__pydantic_complete__,
}))
"""


def _look() -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", _LOOK], capture_output=True, text=True, check=True)
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_the_broker_imports_no_model_of_the_manager_nor_the_apps() -> None:
    modules = _look()["modules"]
    assert isinstance(modules, list)
    for name in (
        "boxd.approval_record",
        "boxd.event_record",
        "boxd.key_use",
        "boxd.sdk",
        "boxd.apps.echo",
        "boxd.task",
        "boxd.task_request",
        "boxd.manager",
        # The broker keeps no database: boxd.full_disk's check does not load SQLite.
        "sqlite3",
        # Its own HTTP server (boxd/broker/http_server.py): aiohttp cost each broker 180 ms to
        # import and 13 MiB; the model gateway imports it on its first connection.
        "aiohttp",
    ):
        assert name not in modules, f"the broker imports {name} as it starts"


def test_the_request_models_are_built_on_their_first_request() -> None:
    found = _look()
    built = found["built"]
    assert isinstance(built, dict) and len(built) == 5 and not any(built.values()), built
    assert found["step"] == {"text": "read the files", "data": None}
    assert found["built_after"] is True
