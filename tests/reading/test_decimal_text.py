import pytest

from boxd.reading.decimal_text import decimal


@pytest.mark.parametrize(("text", "number"), [("0", 0), ("7", 7), ("0042", 42), ("65535", 65535)])
def test_ascii_digits_are_their_number(text: str, number: int) -> None:
    assert decimal(text) == number


@pytest.mark.parametrize(
    "text",
    # Empty; signs, spaces and underscores int() takes; a superscript int() refuses; Arabic-Indic
    # and fullwidth digits int() reads though a header or a rule of them is no number elsewhere.
    ["", "-1", "+1", " 1", "1 ", "1_0", "0x1", "\u00b2", "\u0663", "\uff11", "1.0"],
)
def test_anything_but_ascii_digits_is_none(text: str) -> None:
    assert decimal(text) is None


def test_more_digits_than_the_field_needs_is_none_before_int_reads_them() -> None:
    assert decimal("1" * 18) == int("1" * 18)
    assert decimal("1" * 19) is None
    assert decimal("12345", most_digits=4) is None
    assert decimal("1" * 5000) is None
