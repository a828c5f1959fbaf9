"""The OpenAPI document: every route make_app serves is in it, it is valid OpenAPI 3.1 (the
official schema, by openapi-spec-validator), and its bodies refuse what the box refuses."""

import re
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from boxd.dbus.client import GatewayClient
from boxd.errors import NO_ROOM_TO_START
from boxd.web.app import make_app
from boxd.web.openapi import OPENAPI_PATH, document

_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


def _served() -> set[tuple[str, str]]:
    app = make_app(GatewayClient.__new__(GatewayClient))
    return {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def _documented(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, item in doc["paths"].items() for method in item}


def test_every_route_is_documented_and_nothing_else() -> None:
    assert _documented(document()) == _served()


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, ref
        node = node[part]
    return node


def test_the_document_is_openapi_3_1() -> None:
    doc = document()
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["title"] and doc["info"]["version"]
    schemes = doc["components"]["securitySchemes"]
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        assert set(item) <= _METHODS, path
        wanted = set(re.findall(r"{([^}]+)}", path))
        for method, operation in item.items():
            where = f"{method} {path}"
            declared = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
            assert declared == wanted, where
            for parameter in operation["parameters"]:
                assert parameter["in"] in {"path", "query", "header", "cookie"}, where
                assert parameter["in"] != "path" or parameter["required"] is True, where
            assert operation["responses"], where
            for status, response in operation["responses"].items():
                assert re.fullmatch(r"[1-5]\d\d", status), where
                assert response["description"], where
                for media in response.get("content", {}).values():
                    OAS31Validator.check_schema(media["schema"])
            for requirement in operation.get("security", []):
                assert set(requirement) <= set(schemes), where
            if "requestBody" in operation:
                # JSON for most; an upload's bytes, tar or multipart for the owner's changes.
                assert operation["requestBody"]["content"], where
                for media in operation["requestBody"]["content"].values():
                    OAS31Validator.check_schema(media["schema"])
    for ref in _refs(doc):
        _resolve(doc, ref)
    for schema in doc["components"]["schemas"].values():
        OAS31Validator.check_schema(schema)


def _validator(doc: dict[str, Any], name: str) -> OAS31Validator:
    return OAS31Validator({"components": doc["components"], "$ref": f"#/components/schemas/{name}"})


def test_the_bodies_are_the_models_the_box_checks() -> None:
    doc = document()
    request = _validator(doc, "TaskRequest")
    assert request.is_valid({"title": "a", "prompt": "b", "worker": "fake"})
    assert not request.is_valid({"title": "a", "prompt": "b", "app": "shop"})
    assert not request.is_valid({"prompt": "b"})
    answer = _validator(doc, "Answer")
    assert answer.is_valid({"approved": True}) and not answer.is_valid({"approved": "yes"})
    # Every refusal reads {"error": "..."}, with its words.
    refusal = doc["paths"]["/api/approvals"]["get"]["responses"]["403"]["content"]
    words = [e["value"]["error"] for e in refusal["application/json"]["examples"].values()]
    assert "only this computer's own screen or the owner's paired device can do this" in words


async def test_the_gateway_serves_it_to_anyone() -> None:
    app = make_app(GatewayClient.__new__(GatewayClient))
    async with TestClient(TestServer(app)) as client:
        response = await client.get(OPENAPI_PATH)
        assert response.status == 200
        assert await response.json() == document()


def test_starting_a_task_on_a_full_disk_is_documented_in_the_box_s_words() -> None:
    refusal = document()["paths"]["/api/tasks"]["post"]["responses"]["507"]
    examples = refusal["content"]["application/json"]["examples"]
    assert {"error": NO_ROOM_TO_START} in [example["value"] for example in examples.values()]
