"""The owner's vault in a machine, through boxctl: setting a secret, listing the names."""

import json
import subprocess

from testbed.box_api import (
    BOXCTL,
    boxctl,
)
from testbed.machine import Machine


def vault_set(
    machine: Machine, name: str, value: str, user: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """`boxctl vault set NAME` with the value on stdin, the way a person pipes it in."""
    return machine.run(BOXCTL, "vault", "set", name, user=user, input=value, check=check)


def vault_names(machine: Machine) -> list[str]:
    secrets = json.loads(boxctl(machine, "vault", "ls", "--json").stdout)
    assert isinstance(secrets, list)
    return [secret["name"] for secret in secrets]
