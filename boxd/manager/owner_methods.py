"""The owner's methods that are not about one task: the box's settings, tokens and paired
devices, pausing and resuming the agents, the workspaces, and the Droid and Claude Code
installs' states."""

import asyncio
import logging
from pathlib import Path
from typing import Any

from boxd.errors import Problem, die
from boxd.manager.access.pairing import LIFETIME, Pairings, check_device_name
from boxd.manager.access.tokens import (
    DEVICE,
    check_member_id,
    check_token_name,
    find_token,
    new_token,
    token_hash,
    token_role,
)
from boxd.manager.app_runners import AppRunners
from boxd.manager.background import Background
from boxd.manager.lifecycle import Lifecycle
from boxd.manager.record.store import Store
from boxd.manager.spares import SpareMaker
from boxd.manager.units import disk_quota
from boxd.manager.units.systemd import Systemd, SystemdError
from boxd.manager.units.worker_unit import ALL_TASKS_SLICE, all_tasks_properties
from boxd.manager.workspaces.layers import Layers
from boxd.manager.workspaces.workspaces import PERSONAL, SHARED, Workspaces
from boxd.reading.strict_json import loads
from boxd.wire.caller import Caller, Role
from boxd.wire.models.settings import Settings, change_settings
from boxd.wire.models.task import TaskState
from boxd.wire.models.token_limits import TokenLimits, parse_limits

log = logging.getLogger(__name__)


