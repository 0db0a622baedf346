"""Galleries for the service's tests: Fashion-MNIST test images through the shipped model, as
``/embed`` and ``/classify`` answer them, built with :func:`gallery.build.build` (what
``smso-index`` runs on smso-embed's output; tests/service cannot import batch/, which needs
pyarrow)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient

from gallery.build import BuildOptions, BuildSummary, Rows, build
from gallery.stamp import Stamp
from service.core.card import ModelCard
from service.core.settings import DEFAULT_MODEL
from service.runtime.backend import read_card

from .conftest import FASHION_MNIST, png, read_idx


def fashion_pngs(count: int) -> list[bytes]:
    """The first ``count`` Fashion-MNIST test images as PNG files."""
    images = read_idx(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")[:count]
    return [png(image) for image in images]


def files(images: Sequence[bytes], names: Sequence[str] | None = None) -> list[tuple]:
    """Multipart ``file`` parts, named ``names`` (else ``0.png``, ``1.png``...)."""
    names = names or [f"{i}.png" for i in range(len(images))]
    return [("file", (name, data, "image/png")) for name, data in zip(names, images, strict=True)]


def path_of(i: int) -> str:
    """The path gallery item ``i`` is recorded under (as smso-embed would record a file)."""
    return f"/images/{i:05d}.png"


@dataclass(frozen=True)
class Embedded:
    """What the shipped model answers for some images: ``/embed``'s vectors, ``/classify``'s
    top-1 classes, and the model's card."""

    pngs: list[bytes]
    embeddings: np.ndarray  # (N, p) float32, as /embed answers them
    labels: np.ndarray  # (N,) int32: /classify's top-1 index
    card: ModelCard


def embedded(client: TestClient, count: int) -> Embedded:
    """The first ``count`` test images through the shipped model served by ``client``."""
    pngs = fashion_pngs(count)
    vectors, labels = [], []
    for start in range(0, count, 16):  # within max_files
        part = files(pngs[start : start + 16])
        embed = client.post("/embed", files=part)
        assert embed.status_code == 200, embed.text
        vectors += [r["embedding"] for r in embed.json()["results"]]
        top = client.post("/classify", files=part, params={"top_k": 1})
        labels += [r["predictions"][0]["index"] for r in top.json()["results"]]
    return Embedded(
        pngs=pngs,
        embeddings=np.asarray(vectors, np.float32),
        labels=np.asarray(labels, np.int32),
        card=read_card(DEFAULT_MODEL),
    )


def build_gallery(
    folder: Path,
    source: Embedded,
    rows: Sequence[int],
    stamp: Stamp | None = None,
    options: BuildOptions | None = None,
) -> BuildSummary:
    """``folder`` holding the images ``rows`` of ``source`` (item ``i`` at :func:`path_of`),
    stamped with the shipped model unless ``stamp`` says otherwise."""
    picked = list(rows)
    return build(
        folder,
        Rows(
            paths=[path_of(i) for i in picked],
            embeddings=source.embeddings[picked],
            labels=source.labels[picked],
            file_sizes=np.full(len(picked), 100, np.int64),
            file_mtimes=np.full(len(picked), 1, np.int64),
        ),
        stamp or Stamp.of(source.card),
        source.card.classes,
        options or BuildOptions(),
    )


def exact_neighbours(gallery_x: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """numpy's reference: each query's ``k`` nearest rows of ``gallery_x`` by the cosine of the
    embeddings standardised by the gallery's own mean and standard deviation."""
    mu, sigma = gallery_x.mean(axis=0), gallery_x.std(axis=0)
    sigma[sigma == 0] = 1.0
    g = (gallery_x.astype(np.float64) - mu) / sigma
    q = (queries.astype(np.float64) - mu) / sigma
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return np.argsort(-(q @ g.T), axis=1, kind="stable")[:, :k]
