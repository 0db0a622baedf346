"""The models a server holds: each ready model is one immutable :class:`LoadedModel` (card,
backend, preprocessor, batcher, the slot of its gallery), looked up by name in the
:class:`Registry`.

Every model the server knows has a :class:`ModelEntry` (its status and, when it could not be
loaded, why), which the repository index reports. At most one version of a model serves at a
time, the highest (Triton's "latest" version policy): a new version is loaded and warmed up
beside the old one, then takes its place, and the old one retires once the requests using it
have been answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from modelcard.typicality import Typicality
from service.batching.batcher import MicroBatcher
from service.core.card import ModelCard
from service.core.errors import ServiceError
from service.imaging.images import Preprocess
from service.models.drift import DriftMonitor
from service.models.galleries import GallerySlot
from service.runtime.backend import Backend

__all__ = ["LoadedModel", "ModelEntry", "ModelStatus", "Registry"]


class ModelStatus(enum.StrEnum):
    """A model's state, as Triton's repository index names it."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class _Users:
    """Requests using a model now; ``idle`` is set whenever there are none."""

    count: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


@dataclass(frozen=True, eq=False, kw_only=True)
class LoadedModel:
    """One version of one model, loaded and warmed up: everything a request needs of it."""

    name: str
    version: str
    card: ModelCard
    backend: Backend
    preprocess: Preprocess
    batcher: MicroBatcher
    source: Path | None = None
    users: _Users = field(default_factory=_Users, repr=False)
    #: the card's typicality reference, when it has one and scoring is on
    typicality: Typicality | None = field(default=None, repr=False)
    drift: DriftMonitor | None = field(default=None, repr=False)
    #: the gallery served beside it (service.models.galleries), replaced as its folder changes
    gallery: GallerySlot = field(default_factory=GallerySlot, repr=False)


@dataclass
class ModelEntry:
    """What the server knows of a model: its version, status and, if unavailable, why."""

    name: str
    version: str
    status: ModelStatus
    reason: str = ""
    source: Path | None = None

    def index(self) -> dict[str, str]:
        """The repository index's entry (Triton's ``name``, ``version``, ``state``, ``reason``)."""
        return {
            "name": self.name,
            "version": self.version,
            "state": str(self.status),
            "reason": self.reason,
        }


