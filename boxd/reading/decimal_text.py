"""The one reading of a whole number a caller writes as text (a page, a wait, a port, a length).

`str.isdigit()` alone lets through digits that are not ASCII: int() refuses '²' (a 500 where
the caller earned a 400) and reads '٣' as 3, so a rule or a header that no other program reads
as a number passed as one. And int() refuses text of over 4,300 digits. So a number here is
ASCII digits only, and at most as many as its field can need.
"""


def decimal(text: str, most_digits: int = 18) -> int | None:
    """The number `text` writes in 1 to `most_digits` ASCII digits, or None if it is not one."""
    if not 0 < len(text) <= most_digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)
