"""The owner's settings, stored in the database, with the seed's defaults."""

import ipaddress
import os
import re
from enum import StrEnum
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
)

from boxd.net.address_screen import never_reached
from boxd.wire.models.plain_errors import invalid, plain
from boxd.wire.models.task_request import MAX_PATH, budget_cents, checked_hosts

MAX_AGENT_FOLDERS = 50


class NetworkDefault(StrEnum):
    NONE = "none"
    ALLOWLIST = "allowlist"


DEFAULT_MODEL_BASE_URL = "https://api.anthropic.com"
MAX_MODEL_BASE_URL = 2000
_URL_CHARACTERS = re.compile(r"[!-~]+")


def _model_base_url(value: object) -> str:
    """Where each task's model gateway sends model requests (it adds /v1/messages), with the
    model key: over https, or http to this machine's own loopback only (a proxy the owner runs
    here, a test's server), so the key never crosses a network in clear. Where the host's name
    leads is screened as the gateway connects (boxd/broker/model/upstream.py)."""
    like = f"an https URL like {DEFAULT_MODEL_BASE_URL}"
    if not isinstance(value, str):
        raise plain(f"modelBaseUrl must be {like}")
    if len(value) > MAX_MODEL_BASE_URL:
        raise plain(f"modelBaseUrl is over {MAX_MODEL_BASE_URL:,} characters")
    if not _URL_CHARACTERS.fullmatch(value):
        raise plain(f"modelBaseUrl must be {like}, without spaces or control characters")
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - a port that is not a number from 0 to 65535 raises here
    except ValueError:
        raise plain(f"modelBaseUrl must be {like}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise plain(f"modelBaseUrl must be {like}")
    if url.scheme == "http" and not _loopback(url.hostname):
        raise plain(
            f"modelBaseUrl must be {like}: the model key goes with every request, so plain http "
            "is only for this machine's own loopback (http://127.0.0.1:PORT, http://[::1]:PORT "
            "or http://localhost:PORT, a proxy you run here)"
        )
    if url.username is not None or url.password is not None:
        raise plain(
            "modelBaseUrl must not hold a user name or password: the model key belongs in "
            "the vault (boxctl vault set ANTHROPIC_API_KEY)"
        )
    if url.query or url.fragment or "?" in value or "#" in value:
        raise plain("modelBaseUrl must not have a query or fragment: the gateway adds /v1/messages")
    if _address(url.hostname) is None and _NUMERIC_HOST.fullmatch(url.hostname):
        raise plain(
            f"modelBaseUrl's host {url.hostname} is neither a name nor an address as written "
            "in a URL (a number the system would read as some address): write the address "
            "in full, like 192.0.2.10"
        )
    literal = _address(url.hostname)
    if literal is not None and not literal.is_loopback and never_reached(literal) is not None:
        raise plain(
            f"modelBaseUrl's host {literal} is {never_reached(literal)}: the model key never "
            "goes there"
        )
    return value.rstrip("/")


# What the system's resolver reads as an IPv4 address though ipaddress does not: 2130706433,
# 0x7f.1, 0177.0.0.1, 127.1.
_NUMERIC_HOST = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*\.?", re.IGNORECASE)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The host as an address, a trailing dot taken off (169.254.169.254. is that address)."""
    try:
        return ipaddress.ip_address(host.removesuffix("."))
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    address = _address(host)
    return host.lower() == "localhost" or (address is not None and address.is_loopback)


# The most output tokens a model request may ask for: its worst case (max_tokens at the output
# price) is reserved from the task's budget before it goes. Droid asks for 32,000.
DEFAULT_MODEL_MAX_TOKENS = 32_000
MAX_MODEL_MAX_TOKENS = 128_000


# A task's worker unit gets these as MemoryMax=, TasksMax= and CPUQuota=. The defaults leave
# room for what agents run (node, compilers, test suites) without letting one task starve the box.
MIB = 1024 * 1024
MIN_MEMORY_BYTES = 64 * MIB
MAX_MEMORY_BYTES = 1024 * 1024 * MIB
MIN_TASKS, MAX_TASKS = 16, 65536
MIN_CPU_PERCENT, MAX_CPU_PERCENT = 1, 100 * 1024


GIB = 1024 * MIB
MIN_DISK_QUOTA_BYTES, MAX_DISK_QUOTA_BYTES = 64 * MIB, 1024**5
MAX_RUNNING_TASKS = 4096
MAX_ALL_TASKS = 4_194_304  # the kernel's highest pid_max


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_max_running_tasks(cores: int, memory_bytes: int) -> int:
    """Four tasks a core, two a GiB of memory, whichever is fewer; at least one.

    An agent mostly waits for its model, so a core keeps several busy; but each running task is
    a worker (node, with what it runs) and a broker, half a GiB together in practice, and a box
    that swaps serves no task well."""
    return max(1, min(cores * 4, memory_bytes // GIB * 2, MAX_RUNNING_TASKS))


def default_all_tasks_memory(memory_bytes: int) -> int:
    """Three quarters of the machine's memory: the rest is for boxd, brokers and the system."""
    return min(max(memory_bytes * 3 // 4, MIN_MEMORY_BYTES), MAX_MEMORY_BYTES)


def _whole(field: str, what: str, low: int, high: int) -> BeforeValidator:
    def check(value: object) -> int:
        # bool is an int to Python but never a limit; 2.0 is not a whole number on the wire.
        if type(value) is not int or not low <= value <= high:
            raise plain(f"{field} must be {what} from {low} to {high}")
        return value

    return BeforeValidator(check)


def _disk_quota(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not MIN_DISK_QUOTA_BYTES <= value <= MAX_DISK_QUOTA_BYTES:
        raise plain(
            "taskDiskQuotaBytes must be null (no quota) or a whole number of bytes from "
            f"{MIN_DISK_QUOTA_BYTES} to {MAX_DISK_QUOTA_BYTES}"
        )
    return value


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaultBudgetCents: Annotated[
        int, BeforeValidator(lambda v: budget_cents(v, "defaultBudgetCents"))
    ] = 100
    defaultHosts: Annotated[
        list[str], BeforeValidator(lambda v: checked_hosts(v, "defaultHosts"))
    ] = []
    networkDefault: NetworkDefault = NetworkDefault.NONE
    agentFolders: list[StrictStr] = []
    taskMemoryMaxBytes: Annotated[
        int,
        _whole("taskMemoryMaxBytes", "a whole number of bytes", MIN_MEMORY_BYTES, MAX_MEMORY_BYTES),
    ] = 4096 * MIB
    taskTasksMax: Annotated[
        int, _whole("taskTasksMax", "a whole number of processes", MIN_TASKS, MAX_TASKS)
    ] = 1024
    # Percent of one CPU core: 200 lets a task keep two cores busy.
    taskCPUPercent: Annotated[
        int,
        _whole(
            "taskCPUPercent", "a whole percentage of one core", MIN_CPU_PERCENT, MAX_CPU_PERCENT
        ),
    ] = 200

    # A task's home and changes together, as a project quota where BOX_HOME's file system
    # enforces them (boxd.manager.units.disk_quota); null, the default: none.
    taskDiskQuotaBytes: Annotated[int | None, BeforeValidator(_disk_quota)] = None

    # All tasks' workers together, in box.slice; and how many tasks run at once, the rest
    # waiting `queued` in the order they came. The defaults come from the machine.
    allTasksMemoryMaxBytes: Annotated[
        int,
        _whole(
            "allTasksMemoryMaxBytes",
            "a whole number of bytes",
            MIN_MEMORY_BYTES,
            MAX_MEMORY_BYTES,
        ),
    ] = Field(default_factory=lambda: default_all_tasks_memory(machine_memory_bytes()))
    allTasksTasksMax: Annotated[
        int, _whole("allTasksTasksMax", "a whole number of processes", MIN_TASKS, MAX_ALL_TASKS)
    ] = 16384
    maxRunningTasks: Annotated[
        int, _whole("maxRunningTasks", "a whole number of tasks", 1, MAX_RUNNING_TASKS)
    ] = Field(
        default_factory=lambda: default_max_running_tasks(
            os.cpu_count() or 1, machine_memory_bytes()
        )
    )

    # The Anthropic Messages API every task's model gateway forwards to, with the vault's key.
    modelBaseUrl: Annotated[str, BeforeValidator(_model_base_url)] = DEFAULT_MODEL_BASE_URL
    modelMaxTokens: Annotated[
        int,
        _whole("modelMaxTokens", "a whole number of output tokens", 1, MAX_MODEL_MAX_TOKENS),
    ] = DEFAULT_MODEL_MAX_TOKENS

    @field_validator("agentFolders")
    @classmethod
    def _absolute(cls, folders: list[str]) -> list[str]:
        if len(folders) > MAX_AGENT_FOLDERS:
            raise plain(f"agentFolders names at most {MAX_AGENT_FOLDERS} folders")
        for folder in folders:
            if len(folder) > MAX_PATH:
                raise plain(f"agentFolders: a path is at most {MAX_PATH} characters")
            if not folder.startswith("/"):
                raise plain(f"agentFolders: {folder!r} is not an absolute path")
        return folders


def change_settings(current: Settings, changes: dict[str, Any]) -> Settings:
    """Applies a partial change; unknown names and bad values are refused, nothing half-applied."""
    try:
        return Settings.model_validate({**current.model_dump(mode="json"), **changes})
    except ValidationError as error:
        raise invalid(error) from None
