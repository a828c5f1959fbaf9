from dbus_fast.introspection import Node

from boxd.dbus.interface import BROKER, GATEWAY, MANAGER, METHODS, find_method, introspection_xml


def test_introspection_is_valid_and_complete() -> None:
    node = Node.parse(introspection_xml(["task"]))
    names = {interface.name: interface for interface in node.interfaces}
    for method in METHODS:
        described = {m.name: m for m in names[method.interface].methods}[method.name]
        assert [a.signature for a in described.in_args] == list(method.types)
        assert [a.signature for a in described.out_args] == ["s"]
    assert [child.name for child in node.nodes] == ["task"]


def test_gateway_methods_take_the_token_first() -> None:
    for name in ("CreateTask", "GetTask", "ListTasks", "StopTask"):
        owner = find_method(MANAGER, name)
        gateway = find_method(GATEWAY, name)
        assert owner is not None and gateway is not None
        assert gateway.args == ("token", *owner.args)
    assert find_method(BROKER, "LogStep") is not None
    answer = find_method(MANAGER, "AnswerApproval")
    assert answer is not None and answer.signature == "sb" and answer.names == ("id", "approved")
    assert find_method(MANAGER, "Nothing") is None
