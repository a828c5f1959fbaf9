"""Text as a D-Bus string can carry it: UTF-8 without NUL (the D-Bus specification's rule for a
string). A task's title, its step, an error's words come from callers, and a NUL in them is
theirs to keep: the record and the JSON answers hold it escaped. Put raw into a property or an
error message, though, it cannot be marshalled, the message is never sent, and the step's
answer (or at the next start, the manager itself) fails. There each such character shows as
U+FFFD, the replacement character, rather than break the message.
"""

REPLACEMENT = "\ufffd"


def carried(text: str) -> str:
    """`text` with each NUL and each lone surrogate replaced by U+FFFD."""
    if "\0" not in text:
        try:
            text.encode()
        except UnicodeEncodeError:
            pass
        else:
            return text
    return "".join(REPLACEMENT if c == "\0" or "\ud800" <= c <= "\udfff" else c for c in text)
