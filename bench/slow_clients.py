"""How long slow and silent clients hold the box's doors, and how many it keeps: the bounds of
boxd/doors/connection_limits.py, measured from the attacker's side in a real box.

Run as root from the repository: `.venv/bin/python -m bench.slow_clients`. It boots a test
machine, installs this checkout, starts a fake task and attacks the gateway (127.0.0.1:7700) and
the task's broker.sock at once with testbed/slow_clients.py: 2,000 idle connections, one that
sends nothing, one sending its head a byte every 2 s, one sending 10 bytes of a 1 MB body, one
asking for an 8 MB answer with its window shut; meanwhile a legitimate request is timed. It
prints, per door, when the server ended each bad connection (seconds from its start, seen by
the attacker without reading), the legitimate request's time and the server's descriptors.
"""

import sys
import time
from pathlib import Path
from typing import Any


def say(text: str = "") -> None:
    print(text, flush=True)


def table(name: str, found: dict[str, Any], bound: dict[str, float], cap: int) -> None:
    say(f"\n{name}")
    rows = [
        ("sends nothing", found["halfOpen"]["closedAfter"], bound["head"]),
        ("head a byte every 2 s", found["slowloris"]["closedAfter"], bound["head"]),
        (
            f"10 bytes of a 1 MB body (answered {found['slowBody']['status']})",
            found["slowBody"]["closedAfter"],
            bound["body"],
        ),
        ("8 MB answer, window shut", found["noReader"]["closedAfter"], bound["stall"]),
        (
            f"{found['idle']['opened']} idle (opened over {found['idle']['openingSeconds']} s),"
            " the last",
            found["idle"]["lastClosedAfter"],
            bound["head"],
        ),
    ]
    say(f"  {'attack':<48} {'ended after':>12} {'bound':>7}")
    for what, seconds, limit in rows:
        shown = "never" if seconds is None else f"{seconds:.1f} s"
        say(f"  {what:<48} {shown:>12} {limit:>5.0f} s")
    legit = found["legitimate"]
    fds = found["serverDescriptors"]
    say(f"  legitimate request meanwhile: {legit['status']} in {legit['seconds'] * 1000:.0f} ms")
    say(
        f"  server's descriptors: {fds['before']} before, {fds['during']} during "
        f"(cap {cap} connections), {fds['after']} after"
    )


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from boxd.doors.connection_limits import (
        BODY_SECONDS,
        BROKER_CONNECTIONS,
        GATEWAY_CONNECTIONS,
        HEAD_SECONDS,
        STALL_SECONDS,
    )
    from testbed.machine import Machine, install_boxd
    from testbed.slow_attacks import attack_both

    bound = {"head": HEAD_SECONDS, "body": BODY_SECONDS, "stall": STALL_SECONDS}
    began = time.monotonic()
    with Machine() as machine:
        install_boxd(machine)
        token = machine.run("boxctl", "token", "create", "--name", "bench").stdout.strip()
        say(f"machine ready in {time.monotonic() - began:.0f} s; attacking both doors at once")
        started = time.monotonic()
        gateway, broker, _ = attack_both(machine, token)
        say(f"the attacks took {time.monotonic() - started:.0f} s")
    table("gateway, 127.0.0.1:7700 (TCP)", gateway, bound, GATEWAY_CONNECTIONS)
    table("a task's broker.sock (Unix)", broker, bound, BROKER_CONNECTIONS)


if __name__ == "__main__":
    main()
