"""The service's image preprocessing (``Preprocessor``: decode, resize, crop, normalise) in
thread pools and in process pools, as a server could spread it over the cores."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core.card import Preprocessing
from service.imaging.images import Preprocessor

_worker: Preprocessor | None = None  # a process pool worker's, made by _start_worker


def _start_worker(spec: Preprocessing, max_pixels: int) -> None:
    global _worker
    _worker = Preprocessor(spec, max_pixels)


def _preprocess(data: bytes) -> np.ndarray:
    if _worker is None:
        raise RuntimeError("the worker was started without _start_worker")
    return _worker(data)


def _preprocess_in_place(data: bytes) -> tuple[int, ...]:
    return _preprocess(data).shape  # the array stays in the worker


@dataclass(frozen=True)
class Pools:
    """Executors named ``threads xN`` or ``processes xN`` (N workers; processes spawned), each
    started and warmed up once, preprocessing as ``pre`` does."""

    pre: Preprocessor
    executors: dict[str, concurrent.futures.Executor]

    @classmethod
    def start(cls, pre: Preprocessor, names: Sequence[str], files: Sequence[bytes]) -> Pools:
        context = multiprocessing.get_context("spawn")
        executors: dict[str, concurrent.futures.Executor] = {}
        for name in names:
            kind, workers = name.split(" x")
            if kind == "threads":
                executors[name] = concurrent.futures.ThreadPoolExecutor(int(workers))
            else:
                executors[name] = concurrent.futures.ProcessPoolExecutor(
                    int(workers),
                    mp_context=context,
                    initializer=_start_worker,
                    initargs=(pre.spec, pre.max_pixels),
                )
        pools = cls(pre, executors)
        for name in executors:  # start every worker, import the libraries, warm the caches
            pools.run(name, list(files) * 2)
        return pools

    def run(
        self, name: str, files: Sequence[bytes], send_back: bool = True, chunksize: int = 1
    ) -> list[Any]:
        """Every file through one pool, ``chunksize`` images per task (one: as the service
        submits them); the arrays in order, or only their shapes where a process pool keeps
        them (``send_back=False``: the figure leaves out sending them back)."""
        executor = self.executors[name]
        if isinstance(executor, concurrent.futures.ThreadPoolExecutor):
            return list(executor.map(self.pre, files))
        work = _preprocess if send_back else _preprocess_in_place
        return list(executor.map(work, files, chunksize=chunksize))

    def close(self) -> None:
        for executor in self.executors.values():
            executor.shutdown()
