"""A worker's backend that runs its batches in the session host
(:mod:`service.runtime.session_host`).

It looks like :class:`service.runtime.backend.OnnxBackend` to the batcher (card, providers, outputs,
``run``) but holds no session: ``run`` writes the batch into shared memory, sends the host its
size and waits for the outputs. One slot of shared memory (``max_batch`` images) and one
connection per batch the worker may have in flight (``slots``), so concurrent calls never share
either. Stages (:mod:`service.telemetry.stage_clock`): ``stack`` (the images into the shared
memory), the host's own (upload, run, download; its ``stack`` is next to none: a merged round is
already of its bucket's size), ``share`` (waiting behind other workers' batches, and the copy into
the
merged batch) and ``handoff`` (the rest of the call: the messages both ways).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

from service.core.card import parse_card
from service.core.errors import BackendUnavailableError
from service.runtime.host_link import connect
from service.runtime.host_process import ADDRESS_ENV, KEY_ENV
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch, fill
from service.runtime.session_host import shared_view
from service.telemetry import stage_clock

__all__ = ["HostedBackend", "host_from_environment"]


def host_from_environment() -> tuple[str, bytes] | None:
    """The session host's address and key where this process was started to use one."""
    address = os.environ.get(ADDRESS_ENV)
    key = os.environ.get(KEY_ENV)
    if not address or not key:
        return None
    return address, bytes.fromhex(key)


#: What a call says when the host is not there.
GONE = "the session host is gone (see the server's log)"


@dataclass
class _Slot:
    """One batch's room in the worker's shared memory, and the connection it goes by (None
    after the host failed to answer on it: reconnected on the next call)."""

    offset: int
    view: np.ndarray  # (max_batch, C, H, W) float32 in the shared memory
    connection: Connection | None = None


class HostedBackend:
    """The model served by the session host at ``address``, as a worker's backend."""

    def __init__(
        self, path: str | Path, address: str, key: bytes, slots: int = 1, timeout_s: float = 60
    ) -> None:
        """``timeout_s``: the longest a batch may take in the host (merged with others) before
        the host is taken for hung, and the longest a connection to it may take."""
        self.path = Path(path)
        self.address, self._key, self.timeout_s = address, key, timeout_s
        self._slots: list[_Slot] = []
        self._free: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._seq = itertools.count()
        self._closed = threading.Event()
        try:
            first = connect(address, key, timeout_s)
            first.send("hello")
            hello: dict[str, Any] = first.recv()
            self.card, self.card_dict = parse_card(hello["metadata"])
            spec = self.card.input
            self._shape = (hello["max_batch"], spec.channels, spec.height, spec.width)
            slot_bytes = int(np.prod(self._shape)) * 4
            self._memory = SharedMemory(create=True, size=slot_bytes * slots)
            for number in range(slots):
                offset = number * slot_bytes
                slot = _Slot(offset, shared_view(self._memory, offset, self._shape))
                self._slots.append(slot)
                self._attach(slot, first if number == 0 else None)
                self._free.put(slot)
        except (OSError, EOFError, BackendUnavailableError) as error:
            self.close()
            raise ValueError(f"the session host at {address} did not answer: {error}") from None
        self.providers: list[str] = hello["providers"]
        self.outputs: list[str] = hello["outputs"]
        self.max_batch: int = hello["max_batch"]
        #: the host warmed up every bucket; one small batch checks the way there and back
        self.warmup_batches = [1]
        self.mode = "shared session"

    def _attach(self, slot: _Slot, connection: Connection | None = None) -> None:
        """Connect ``slot`` (a new connection unless given) and have the host attach it."""
        try:
            connection = connection or connect(self.address, self._key, self.timeout_s)
            connection.send((self._memory.name, slot.offset, self._shape[0]))
            if not connection.poll(self.timeout_s) or connection.recv() != "attached":
                connection.close()
                raise OSError("the host did not attach the shared memory")
        except (OSError, EOFError):
            raise BackendUnavailableError(GONE) from None
        slot.connection = connection

    def _drop(self, slot: _Slot) -> None:
        """Close a slot's connection after a failure: a late answer must not be read as the
        next batch's, and the host must not wait to send it (the next call reconnects)."""
        if slot.connection is not None:
            slot.connection.close()
            slot.connection = None

    def run(self, images: Batch) -> BackendOutputs:
        """N images ``(C, H, W)`` float32 (:data:`service.runtime.runner.Batch`) -> their rows of
        the outputs the host's model answers (``outputs``). Records ``stack`` (the images into
        the shared memory) and ``handoff`` (the messages both ways), with the host's stages."""
        n = len(images)
        if n > self.max_batch:
            raise ValueError(f"a batch of {n} is larger than the host's {self.max_batch}")
        slot = self._free.get()
        try:
            if slot.connection is None:
                self._attach(slot)
            connection = slot.connection
            assert connection is not None
            seq = next(self._seq)
            start = time.perf_counter()
            fill(slot.view, images)
            start = stage_clock.record("stack", start)
            connection.send((seq, n))
            while True:  # answers to earlier batches (a round failed part-way) are dropped
                left = start + self.timeout_s - time.perf_counter()
                if left <= 0 or not connection.poll(left):
                    self._drop(slot)
                    raise BackendUnavailableError(
                        f"the session host did not answer within {self.timeout_s:g} s"
                    )
                answer = connection.recv()
                if answer[1] == seq:
                    break
            elapsed = time.perf_counter() - start
        except (OSError, EOFError):
            self._drop(slot)
            raise BackendUnavailableError(GONE) from None
        finally:
            self._free.put(slot)
        if answer[0] != "ok":
            raise RuntimeError(f"the session host could not run the batch: {answer[2]}")
        _, _, outputs, stages, _merged = answer
        for name, seconds in stages.items():
            stage_clock.add(name, seconds)
        stage_clock.add("handoff", max(0.0, elapsed - sum(stages.values())))
        if not isinstance(outputs, BackendOutputs):
            raise RuntimeError(f"the session host answered {type(outputs).__name__}, not outputs")
        return outputs

    def close(self) -> None:
        """Close the connections and free the shared memory (the host lets go of it when its
        connections close)."""
        if self._closed.is_set():
            return
        self._closed.set()
        for slot in self._slots:
            self._drop(slot)
        memory = getattr(self, "_memory", None)
        if memory is not None:
            memory.unlink()  # the name first: whatever happens next, nothing is left behind
            for slot in self._slots:
                slot.view = None  # type: ignore[assignment]  # the views of the memory
            while not self._free.empty():
                self._free.get()
            self._slots.clear()
            with contextlib.suppress(BufferError):  # a call still running keeps its view
                memory.close()
