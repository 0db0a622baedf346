"""The gallery served beside a model version: loaded with it, checked against its card, and
replaced when its folder holds a new generation.

Where it is (:func:`gallery_place`): ``--gallery GALLERY`` (``SMSO_GALLERY_PATH``) for the one
model file, and in a repository the folder ``gallery/`` beside a version's ``model.onnx``
(``<name>/<version>/gallery``), which a version may have or not.

Each :class:`~service.models.registry.LoadedModel` holds a :class:`GallerySlot`. What requests
search is its :attr:`~GallerySlot.current` :class:`ServedGallery`, one immutable object (or
``None``): a request reads it once and searches that gallery to its end. A new generation (a
build replaces ``gallery.json`` in one rename, :mod:`gallery.store`) is loaded beside the one
serving and then takes its place by one assignment on the event loop: a request in flight keeps
the gallery it began with, whose arrays stay in memory until the last such request ends.

A gallery is refused, and the model serves without it (or with the generation it served before),
when :func:`gallery.search.load` finds it missing, truncated or altered, when its stamp is not
the served model's card (:meth:`gallery.stamp.Stamp.require`: the log line names both models), or
when its vectors are not the model's size; :attr:`GallerySlot.refused` says why, for ``/metadata``
and the repository index (the folder named by its place, not the server's path; the log keeps
the path). A refused gallery is tried again once ``gallery.json`` changes.

With ``model_control = "poll"`` :func:`follow_galleries` looks at every served model's gallery
each ``repository_poll_s`` seconds: one ``stat`` of ``gallery.json`` when nothing changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gallery.search import Gallery, load
from gallery.stamp import Stamp, StampMismatchError
from gallery.store import MANIFEST, GalleryError
from service.core.card import ModelCard
from service.core.settings import Settings

__all__ = [
    "GALLERY_FOLDER",
    "GalleryPlace",
    "GallerySlot",
    "ServedGallery",
    "follow_galleries",
    "gallery_place",
]

log = logging.getLogger("service")

#: A repository version's gallery: this folder beside its model file.
GALLERY_FOLDER = "gallery"

#: ``gallery.json``'s state: modification time, size, inode and change time (a new build
#: replaces the file: another inode); ``None`` while there is none.
FileState = tuple[int, ...] | None


@dataclass(frozen=True)
class GalleryPlace:
    """Where a model's gallery is looked for."""

    folder: Path
    #: the folder as clients read it (``name/version/gallery``, or the --gallery folder's name)
    shown: str
    #: named by ``--gallery``: its absence is a refusal; a repository's ``gallery/`` is optional
    required: bool


def gallery_place(settings: Settings, source: Path | None) -> GalleryPlace | None:
    """Where the gallery of the model loaded from ``source`` is, if anywhere: beside it in a
    repository, else ``settings.gallery_path``."""
    if settings.model_repository is not None:
        if source is None:
            return None
        folder = source.parent / GALLERY_FOLDER
        return GalleryPlace(folder, "/".join(folder.parts[-3:]), required=False)
    if settings.gallery_path is None:
        return None
    return GalleryPlace(settings.gallery_path, settings.gallery_path.name, required=True)


@dataclass(frozen=True, eq=False)
class ServedGallery:
    """A loaded gallery that a model's requests search, and the lock its searches take
    (usearch's graph is searched by one thread at a time)."""

    gallery: Gallery
    shown: str
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def describe(self) -> dict[str, object]:
        """What ``/metadata`` says of it (:meth:`gallery.search.Gallery.describe`), the folder
        named by its place."""
        return self.gallery.describe() | {"path": self.shown}


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _file_state(path: Path) -> FileState:
    """``path``'s state, ``None`` where it does not exist; a file that cannot be looked at has
    a state of its own (the load then says why)."""
    try:
        stat = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        return (-1, error.errno or 0)
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino, stat.st_ctime_ns)


def _look(place: GalleryPlace) -> tuple[FileState, bool]:
    """``gallery.json``'s state, and whether the folder is there (in a thread: a slow file
    system must not hold the event loop)."""
    return _file_state(place.folder / MANIFEST), place.folder.is_dir()


