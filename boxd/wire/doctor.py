"""What `boxd doctor` found of this machine, as the manager answers it (`boxctl doctor`,
`GET /api/doctor`) and as both commands print it.

A check that *blocks* guards the sandbox itself: while one fails, the manager starts no task
and refuses each start with that check's words (`refusal`; to others than the owner,
`OWNER_TOLD`), rather than run one in a sandbox weaker than boxd promises. A check that only
*advises* names something the owner should fix whose lack shows up loudly by itself (a Droid
task fails in words, a full disk is a 507). docs/install.md says which is which, and why.
"""

from dataclasses import dataclass
from typing import Any

# The words every refused start begins with, before the failed check's.
NO_TASK_STARTS = (
    "boxd starts no task on this machine until it is fixed, so that none runs in a weaker "
    "sandbox than boxd promises."
)
CHECK_AGAIN = (
    "Once it is fixed, `boxctl doctor` (or `boxd doctor` as root) checks again, and queued "
    "tasks start."
)

# The least time from the end of one run of the checks to the start of the next, however often
# the owner asks (boxd.manager.doctor.gate): about ten times a run's own.
MIN_INTERVAL_SECONDS = 10.0

# What a start is refused with when its caller is not the owner (an app's or a member's token,
# and the failure recorded on a task they read): what the machine lacks is the owner's to know,
# not theirs (that the box's network filter is not enforced, the machine's paths and versions).
OWNER_TOLD = (
    f"{NO_TASK_STARTS} The box's owner is told what is missing and how to fix it (boxctl "
    "doctor, the owner's screen); queued tasks start once it is fixed."
)


@dataclass(frozen=True)
class Finding:
    """One check: its name, whether it passed, whether its failing stops tasks from starting,
    and, when it failed, what is missing and how to fix it, in plain words."""

    name: str
    ok: bool
    blocks: bool
    problem: str = ""
    fix: str = ""

    def public(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"name": self.name, "ok": self.ok, "blocks": self.blocks}
        if not self.ok:
            shown.update(problem=self.problem, fix=self.fix)
        return shown

    @classmethod
    def read(cls, shown: dict[str, Any]) -> "Finding":
        return cls(
            name=str(shown["name"]),
            ok=bool(shown["ok"]),
            blocks=bool(shown["blocks"]),
            problem=str(shown.get("problem", "")),
            fix=str(shown.get("fix", "")),
        )

    @property
    def words(self) -> str:
        return f"{self.name}: {self.problem} To fix it: {self.fix}"


def passed(name: str, *, blocks: bool) -> Finding:
    return Finding(name, True, blocks)


def failed(name: str, problem: str, fix: str, *, blocks: bool) -> Finding:
    return Finding(name, False, blocks, problem, fix)


def blocking(findings: list[Finding]) -> list[Finding]:
    """The failed checks that stop tasks from starting."""
    return [finding for finding in findings if finding.blocks and not finding.ok]


def refusal(findings: list[Finding]) -> str | None:
    """Why no task starts, in the failed blocking checks' words; None when none failed."""
    failing = blocking(findings)
    if not failing:
        return None
    return " ".join([NO_TASK_STARTS, *(finding.words for finding in failing), CHECK_AGAIN])


def public(findings: list[Finding], age: float | None = None) -> dict[str, Any]:
    """The answer of `CheckMachine` and `GET /api/doctor`; `age`, how many seconds ago the
    checks answered (the manager answers again a run a few seconds old)."""
    words = refusal(findings)
    return {
        "tasksStart": words is None,
        **({"refusal": words} if words else {}),
        **({} if age is None else {"ageSeconds": round(age, 1)}),
        "checks": [finding.public() for finding in findings],
    }


def age_line(answer: dict[str, Any]) -> str | None:
    """For a person: how old the findings answered are, when they are not fresh."""
    age = answer.get("ageSeconds", 0)
    if not age:
        return None
    return (
        f"(checked {age:g} s ago: boxd checks this machine again once {MIN_INTERVAL_SECONDS:g} s "
        "have passed since it last did)"
    )


def report(findings: list[Finding]) -> str:
    """The findings for a person's terminal: one line a check, then what to do for each that
    failed."""
    lines = []
    for finding in findings:
        mark = "ok" if finding.ok else "FAILED" if finding.blocks else "advice"
        lines.append(f"{mark:<7}{finding.name}")
        if not finding.ok:
            lines.append(f"       {finding.problem}")
            lines.append(f"       To fix it: {finding.fix}")
    failing = blocking(findings)
    if failing:
        lines.append(f"{NO_TASK_STARTS} {CHECK_AGAIN}")
    elif any(not finding.ok for finding in findings):
        lines.append("Tasks start; the advice above is worth following.")
    else:
        lines.append("Every check passed: this machine has what boxd needs.")
    return "\n".join(lines)
