"""The findings of boxd doctor as the manager answers them and the commands print them."""

from boxd.wire.doctor import (
    CHECK_AGAIN,
    NO_TASK_STARTS,
    Finding,
    age_line,
    failed,
    passed,
    public,
    refusal,
    report,
)

NO_NETNS = failed(
    "network namespaces", "ip netns add failed.", "apt install iproute2.", blocks=True
)
NO_BPF = failed("IPAddressDeny (BPF)", "not enforced.", "allow bpf().", blocks=True)
LOW_DISK = failed("disk space", "only 10 MiB free.", "free space.", blocks=False)
OVERLAY = passed("overlayfs", blocks=True)


def test_a_refusal_names_every_failed_check_that_blocks_and_no_advice() -> None:
    words = refusal([OVERLAY, NO_NETNS, LOW_DISK, NO_BPF])
    assert words == (
        f"{NO_TASK_STARTS} network namespaces: ip netns add failed. To fix it: apt install "
        f"iproute2. IPAddressDeny (BPF): not enforced. To fix it: allow bpf(). {CHECK_AGAIN}"
    )
    assert refusal([OVERLAY, LOW_DISK]) is None


def test_the_answer_says_whether_tasks_start_and_each_check() -> None:
    answer = public([OVERLAY, NO_BPF])
    assert answer["tasksStart"] is False
    assert answer["refusal"] == refusal([NO_BPF])
    assert answer["checks"] == [
        {"name": "overlayfs", "ok": True, "blocks": True},
        {
            "name": "IPAddressDeny (BPF)",
            "ok": False,
            "blocks": True,
            "problem": "not enforced.",
            "fix": "allow bpf().",
        },
    ]
    assert [Finding.read(shown) for shown in answer["checks"]] == [OVERLAY, NO_BPF]
    assert public([OVERLAY]) == {"tasksStart": True, "checks": [OVERLAY.public()]}


def test_an_answer_given_again_says_how_old_it_is() -> None:
    fresh, old = public([OVERLAY], age=0), public([OVERLAY], age=4.26)
    assert (fresh["ageSeconds"], old["ageSeconds"]) == (0, 4.3)
    assert age_line(fresh) is None
    assert age_line(old) == (
        "(checked 4.3 s ago: boxd checks this machine again once 10 s have passed since it "
        "last did)"
    )


def test_the_report_marks_each_check_and_says_what_to_do() -> None:
    lines = report([OVERLAY, NO_BPF, LOW_DISK]).splitlines()
    assert lines[:7] == [
        "ok     overlayfs",
        "FAILED IPAddressDeny (BPF)",
        "       not enforced.",
        "       To fix it: allow bpf().",
        "advice disk space",
        "       only 10 MiB free.",
        "       To fix it: free space.",
    ]
    assert lines[7].startswith(NO_TASK_STARTS)
    assert report([OVERLAY, LOW_DISK]).endswith("Tasks start; the advice above is worth following.")
    assert report([OVERLAY]).endswith("Every check passed: this machine has what boxd needs.")
