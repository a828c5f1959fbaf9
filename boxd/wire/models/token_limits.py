"""The owner's limits on an app's or a member's token: the highest budget, the tools, the hosts
and the workspaces its tasks may have. Set when the token is made (`boxctl token create
--max-budget --tool --host --workspace`, or the screen's token form) and checked by the manager
where a task is created, so every door that starts a task meets them.

A token made without limits, or stored before tokens had any, gets the safe ones: a budget no
higher than Settings defaultBudgetCents as it is when the task is made, no tools, no hosts, the
workspace home.
"""

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr

from boxd.errors import Problem, die
from boxd.net.host_rules import Rule, parse_rule
from boxd.reading.caps import MAX_LABEL, MAX_TOOLS
from boxd.wire.models.plain_errors import parse, plain
from boxd.wire.models.task_request import MAX_WORKSPACE, TaskRequest, budget_cents, checked_hosts

# Workspaces one token may name.
MAX_WORKSPACES = 50
HOME = "home"


def _budget(value: object) -> int | None:
    return None if value is None else budget_cents(value, "maxBudgetCents")


def _names(field: str, limit: int, longest: int) -> Any:
    def check(value: object) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise plain(f"{field} must be a list of names")
        if len(value) > limit:
            raise plain(f"{field} has {len(value)} names; at most {limit} are allowed")
        for name in value:
            if not name or len(name) > longest:
                raise plain(f"{field}: a name is 1 to {longest} characters")
        # Each once, in the order given: the owner reads them back as they wrote them.
        return list(dict.fromkeys(value))

    return BeforeValidator(check)


class TokenLimits(BaseModel):
    __doc__ = (
        "What the tasks an app's or a member's token starts may have. A field left out gets "
        "the safe default."
    )

    model_config = ConfigDict(extra="forbid", frozen=True)

    maxBudgetCents: Annotated[int | None, BeforeValidator(_budget)] = Field(
        default=None,
        description=(
            "The highest budgetCents its tasks may ask for, 0 to 100000; null (the default): "
            "Settings defaultBudgetCents as it is when the task is made"
        ),
    )
    tools: Annotated[list[StrictStr], _names("tools", MAX_TOOLS, MAX_LABEL)] = Field(
        default=[], description="The tools its tasks may name, such as echo.say; none by default"
    )
    hosts: Annotated[list[str], BeforeValidator(checked_hosts)] = Field(
        default=[],
        description=(
            "Host rules its tasks' hosts must each fall within (example.com covers "
            "example.com:443; *.example.com covers a.example.com, never example.com); none by "
            "default"
        ),
    )
    workspaces: Annotated[list[StrictStr], _names("workspaces", MAX_WORKSPACES, MAX_WORKSPACE)] = (
        Field(default=[HOME], description="The workspaces its tasks may work on; home by default")
    )


# What a token stored before tokens had limits gets, and one made without any named.
DEFAULT = TokenLimits()


def parse_limits(text: str) -> TokenLimits:
    """The limits a caller sent, as JSON; "" is no limits named: the defaults."""
    return parse(TokenLimits, text or "{}")


def holder(role: str) -> str:
    """How a refusal names the token: "this member's token"."""
    return f"this {role}'s token"


def covers(allowed: Rule, wanted: Rule) -> bool:
    """Whether every place `wanted` lets a task reach, `allowed` lets it reach too: the same
    address or name, a name under a wildcard, a narrower wildcard under a wider one; and any
    port, or the one port `wanted` is limited to."""
    if allowed.port is not None and allowed.port != wanted.port:
        return False
    if wanted.address is not None:
        return allowed.address == wanted.address
    if wanted.name is not None:
        if allowed.suffix is not None:
            return wanted.name.endswith(allowed.suffix)
        return allowed.name == wanted.name
    assert wanted.suffix is not None
    return allowed.suffix is not None and wanted.suffix.endswith(allowed.suffix)


def within(allowed: list[str], host: str) -> bool:
    wanted = parse_rule(host)
    return any(covers(parse_rule(rule), wanted) for rule in allowed)


def _listed(kind: str, names: list[str]) -> str:
    return f"only the {kind} {', '.join(names)}" if names else f"no {kind}"


def _refuse(who: str, allows: str, asks: str) -> None:
    die(Problem.FORBIDDEN, f"{who} allows {allows}, and this task asks for {asks}")


def check_task(
    limits: TokenLimits,
    who: str,
    request: TaskRequest,
    *,
    default_budget: int,
    default_hosts: list[str],
) -> tuple[int, list[str]]:
    """The budget and hosts a task of this token gets, or a 403 that names the first limit the
    request goes past. Autonomy and the worker are not looked at: they only ever narrow what a
    task may do (a Droid task at low autonomy reaches no host), never widen it."""
    highest = default_budget if limits.maxBudgetCents is None else limits.maxBudgetCents
    budget = request.budgetCents
    if budget is None:
        budget = min(default_budget, highest)
    elif budget > highest:
        die(
            Problem.FORBIDDEN,
            f"{who} allows a budget of at most {highest} cents, not {budget}",
        )
    for tool in request.tools:
        if tool not in limits.tools:
            _refuse(who, _listed("tools", limits.tools), tool)
    if request.hosts is None:
        # The owner's default hosts, as far as the token allows them.
        hosts = [host for host in default_hosts if within(limits.hosts, host)]
    else:
        hosts = request.hosts
        for host in hosts:
            if not within(limits.hosts, host):
                covered = ", which they do not cover" if limits.hosts else ""
                _refuse(who, _listed("hosts", limits.hosts), f"{host}{covered}")
    # Shared files go to a new workspace of the task's own: nothing of the owner's is in it.
    if request.files is None and request.workspace not in limits.workspaces:
        _refuse(who, _listed("workspaces", limits.workspaces), f"workspace {request.workspace}")
    return budget, hosts
