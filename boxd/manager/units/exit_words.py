"""Why a worker unit failed, as a sentence a person can read."""

import signal

from boxd.manager.units.systemd import CLD_DUMPED, CLD_EXITED, CLD_KILLED, UnitStatus

# systemd's own exit statuses for a service that never got to run its program
# (systemd.exec(5), "Process Exit Codes").
_SETUP_FAILURES = {
    200: "systemd could not change to its working directory",
    203: "its program could not be run",
    216: "systemd could not set its group",
    217: "its user does not exist",
    218: "systemd could not set its capabilities",
    226: "systemd could not set up its file system namespace (ProtectSystem, ReadWritePaths)",
    228: "systemd could not set up its system call filter",
    233: "systemd could not drop its privileges",
    242: "systemd could not set up its user namespace",
}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def why_failed(status: UnitStatus, last_words: str | None = None) -> str:
    said = f": {last_words}" if last_words else "."
    if status.result == "exit-code" and status.main_code == CLD_EXITED:
        if status.main_status in _SETUP_FAILURES:
            return (
                f"The worker could not start: {_SETUP_FAILURES[status.main_status]} "
                f"(exit status {status.main_status})."
            )
        return f"The worker exited with status {status.main_status}{said}"
    if status.result == "oom-kill":
        return "The worker ran out of memory and the kernel killed it."
    if status.result == "signal" or status.main_code == CLD_KILLED:
        return f"The worker was killed by {_signal_name(status.main_status)}{said}"
    if status.result == "core-dump" or status.main_code == CLD_DUMPED:
        return f"The worker crashed with {_signal_name(status.main_status)} and dumped core{said}"
    if status.result == "timeout":
        return "The worker ran past its time limit and systemd stopped it."
    if status.result == "resources":
        return "systemd could not set up the worker's sandbox (out of resources)."
    if status.active_state == "inactive":
        return "The worker unit was stopped from outside boxd (systemctl stop?)."
    return f"The worker unit failed: systemd says {status.result}{said}"
