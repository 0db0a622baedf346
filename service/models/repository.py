"""A model repository in Triton's layout, ``<root>/<name>/<version>/model.onnx``, kept in step
with the server.

A model's name is its folder's name; its versions are the sub-folders named by positive
integers that hold a ``model.onnx``, and the highest one is served (Triton's "latest" policy).
With ``model_control = "poll"`` the folder is scanned every ``repository_poll_s`` seconds: a new
model is loaded, a new version (or a changed file) is loaded and warmed up beside the old one
and then takes its place, and a removed model stops taking requests once those in flight are
answered; the repository API may load a model from the folder at once, but not unload one
(the folder decides). With ``"explicit"`` only the repository API (``/v2/repository/...``)
loads and unloads.
A model that fails to load is unavailable with its reason, and is tried again only when its file
changes; the other models keep serving.

Each model loads in a task of its own, beside the others: a model that takes long to load (up to
``load_timeout_s``, its deadline) holds neither the other models nor the next scan. The first
scan's loads are waited for before the registry is settled (readiness), a later scan's are not;
a model whose file changes again while it loads has that load cancelled for the new one.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from service.core.errors import ServiceError
from service.models.host import Host
from service.models.loader import load_model, unload_model
from service.models.registry import ModelStatus
from service.models.scan import MODEL_FILE, Scanner, Skipped, Version, scan

__all__ = ["MODEL_FILE", "Repository", "Version", "scan"]

log = logging.getLogger("service")


class Repository:
    """Keeps ``state.registry`` in step with the folder ``root``."""

    def __init__(self, state: Host, root: Path) -> None:
        self.state = state
        self.root = root
        #: what each model's entry was loaded (or tried) from
        self.loaded: dict[str, Version] = {}
        #: what the last scan passed over, and why (listed in the repository index)
        self.skipped: list[Skipped] = []
        self._scanner = Scanner(root)
        self._lock = asyncio.Lock()
        self._failing: str | None = None  # the last scan's failure, logged once
        #: each model's load in progress (one at most per model)
        self._loads: dict[str, asyncio.Task[object]] = {}

    async def run(self) -> None:
        """Load every model, then, with ``model_control = "poll"``, follow the folder. Cancelled
        (the server stops), every load in progress is cancelled too; returning (``explicit``,
        once the first scan's models are tried), it leaves the repository API's loads alone."""
        settings, registry = self.state.settings, self.state.registry
        try:
            await self._sync_or_log()
            # settled once the first scan's models have each been tried (each within its
            # load deadline, side by side), while the folder is followed meanwhile
            first = asyncio.gather(*self._loads.values(), return_exceptions=True)
            first.add_done_callback(lambda _: setattr(registry, "settled", True))
            if not self.loaded:  # a mistyped path looks just like this: say so once
                log.warning(
                    "repository: %s holds no models yet (each is a folder <name>/<version>/%s); %s",
                    self.root,
                    MODEL_FILE,
                    "they are loaded as they appear"
                    if settings.model_control == "poll"
                    else "load each with POST /v2/repository/models/<name>/load once it is there",
                )
            while settings.model_control == "poll":
                await asyncio.sleep(settings.repository_poll_s)
                await self._sync_or_log()
            await first
        except asyncio.CancelledError:
            await self.close()
            raise

    async def close(self) -> None:
        """Cancel every load in progress (the first scan's, a later one's or the repository
        API's) and wait until each has ended: the server stops."""
        loads = list(self._loads.values())
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)

    async def _sync_or_log(self) -> None:
        """One sync; a failure is logged (once until it changes) and the next scan tries again:
        following the folder never stops."""
        try:
            await self.sync()
        except OSError as error:  # the folder is gone or unreadable for a while
            failing = f"cannot scan {self.root}: {error.strerror or error}"
        except Exception as error:  # a defect of ours: say so, keep following the folder
            log.exception("repository: scanning %s failed", self.root)
            failing = f"scanning {self.root} failed: {error!r}"
        else:
            if self._failing is not None:
                log.warning("repository: %s can be scanned again", self.root)
            self._failing = None
            return
        if failing != self._failing:
            log.warning("repository: %s; trying again at each scan", failing)
        self._failing = failing

    async def _scan(self) -> dict[str, Version]:
        """The folder's models, read in a thread (a large folder must not hold the event loop);
        what it passed over is kept for the index."""
        found, self.skipped = await asyncio.to_thread(self._scanner)
        return found

    async def sync(self) -> None:
        """Start loading what is new or changed (each model in a task of its own: see
        :meth:`_start`), unload what was removed."""
        async with self._lock:
            found = await self._scan()
            changed = {n: v for n, v in found.items() if self.loaded.get(n) != v}
            for name, version in changed.items():  # known before any loads: not ready midway
                self.state.registry.mark(
                    name, str(version.number), ModelStatus.LOADING, source=version.path
                )
            for name, version in changed.items():
                self._start(name, version)
            for name in [n for n in self.loaded if n not in found]:
                del self.loaded[name]
                await self._cancel(name)
                await unload_model(self.state, name)

    async def load(self, name: str) -> None:
        """Load (or reload) ``name`` from the folder: 404 if the repository has no such model,
        400 with the reason if it cannot be loaded (its deadline passed included)."""
        async with self._lock:
            version = (await self._scan()).get(name)
            if version is None:
                raise ServiceError(
                    404,
                    "model_not_found",
                    f"the repository has no model {name!r} (a folder "
                    f"{name}/<version>/{MODEL_FILE})",
                )
            task = self._loads.get(name)
            if task is None or self.loaded.get(name) != version:  # else: that file loads now
                task = self._start(name, version)
        try:
            loaded = await asyncio.shield(task)  # a client gone does not cancel the load
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise ServiceError(  # the load was cancelled: the file changed, or an unload
                503,
                "not_ready",
                f"model {name!r} changed or was unloaded while it loaded",
                headers={"Retry-After": "1"},
            ) from None
        if loaded is None:
            reason = self.state.registry.entries[name].reason
            raise ServiceError(400, "load_failed", f"model {name!r} failed to load: {reason}")

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (404 if it is not known). Refused (400) with
        ``model_control = "poll"``, where the folder decides what is served (the next scan
        would load it again), as Triton refuses it."""
        if self.state.settings.model_control == "poll":
            raise ServiceError(
                400,
                "unload_not_allowed",
                f"the server follows its repository folder (model control 'poll'): remove "
                f"{self.root / name} to unload {name!r}, or start the server with "
                "--model-control explicit to load and unload through this API",
            )
        async with self._lock:
            self.loaded.pop(name, None)
            await self._cancel(name)
            if not await unload_model(self.state, name):
                raise ServiceError(404, "model_not_found", f"model {name!r} is not loaded")

    def _start(self, name: str, version: Version) -> asyncio.Task[object]:
        """Load ``version`` of ``name`` in a task of its own, cancelling the load of an older
        file of ``name`` still in progress (what it would serve is already replaced)."""
        self.loaded[name] = version
        previous = self._loads.get(name)
        if previous is not None:
            previous.cancel()
        log.info("repository: loading %s version %d", name, version.number)
        task = asyncio.get_running_loop().create_task(
            self._load(name, version, previous), name=f"load {name}"
        )
        self._loads[name] = task

        def forget(done: asyncio.Task[object]) -> None:
            if self._loads.get(name) is done:  # not a newer load's
                del self._loads[name]

        task.add_done_callback(forget)
        return task

    async def _cancel(self, name: str) -> None:
        """Cancel ``name``'s load in progress, if any, and wait until it has let go."""
        task = self._loads.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _load(
        self, name: str, version: Version, previous: asyncio.Task[object] | None
    ) -> object:
        if previous is not None:  # cancelled: wait until it has let go of what it held
            await asyncio.gather(previous, return_exceptions=True)
        return await load_model(self.state, version.path, name, str(version.number))
