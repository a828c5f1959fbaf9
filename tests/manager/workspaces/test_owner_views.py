"""The owner's views' pure parts: the overlay's options, mountinfo, and the generations and
links that make a remake atomic."""

import os
from pathlib import Path

from boxd.manager.workspaces.layers import MAX_DONE, layer_name
from boxd.manager.workspaces.owner_views import (
    GENERATIONS,
    OwnerViews,
    mount_options,
    mount_points,
    propagation,
    shown,
)

PAGE = 4096
MOUNTINFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 0:40 / /run rw,nosuid shared:12 - tmpfs tmpfs rw\n"
    "31 30 0:41 / /run/boxd/views rw,nosuid - tmpfs boxd-views rw,mode=750\n"
    "32 31 0:42 / /run/boxd/views/.gen/ab12 ro master:5 - overlay boxd-view ro\n"
    "40 22 0:43 / /var/lib/box/odd\\040name rw shared:1 - ext4 /dev/vda rw\n"
)


def test_options_are_lower_folders_only_and_read_only() -> None:
    options = mount_options(["2", "1"], "../../workspaces/w", Path("/run/boxd/views/.empty"))
    assert options.startswith("ro,")
    assert "upperdir" not in options and "workdir" not in options
    assert options.endswith("lowerdir=2:1:../../workspaces/w")


def test_an_empty_stack_gets_an_empty_second_lower() -> None:
    options = mount_options([], "../../workspaces/w", Path("/run/boxd/views/.empty"))
    assert options.endswith("lowerdir=../../workspaces/w:/run/boxd/views/.empty")


def test_a_full_stack_fits_the_options_page() -> None:
    stack = [layer_name(number) for number in range(MAX_DONE + 100, 100, -1)][:MAX_DONE]
    base = "../../workspaces/" + "w" * 100
    assert len(mount_options(stack, base, Path("/run/boxd/views/.empty"))) < PAGE


def test_mountinfo_points_and_propagation() -> None:
    assert "/var/lib/box/odd name" in mount_points(MOUNTINFO)
    assert propagation(MOUNTINFO, "/run/boxd/views") == ""
    assert propagation(MOUNTINFO, "/run") == "shared:12"
    assert propagation(MOUNTINFO, "/run/boxd/views/.gen/ab12") == "master:5"
    assert propagation(MOUNTINFO, "/nowhere") is None


def test_a_swap_replaces_the_link_in_one_rename(tmp_path: Path) -> None:
    views = OwnerViews(tmp_path / "home", tmp_path / "views")
    views.root.mkdir()
    views.prepare()
    first = views.new_generation()
    assert views.swap("w", first) is None
    assert os.readlink(views.link("w")) == f"{GENERATIONS}/{first.name}"
    second = views.new_generation()
    assert views.swap("w", second) == first
    assert os.readlink(views.link("w")) == f"{GENERATIONS}/{second.name}"
    # No temporary link is left beside it, and the first generation is the one unused.
    assert sorted(p.name for p in views.root.iterdir()) == [".empty", GENERATIONS, "w"]
    assert views.unused() == [first]
    views.remove_generation(first)
    assert views.unused() == []
    assert views.stale_links({"w"}) == [] and views.stale_links(set()) == ["w"]
    assert views.unlink("w") == second and views.unlink("w") is None


def test_a_members_personal_copy_gets_no_view() -> None:
    assert shown("home") and shown("files-abc") and shown("docs.v2")
    assert not shown("owner-1000-abcdef") and not shown(".gen") and not shown("../x")