class Registry:
    """Models by name: their entries, and the ready model serving each name.

    ``default`` names the model that ``/classify``, ``/embed`` and ``/metadata`` serve; ``None``
    means the only model, when there is exactly one.
    """

    def __init__(self, default: str | None = None) -> None:
        self.default = default
        #: every model there is to load has been tried at least once (a repository's first
        #: scan): from then on, no models means an empty server, not one still loading
        self.settled = False
        self.entries: dict[str, ModelEntry] = {}
        self._serving: dict[str, LoadedModel] = {}

    # --- what the routes ask -------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self.entries)

    def default_name(self) -> str | None:
        """The default model's name: the configured one, else the only model's."""
        if self.default is not None:
            return self.default
        return next(iter(self.entries)) if len(self.entries) == 1 else None

    def lookup(self, name: str | None = None, version: str | None = None) -> LoadedModel:
        """The ready model serving ``name`` (the default model if ``None``), at ``version`` if
        given. 404 for a name or version not served here, 503 while it loads (with
        ``Retry-After``) or when it could not be loaded (without: a retry cannot help)."""
        if not self.entries and not self._serving and not self.settled:
            raise ServiceError(
                503, "not_ready", "the server is loading its models", headers={"Retry-After": "1"}
            )
        if name is None:
            name = self.default_name()
            if name is None:
                raise ServiceError(
                    404,
                    "no_default_model",
                    f"this server holds {len(self.entries)} models and none is the default; "
                    f"name one: /models/{{name}}/... with a name of {self.names()}",
                )
        entry = self.entries.get(name)
        model = self._serving.get(name)
        if entry is None and model is None:
            raise ServiceError(
                404, "model_not_found", f"model {name!r} is not served here; models: {self.names()}"
            )
        if model is None:
            assert entry is not None
            if entry.status is ModelStatus.UNAVAILABLE:
                raise ServiceError(
                    503, "model_failed", f"model {name!r} failed to load: {entry.reason}"
                )
            raise ServiceError(
                503,
                "not_ready",
                f"model {name!r} is loading or unloading",
                headers={"Retry-After": "1"},
            )
        if version is not None and version != model.version:
            raise ServiceError(
                404,
                "model_not_found",
                f"model {name!r} version {version!r} is not served here; it serves version "
                f"{model.version!r}",
            )
        return model

    @contextlib.asynccontextmanager
    async def using(
        self, name: str | None = None, version: str | None = None
    ) -> AsyncIterator[LoadedModel]:
        """:meth:`lookup`, holding the model for the duration: it does not retire (stop its
        batcher) while a request is still using it."""
        model = self.lookup(name, version)
        model.users.count += 1
        model.users.idle.clear()
        try:
            yield model
        finally:
            model.users.count -= 1
            if model.users.count == 0:
                model.users.idle.set()

    def readiness(self) -> str:
        """Whether this server answers its default route (``/classify``): ``"ready"`` when the
        default model serves (the only model, or the one named) and no other model is still
        loading; ``"failed"`` when the default model could not be loaded; ``"missing"`` when
        the models have been read and the default names none of them (or there are none);
        else ``"loading"``. A server of several models without a default answers every
        model's own routes, and is ready once they have all been tried and one serves.

        Only the first scan's models are waited for (``settled``): a model that appears later, or
        is loaded on request, loads while the replica stays ready. Otherwise one model copied into
        a shared repository would make every replica unready at once, and the default route,
        which they all still answer, would lose every endpoint."""
        if not self.entries and not self.settled:
            return "loading"
        default = self.default_name()
        if default is None:
            if not self._serving:
                return "missing" if self.settled else "loading"
        elif default not in self._serving:
            entry = self.entries.get(default)
            if entry is None:
                return "missing" if self.settled else "loading"
            return "failed" if entry.status is ModelStatus.UNAVAILABLE else "loading"
        if self.settled:
            return "ready"
        # a model being replaced by a new version serves meanwhile: it does not make the
        # server unready
        settled = (ModelStatus.READY, ModelStatus.UNAVAILABLE)
        waiting = [
            e
            for e in self.entries.values()
            if e.status not in settled and e.name not in self._serving
        ]
        return "loading" if waiting else "ready"

    def served(self, name: str) -> LoadedModel | None:
        """The model serving ``name`` now, if one does (whatever its entry says)."""
        return self._serving.get(name)

    def serving(self) -> list[LoadedModel]:
        return [self._serving[name] for name in sorted(self._serving)]

    def queue_depth(self) -> int:
        """Images waiting for inference, over every model served."""
        return sum(model.batcher.depth for model in self.serving())

    # --- what loading and unloading do ---------------------------------------------------------

    def mark(
        self,
        name: str,
        version: str,
        status: ModelStatus,
        reason: str = "",
        source: Path | None = None,
    ) -> None:
        """Note what happens to ``name``. While a model serves the name, its entry stays the
        served one (READY, its version): a new version loading or failing beside it only adds
        to the reason, so that the index says what is served."""
        serving = self._serving.get(name)
        if serving is not None and status is not ModelStatus.READY:
            if status is ModelStatus.UNAVAILABLE:
                reason = (
                    f"version {version} failed to load ({reason}); version {serving.version} serves"
                )
            else:
                reason = f"version {version} is loading; version {serving.version} serves"
            status, version, source = ModelStatus.READY, serving.version, serving.source
        self.entries[name] = ModelEntry(name, version, status, reason, source)

    def serve(self, model: LoadedModel) -> LoadedModel | None:
        """Make ``model`` the one serving its name; the model it replaces, if any (to retire)."""
        previous = self._serving.get(model.name)
        self._serving[model.name] = model
        self.mark(model.name, model.version, ModelStatus.READY, source=model.source)
        return previous

    def withdraw(self, name: str) -> LoadedModel | None:
        """Stop serving ``name`` (new requests get 404); the model withdrawn, to retire."""
        self.entries.pop(name, None)
        return self._serving.pop(name, None)
