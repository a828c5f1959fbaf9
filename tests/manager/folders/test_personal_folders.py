"""The rules for personal folders, their mirror, and keeping a task's layer, on plain files."""

import asyncio
import os
import pwd
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from boxd.errors import BoxError, Problem
from boxd.manager.folders import owner_process
from boxd.manager.folders.beneath import NotBeneath, open_path, parent_of
from boxd.manager.folders.folder_stream import data_ranges
from boxd.manager.folders.folders import (
    Account,
    Folder,
    asker_only,
    asking_account,
    check_folder,
    check_folders,
    folder_workspace,
    look_as,
)
from boxd.manager.folders.keep import KeepError, Places, keep, layer_changes, take_manifest
from boxd.manager.folders.mirror import MirrorError, sync_mirror, sync_tree
from boxd.manager.folders.owner_process import OwnerProcess, as_owner_work
from boxd.manager.folders.pause import VARIABLE
from boxd.wire.caller import Caller, Role
from boxd.wire.models.task import Task, TaskState

SOMEONE = 65534  # nobody: as root, folders must belong to someone else to be allowed
# The account that asks for the tasks here, and owns their folders: nobody, when the tests run
# as root; else the tests' own.
ASKER = SOMEONE if os.geteuid() == 0 else os.geteuid()
# The tests' own account, which asks for the folder rules' tests: root may ask for anyone's.
ME = Account(os.geteuid(), pwd.getpwuid(os.geteuid()).pw_name, None)


def owned(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, SOMEONE, SOMEONE)
    return path


