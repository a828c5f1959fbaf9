from typing import Any, cast

import pytest
from dbus_fast.aio import MessageBus
from dbus_fast.introspection import Node

from boxd.dbus.client import BoxClient, GatewayClient
from boxd.dbus.interface import (
    ANSWER_APPROVAL,
    BROKER,
    BROKER_GET_TASK,
    CREATE_SCREEN_LINK,
    GATEWAY,
    GET_TASK,
    LOG_STEP,
    MANAGER,
    METHODS,
    WAIT_APPROVAL,
    Door,
    Method,
    bound_methods,
    bound_on,
    find_method,
    introspection_xml,
)
from boxd.dbus.server import Handler, check_handler
from boxd.manager.access.screen_sessions import ScreenSessions
from boxd.manager.access.vault import Vault
from boxd.manager.approval_answers import ApprovalAnswers
from boxd.manager.box import Box
from boxd.manager.broker_methods import BrokerMethods
from boxd.manager.model_requests import ModelRequests
from boxd.manager.owner_methods import OwnerMethods
from boxd.manager.review import ReviewMethods
from boxd.manager.workspace_archive import WorkspaceArchives
from boxd.manager.workspace_files import WorkspaceFiles
from boxd.wire.caller import Caller, Role


def test_introspection_is_valid_and_complete() -> None:
    node = Node.parse(introspection_xml(["task"]))
    names = {interface.name: interface for interface in node.interfaces}
    for bound in bound_methods():
        described = {m.name: m for m in names[bound.interface].methods}[bound.name]
        assert [a.signature for a in described.in_args] == list(bound.types)
        assert [a.name for a in described.in_args] == list(bound.names)
        assert "".join(str(a.signature) for a in described.out_args) == bound.method.reply_signature
    assert [child.name for child in node.nodes] == ["task"]


def test_gateway_methods_take_the_token_first() -> None:
    for name in ("CreateTask", "GetTask", "ListTasks", "StopTask", "RevokeToken"):
        owner = find_method(MANAGER, name)
        gateway = find_method(GATEWAY, name)
        assert owner is not None and gateway is not None
        assert gateway.args == ("token", *owner.args)
    assert find_method(BROKER, "LogStep") is not None
    answer = find_method(MANAGER, "AnswerApproval")
    assert answer is not None and answer.signature == "sb" and answer.names == ("id", "approved")
    assert find_method(MANAGER, "Nothing") is None


def test_interfaces_follow_the_callers() -> None:
    for method in METHODS:
        on = set(method.interfaces)
        assert (MANAGER in on) == (Door.POLKIT in method.callers)
        tokens = {
            Door.OWNER_TOKEN,
            Door.APP_TOKEN,
            Door.MEMBER_TOKEN,
            Door.PAIRING_CODE,
            Door.SCREEN,
            Door.LOGIN_LINK,
            Door.DEVICE,
        }
        assert (GATEWAY in on) == bool(method.callers & tokens)
        assert (BROKER in on) == (Door.BROKER in method.callers)
    # A broker reaches none of the owner's methods, and the owner none of the broker's.
    assert find_method(BROKER, "AnswerApproval") is None
    assert find_method(MANAGER, "LogStep") is None
    assert find_method(GATEWAY, "LogStep") is None


# The workspace as it stands, which a token reads only in the workspaces its limits name
# (tests/manager/test_workspace_files.py).
_READING = {
    "ListWorkspaceFiles",
    "GetWorkspaceFileHistory",
    "OpenWorkspaceFile",
    "OpenWorkspaceArchive",
}


def test_an_app_may_only_start_see_and_stop() -> None:
    admitted = {m.name for m in METHODS if Door.APP_TOKEN in m.callers}
    assert admitted == {"CreateTask", "GetTask", "ListTasks", "StopTask", *_READING}
    for method in METHODS:
        assert method.admits(GATEWAY, Role.APP) == (Door.APP_TOKEN in method.callers)


def test_a_member_may_only_start_see_and_stop() -> None:
    admitted = {m.name for m in METHODS if Door.MEMBER_TOKEN in m.callers}
    assert admitted == {"CreateTask", "GetTask", "ListTasks", "StopTask", *_READING}
    for method in METHODS:
        assert method.admits(GATEWAY, Role.MEMBER) == (Door.MEMBER_TOKEN in method.callers)
        assert not method.admits(MANAGER, Role.MEMBER)


def test_a_pairing_code_opens_only_the_exchange_and_only_the_owner_makes_codes() -> None:
    admitted = {m.name for m in METHODS if Door.PAIRING_CODE in m.callers}
    assert admitted == {"Pair"}
    for method in METHODS:
        assert method.admits(GATEWAY, Role.PAIRING) == (method.name == "Pair")
    make = find_method_strict(MANAGER, "CreatePairing").method
    assert make.callers == {Door.POLKIT, Door.SCREEN, Door.DEVICE}


IN_PERSON = {
    "GetSettings",
    "SetSettings",
    "SetSecret",
    "RemoveSecret",
    "ListSecrets",
    "CreatePairing",
    "CreateToken",
    "RemoveWorkspace",
}


def test_the_owner_in_person_may_change_settings_vault_pairing_and_workspaces() -> None:
    """The attacker's view: an owner's token (a script's), an app's or a member's is refused
    each of these; only polkit, this computer's screen and the owner's paired device are let in."""
    for name in IN_PERSON:
        method = find_method_strict(GATEWAY, name).method
        assert method.callers == {Door.POLKIT, Door.SCREEN, Door.DEVICE}, name
        for role in (Role.OWNER, Role.APP, Role.MEMBER, Role.PAIRING, Role.LOGIN_LINK):
            assert not method.admits(GATEWAY, role), (name, role)
        assert method.admits(GATEWAY, Role.SCREEN) and method.admits(GATEWAY, Role.DEVICE)


