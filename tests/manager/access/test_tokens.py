"""What a token may be made as: its role, and a member's id that becomes tasks' requester."""

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.access.tokens import MAX_NAME, check_member_id, token_role
from boxd.wire.caller import Role


def test_a_token_is_an_owners_an_apps_or_a_members_never_a_brokers() -> None:
    assert [token_role(r) for r in ("owner", "app", "member")] == [
        Role.OWNER,
        Role.APP,
        Role.MEMBER,
    ]
    for wrong in ("broker", "Owner", "", "true"):
        with pytest.raises(BoxError) as refused:
            token_role(wrong)
        assert refused.value.problem == Problem.INVALID
        assert refused.value.message == (
            f"a token's role must be one of owner, app, member, not {wrong!r}"
        )


def test_a_members_id_is_shown_as_it_is_so_it_must_read_plainly() -> None:
    assert check_member_id("u-4711") == "u-4711"
    assert check_member_id("anna@example.com") == "anna@example.com"
    assert check_member_id("x" * MAX_NAME) == "x" * MAX_NAME
    for wrong in ("", "anna smith", "a\nb", "\x1b[31m", " u1", "x" * (MAX_NAME + 1)):
        with pytest.raises(BoxError) as refused:
            check_member_id(wrong)
        assert "a member's id must be 1 to 100 printable characters" in refused.value.message
