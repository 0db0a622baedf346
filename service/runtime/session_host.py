"""The session host's loop: one session running the batches of every worker process.

With ``--workers N`` each worker has a session of its own, and on a GPU a CUDA context of its
own: the contexts take turns on the device (on an H200, eight workers' batches of one image took
4.3 ms each against 0.65 ms for the session alone), and every worker batches only its own share
of the requests. With ``--shared-session`` the parent starts a host process first
(:mod:`service.runtime.host_process`), which runs :class:`SessionHost`; the workers do HTTP,
decoding and batching, and hand their batches to it (:mod:`service.runtime.hosted_backend`):

* a worker writes its batch ``(n, C, H, W)`` float32 into shared memory of its own and sends
  ``(seq, n)`` over a Unix socket (the batch's number and size; authenticated connections with
  bounded reads and writes: :mod:`service.runtime.host_link`);
* the host's batching thread takes every batch that is waiting, up to ``max_batch`` images,
  and copies them into one array; its run thread runs that through the runner (padded to a
  bucket, IO binding, CUDA graphs: :mod:`service.runtime.runner`) while the next round is copied,
  and answers each batch ``(kind, seq, ...)``: its rows of the outputs (about 12 kB an image for
  ResNet-50 SMSO p = 2,048 with 1,000 classes) and the seconds by stage, or the error.

So the GPU sees one context and batches merged across workers, and each worker's interpreter
is free of the session's copies. Connections are read by one thread each; the run thread is
the only one that runs the session. The host serves one model file (no repository).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from service.runtime.host_link import socket_of, timeval
from service.runtime.runner import bucket_for
from service.telemetry import stage_clock

__all__ = ["SEND_TIMEOUT_S", "SessionHost", "or_exit", "shared_view"]

log = logging.getLogger("service.session_host")  # stable for logging configs
#: The longest the host waits to send an answer to a worker that does not read (stopped, or
#: stuck): then that connection is shut down, and the other workers' answers go on.
SEND_TIMEOUT_S = 10.0


class _Peer:
    """A worker's connection, as the host answers on it: a send that cannot complete within
    :data:`SEND_TIMEOUT_S` (or fails) shuts the connection down, so that a worker that stopped
    reading never blocks the host (its reader thread then sees the end and cleans up)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._socket = socket_of(connection)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval(SEND_TIMEOUT_S))

    def send(self, message: Any) -> None:
        try:
            self.connection.send(message)
        except (OSError, TypeError, ValueError):  # gone, closed meanwhile, or timed out
            self.shut()

    def shut(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.connection.close()
        self._socket.close()


@dataclass
class _Batch:
    """One worker's batch waiting for the host: its rows in ``images``, the peer to answer
    and the batch's number there (echoed in the answer)."""

    peer: _Peer
    seq: int
    images: np.ndarray  # (n, C, H, W), a view of the worker's shared memory
    received: float  # perf_counter() when it arrived
    answered: bool = False

    def answer(self, kind: str, *rest: Any) -> None:
        if not self.answered:
            self.answered = True
            self.peer.send((kind, self.seq, *rest))


@dataclass
class _Round:
    """Batches merged into one run: their rows ``offsets`` in ``buffer``, run as ``size``."""

    batches: list[_Batch]
    offsets: list[tuple[int, int]]
    buffer: np.ndarray
    size: int


class SessionHost:
    """The serving side: the listener, a reader thread per connection, the batching loop."""

    def __init__(
        self, backend: Any, *, max_batch: int, listener: Listener, busy: Any = None
    ) -> None:
        """``backend``: an :class:`~service.runtime.backend.OnnxBackend` (its card, buckets,
        outputs and session's metadata, and ``run``); ``busy``: a shared
        ``multiprocessing.Value("d")`` that holds the ``time.monotonic()`` at which the running
        round started, 0 between rounds (the parent's watcher reads it: a round that never ends
        is a hung device)."""
        self.backend = backend
        self.busy = busy
        self.max_batch = max_batch
        self.listener = listener
        spec = backend.card.input
        self.shape = (spec.channels, spec.height, spec.width)
        self.waiting: queue.Queue[_Batch] = queue.Queue()
        # merged batches are gathered here: one round is gathered while the other runs
        self.buffers = [np.zeros((max_batch, *self.shape), np.float32) for _ in range(2)]
        self.buckets: list[int] | None = getattr(backend, "buckets", None)
        self._carried: _Batch | None = None
        self._orphans: list[SharedMemory] = []  # memory of workers gone, views still in use
        self._orphans_lock = threading.Lock()

    def hello(self) -> dict[str, Any]:
        """What a worker's backend needs to know: the file's metadata (its card), the
        providers and the outputs ``run`` answers, in order."""
        metadata = self.backend.session.get_modelmeta().custom_metadata_map
        return {
            "metadata": dict(metadata),
            "providers": list(self.backend.providers),
            "outputs": list(self.backend.outputs),
            "max_batch": self.max_batch,
        }

    def accept_forever(self) -> None:
        """Accept connections for ever; one that fails its handshake (a worker killed while
        connecting, a wrong key) is logged, and the next one accepted."""
        while True:
            try:
                connection = self.listener.accept()
            except (OSError, EOFError, AuthenticationError) as error:
                log.warning("session host: a connection failed its handshake: %r", error)
                continue
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: Connection) -> None:
        """A connection asks for the hello (``"hello"``, any number of times), then names its
        shared memory and slot (``(name, offset, rows)``); then each message ``(seq, n)`` is a
        batch of ``n`` images in that slot."""
        peer = _Peer(connection)
        memory = slot = None
        try:
            message = connection.recv()
            while message == "hello":
                connection.send(self.hello())
                message = connection.recv()
            name, offset, rows = message
            memory = _attach(name)
            slot = shared_view(memory, offset, (rows, *self.shape))
            connection.send("attached")
            while True:
                seq, n = connection.recv()
                self.waiting.put(_Batch(peer, seq, slot[:n], time.perf_counter()))
        except (EOFError, OSError):  # the worker closed its connection (or exited)
            pass
        finally:
            peer.close()
            if memory is not None:
                slot = None  # the view must go before the memory can close
                self._let_go(memory)

    def _let_go(self, memory: SharedMemory) -> None:
        """Close a gone worker's memory, or, while a batch of it still waits or runs (its
        views export the buffer: closing raises), once that batch's round is over."""
        try:
            memory.close()
        except BufferError:
            with self._orphans_lock:
                self._orphans.append(memory)

    def serve_forever(self) -> None:
        """Round after round, in two threads: this one takes what is waiting and copies it
        into a free buffer (:meth:`gather`) while the other runs the previous round and
        answers it (:meth:`run_gathered`), so the device is not idle during the copies. Two
        buffers: at most one round gathered ahead. A round that fails in any way answers its
        batches the error; the host goes on."""
        free: queue.Queue[np.ndarray] = queue.Queue()
        for buffer in self.buffers:
            free.put(buffer)
        gathered: queue.Queue[_Round] = queue.Queue(maxsize=1)

        def run_rounds() -> None:
            with or_exit("the run thread"):
                while True:
                    round_ = gathered.get()
                    self._guarded(round_.batches, self.run_gathered, round_)
                    free.put(round_.buffer)
                    del round_  # the views into the workers' memory
                    self._close_orphans()

        threading.Thread(target=run_rounds, name="run", daemon=True).start()
        while True:
            batches, total = self.next_round()
            buffer = free.get()
            round_ = self._guarded(batches, self.gather, batches, total, buffer)
            if round_ is None:
                free.put(buffer)
            else:
                gathered.put(round_)
            del batches, round_

    def run_round(self, batches: Sequence[_Batch], total: int) -> None:
        """One round in the calling thread: gather, run, answer."""
        self.run_gathered(self.gather(batches, total, self.buffers[0]))

    def _guarded(self, batches: Sequence[_Batch], step: Any, *args: Any) -> Any:
        """``step(*args)``; where it raises, every batch of the round is answered the error."""
        try:
            return step(*args)
        except Exception as error:
            log.exception("session host: a round of %d batches failed", len(batches))
            for batch in batches:  # those not answered yet
                batch.answer("error", f"{type(error).__name__}: {error}")
            return None

    def _close_orphans(self) -> None:
        """Close the memory of workers gone while a batch of theirs waited."""
        with self._orphans_lock:
            for memory in list(self._orphans):
                with contextlib.suppress(BufferError):
                    memory.close()
                    self._orphans.remove(memory)

    def next_round(self) -> tuple[list[_Batch], int]:
        """Every batch waiting, in order of arrival (at least one: waits for it), up to
        ``max_batch`` images; the batch that would overflow goes first in the next round."""
        batches = [self._carried or self.waiting.get()]
        self._carried = None
        total = len(batches[0].images)
        while True:
            try:
                batch = self.waiting.get_nowait()
            except queue.Empty:
                break
            if total + len(batch.images) > self.max_batch:
                self._carried = batch
                break
            batches.append(batch)
            total += len(batch.images)
        return batches, total

    def gather(self, batches: Sequence[_Batch], total: int, buffer: np.ndarray) -> _Round:
        """Copy the batches' images into ``buffer``, one after another; the rows up to the
        runner's bucket are sent too (zeros or earlier rounds' images: rows are independent),
        so that the runner does not copy again to pad."""
        offsets, row = [], 0
        for batch in batches:
            n = len(batch.images)
            buffer[row : row + n] = batch.images
            offsets.append((row, row + n))
            row += n
        size = bucket_for(total, self.buckets) if self.buckets else total
        return _Round(list(batches), offsets, buffer, size)

    def run_gathered(self, round_: _Round) -> None:
        """Run a gathered round and answer each batch its rows, with the seconds by stage:
        the runner's, and ``share`` (from the batch's arrival to the start of the run: other
        rounds ahead of it, and the copy)."""
        stage_clock.take()
        start = time.perf_counter()
        if self.busy is not None:
            self.busy.value = time.monotonic()
        try:
            outputs = self.backend.run(round_.buffer[: round_.size])
        except Exception as error:  # every batch of the round fails with it
            message = f"{type(error).__name__}: {error}"
            for batch in round_.batches:
                batch.answer("error", message)
            return
        finally:
            if self.busy is not None:
                self.busy.value = 0.0
        stages = stage_clock.take()
        total = round_.offsets[-1][1]
        for batch, (begin, end) in zip(round_.batches, round_.offsets, strict=True):
            mine = outputs.rows(begin, end).map(np.ascontiguousarray)  # a BackendOutputs
            batch.answer("ok", mine, {**stages, "share": start - batch.received}, total)


