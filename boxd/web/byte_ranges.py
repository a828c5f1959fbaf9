"""One byte range of a file, as a Range header asks for it (RFC 9110, section 14)."""

import re

# A byte position in a Range: at most 19 digits (below 2**63); longer is past any file's end.
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_MAX_DIGITS = 19


class Unsatisfiable(Exception):
    """A range that starts past the file's end."""


def wanted_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one range (start, end exclusive) a Range header asks for; None: the whole file (no
    header, or one this does not serve, which RFC 9110 lets a server ignore). Raises
    Unsatisfiable for a range wholly past the end."""
    if header is None:
        return None
    found = _RANGE.fullmatch(header.strip())
    if found is None:
        return None
    first, last = found.groups()
    if not first and not last:
        return None
    if len(first) > _MAX_DIGITS or len(last) > _MAX_DIGITS:
        # Past any file's end, and never a number to compute with.
        raise Unsatisfiable
    if size == 0:
        raise Unsatisfiable
    if not first:
        length = int(last)
        if length == 0:
            raise Unsatisfiable
        return max(0, size - length), size
    start = int(first)
    if start >= size:
        raise Unsatisfiable
    end = size if not last else min(size, int(last) + 1)
    if end <= start:
        return None
    return start, end


def past_the_end(size: int) -> str:
    return f"the range asked for starts past the end of the file ({size} bytes)"