def test_new_tokens_are_the_owners_in_person() -> None:
    # As pairing is: by the owner's account, this computer's screen or their paired device;
    # never by a script's owner token, an app's or a member's, so no token widens what it or
    # another token may do.
    assert find_method_strict(GATEWAY, "CreateToken").method.callers == {
        Door.POLKIT,
        Door.SCREEN,
        Door.DEVICE,
    }
    # A role that came in by another door is not admitted, whatever the method.
    assert not find_method_strict(MANAGER, "ListTasks").method.admits(MANAGER, Role.APP)
    assert not find_method_strict(BROKER, "LogStep").method.admits(BROKER, Role.OWNER)


def find_method_strict(interface: str, name: str) -> Any:
    found = find_method(interface, name)
    assert found is not None
    return found


def _routes() -> dict[Method, Handler]:
    # routes() only names bound methods of the box and of its parts, so parts that are never
    # opened show each handler's signature.
    box: Any = Box.__new__(Box)
    for name, kind in (
        ("approvals", ApprovalAnswers),
        ("broker", BrokerMethods),
        ("vault", Vault),
        ("screen", ScreenSessions),
        ("model_requests", ModelRequests),
        ("review", ReviewMethods),
        ("owner", OwnerMethods),
        ("archives", WorkspaceArchives),
        ("files", WorkspaceFiles),
    ):
        setattr(box, name, kind.__new__(kind))
    return Box.routes(box)


def test_every_method_has_a_handler_and_no_handler_is_undeclared() -> None:
    assert set(_routes()) == set(METHODS)


def test_every_handler_takes_its_methods_arguments_by_name() -> None:
    for method, handler in _routes().items():
        check_handler(method, handler)


def test_a_handler_whose_arguments_differ_from_the_table_is_refused() -> None:
    async def get_task(caller: Caller, task: str, page: str) -> None: ...

    async def answer(caller: Caller, approval_id: str, approved: str) -> None: ...

    with pytest.raises(RuntimeError, match=r"get_task of GetTask takes \(caller: Caller, task"):
        check_handler(GET_TASK, get_task)
    with pytest.raises(RuntimeError, match=r"table says .*approved: bool"):
        check_handler(ANSWER_APPROVAL, answer)


def test_arguments_are_named_for_python_from_the_table() -> None:
    assert GET_TASK.params == ("task_id", "page")
    assert ANSWER_APPROVAL.params == ("approval_id", "approved")
    assert ANSWER_APPROVAL.param_types == (str, bool)
    assert WAIT_APPROVAL.params == ("task_id", "approval", "wait_ms")


def test_the_screen_may_do_what_the_owners_token_may_and_more() -> None:
    for method in METHODS:
        if Door.OWNER_TOKEN in method.callers:
            assert Door.SCREEN in method.callers, method
        expected = (
            Door.OWNER_TOKEN in method.callers
            or method.name in IN_PERSON
            or method.name == "CloseScreenSession"
        )
        assert (Door.SCREEN in method.callers) == expected, method
        assert method.admits(GATEWAY, Role.SCREEN) == expected, method


def test_a_paired_device_may_do_what_the_screen_may() -> None:
    for method in METHODS:
        if method.name == "CloseScreenSession":
            # Logging out is a screen's own: a device has no session to end.
            assert method.callers == {Door.SCREEN}
            continue
        assert (Door.DEVICE in method.callers) == (Door.SCREEN in method.callers), method
        assert method.admits(GATEWAY, Role.DEVICE) == method.admits(GATEWAY, Role.SCREEN)
    assert Caller(Role.DEVICE, "phone", device="phone").acts_as_owner


def test_only_the_owner_by_polkit_makes_a_login_link_and_a_link_only_opens_a_session() -> None:
    link = find_method_strict(MANAGER, "CreateScreenLink")
    assert link.method.callers == {Door.POLKIT}
    # No token of any kind, nor a screen's session, can make a link: it is not on the gateway.
    assert find_method(GATEWAY, "CreateScreenLink") is None
    assert {m.name for m in METHODS if Door.LOGIN_LINK in m.callers} == {"OpenScreenSession"}
    opening = find_method_strict(GATEWAY, "OpenScreenSession")
    for role in (Role.OWNER, Role.APP, Role.SCREEN, Role.BROKER):
        assert not opening.method.admits(GATEWAY, role)
    assert opening.method.admits(GATEWAY, Role.LOGIN_LINK)


async def test_a_client_calls_only_what_its_interface_declares() -> None:
    # Refused before anything is sent: the bus is never touched.
    nowhere = cast(MessageBus, None)
    with pytest.raises(RuntimeError, match=f"{BROKER} does not declare GetTask"):
        await BoxClient(nowhere, BROKER).call(GET_TASK, "t000000001", "")
    with pytest.raises(RuntimeError, match=f"{GATEWAY} does not declare CreateScreenLink"):
        await GatewayClient(nowhere).call_as("token", CREATE_SCREEN_LINK)
    with pytest.raises(RuntimeError, match=f"{MANAGER} does not declare LogStep"):
        await BoxClient(nowhere, MANAGER).call(LOG_STEP, "t000000001", "{}")
    assert bound_on(BROKER, BROKER_GET_TASK).args == ("id", "page")
    assert bound_on(GATEWAY, GET_TASK).args == ("token", "id", "page")
