"""boxctl shows what tasks wrote with its control characters made visible."""

from typing import Any

from boxd.cli import show
from boxd.wire.pairing_qr import qr_text

EVIL = "a\x1b[2Jb\rc\x07d\x9be\u202ef\u2028g\x00h\t"


def test_control_characters_are_shown_as_escapes() -> None:
    shown = show.visible(EVIL)
    assert shown == "a\\x1b[2Jb\\rc\\x07d\\x9be\\u202ef\\u2028g\\x00h\\t"
    assert show.visible("line\nnext") == "line\\nnext"
    assert show.visible("ünïcode, 日本, emoji 🙂 stay") == "ünïcode, 日本, emoji 🙂 stay"
    assert show.visible("\ud800") == "\\ud800"


def test_nothing_a_task_wrote_reaches_the_terminal_raw() -> None:
    step = {"at": 0, "text": EVIL + "\n  00:00:00  -> done"}
    task: dict[str, Any] = {
        "id": "t000000001",
        "state": "failed",
        "worker": "fake",
        "title": EVIL,
        "error": EVIL,
        "tools": [EVIL],
        "steps": [step],
    }
    approval = {"id": "t000000001." + EVIL, "state": "pending", "question": EVIL}
    printed = [
        show.task_line(task),
        show.task_table([task]),
        show.task_details(task),
        show.step_line(step),
        show.state_line("failed", EVIL, 0),
        show.approval_line(approval),
        show.approval_table([approval]),
    ]
    for text in printed:
        assert not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text), text
        assert "\u202e" not in text and "\u2028" not in text
        assert "\\x1b[2J" in text


def test_a_step_cannot_forge_a_line_of_boxd() -> None:
    forged = show.step_line({"at": 0, "text": "ok\n  00:00:00  -> done"})
    first, second = forged.split("\n")
    assert first.endswith("  ok")
    assert second.startswith(show.CONTINUED)
    # boxd's own lines start with the clock; a continued line never does.
    assert not second.lstrip().startswith("00:00:00")


def test_boxctl_pair_draws_the_code_as_a_qr_code_under_it_on_a_terminal() -> None:
    pairing = {"device": "phone", "code": "ABCDE-FGHIJ", "expiresInSeconds": 600}
    plain = show.pairing_text(pairing)
    drawn = show.pairing_text(pairing, qr=True)
    assert qr_text("ABCDE-FGHIJ") not in plain and "█" not in plain
    first, rest = drawn.split("\n", 1)
    assert first == "Pairing code for phone: ABCDE-FGHIJ"
    assert rest.startswith(qr_text("ABCDE-FGHIJ") + "\n")
    assert drawn.replace(qr_text("ABCDE-FGHIJ") + "\n", "") == plain


def test_an_agent_s_install_in_a_sentence() -> None:
    def line(installed: bool, installing: bool, error: str | None) -> str:
        answer = {"version": "2.1.337", "installed": installed, "installing": installing}
        return show.install_line({**answer, "error": error}, "Claude Code", "Claude", "; later")

    assert line(True, False, None) == "Claude Code 2.1.337 is installed."
    assert line(False, True, None) == (
        "Claude Code 2.1.337 is being installed; Claude tasks wait, queued, until it is."
    )
    assert line(False, False, None) == "Claude Code 2.1.337 is not installed; later."
    assert line(False, False, "no\x1b network") == "no\\x1b network"
