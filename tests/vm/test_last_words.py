"""A failed task says what its worker said last, also on a box that ran more tasks than boxd
has file descriptors: journald keeps a file for every uid that logged, every task has one, and
a reader of the whole journal opened them all (and boxd ran out of descriptors)."""

from testbed.box_api import finish, start_fake
from testbed.machine import Machine

OTHER_USERS = 1500


def test_last_words_on_a_box_with_more_journal_files_than_descriptors(
    machine: Machine, token: str
) -> None:
    # One journal file under many names (hard links, so no room is taken): to a reader, as
    # many files as a box that ran that many tasks has.
    directory = machine.run("sh", "-c", "ls -d /var/log/journal/*/").stdout.strip()
    make = (
        f"cd {directory} && one=$(ls system@*.journal system.journal | head -n1) && "
        f"for n in $(seq 1 {OTHER_USERS}); do ln $one user-$((2100000000 + n)).journal; done"
    )
    machine.run("sh", "-c", make)
    try:
        task = start_fake(machine, token, "step up\nbogus words")
        ended = finish(machine, task["id"])
        assert ended["state"] == "failed"
        assert ended["error"].endswith("line 2: unknown command 'bogus'"), ended["error"]
    finally:
        machine.run("sh", "-c", f"rm -f {directory}user-21*.journal")
