"""Pairing codes, as a guesser and a slow device would try them."""

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.access.pairing import (
    EXPIRED,
    LIFETIME,
    MAX_OPEN,
    USED,
    WRONG,
    Paired,
    Pairings,
    check_device_name,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused(pairings: Pairings, code: str) -> str:
    with pytest.raises(BoxError) as error:
        pairings.redeem(code)
    assert error.value.problem == Problem.FORBIDDEN
    return error.value.message


def test_a_code_pairs_once() -> None:
    pairings = Pairings(Clock())
    code = pairings.make("anna-phone", "alice")
    assert len(code) == 11 and code[5] == "-"
    # As typed by a person: lower case, without the dash.
    assert pairings.redeem(code.lower().replace("-", " ")) == Paired("anna-phone", "alice")
    assert refused(pairings, code) == USED


def test_a_code_expires_after_ten_minutes() -> None:
    clock = Clock()
    pairings = Pairings(clock)
    code = pairings.make("anna-phone", None)
    clock.now += LIFETIME
    assert refused(pairings, code) == EXPIRED
    assert "ten minutes" in EXPIRED


def test_wrong_codes_hold_up_no_one() -> None:
    """The door needs no credentials: a stranger's wrong codes must not keep the owner from
    pairing."""
    pairings = Pairings(Clock())
    code = pairings.make("anna-phone", None)
    for _ in range(10_000):
        assert refused(pairings, "AAAAA-AAAAA") == WRONG
    assert pairings.redeem(code).device == "anna-phone"


def test_open_codes_are_bounded() -> None:
    pairings = Pairings(Clock())
    first = pairings.make("old-phone", None)
    for n in range(MAX_OPEN):
        pairings.make(f"phone-{n}", None)
    assert refused(pairings, first) == WRONG


def test_a_device_name_is_shown_as_it_is() -> None:
    assert check_device_name(" anna's phone ") == "anna's phone"
    for wrong in ("", "   ", "a\nb", "x" * 61):
        with pytest.raises(BoxError) as error:
            check_device_name(wrong)
        assert "a device's name must be 1 to 60 printable characters" in error.value.message
