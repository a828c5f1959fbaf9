"""The owner's read access: the ACL arithmetic, and the walk of a layer an attacker wrote."""

import os
import stat
from pathlib import Path

import pytest

from boxd.manager.workspaces import owner_access as oa
from boxd.manager.workspaces.owner_access import (
    GROUP,
    GROUP_OBJ,
    MASK,
    OTHER,
    USER,
    USER_OBJ,
    build,
    from_mode,
    open_to_owner,
    parse,
    with_reader,
)

NO_ID = 0xFFFFFFFF
GID = 4242


def _acl(path: Path, name: str = oa.ACCESS) -> list[oa.Entry] | None:
    try:
        return parse(os.getxattr(path, name, follow_symlinks=False))
    except OSError:
        return None


def _reader(entries: list[oa.Entry] | None, gid: int = GID) -> int | None:
    for tag, perm, ident in entries or []:
        if tag == GROUP and ident == gid:
            return perm
    return None


def test_a_private_file_gains_the_owners_read_and_nothing_else() -> None:
    wider = with_reader(from_mode(0o600), GID, oa.READ)
    assert wider == [
        (USER_OBJ, 6, NO_ID),
        (GROUP_OBJ, 0, NO_ID),
        (GROUP, 4, GID),
        (MASK, 4, NO_ID),
        (OTHER, 0, NO_ID),
    ]


def test_a_mask_is_baked_in_so_no_named_entry_gains_by_the_wider_mask() -> None:
    # user 1000 is given rw- but the mask lets it only r--; group boxd-work rwx masked to ---.
    entries = [
        (USER_OBJ, 7, NO_ID),
        (USER, 6, 1000),
        (GROUP_OBJ, 7, NO_ID),
        (MASK, 4, NO_ID),
        (OTHER, 0, NO_ID),
    ]
    wider = with_reader([*entries[:3], (MASK, 0, NO_ID), entries[4]], GID, oa.READ | oa.SEARCH)
    assert wider is not None
    assert (USER, 0, 1000) in wider and (GROUP_OBJ, 0, NO_ID) in wider
    assert (GROUP, 5, GID) in wider and (MASK, 5, NO_ID) in wider
    wider = with_reader(entries, GID, oa.READ)
    assert wider is not None
    assert (USER, 4, 1000) in wider and (GROUP_OBJ, 4, NO_ID) in wider and (MASK, 4, NO_ID) in wider


def test_an_acl_that_has_it_already_is_left_alone() -> None:
    once = with_reader(from_mode(0o640), GID, oa.READ)
    assert once is not None
    assert with_reader(once, GID, oa.READ) is None


def test_acls_round_trip_and_garbage_is_refused() -> None:
    entries = with_reader(from_mode(0o750), GID, 5)
    assert entries is not None
    assert parse(build(entries)) == entries
    for bad in (b"", b"\x02\0\0\0\1", b"\x03\0\0\0" + b"\0" * 8):
        with pytest.raises(ValueError):
            parse(bad)


def test_a_hostile_layer_is_walked_by_fds_and_nothing_outside_changes(tmp_path: Path) -> None:
    layer, outside = tmp_path / "layer", tmp_path / "outside"
    layer.mkdir(mode=0o700)
    outside.mkdir()
    (outside / "secret").write_text("no")
    (outside / "secret").chmod(0o600)
    (layer / "file").write_text("yes")
    (layer / "file").chmod(0o600)
    (layer / "to-secret").symlink_to(outside / "secret")
    (layer / "to-outside").symlink_to(outside)
    os.mkfifo(layer / "fifo")
    deep = layer
    for _ in range(300):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "bottom").write_text("deep")
    (layer / "bidi\u202egnp.exe").write_text("x")
    (layer / "bytes\udcff").write_text("x")

    changed = open_to_owner(layer, GID)

    assert changed == 300 + 1 + 4  # the folders, the root, the four plain files
    for path in (layer, layer / "file", deep, deep / "bottom", layer / "bidi\u202egnp.exe"):
        assert _reader(_acl(path)) in (4, 5), path
    assert _acl(outside / "secret") is None and _acl(outside) is None
    assert stat.S_IMODE((outside / "secret").stat().st_mode) == 0o600
    # The mode bits others see are not widened: the group bits show the mask, r for the reader.
    assert stat.S_IMODE((layer / "file").stat().st_mode) == 0o640
    assert stat.S_IMODE(layer.stat().st_mode) == 0o750
    # A second walk changes nothing.
    assert open_to_owner(layer, GID) == 0


def test_a_base_gets_a_default_entry_for_what_is_put_in_it(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir(mode=0o770)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert oa.grant(fd, GID, default=True)
        assert not oa.grant(fd, GID, default=True)
    finally:
        os.close(fd)
    (base / "later").write_text("put")
    later = _acl(base / "later")
    mask = [perm for tag, perm, _ in later or [] if tag == MASK]
    assert (_reader(later) or 0) & mask[0] == oa.READ
    assert _reader(_acl(base, oa.DEFAULT)) == 5
