"""Whether a task's hosts let it reach a target, and if not, why not in plain words.

The rules are the canonical forms of boxd.net.hosts: `example.com` (any port), `example.com:8080`
(that port only), `*.example.com` (its subdomains, never example.com itself), and IP addresses,
`93.184.216.34` or `[2001:db8::1]:443`. An address is reached only when a rule names that
address: a name never stands for the addresses it resolves to, nor the other way round.
"""

import ipaddress
from dataclasses import dataclass

from boxd.net.egress_target import IPAddress, Target
from boxd.net.hosts import check_host


@dataclass(frozen=True)
class Rule:
    # Exactly one of name, suffix and address is set; suffix keeps its leading dot.
    name: str | None
    suffix: str | None
    address: IPAddress | None
    port: int | None

    def matches_host(self, target: Target) -> bool:
        if target.address is not None:
            return self.address == target.address
        if target.name is None:
            return False
        if self.suffix is not None:
            return target.name.endswith(self.suffix)
        return self.name == target.name


def _split_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest else None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, int(port)
    return text, None


def parse_rule(raw: str) -> Rule:
    """One rule, checked by boxd.net.hosts first, so a bad rule fails with its plain words."""
    canonical = check_host(raw)
    wildcard = canonical.startswith("*.")
    host, port = _split_port(canonical.removeprefix("*."))
    try:
        address: IPAddress | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        return Rule(None, None, address, port)
    name = host.removesuffix(".")
    if wildcard:
        return Rule(None, f".{name}", None, port)
    return Rule(name, None, None, port)


class HostRules:
    def __init__(self, hosts: list[str]) -> None:
        self.rules = [parse_rule(host) for host in hosts]

    def refusal(self, target: Target) -> str | None:
        """None when a rule allows the target; otherwise the reason, for the task to read."""
        if not target.valid:
            return "it is not a host name or an IP address"
        if not self.rules:
            return "this task may not reach the network: its hosts list is empty"
        same_host = [rule for rule in self.rules if rule.matches_host(target)]
        if any(rule.port in (None, target.port) for rule in same_host):
            return None
        if same_host:
            ports = sorted({rule.port for rule in same_host if rule.port is not None})
            listed = ", ".join(str(port) for port in ports)
            word = "port" if len(ports) == 1 else "ports"
            return f"this task's hosts allow {target.host} on {word} {listed} only"
        if target.address is not None:
            return "it is an IP address, and this task's hosts do not list that address"
        return "it is not in this task's hosts"
