"""The embedded engine (``--engine local``, the default): a job's stages in one process.

::

    chunks --> decode pool (threads) --> inference (sessions) --> writer thread --> OUT
              decode_batch images        batch_size images       a chunk's parts
              per task, in order         per call                once it is complete

* **Read and decode**: a pool of ``decoders`` threads, each task one slice of
  ``decode_batch`` paths (:func:`batch.decoding.decode`). Threads, not processes: Pillow and
  numpy release the GIL in their codecs and kernels, and a thread needs no start-up, no copy of
  the decoded images between processes and no second import of the decoder (measured in
  docs/batch.md: the processes' pickling and start cost more than the GIL does here).
* **Inference**: ``sessions`` threads, each with its own onnxruntime session
  (:class:`batch.embedder.Embedder`) and ``threads`` intra-op threads; one session is enough on
  most machines, several help where one session's threads leave cores idle (small models on a
  large CPU, or a GPU fed by several streams).
* **Write**: one thread, :class:`batch.parts.PartCollector`.

The stages are joined by bounded queues (at most ``2 x decoders`` decode tasks in flight, two
batches waiting per session, ``4`` row tables waiting for the writer), so the memory a job
holds does not grow with the collection. No Ray is imported.

A failure in any thread stops the others and is raised in the caller's thread; so is a
``KeyboardInterrupt`` there: what was written is kept, and ``--resume`` goes on from it.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from batch.decoding import decode
from batch.embedder import Embedder
from batch.engine import LARGE_MODEL_BYTES, EngineRun, Work
from batch.stages import StageWorkers
from service.runtime.providers import runs_on_gpu

__all__ = ["LocalEngine", "LocalOptions", "default_local_options"]

WRITE_QUEUE = 4  # row tables waiting for the writer
_DONE = object()  # the end of a queue's items


@dataclass(frozen=True)
class LocalOptions:
    """How the embedded engine spreads its stages."""

    decoders: int  # decode threads (0: each session decodes its own batches)
    sessions: int  # onnxruntime sessions, one inference thread each
    threads: int = 0  # onnxruntime's intra-op threads per session (0: its default, every core)
    decode_batch: int = 64  # images per decode task


def default_local_options(
    providers: str = "auto", cpus: int | None = None, model_bytes: int = 0
) -> LocalOptions:
    """The defaults for this machine (``cpus`` cores) and a model file of ``model_bytes``.

    On a GPU: one session and a decode thread per core (decoding is then what bounds the job).
    On the CPU, a small model: a session per core with one intra-op thread each, and a decode
    thread per two cores; sessions side by side use the cores better than one session's
    threads, which wait for each other at every operator of a small graph. A large model: one
    session with its threads on every core, and one decode thread that decodes the next batch
    while the session runs this one (two one-thread sessions of a large graph share the caches
    and run slower than one session of two threads). Measured in docs/batch.md; ``--sessions``,
    ``--threads`` and ``--decoders`` override each."""
    cores = cpus or os.cpu_count() or 1
    if runs_on_gpu(providers):
        return LocalOptions(decoders=cores, sessions=1, threads=0)
    if model_bytes >= LARGE_MODEL_BYTES:
        return LocalOptions(decoders=1, sessions=1, threads=0)
    return LocalOptions(decoders=max(1, cores // 2), sessions=cores, threads=1)


class _StoppedError(Exception):
    """Another stage failed: this one ends without a word (the failure is raised)."""


class _Failure:
    """The first failure of any stage, and the event that tells every stage to stop."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def record(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        self.stop.set()

    def put(self, target: queue.Queue[object], item: object) -> None:
        """``item`` into ``target``, waiting while it is full, unless a stage failed."""
        while not self.stop.is_set():
            try:
                target.put(item, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _StoppedError

    def get(self, source: queue.Queue[object]) -> object:
        while not self.stop.is_set():
            try:
                return source.get(timeout=0.1)
            except queue.Empty:
                continue
        raise _StoppedError


def _paths(piece: pa.Table) -> dict[str, np.ndarray]:
    """A slice of :func:`batch.parts.chunked`'s table as :func:`batch.decoding.decode`'s input."""
    return {
        "path": np.array(piece.column("path").to_pylist(), dtype=object),
        "chunk": piece.column("chunk").to_numpy(),
    }


def _concatenated(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


@dataclass(frozen=True)
class LocalEngine:
    """The stages in threads of this process."""

    options: LocalOptions

    name = "local"

    def run(self, work: Work) -> EngineRun:
        """Every image of ``work.chunks`` decoded, embedded and handed to the collector."""
        options = self.options
        failure = _Failure()
        batches: queue.Queue[object] = queue.Queue(maxsize=2 * options.sessions)
        rows: queue.Queue[object] = queue.Queue(maxsize=WRITE_QUEUE)
        sessions_left = [options.sessions]
        sessions_lock = threading.Lock()

        def infer() -> None:
            try:
                decoding = work.decoding if not options.decoders else None
                embed = work.embed
                if options.threads and not embed.threads:
                    embed = replace(embed, threads=options.threads)
                embedder = Embedder(work.model.data, embed, decoding)
                while True:
                    batch = failure.get(batches)
                    if batch is _DONE:
                        break
                    failure.put(rows, embedder(batch))  # type: ignore[arg-type]
            except _StoppedError:
                return
            except BaseException as error:
                failure.record(error)
                return
            with sessions_lock:
                sessions_left[0] -= 1
                last = sessions_left[0] == 0
            if last:
                try:
                    failure.put(rows, _DONE)
                except _StoppedError:
                    return

        def write() -> None:
            try:
                while True:
                    table = failure.get(rows)
                    if table is _DONE:
                        return
                    work.collector.add(table)
            except _StoppedError:
                return
            except BaseException as error:
                failure.record(error)

        threads = [
            threading.Thread(target=infer, name=f"smso-embed-session-{i}", daemon=True)
            for i in range(options.sessions)
        ]
        threads.append(threading.Thread(target=write, name="smso-embed-writer", daemon=True))
        for thread in threads:
            thread.start()
        try:
            self._feed(work, failure, batches)
            for _ in range(options.sessions):
                failure.put(batches, _DONE)
            for thread in threads:
                while thread.is_alive():
                    thread.join(timeout=0.1)
        except _StoppedError:
            pass
        except BaseException as error:  # KeyboardInterrupt too: stop every stage, then raise
            failure.record(error)
            for thread in threads:
                thread.join(timeout=5)
            raise
        if failure.error is not None:
            for thread in threads:
                thread.join(timeout=5)
            raise failure.error
        return EngineRun(
            engine=self.name,
            start_s=0.0,
            workers=StageWorkers(
                decode=options.decoders or options.sessions, infer=options.sessions, write=1
            ),
        )

    def _feed(self, work: Work, failure: _Failure, batches: queue.Queue[object]) -> None:
        """Decode tasks in order, their images gathered into batches of ``batch_size``."""
        options, chunks = self.options, work.chunks
        if not options.decoders:  # each session decodes its own batches of paths
            size = work.embed.batch_size
            for i in range(0, chunks.num_rows, size):
                failure.put(batches, _paths(chunks.slice(i, size)))
            return
        size = options.decode_batch
        window = 2 * options.decoders
        pending: deque[Future[dict[str, np.ndarray]]] = deque()
        gathered: list[dict[str, np.ndarray]] = []

        def take(decoded: dict[str, np.ndarray]) -> None:
            """One decode task's images, handed on once they fill a batch."""
            gathered.append(decoded)
            if sum(len(part["path"]) for part in gathered) >= work.embed.batch_size:
                failure.put(batches, _concatenated(gathered))
                gathered.clear()

        slices = (chunks.slice(i, size) for i in range(0, chunks.num_rows, size))
        with ThreadPoolExecutor(options.decoders, thread_name_prefix="smso-embed-decode") as pool:
            try:
                for piece in slices:
                    pending.append(pool.submit(decode, _paths(piece), work.decoding))
                    while len(pending) >= window or (pending and pending[0].done()):
                        take(pending.popleft().result())
                    if failure.stop.is_set():
                        raise _StoppedError
                while pending:
                    take(pending.popleft().result())
                if gathered:
                    failure.put(batches, _concatenated(gathered))
            finally:
                for future in pending:
                    future.cancel()
