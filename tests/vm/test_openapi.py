"""The OpenAPI document as a box in a test machine serves it: to anyone, with every route."""

from testbed.box_api import http
from testbed.machine import Machine


def test_the_box_serves_its_openapi_document_to_anyone(machine: Machine) -> None:
    status, doc = http(machine, "GET", "/api/openapi.json")
    assert status == 200
    assert doc["openapi"] == "3.1.0"
    assert {"/api/tasks", "/api/tasks/{id}", "/api/session"} <= set(doc["paths"])
    assert "TaskRequest" in doc["components"]["schemas"]
