"""A unified diff of two contents, as `diff -u` makes it, by GNU diff itself.

Not difflib: difflib takes several times as long as GNU diff on a megabyte of a few hundred
lines shuffled (docs/performance.md, "Reviewing a task's changes") and cannot be stopped; a
child is stopped after MAX_DIFF_SECONDS. It reads two memfds of bytes, never a path a task controls.
"""

import os
import subprocess

from boxd.wire.models.task_diff import MAX_DIFF_SECONDS, MAX_DIFF_TEXT

DIFF = "/usr/bin/diff"


def is_text(content: bytes) -> bool:
    if b"\0" in content:
        return False
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class Slow(Exception):
    """diff took longer than MAX_DIFF_SECONDS, in words."""


def _memfd(content: bytes) -> int:
    fd = os.memfd_create("boxd-diff", os.MFD_CLOEXEC)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def unified(name: str, old: bytes | None, new: bytes | None) -> tuple[str, bool]:
    """`diff -u` of two contents (None: no file), with a/ and b/ names; cut at MAX_DIFF_TEXT
    characters at a line (then True)."""
    # A newline in a name would start a line of its own in the diff: one that could pass
    # for a header or a hunk.
    label = name.replace("\n", "\\n")
    fds = [_memfd(old or b""), _memfd(new or b"")]
    try:
        done = subprocess.run(
            [
                DIFF,
                "--unified",
                "--text",
                "--label",
                f"a/{label}" if old is not None else "/dev/null",
                "--label",
                f"b/{label}" if new is not None else "/dev/null",
                *(f"/dev/fd/{fd}" for fd in fds),
            ],
            pass_fds=fds,
            capture_output=True,
            timeout=MAX_DIFF_SECONDS,
            env={"LC_ALL": "C"},
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise Slow(f"its diff took over {MAX_DIFF_SECONDS} seconds to make") from None
    finally:
        for fd in fds:
            os.close(fd)
    if done.returncode not in (0, 1):
        raise OSError(f"diff failed: {done.stderr.decode(errors='replace').strip()}")
    text = done.stdout.decode("utf-8", "replace")
    if len(text) <= MAX_DIFF_TEXT:
        return text, False
    return text[: text.rfind("\n", 0, MAX_DIFF_TEXT) + 1], True