@pytest.fixture
def place(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder every account can pass through: the owner's process walks from / to it, and
    pytest's own folders are root's alone. As root, the owner's process runs as nobody, with an
    interpreter nobody may run (this venv's may live in root's home)."""
    if os.geteuid() == 0:
        system = Path("/usr/bin/python3.11")
        if not system.exists():
            pytest.skip("as root, these need /usr/bin/python3.11, which nobody may run")
        monkeypatch.setattr(owner_process, "PYTHON", str(system))
    made = Path(tempfile.mkdtemp(prefix="boxd-folders-"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        for path in [made, *made.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(made)


def give_away(folder: Path) -> None:
    """As root, the files of a real folder must be someone else's, or the mirror leaves them out."""
    if os.geteuid() == 0:
        for path in [folder, *folder.rglob("*")]:
            os.lchown(path, SOMEONE, SOMEONE)


def mine(home: Path) -> Account:
    return Account(ME.uid, ME.name, home)


def look(asked: str) -> Any:
    return look_as(ME.uid, asked)


def refusal(asked: Path | str, home: Path, box: Path) -> str:
    with pytest.raises(BoxError) as caught:
        check_folder(str(asked), mine(home), [], box, look)
    return caught.value.message


def test_folder_rules(tmp_path: Path) -> None:
    home, box = owned(tmp_path / "home"), tmp_path / "box"
    (box / "workspaces").mkdir(parents=True)
    project = owned(home / "project")
    assert check_folder(str(project) + "/", mine(home), [], box, look) == project
    outside = owned(tmp_path / "outside")
    assert refusal(outside, home, box) == (
        f"folder {outside}: it is not in your home folder ({home}) or in Settings agentFolders"
    )
    assert check_folder(str(outside), mine(home), [str(tmp_path / "outside")], box, look) == outside
    assert refusal(home, home, box).endswith("or in Settings agentFolders")
    assert refusal(home / "nope", home, box) == f"folder {home / 'nope'}: there is no such folder"
    (home / "file").write_text("x")
    assert refusal(home / "file", home, box) == f"folder {home / 'file'}: it is not a folder"
    (home / "link").symlink_to(box / "workspaces")
    assert refusal(home / "link", home, box) == (
        f"folder {home / 'link'}: it holds the box's own state (a link to "
        f"{box / 'workspaces'}); agents never work on that"
    )
    (home / "etc").symlink_to("/etc")
    assert "it is part of the system (a link to /etc)" in refusal(home / "etc", home, box)
    if os.geteuid() == 0:
        (home / "roots").mkdir()
        assert refusal(home / "roots", home, box).endswith(
            "it belongs to root; agents may not use root's folders"
        )


def test_several_folders(tmp_path: Path) -> None:
    home, box = owned(tmp_path / "home"), tmp_path / "box"
    notes, code = owned(home / "notes"), owned(home / "code")
    owned(home / "other" / "notes")
    folders = check_folders([str(notes), str(code)], mine(home), [], box, look)
    assert [f.name for f in folders] == ["notes", "code"]
    assert folder_workspace(folders).startswith("owner-notes-and-1-")
    assert folder_workspace(folders) == folder_workspace(folders)
    assert folder_workspace(folders[:1]) != folder_workspace(folders[1:])
    with pytest.raises(BoxError, match="it overlaps"):
        check_folders([str(home), str(notes)], mine(tmp_path), [], box, look)
    with pytest.raises(BoxError, match="it has the same name as"):
        check_folders([str(notes), str(home / "other" / "notes")], mine(home), [], box, look)


def test_mirror_copies_only_what_changed(place: Path) -> None:
    real, base = place / "real", place / "base"
    (real / "sub").mkdir(parents=True)
    (real / "a.txt").write_text("a")
    (real / "sub" / "b.txt").write_text("b")
    (real / "link").symlink_to("a.txt")
    give_away(real)
    gid = os.getgid()
    assert sync_mirror([Folder(real, "real")], base, gid, ASKER) == 4
    assert (base / "sub" / "b.txt").read_text() == "b"
    assert os.readlink(base / "link") == "a.txt"
    assert (base / "a.txt").stat().st_mtime_ns == (real / "a.txt").stat().st_mtime_ns
    assert (base / "a.txt").stat().st_mode & 0o060 == 0o060
    assert sync_tree(real, base, gid, ASKER) == 0
    (real / "a.txt").write_text("changed")
    (real / "sub" / "b.txt").unlink()
    if os.geteuid() == 0:
        (real / "root.txt").write_text("root's")
    assert sync_tree(real, base, gid, ASKER) == 2
    assert (base / "a.txt").read_text() == "changed"
    assert not (base / "sub" / "b.txt").exists()
    assert not (base / "root.txt").exists()


def test_mirror_reads_only_what_the_owner_can(place: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a file the owner cannot read")
    real, base = place / "real", place / "base"
    real.mkdir()
    (real / "mine.txt").write_text("mine")
    give_away(real)
    secret = real / "theirs.txt"
    secret.write_text("someone else's")
    os.chown(secret, SOMEONE - 1, SOMEONE - 1)
    secret.chmod(0o600)
    sync_mirror([Folder(real, "real")], base, os.getgid(), ASKER)
    assert sorted(p.name for p in base.iterdir()) == ["mine.txt"]


def test_mirror_leaves_fifos_out_and_keeps_holes(place: Path) -> None:
    real, base = place / "real", place / "base"
    real.mkdir()
    os.mkfifo(real / "pipe")
    with (real / "sparse.img").open("wb") as sparse:
        sparse.truncate(64 << 30)
        sparse.seek(1 << 30)
        sparse.write(b"middle")
    give_away(real)
    sync_mirror([Folder(real, "real")], base, os.getgid(), ASKER)
    assert sorted(p.name for p in base.iterdir()) == ["sparse.img"]
    copy = (base / "sparse.img").stat()
    assert copy.st_size == 64 << 30 and copy.st_blocks * 512 < 1 << 20
    with (base / "sparse.img").open("rb") as read:
        read.seek(1 << 30)
        assert read.read(6) == b"middle"


def test_a_folder_swapped_for_a_link_mid_mirror_is_not_followed(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the pause points answer only FIFOs made by root")
    real, base, elsewhere = place / "real", place / "base", place / "elsewhere"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "ok.txt").write_text("ok")
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not the folder's")
    give_away(real)
    give_away(elsewhere)
    pauses = place / "pauses"
    pauses.mkdir()
    os.mkfifo(pauses / "mirror-sub")
    monkeypatch.setenv(VARIABLE, str(pauses))

    def swap() -> None:
        with (pauses / "mirror-sub").open("wb"):  # waits until the mirror is there
            (real / "sub").rename(real / "sub.moved")
            (real / "sub").symlink_to(elsewhere)

    swapping = threading.Thread(target=swap)
    swapping.start()
    sync_mirror([Folder(real, "real")], base, os.getgid(), ASKER)
    swapping.join()
    assert not (base / "sub").exists()
    assert [p.name for p in base.iterdir()] == []


def test_beneath_walks_follow_no_link(place: Path) -> None:
    (place / "dir").mkdir()
    (place / "link").symlink_to(place / "dir")
    fd = open_path(str(place))
    try:
        with pytest.raises(OSError):
            parent_of(fd, "link/x")
        for bad in ("../x", "/etc/passwd", "a//b", "."):
            with pytest.raises(NotBeneath):
                parent_of(fd, bad)
        parent, name = parent_of(fd, "dir/x")
        os.close(parent)
        assert name == "x"
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        open_path(str(place / "link"))


def test_data_ranges_skip_holes(tmp_path: Path) -> None:
    with (tmp_path / "f").open("wb") as f:
        f.truncate(10 << 20)
        f.seek(4 << 20)
        f.write(b"x")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        ranges = data_ranges(fd, 10 << 20)
    finally:
        os.close(fd)
    assert len(ranges) == 1 and ranges[0][0] <= 4 << 20 < ranges[0][1] <= 5 << 20


def _task_on(place: Path, files: dict[str, str]) -> tuple[Path, Path, Path]:
    real, view, layer = place / "real", place / "view", place / "layer"
    for folder in (real, view, layer):
        folder.mkdir()
    for name, text in files.items():
        (real / name).parent.mkdir(parents=True, exist_ok=True)
        (real / name).write_text(text)
        (real / name).chmod(0o644)
    give_away(real)
    sync_tree(real, view, os.getgid(), ASKER)
    return real, view, layer


def test_keep_applies_a_layer_and_finds_conflicts(place: Path) -> None:
    real, view, layer = _task_on(place, {"a.txt": "old", "b.txt": "keep me"})
    saw = take_manifest(view)
    # What the task's overlay would have put in its upper folder.
    (layer / "a.txt").write_text("new")
    (layer / "dir").mkdir()
    (layer / "dir" / "c.txt").write_text("c")
    places = Places([Folder(real, "real")])
    changes = layer_changes(layer)
    outcome = keep(changes, saw, layer, places, ASKER)
    assert outcome.conflicts == [] and outcome.stopped_at is None
    assert outcome.applied == ["a.txt", "dir", "dir/c.txt"]
    assert (real / "a.txt").read_text() == "new"
    assert (real / "dir" / "c.txt").read_text() == "c"
    assert (real / "b.txt").read_text() == "keep me"
    assert (real / "dir" / "c.txt").stat().st_uid == (real.stat().st_uid)
    # Kept again: what is already there as the task left it is no conflict.
    assert keep(changes, saw, layer, places, ASKER).conflicts == []
    # The owner changed a.txt since: keeping again would conflict, and apply nothing.
    (real / "a.txt").write_text("the owner's")
    outcome = keep(changes, saw, layer, places, ASKER)
    assert outcome.conflicts == ["a.txt"] and outcome.applied == []
    assert (real / "a.txt").read_text() == "the owner's"


def test_keep_never_widens_a_mode(place: Path) -> None:
    real, view, layer = _task_on(place, {"a.txt": "a", "b.txt": "b"})
    assert (view / "a.txt").stat().st_mode & 0o777 == 0o664  # the mirror's copy: group-writable
    saw = take_manifest(view)
    shutil.copy2(view / "a.txt", layer / "a.txt")  # unchanged but copied up
    (layer / "b.txt").write_text("b2")
    (layer / "b.txt").chmod(0o6777)
    (layer / "new.sh").write_text("new")
    (layer / "new.sh").chmod(0o4777)
    outcome = keep(layer_changes(layer), saw, layer, Places([Folder(real, "real")]), ASKER)
    assert outcome.stopped_at is None, outcome
    modes = {name: stat.S_IMODE((real / name).stat().st_mode) for name in ("a.txt", "b.txt")}
    assert modes == {"a.txt": 0o644, "b.txt": 0o644}
    assert stat.S_IMODE((real / "new.sh").stat().st_mode) == 0o755


def test_keep_keeps_holes(place: Path) -> None:
    real, view, layer = _task_on(place, {})
    saw = take_manifest(view)
    with (layer / "big.img").open("wb") as big:
        big.truncate(1 << 40)
        big.write(b"start")
    outcome = keep(layer_changes(layer), saw, layer, Places([Folder(real, "real")]), ASKER)
    assert outcome.applied == ["big.img"]
    kept = (real / "big.img").stat()
    assert kept.st_size == 1 << 40 and kept.st_blocks * 512 < 1 << 20


def test_a_keep_that_stops_says_what_was_applied(place: Path) -> None:
    real, view, layer = _task_on(place, {"a.txt": "a", "locked/b.txt": "b"})
    saw = take_manifest(view)
    (layer / "a.txt").write_text("a2")
    (layer / "locked").mkdir()
    (layer / "locked" / "b.txt").write_text("b2")
    (layer / "z.txt").write_text("z")
    (real / "locked").chmod(0o555)  # the owner's process may not write there
    outcome = keep(layer_changes(layer), saw, layer, Places([Folder(real, "real")]), ASKER)
    assert outcome.conflicts == []
    assert outcome.applied == ["a.txt", "locked"]
    assert outcome.stopped_at == "locked/b.txt"
    assert outcome.why == "permission denied"
    assert outcome.not_applied == ["locked/b.txt", "z.txt"]
    assert (real / "a.txt").read_text() == "a2"
    assert (real / "locked" / "b.txt").read_text() == "b"
    assert not (real / "z.txt").exists()


def test_a_folder_swapped_for_a_link_mid_keep_writes_nothing_outside(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the pause points answer only FIFOs made by root")
    real, view, layer = _task_on(place, {"sub/a.txt": "a"})
    outside = place / "outside"
    outside.mkdir()
    give_away(outside)
    saw = take_manifest(view)
    (layer / "sub").mkdir()
    (layer / "sub" / "a.txt").write_text("written")
    pauses = place / "pauses"
    pauses.mkdir()
    os.mkfifo(pauses / "keep-sub%a.txt")
    monkeypatch.setenv(VARIABLE, str(pauses))

    def swap() -> None:
        with (pauses / "keep-sub%a.txt").open("wb"):
            (real / "sub").rename(real / "sub.moved")
            (real / "sub").symlink_to(outside)

    swapping = threading.Thread(target=swap)
    swapping.start()
    outcome = keep(layer_changes(layer), saw, layer, Places([Folder(real, "real")]), ASKER)
    swapping.join()
    assert outcome.stopped_at == "sub/a.txt"
    assert outcome.why == "a folder on its way is a link or a file now, so it was not followed"
    assert list(outside.iterdir()) == []


def test_a_folder_is_looked_at_as_the_account_that_asks(place: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to ask as another account")
    box = place / "box"
    (box / "workspaces").mkdir(parents=True)
    nobody = Account(SOMEONE, "nobody", None)
    ask = partial(look_as, SOMEONE)

    def refused(path: Path) -> str:
        with pytest.raises(BoxError) as caught:
            check_folder(str(path), nobody, [str(place)], box, ask)
        assert caught.value.problem == Problem.INVALID
        return caught.value.message

    theirs = place / "theirs"
    (theirs / "inner").mkdir(parents=True)
    for path in (theirs, theirs / "inner"):
        os.chown(path, SOMEONE - 1, SOMEONE - 1)
    (place / "link").symlink_to(theirs)
    assert refused(theirs) == (
        f"folder {theirs}: it belongs to uid {SOMEONE - 1}, not to your account (nobody); "
        "only root may start a task on another account's folder"
    )
    assert refused(place / "link") == (
        f"folder {place / 'link'}: it belongs to uid {SOMEONE - 1}, not to your account "
        f"(nobody) (a link to {theirs}); only root may start a task on another account's folder"
    )
    # Beyond a folder the account cannot search, it learns nothing: not even what is there.
    theirs.chmod(0o700)
    for path in (theirs / "inner", theirs / "missing"):
        assert refused(path) == (
            f"folder {path}: it cannot be followed to a real folder (permission denied)"
        )
    # Its own folder, which it cannot list.
    closed = owned(place / "closed")
    closed.chmod(0)
    assert refused(closed) == (
        f"folder {closed}: your account (nobody) cannot read it itself (permission denied); "
        "agents may not either"
    )
    closed.chmod(0o755)
    assert check_folder(str(closed), nobody, [str(place)], box, ask) == closed
    # Root may ask for anyone's folder but root's.
    root = Account(0, "root", None)
    assert check_folder(str(theirs), root, [str(place)], box, partial(look_as, 0)) == theirs


def test_the_mirror_and_keep_act_as_the_account_that_asked(place: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a folder of another account's")
    other = pwd.getpwnam("daemon")
    real, view, layer = _task_on(place, {"a.txt": "a"})
    saw = take_manifest(view)
    (layer / "a.txt").write_text("changed")
    places = Places([Folder(real, "real")])
    for path in (real, real / "a.txt"):
        os.chown(path, other.pw_uid, other.pw_gid)
    with pytest.raises(MirrorError) as mirrored:
        sync_tree(real, view, os.getgid(), SOMEONE)
    said = f"folder {real} belongs to daemon now, not to nobody, who asked for the task"
    assert str(mirrored.value) == said
    with pytest.raises(KeepError) as kept:
        keep(layer_changes(layer), saw, layer, places, SOMEONE)
    assert str(kept.value) == f"{said}; nothing was applied"
    assert (real / "a.txt").read_text() == "a"
    # Root asked: as the folder's owner, whoever that is now.
    outcome = keep(layer_changes(layer), saw, layer, places, 0)
    assert outcome.applied == ["a.txt"]
    assert (real / "a.txt").read_text() == "changed"
    assert (real / "a.txt").stat().st_uid == other.pw_uid


def test_the_account_that_asks() -> None:
    assert asking_account(Caller(Role.OWNER, "root", user="root", uid=0)).uid == 0
    me = pwd.getpwuid(os.geteuid())
    by_token = asking_account(Caller(Role.OWNER, "phone", user=me.pw_name))
    assert (by_token.uid, by_token.name, by_token.home) == (me.pw_uid, me.pw_name, Path(me.pw_dir))
    with pytest.raises(BoxError) as older:
        asking_account(Caller(Role.OWNER, "phone"))
    assert older.value.problem == Problem.FORBIDDEN
    assert older.value.message == (
        "a task on personal folders works as the account that asks for it, and it does not say "
        "which account made it (it is older than boxd's record of that): make a new token with "
        "boxctl token create, as that account"
    )
    with pytest.raises(BoxError) as gone:
        asking_account(Caller(Role.OWNER, "phone", user="no-such-account-here"))
    assert "the account no-such-account-here that made it is no longer on this box" in (
        gone.value.message
    )


def test_only_the_account_that_asked_or_root_reviews_and_keeps() -> None:
    asker_only(1000, 1000, "t1", "keep")
    asker_only(0, 1000, "t1", "keep")
    asker_only(0, None, "t1", "keep")
    refusals = []
    for uid, asker in ((1001, 1000), (None, 1000), (1000, 0), (1000, None)):
        with pytest.raises(BoxError) as refused:
            asker_only(uid, asker, "t1", "keep")
        assert refused.value.problem == Problem.FORBIDDEN
        refusals.append(refused.value.message)
    name = pwd.getpwuid(1000).pw_name if _has_uid(1000) else "uid 1000"
    assert refusals == [
        f"task t1 was asked for by {name}: only {name} or root may keep it",
        f"task t1 was asked for by {name}: only {name} or root may keep it",
        "task t1 was asked for by root: only root may keep it",
        "task t1 was asked for before boxd recorded which account asked: only root may keep it",
    ]


def _has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_the_asker_is_in_the_record_only() -> None:
    task = Task(
        id="t1",
        title="t",
        prompt="p",
        state=TaskState.QUEUED,
        user="box-t1",
        workspace="owner-notes-0123456789",
        worker="fake",
        tools=[],
        hosts=[],
        source="api",
        budgetCents=0,
        createdAt=0.0,
        folders=["/home/alice/notes"],
        askerUid=1000,
    )
    assert "askerUid" not in task.public()
    assert Task.model_validate_json(task.model_dump_json()).askerUid == 1000
    assert "askerUid" not in Task.model_json_schema(mode="serialization")["properties"]


def test_a_process_as_the_account_that_moves_nothing_is_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker stops (SIGSTOP) the process boxd runs as their account: before, the thread
    that waited on it waited for good. Now it is killed once nothing moved for STALL_SECONDS,
    and the wait ends saying why."""
    monkeypatch.setattr(owner_process, "STALL_SECONDS", 0.5)
    with OwnerProcess(os.geteuid(), "look", str(tmp_path)) as child:
        os.kill(child._process.pid, signal.SIGSTOP)
        assert child.reader.record() is None
        assert child.finish() == -signal.SIGKILL
        assert child.complaint().startswith("it moved nothing for 0.5 s (stopped")


async def test_stalled_work_as_an_account_leaves_boxds_own_threads_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker's processes, stopped as they start, one for each of boxd's threads: work
    as an account waits on threads of its own, so the rest of boxd goes on meanwhile."""
    monkeypatch.setattr(owner_process, "STALL_SECONDS", 2.0)

    def stopped_look() -> None:
        with OwnerProcess(os.geteuid(), "look", str(tmp_path)) as child:
            os.kill(child._process.pid, signal.SIGSTOP)
            child.reader.record()

    stalled = [asyncio.ensure_future(as_owner_work(stopped_look)) for _ in range(8)]
    await asyncio.sleep(0.5)
    assert not any(job.done() for job in stalled)
    # boxd's own work, on the loop's own threads, is not held up behind them.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 1) == "free"
    await asyncio.gather(*stalled)