def _attach(name: str) -> SharedMemory:
    """The worker's shared memory ``name``, which the worker created and unlinks. Untracked
    where Python can (3.13+); before, the resource tracker that the workers and this process
    share (all are started by the same parent) holds the name once, and the worker's unlink
    removes it."""
    try:
        return SharedMemory(name=name, track=False)  # type: ignore[call-arg]
    except TypeError:
        return SharedMemory(name=name)


def shared_view(memory: SharedMemory, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """``shape`` float32 at ``offset`` in ``memory``, through a slice of its memoryview: the
    array (and every view of it) holds an export of the buffer, so that the memory cannot be
    closed under it (``close`` raises ``BufferError``: a numpy array made on ``memory.buf``
    directly does not, and reading it after ``close`` is a segmentation fault)."""
    count = int(np.prod(shape))
    if memory.buf is None:
        raise ValueError(f"shared memory {memory.name} is closed")
    window = memory.buf[offset : offset + 4 * count]
    return np.frombuffer(window, np.float32, count).reshape(shape)


@contextlib.contextmanager
def or_exit(what: str) -> Iterator[None]:
    """End the host process if the block raises: a host without its batching or run thread
    would hang every worker; an exited one is seen by the server, which stops."""
    try:
        yield
    except BaseException:
        log.exception("session host: %s failed; the host exits", what)
        os._exit(1)
