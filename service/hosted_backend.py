"""A worker's backend that runs its batches in the session host (:mod:`service.session_host`).

It looks like :class:`service.backend.OnnxBackend` to the batcher (card, providers, outputs,
``run``) but holds no session: ``run`` writes the batch into shared memory, sends the host its
size and waits for the outputs. One slot of shared memory (``max_batch`` images) and one
connection per batch the worker may have in flight (``slots``), so concurrent calls never share
either. Stages (:mod:`service.stage_clock`): the host's own (pad, upload, run, download), with
``share`` (waiting behind other workers' batches, and the copy into the merged batch) and
``handoff`` (the rest of the call: the copy into shared memory, the messages both ways).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from multiprocessing.connection import Client, Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

from service import stage_clock
from service.card import parse_card
from service.errors import BackendUnavailableError
from service.session_host import ADDRESS_ENV, KEY_ENV

__all__ = ["HostedBackend", "host_from_environment"]


def host_from_environment() -> tuple[str, bytes] | None:
    """The session host's address and key where this process was started to use one."""
    address = os.environ.get(ADDRESS_ENV)
    key = os.environ.get(KEY_ENV)
    if not address or not key:
        return None
    return address, bytes.fromhex(key)


class HostedBackend:
    """The model served by the session host at ``address``, as a worker's backend."""

    def __init__(
        self, path: str | Path, address: str, key: bytes, slots: int = 1, timeout_s: float = 60
    ) -> None:
        """``timeout_s``: the longest a batch may take in the host (merged with others) before
        the host is taken for hung."""
        self.path = Path(path)
        self.timeout_s = timeout_s
        self._broken: str | None = None  # why the host cannot be used any more
        self._connections: list[Connection] = []
        self._free: queue.SimpleQueue[tuple[Connection, np.ndarray]] = queue.SimpleQueue()
        self._closed = threading.Event()
        hello: dict[str, Any] = {}
        try:
            for _ in range(slots):
                self._connections.append(Client(address, "AF_UNIX", authkey=key))
            self._connections[0].send("hello")
            hello = self._connections[0].recv()
            self.card, self.card_dict = parse_card(hello["metadata"])
            spec = self.card.input
            rows = hello["max_batch"]
            shape = (rows, spec.channels, spec.height, spec.width)
            slot_bytes = int(np.prod(shape)) * 4
            self._memory = SharedMemory(create=True, size=slot_bytes * slots)
            for number, connection in enumerate(self._connections):
                connection.send((self._memory.name, number * slot_bytes, rows))
                if connection.recv() != "attached":
                    raise OSError("the host did not attach the shared memory")
                offset = number * slot_bytes
                self._free.put(
                    (connection, np.ndarray(shape, np.float32, self._memory.buf, offset))
                )
        except (OSError, EOFError) as error:
            self.close()
            raise ValueError(f"the session host at {address} did not answer: {error}") from None
        self.providers: list[str] = hello["providers"]
        self.outputs: list[str] = hello["outputs"]
        self.max_batch: int = hello["max_batch"]
        #: the host warmed up every bucket; one small batch checks the way there and back
        self.warmup_batches = [1]
        self.mode = "shared session"

    def run(self, images: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(N, C, H, W)`` float32 -> the outputs, in the order of ``outputs``."""
        n = len(images)
        if n > self.max_batch:
            raise ValueError(f"a batch of {n} is larger than the host's {self.max_batch}")
        if self._broken:
            raise BackendUnavailableError(self._broken)
        connection, slot = self._free.get()
        try:
            start = time.perf_counter()
            slot[:n] = images
            connection.send(n)
            if not connection.poll(self.timeout_s):  # a late answer would be the next call's
                self._broken = f"the session host did not answer within {self.timeout_s:g} s"
                raise BackendUnavailableError(self._broken)
            answer = connection.recv()
            elapsed = time.perf_counter() - start
        except (OSError, EOFError):
            self._broken = "the session host is gone (see the server's log)"
            raise BackendUnavailableError(self._broken) from None
        finally:
            self._free.put((connection, slot))
        if answer[0] != "ok":
            raise RuntimeError(f"the session host could not run the batch: {answer[1]}")
        _, outputs, stages, _merged = answer
        for name, seconds in stages.items():
            stage_clock.add(name, seconds)
        stage_clock.add("handoff", max(0.0, elapsed - sum(stages.values())))
        return tuple(outputs)

    def close(self) -> None:
        """Close the connections and free the shared memory (the host lets go of it when its
        connections close)."""
        if self._closed.is_set():
            return
        self._closed.set()
        for connection in self._connections:
            connection.close()
        memory = getattr(self, "_memory", None)
        if memory is not None:
            memory.unlink()  # the name first: whatever happens next, nothing is left behind
            while not self._free.empty():
                self._free.get()  # the views of the memory
            memory.close()