class OwnerMethods:
    def __init__(
        self,
        home: Path,
        store: Store,
        systemd: Systemd,
        apps: AppRunners,
        workspaces: Workspaces,
        layers: Layers,
        lifecycle: Lifecycle,
        spare_maker: SpareMaker,
        background: Background,
    ) -> None:
        self.home = home
        self.store = store
        self.systemd = systemd
        self.apps = apps
        self.workspaces = workspaces
        self.layers = layers
        self.lifecycle = lifecycle
        self.spare_maker = spare_maker
        self.background = background
        self.pairings = Pairings()

    async def get_settings(self, caller: Caller) -> dict[str, Any]:
        return (await self.store.settings()).model_dump(mode="json")

    async def set_settings(self, caller: Caller, changes: str) -> dict[str, Any]:
        changed = loads(changes, "the settings")
        if not isinstance(changed, dict):
            die(Problem.INVALID, "the settings must be a JSON object of names and values")
        current = await self.store.settings()
        settings = change_settings(current, changed)
        if settings.taskDiskQuotaBytes not in (None, current.taskDiskQuotaBytes):
            why = await asyncio.to_thread(disk_quota.why_not, self.home)
            if why is not None:
                die(Problem.INVALID, disk_quota.refused(self.home, why))
        await self.limit_all_tasks(settings)
        await self.store.save_settings(settings)
        # A higher maxRunningTasks lets queued tasks start now.
        self.lifecycle.start_queued_soon()
        self.background(self.spare_maker.renew_stale(settings))
        return settings.model_dump(mode="json")

    async def limit_all_tasks(self, settings: Settings) -> None:
        try:
            await self.systemd.set_properties(ALL_TASKS_SLICE, all_tasks_properties(settings))
        except SystemdError as error:
            die(
                Problem.FAILED,
                f"could not set the limits of all tasks together on {ALL_TASKS_SLICE}: {error}",
            )

    async def get_droid(self, caller: Caller) -> dict[str, Any]:
        return self.lifecycle.droid.state.public()

    async def get_claude(self, caller: Caller) -> dict[str, Any]:
        return self.lifecycle.claude.state.public()

    async def create_token(self, caller: Caller, name: str, role: str, limits: str) -> str:
        as_role = token_role(role)
        checked = check_member_id(name) if as_role == Role.MEMBER else check_token_name(name)
        limited = self._check_limits(as_role, limits)
        token = new_token()
        stored = None if limited is None else limited.model_dump_json()
        await self.store.add_token(token_hash(token), checked, as_role.value, caller.user, stored)
        return token

    def _check_limits(self, role: Role, text: str) -> TokenLimits | None:
        """An app's or a member's limits as sent, each of them one a task could have here now;
        an owner's token has none: it acts as the owner."""
        limits = parse_limits(text)
        if role == Role.OWNER:
            if limits.model_fields_set:
                die(
                    Problem.INVALID,
                    "an owner's token acts as the owner, so it has no limits: limits are for "
                    "an app's or a member's token (--app, --member)",
                )
            return None
        for tool in limits.tools:
            self.installed(tool)
        for workspace in limits.workspaces:
            if workspace.startswith((SHARED, PERSONAL)):
                die(
                    Problem.INVALID,
                    f"workspace {workspace} is one the box made for one task's files or the "
                    "owner's own folders: only the owner may start tasks on it",
                )
            if not self.workspaces.exists(workspace):
                die(Problem.INVALID, f"no workspace {workspace}")
        return limits

    def installed(self, tool: str) -> None:
        """A 400 unless the tool's app is installed. By its app: which tools an app has only its
        runner knows, and root runs no app's code; a tool its app lacks is refused when a task
        calls it."""
        app, dot, verb = tool.partition(".")
        if not (dot and verb and app in self.apps.installed):
            die(Problem.INVALID, f"no tool {tool}: it is not installed on this box")

    async def list_tokens(self, caller: Caller) -> list[dict[str, Any]]:
        return [token.public() for token in await self.store.tokens()]

    async def revoke_token(self, caller: Caller, token_id: str) -> dict[str, Any]:
        """Removes a token: its next call is refused (401), whatever it was doing."""
        token = find_token(await self.store.tokens(), token_id)
        await self.store.remove_token(token.hash)
        return token.public()

    async def create_pairing(self, caller: Caller, name: str) -> dict[str, Any]:
        device = check_device_name(name)
        code = self.pairings.make(device, caller.user)
        return {"device": device, "code": code, "expiresInSeconds": int(LIFETIME)}

    async def pair(self, caller: Caller, code: str) -> dict[str, Any]:
        """A device's token, for a good code: stored as the device's, shown once, here."""
        paired = self.pairings.redeem(code)
        token = new_token()
        await self.store.add_token(token_hash(token), paired.device, DEVICE, paired.maker)
        log.info("device %s is paired", paired.device)
        return {"device": paired.device, "token": token}

    async def get_agents(self, caller: Caller) -> dict[str, Any]:
        return {"paused": await self.store.agents_paused()}

    async def pause_agents(self, caller: Caller) -> dict[str, Any]:
        """New tasks stay queued from now on, across restarts; running ones carry on
        (docs/limits.md, "Pausing the agents"). Under the admission lock, so no task is admitted
        after this answers."""
        async with self.lifecycle.admission:
            await self.store.save_agents_paused(True)
        log.info("the agents are paused by %s", caller.name)
        return {"paused": True}

    async def resume_agents(self, caller: Caller) -> dict[str, Any]:
        """The queued tasks start in the order they came, as places are free."""
        async with self.lifecycle.admission:
            await self.store.save_agents_paused(False)
        log.info("the agents are resumed by %s", caller.name)
        self.lifecycle.start_queued_soon()
        return {"paused": False}

    async def list_workspaces(self, caller: Caller) -> list[dict[str, Any]]:
        return [self.workspaces.describe(name) for name in self.workspaces.names()]

    async def create_workspace(self, caller: Caller, name: str) -> dict[str, Any]:
        made = await self.workspaces.create(name)
        await self.lifecycle.views.made(name)
        return made

    async def remove_workspace(self, caller: Caller, name: str) -> dict[str, Any]:
        unfinished = (TaskState.QUEUED, TaskState.RUNNING, TaskState.WAITING)
        busy = [t.id for t in await self.store.tasks(unfinished) if t.workspace == name]
        self.workspaces.check_removable(name, busy)
        # Its view first: nothing stays mounted from the folders that go to the trash.
        await self.lifecycle.views.drop(name)
        async with self.layers.joins[name]:
            await self.store.drop_workspace_layers(name)
            return await self.workspaces.move_to_trash(name, self.layers.store(name))
