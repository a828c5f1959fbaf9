"""`GET /api/doctor` in the OpenAPI document: the findings of boxd doctor (boxd.wire.doctor),
and the words a start is refused with while a check that blocks tasks fails."""

from typing import Any

from boxd.wire.doctor import MIN_INTERVAL_SECONDS, failed, refusal

_CHECK: dict[str, Any] = {
    "type": "object",
    "required": ["name", "ok", "blocks"],
    "properties": {
        "name": {"type": "string"},
        "ok": {"type": "boolean"},
        "blocks": {
            "type": "boolean",
            "description": "whether its failing stops every task from starting",
        },
        "problem": {"type": "string", "description": "when it failed: what is missing"},
        "fix": {"type": "string", "description": "when it failed: how to fix it"},
    },
}
DOCTOR: dict[str, Any] = {
    "type": "object",
    "required": ["tasksStart", "checks"],
    "properties": {
        "tasksStart": {
            "type": "boolean",
            "description": "false while a check that blocks tasks fails: every start is a 503",
        },
        "refusal": {
            "type": "string",
            "description": "while tasks cannot start: the words a start is refused with",
        },
        "ageSeconds": {
            "type": "number",
            "description": "how many seconds ago the checks answered: 0 for a run made for this "
            "request; boxd answers the last run's findings again within "
            f"{MIN_INTERVAL_SECONDS:g} s of its end",
        },
        "checks": {"type": "array", "items": _CHECK},
    },
}

# A start refused while a check of the machine fails (boxd.wire.doctor), for example.
NOT_SANDBOXED = (
    refusal(
        [
            failed(
                "IPAddressDeny (BPF)",
                "systemd does not enforce IPAddressDeny= here.",
                "allow the bpf() system call, then run boxctl doctor.",
                blocks=True,
            )
        ]
    )
    or ""
)
NOT_SANDBOXED_WHY = (
    "boxd is not running, or this machine lacks what a task's sandbox needs (GET /api/doctor "
    "says what): no task starts until it is fixed"
)
DOCTOR_SUMMARY = (
    "Check this machine anew for what boxd needs (boxd doctor); tasks start only while no check "
    "that blocks them fails"
)
