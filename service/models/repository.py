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
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from service.core.errors import ServiceError
from service.models.host import Host
from service.models.loader import load_model, unload_model

__all__ = ["MODEL_FILE", "Repository", "Version", "scan"]

log = logging.getLogger("service")

MODEL_FILE = "model.onnx"
#: A model folder's name: what clients put in a URL path.
NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(frozen=True)
class Version:
    """The version of a model the repository holds: its number, file, and the file's
    modification time and size (a changed file is a new model)."""

    number: int
    path: Path
    stamp: tuple[int, int]


def scan(root: Path) -> dict[str, Version]:
    """Each model folder's highest version (folders and files that do not fit the layout are
    skipped, with a log line)."""
    found: dict[str, Version] = {}
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        if not NAME.fullmatch(folder.name) or folder.name in (".", ".."):
            log.warning(
                "repository: %r is not a model name (letters, digits, _ . -); skipped", folder.name
            )
            continue
        versions = [
            int(sub.name)
            for sub in folder.iterdir()
            if sub.name.isdigit() and int(sub.name) > 0 and (sub / MODEL_FILE).is_file()
        ]
        if not versions:
            continue
        number = max(versions)
        path = folder / str(number) / MODEL_FILE
        try:
            stat = path.stat()
        except FileNotFoundError:  # removed while scanning
            continue
        found[folder.name] = Version(number, path, (stat.st_mtime_ns, stat.st_size))
    return found


class Repository:
    """Keeps ``state.registry`` in step with the folder ``root``."""

    def __init__(self, state: Host, root: Path) -> None:
        self.state = state
        self.root = root
        #: what each model's entry was loaded (or tried) from
        self.loaded: dict[str, Version] = {}
        self._lock = asyncio.Lock()

    async def run(self) -> None:
        """Load every model, then, with ``model_control = "poll"``, follow the folder."""
        settings = self.state.settings
        await self.sync()
        if not self.loaded:  # a mistyped path looks just like this: say so once
            log.warning(
                "repository: %s holds no models yet (each is a folder <name>/<version>/%s); %s",
                self.root,
                MODEL_FILE,
                "they are loaded as they appear"
                if settings.model_control == "poll"
                else "load each with POST /v2/repository/models/<name>/load once it is there",
            )
        self.state.registry.settled = True
        while settings.model_control == "poll":
            await asyncio.sleep(settings.repository_poll_s)
            try:
                await self.sync()
            except OSError as error:  # the folder is gone or unreadable for a while
                log.warning("repository: cannot scan %s: %s", self.root, error)

    async def sync(self) -> None:
        """Load what is new or changed, unload what was removed."""
        async with self._lock:
            found = scan(self.root)
            for name, version in found.items():
                if self.loaded.get(name) != version:
                    await self._load(name, version)
            for name in [n for n in self.loaded if n not in found]:
                del self.loaded[name]
                await unload_model(self.state, name)

    async def load(self, name: str) -> None:
        """Load (or reload) ``name`` from the folder: 404 if the repository has no such model,
        400 with the reason if it cannot be loaded."""
        async with self._lock:
            version = scan(self.root).get(name)
            if version is None:
                raise ServiceError(
                    404,
                    "model_not_found",
                    f"the repository has no model {name!r} (a folder "
                    f"{name}/<version>/{MODEL_FILE})",
                )
            if await self._load(name, version) is None:
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
            if not await unload_model(self.state, name):
                raise ServiceError(404, "model_not_found", f"model {name!r} is not loaded")

    async def _load(self, name: str, version: Version) -> object:
        self.loaded[name] = version
        log.info("repository: loading %s version %d", name, version.number)
        return await load_model(self.state, version.path, name, str(version.number))