class GallerySlot:
    """The gallery beside one model version: the one serving (:attr:`current`), why the last
    one tried was refused (:attr:`refused`), and the refresh that replaces it."""

    def __init__(
        self,
        place: GalleryPlace | None = None,
        *,
        card: ModelCard | None = None,
        model: str = "",
        report: Callable[[int], None] | None = None,
    ) -> None:
        self.place = place
        #: the served model's stamp, which a gallery must carry
        self.stamp = Stamp.of(card) if card is not None else None
        self.dimension = card.model.embedding_dim if card is not None else 0
        self.model = model  # "name version v", for the log
        self._report = report
        #: what requests search now; replaced whole, never changed
        self.current: ServedGallery | None = None
        #: why the last gallery tried was refused ("" when it was not)
        self.refused = ""
        self._seen: FileState = None
        self._tried = False
        self._lock = asyncio.Lock()

    def describe(self) -> dict[str, Any]:
        """``{"gallery": its description or None, "gallery_refused": why or None}``."""
        current = self.current
        return {
            "gallery": None if current is None else current.describe(),
            "gallery_refused": self.refused or None,
        }

    async def refresh(self) -> None:
        """Load the gallery if ``gallery.json`` changed since it was last tried (or it was never
        tried), and serve it if it passes; the slot of a model without a place does nothing."""
        place = self.place
        if place is None:
            return
        async with self._lock:
            state, present = await asyncio.to_thread(_look, place)
            if self._tried and state == self._seen:
                return
            self._tried, self._seen = True, state
            if state is None and not place.required and not present:
                self._withdraw("")  # no gallery/ folder: a version without a gallery
                return
            try:
                loaded = await asyncio.to_thread(self._load, place)
            except (GalleryError, StampMismatchError) as error:  # each names the folder or file
                self._refuse(place, _one_line(error), gone=state is None)
                return
            except Exception as error:  # whatever else a damaged gallery raises: refused too
                reason = f"the gallery {place.folder} cannot be read: {type(error).__name__}: "
                self._refuse(place, reason + _one_line(error), gone=state is None)
                log.debug("what failed", exc_info=True)
                return
            self._serve(place, loaded)

    def _load(self, place: GalleryPlace) -> Gallery:
        """The gallery in ``place``, checked against the served model (in a thread)."""
        loaded = load(place.folder)
        if self.stamp is not None:
            loaded.stamp.require(self.stamp, f"the gallery {place.folder}", "the model served")
        if self.dimension and loaded.manifest.dimension != self.dimension:
            raise GalleryError(
                f"the gallery {place.folder} holds vectors of {loaded.manifest.dimension} "
                f"values, the model's embeddings have {self.dimension}"
            )
        return loaded

    def _serve(self, place: GalleryPlace, loaded: Gallery) -> None:
        self.refused = ""
        generation = loaded.manifest.generation
        if self.current is not None and self.current.gallery.manifest.generation == generation:
            return  # the same build, read again
        self.current = ServedGallery(loaded, place.shown)
        log.info(
            "gallery %s (generation %s: %d items, %s codes, %s search) serves beside %s",
            place.folder,
            generation,
            loaded.size,
            loaded.manifest.dtype.value,
            loaded.manifest.search,
            self.model,
        )
        self._tell()

    def _refuse(self, place: GalleryPlace, reason: str, gone: bool) -> None:
        """Refused: a previous generation goes on serving, unless the gallery is gone."""
        self.refused = reason.replace(str(place.folder), place.shown)
        if gone and self.current is not None:
            self._withdraw(self.refused)
        if self.current is None:
            outcome = "serves without a gallery"
        else:
            generation = self.current.gallery.manifest.generation
            outcome = f"goes on with the gallery's generation {generation} as loaded before"
        log.error("gallery %s refused, and %s %s: %s", place.folder, self.model, outcome, reason)
        self._tell()

    def _withdraw(self, reason: str) -> None:
        self.refused = reason
        if self.current is not None:
            log.warning("gallery %s is gone: %s serves without one", self.current.shown, self.model)
            self.current = None
            self._tell()

    def _tell(self) -> None:
        if self._report is not None:
            self._report(0 if self.current is None else self.current.gallery.size)


async def follow_galleries(slots: Callable[[], Iterable[GallerySlot]], interval_s: float) -> None:
    """Refresh every slot of ``slots()`` (the served models' galleries) each ``interval_s``
    seconds, until cancelled; a failure is logged and the next round tries again."""
    while True:
        await asyncio.sleep(interval_s)
        for slot in list(slots()):
            try:
                await slot.refresh()
            except Exception:  # a defect of ours: say so, keep following
                log.exception("refreshing the gallery beside %s failed", slot.model)
