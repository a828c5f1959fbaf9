"""The last line a worker printed, so a failed task says more than its exit status."""

import asyncio

from systemd import journal

# journald reads the worker's stdout on its own schedule; give it a moment to catch up.
_CATCH_UP_SECONDS = 0.3
_MAX_CHARS = 300


def _read(unit: str) -> str | None:
    reader = journal.Reader()
    try:
        reader.this_boot()
        reader.add_match(_SYSTEMD_UNIT=unit, _TRANSPORT="stdout")
        reader.seek_tail()
        entry = reader.get_previous()
    finally:
        reader.close()
    message = entry.get("MESSAGE") if entry else None
    if isinstance(message, bytes):
        message = message.decode(errors="replace")
    if not isinstance(message, str) or not message.strip():
        return None
    return message.strip()[:_MAX_CHARS]


async def last_words(unit: str) -> str | None:
    await asyncio.sleep(_CATCH_UP_SECONDS)
    try:
        return await asyncio.to_thread(_read, unit)
    except OSError:
        return None
