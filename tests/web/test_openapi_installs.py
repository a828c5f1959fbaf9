"""GET /api/droid and GET /api/claude in the OpenAPI document: every state of an install, as the
manager answers it, is what the document describes, and an answer missing a field is not."""

from typing import Any

from openapi_schema_validator import OAS31Validator

from boxd.manager.agent_install import CLAUDE, DROID, InstallState, Phase
from boxd.web.openapi import document


def _answer_schema(path: str) -> dict[str, Any]:
    schema = document()["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
    assert isinstance(schema["schema"], dict)
    return schema["schema"]


def test_each_state_of_each_install_is_as_documented() -> None:
    for path, agent in (("/api/droid", DROID), ("/api/claude", CLAUDE)):
        validator = OAS31Validator(_answer_schema(path))
        states = [InstallState(phase, agent=agent) for phase in Phase]
        states.append(InstallState(Phase.FAILED, "no network", agent))
        for state in states:
            answer = state.public()
            assert validator.is_valid(answer), (path, answer)
            assert set(answer) == set(_answer_schema(path)["properties"])
        assert not validator.is_valid({"version": agent.version, "installed": True})
