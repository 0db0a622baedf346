"""Work that may never end, run where it cannot hold the server: loading a model file and its
warm-up runs.

An onnxruntime session's constructor cannot be interrupted, and a run can only be asked to stop
(``RunOptions.terminate``); a pool's thread stuck in either would hold whatever waits for the
pool (asyncio's default executor is joined when the event loop closes, a ``ThreadPoolExecutor``
when the interpreter exits). :func:`in_daemon_thread` runs one call in a daemon thread of its own
instead: the caller awaits it with a deadline and may give up on it, and a result that comes
after that goes to ``abandoned`` (to let go of a session loaded too late); the process can exit
whatever the thread is doing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["in_daemon_thread"]

T = TypeVar("T")


def in_daemon_thread(
    work: Callable[[], T], name: str, abandoned: Callable[[T], None] | None = None
) -> asyncio.Future[T]:
    """``work()`` in a new daemon thread called ``name``: a future of its result on the running
    loop. Cancelling the future (or the task awaiting it, its deadline) does not stop the
    thread; a result it returns after that is given to ``abandoned``, on the loop or, once the
    loop has closed, in the thread."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            value = work()
        except BaseException as error:  # delivered to the awaiting task, whatever it is
            failure = error  # ``error`` is unbound once the except clause ends

            def fail() -> None:
                if not future.done():
                    future.set_exception(failure)

            _on_loop(loop, fail)
            return

        def settle() -> None:
            if not future.done():
                future.set_result(value)
            elif abandoned is not None:  # given up on
                abandoned(value)

        if not _on_loop(loop, settle) and abandoned is not None:
            abandoned(value)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> bool:
    """Call ``callback`` on ``loop``; False when the loop has closed (nobody awaits it)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        return False
    return True
