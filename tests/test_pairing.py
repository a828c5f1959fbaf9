"""Pairing codes, as a guesser and a slow device would try them."""

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.pairing import (
    EXPIRED,
    LIFETIME,
    MAX_WRONG,
    TOO_MANY,
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


def test_guessing_is_bounded_and_voids_the_open_codes() -> None:
    pairings = Pairings(Clock())
    code = pairings.make("anna-phone", None)
    for _ in range(MAX_WRONG):
        assert refused(pairings, "AAAAA-AAAAA") == WRONG
    # The right code no longer works either: the guesser had MAX_WRONG tries, no more.
    assert refused(pairings, code) == TOO_MANY
    fresh = pairings.make("anna-phone", None)
    assert refused(pairings, code) == WRONG
    assert pairings.redeem(fresh).device == "anna-phone"


def test_a_device_name_is_shown_as_it_is() -> None:
    assert check_device_name(" anna's phone ") == "anna's phone"
    for wrong in ("", "   ", "a\nb", "x" * 61):
        with pytest.raises(BoxError) as error:
            check_device_name(wrong)
        assert "a device's name must be 1 to 60 printable characters" in error.value.message
