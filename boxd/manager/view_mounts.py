"""Keeps the owner's mounted views (boxd.manager.workspaces.owner_views) in step with the record:
each is remade from the workspace's stack as the record has it, under the workspace's
`layers.joins` lock, whenever the stack changes (a task's layer joins, undo, keep, a workspace
made or removed) and at every start (`/run` is a tmpfs: a reboot empties it).

A view that cannot be made never fails what changed the stack: the change is recorded already,
and tasks see it; the owner's view is told of in the journal, and the next change or start makes
it again."""

import asyncio
import logging
import os
from pathlib import Path

from boxd.manager.record.store import Store
from boxd.manager.run import complaint
from boxd.manager.units import at_rest
from boxd.manager.workspaces import owner_access
from boxd.manager.workspaces.layers import Layers, layer_name, mount_overlay
from boxd.manager.workspaces.owner_views import EMPTY, OwnerViews, mount_options, shown
from boxd.paths import workspaces_dir

log = logging.getLogger(__name__)


class ViewMounts:
    def __init__(self, store: Store, layers: Layers, views: OwnerViews | None = None) -> None:
        self.store = store
        self.layers = layers
        self.views = views or OwnerViews(layers.home)
        self.gid = owner_access.owner_gid()
        self._ready = False

    async def open(self, workspaces: list[str]) -> None:
        """Makes the gate and every workspace's view, and takes away what a workspace removed
        or a remake cut off left; at start-up."""
        if self.gid is None:
            log.warning("there is no group boxd-owner: the owner's views are not mounted")
            return
        for command in await asyncio.to_thread(self.views.gate_commands, self.gid):
            failed = await complaint(*command)
            if failed:
                log.error("the owner's views cannot be mounted in %s: %s", self.views.root, failed)
                return
        # The first try's lesson: no view is mounted where a mount could propagate.
        if not await asyncio.to_thread(self.views.gate_is_private):
            log.error(
                "%s is not a private mount: the owner's views are not mounted", self.views.root
            )
            return
        await asyncio.to_thread(self.views.prepare)
        self._ready = True
        for name in await asyncio.to_thread(self.views.stale_links, set(workspaces)):
            await self.drop(name)
        for name in filter(shown, workspaces):
            await asyncio.to_thread(self._open_base, name)
            await self.remake(name)
        for generation in await asyncio.to_thread(self.views.unused):
            await self._detach(generation)

    def _open_base(self, workspace: str) -> None:
        """The base folder readable by boxd-owner, and what is put in it later too."""
        assert self.gid is not None
        base = workspaces_dir(self.layers.home) / workspace
        try:
            fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        try:
            owner_access.grant(fd, self.gid, default=True)
        except OSError as failure:
            log.warning("could not let boxd-owner read workspace %s: %s", workspace, failure)
        finally:
            os.close(fd)

    async def open_base(self, workspace: str) -> None:
        """A new workspace's base opened to boxd-owner, before anything is put in it."""
        if self.gid is not None and shown(workspace):
            await asyncio.to_thread(self._open_base, workspace)

    async def made(self, workspace: str) -> None:
        """A new workspace: its base opened to boxd-owner, and its view."""
        await self.open_base(workspace)
        await self.remake(workspace)

    async def open_layer(self, workspace: str, layer: Path) -> None:
        """A layer joining: readable by boxd-owner through the view (owner_access). Never fails
        the join: the owner may then not read some of it, which the journal says."""
        if self.gid is None or not shown(workspace):
            return
        try:
            await asyncio.to_thread(owner_access.open_to_owner, layer, self.gid)
        except OSError as failure:
            log.warning("could not let boxd-owner read layer %s: %s", layer, failure)

    async def remake(self, workspace: str) -> None:
        """Mounts the workspace's view as its stack stands in the record, and swaps it in."""
        if not self._ready or not shown(workspace):
            return
        async with self.layers.joins[workspace]:
            try:
                await self._remake(workspace)
            except OSError as failure:
                log.error("the owner's view of workspace %s is not remade: %s", workspace, failure)

    async def _remake(self, workspace: str) -> None:
        if not await asyncio.to_thread((workspaces_dir(self.layers.home) / workspace).is_dir):
            await self._drop(workspace)
            return
        stack = [layer_name(number) for number, _ in await self.store.stack(workspace)]
        store = self.layers.store(workspace)
        await asyncio.to_thread(store.mkdir, at_rest.LAYERS, True, True)
        generation = await asyncio.to_thread(self.views.new_generation)
        options = mount_options(stack, self.views.base(workspace), self.views.root / EMPTY)
        failed = await mount_overlay("boxd-view", options, generation, store)
        if failed:
            await asyncio.to_thread(self.views.remove_generation, generation)
            log.error("the owner's view of workspace %s cannot be mounted: %s", workspace, failed)
            return
        # Private already, as a mount below a private one; said again, as the first try's
        # mistake was a mount that was not.
        await complaint("mount", "--make-private", str(generation))
        old = await asyncio.to_thread(self.views.swap, workspace, generation)
        if old is not None:
            await self._detach(old)

    async def drop(self, workspace: str) -> None:
        """A workspace removed: its view goes."""
        if not self._ready:
            return
        async with self.layers.joins[workspace]:
            await self._drop(workspace)

    async def _drop(self, workspace: str) -> None:
        old = await asyncio.to_thread(self.views.unlink, workspace)
        if old is not None:
            await self._detach(old)

    async def _detach(self, generation: Path) -> None:
        """Detaches an old generation (MNT_DETACH): whoever has a file open in it keeps reading
        it; the folder goes once nothing is mounted on it."""
        while await asyncio.to_thread(os.path.ismount, generation):
            failed = await complaint("umount", "--lazy", str(generation))
            if failed:
                log.error("could not detach the old view %s: %s", generation, failed)
                return
        await asyncio.to_thread(self.views.remove_generation, generation)
