"""Slow, silent and crowding clients on the gateway (127.0.0.1:7700) and on a task's broker
socket, in a real box: each bad connection ends within its bound (boxd/doors/connection_limits.py),
the service's descriptors stay within its cap, and a legitimate caller is answered meanwhile."""

import json
import time
from typing import Any

from boxd.doors.connection_limits import (
    BODY_SECONDS,
    BROKER_CONNECTIONS,
    EGRESS_CONNECTIONS,
    GATEWAY_CONNECTIONS,
    HEAD_SECONDS,
    LISTEN_BACKLOG,
    MODEL_GATEWAY_CONNECTIONS,
    STALL_SECONDS,
    TURNED_AWAY,
    body_words,
)
from testbed.box_api import boxctl, finish
from testbed.machine import Machine
from testbed.slow_attacks import (
    IDLE,
    attack_both,
)

# How much later than its bound an end may come: the guard checks every second, and the
# attacker looks every tenth of one; two cores are shared by the machine and its tests.
SLACK = 4.0
# Descriptors beyond the cap: the system bus, the journal, the loop, a few turned away.
OVERHEAD = 100
# What a tunnel through the egress proxy holds: its two sockets and its two pipes' four ends.
TUNNEL_FDS = 6
# Descriptors each service may need at its caps, all doors full and each turning some away.
NEEDED = {
    "boxd-web.service": GATEWAY_CONNECTIONS + TURNED_AWAY + OVERHEAD,
    "box-broker@": BROKER_CONNECTIONS
    + 2 * MODEL_GATEWAY_CONNECTIONS
    + TUNNEL_FDS * EGRESS_CONNECTIONS
    + 4 * TURNED_AWAY
    + OVERHEAD,
}


def check(found: dict[str, Any], cap: int) -> None:
    # Answered while every attacker still hangs on, not once their bounds freed the server
    # (how fast: bench/slow_clients.py prints it).
    assert found["legitimate"]["status"] == 200, found
    assert found["legitimate"]["seconds"] < HEAD_SECONDS, found
    assert found["halfOpen"]["closedAfter"] <= HEAD_SECONDS + SLACK, found
    assert found["slowloris"]["closedAfter"] <= HEAD_SECONDS + SLACK, found
    assert found["slowBody"]["status"] == 408, found
    assert body_words(BODY_SECONDS) in found["slowBody"]["answer"], found
    assert found["slowBody"]["closedAfter"] <= BODY_SECONDS + SLACK, found
    assert found["noReader"]["closedAfter"] <= STALL_SECONDS + SLACK, found
    idle = found["idle"]
    assert idle["opened"] == IDLE and idle["closed"] == IDLE, found
    # The last of them is accepted once the server took the whole flood.
    taken = idle["openingSeconds"] + idle["serverTookThemSeconds"]
    assert idle["lastClosedAfter"] <= taken + HEAD_SECONDS + SLACK, found
    assert found["serverDescriptors"]["during"] <= cap + OVERHEAD, found


def test_slow_and_silent_clients_are_bounded_on_the_gateway_and_a_broker(
    machine: Machine, token: str
) -> None:
    started = time.monotonic()
    on_gateway, on_broker, task_id = attack_both(machine, token)
    print(json.dumps({"gateway": on_gateway, "broker": on_broker}, indent=1))
    print(f"the attacks took {time.monotonic() - started:.0f} s")
    check(on_gateway, GATEWAY_CONNECTIONS)
    check(on_broker, BROKER_CONNECTIONS)
    # The kernel queues a burst for the gateway as systemd asked (asyncio listens again, with
    # 100 unless told: a burst beyond it waited a second or more per connection for a new SYN).
    listening = machine.run("ss", "-ltnH", "sport = :7700").stdout.split()
    assert listening[2] == str(LISTEN_BACKLOG), listening
    # Neither service can run out of descriptors before its caps are reached.
    for unit in ("boxd-web.service", f"box-broker@{task_id}.service"):
        limit = machine.run("systemctl", "show", "-P", "LimitNOFILE", unit).stdout.strip()
        needed = NEEDED[unit if unit.startswith("boxd") else "box-broker@"]
        assert int(limit) >= needed, (unit, limit, needed)
    # Both still serve, and the task carries on.
    assert machine.run("systemctl", "is-active", "boxd-web.service").stdout.strip() == "active"
    shown = json.loads(boxctl(machine, "show", task_id, "--json").stdout)
    assert shown["state"] == "running"
    # Its place is given back, for the tests that come after in the same box.
    boxctl(machine, "stop", task_id)
    assert finish(machine, task_id)["state"] in ("stopped", "failed")
