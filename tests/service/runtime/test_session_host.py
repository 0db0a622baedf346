"""The session host (one process running every worker's batches) and the workers' backend."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from service.core.errors import BackendUnavailableError
from service.core.settings import Settings
from service.runtime.backend import BackendOptions, OnnxBackend
from service.runtime.host_link import connect
from service.runtime.host_process import HostHandle, start_host
from service.runtime.hosted_backend import HostedBackend
from service.runtime.outputs import BackendOutputs
from service.runtime.session_host import SessionHost, _Batch, shared_view
from service.telemetry import stage_clock
from tests.service.conftest import process_running, wait_gone

CPU = BackendOptions(providers="CPUExecutionProvider", max_batch=8)


@pytest.fixture(scope="module")
def host(shipped_model: str) -> Iterator[HostHandle]:
    handle = start_host(shipped_model, CPU)
    try:
        yield handle
    finally:
        handle.stop()


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 28, 28), np.float32)


def test_a_hosted_backend_answers_what_the_model_answers(host: HostHandle, shipped_model: str):
    direct = OnnxBackend(shipped_model, CPU)
    hosted = HostedBackend(shipped_model, host.address, host.key)
    try:
        assert hosted.card == direct.card
        assert hosted.card_dict == direct.card_dict
        assert hosted.outputs == direct.outputs
        assert hosted.providers == host.providers == ["CPUExecutionProvider"]
        batch = images(5)
        stage_clock.take()
        got, want = hosted.run(batch).named(), direct.run(batch).named()
        assert list(got) == list(want) == hosted.outputs
        for name, array in want.items():
            np.testing.assert_array_equal(got[name], array)
        # the host's stages, and the worker's share of the call
        assert {"run", "share", "handoff"} <= set(stage_clock.take())
    finally:
        hosted.close()


def test_workers_calling_at_once_each_get_their_own_rows(host: HostHandle, shipped_model: str):
    """Three callers (two on one backend with two slots, one on another) in threads: every
    answer is the model's answer for that caller's own batch, whatever it was merged with."""
    direct = OnnxBackend(shipped_model, CPU)
    first = HostedBackend(shipped_model, host.address, host.key, slots=2)
    second = HostedBackend(shipped_model, host.address, host.key)
    wrong: list[str] = []
    calls = [0, 0, 0]

    def call(backend: HostedBackend, caller: int) -> None:
        for i in range(30):
            batch = images(i % 4 + 1, seed=100 * caller + i)
            logits = backend.run(batch).logits
            if not np.allclose(logits, direct.run(batch).logits, atol=1e-5):
                wrong.append(f"caller {caller}, call {i}")
            calls[caller] += 1

    callers = [(first, 0), (first, 1), (second, 2)]
    threads = [threading.Thread(target=call, args=c) for c in callers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a caller hung"
        assert wrong == []
        assert calls == [30, 30, 30]
    finally:
        first.close()
        second.close()


class _Recorder:
    """A backend for the host's loop: records the batch sizes it runs, answers row numbers."""

    def __init__(self, fail: bool = False) -> None:
        self.sizes: list[int] = []
        self.fail = fail
        self.card = SimpleNamespace(input=SimpleNamespace(channels=1, height=2, width=2))
        self.buckets: list[int] | None = None  # as OnnxBackend's on the CPU: no padding

    def run(self, batch: np.ndarray) -> BackendOutputs:
        self.sizes.append(len(batch))
        if self.fail:
            raise RuntimeError("device lost")
        rows = batch.reshape(len(batch), -1)[:, :1].copy()
        return BackendOutputs(logits=rows, embedding=rows)


class _Pipe:
    """A connection that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.sent.append(message)


def _queue(host: SessionHost, sizes: list[int]) -> list[_Pipe]:
    pipes = []
    for k, n in enumerate(sizes):
        pipe = _Pipe()
        rows = np.full((n, 1, 2, 2), float(k), np.float32)
        host.waiting.put(_Batch(pipe, k, rows, time.perf_counter()))  # type: ignore[arg-type]
        pipes.append(pipe)
    return pipes


def test_the_host_merges_waiting_batches_up_to_its_largest():
    """Batches of 3, 4 and 2 waiting with a largest batch of 8: one round of 7 (the first two),
    then the third alone; each batch gets its own rows back."""
    backend = _Recorder()
    host = SessionHost(backend, max_batch=8, listener=None)  # type: ignore[arg-type]
    pipes = _queue(host, [3, 4, 2])
    host.run_round(*host.next_round())
    host.run_round(*host.next_round())
    assert backend.sizes == [7, 2]
    for k, (pipe, n) in enumerate(zip(pipes, [3, 4, 2], strict=True)):
        ((status, seq, outputs, stages, merged),) = pipe.sent
        assert (status, seq) == ("ok", k)
        np.testing.assert_array_equal(outputs.logits, np.full((n, 1), float(k)))
        assert merged == (7 if k < 2 else 2)
        assert stages["share"] >= 0
    assert host.waiting.empty()


def test_the_host_pads_a_merged_batch_to_its_bucket_in_place():
    """On an accelerator the runner pads to a bucket: the host hands it a whole bucket of its
    buffer (no second copy), and each batch still gets only its own rows."""
    backend = _Recorder()
    backend.buckets = [1, 2, 4, 8]
    host = SessionHost(backend, max_batch=8, listener=None)  # type: ignore[arg-type]
    pipes = _queue(host, [2, 3])
    host.run_round(*host.next_round())
    assert backend.sizes == [8]
    assert [len(p.sent[0][2]) for p in pipes] == [2, 3]


def test_a_round_that_cannot_be_gathered_is_answered_the_error():
    """Whatever fails in a round (here the copy: rows of the wrong shape) is every batch's
    answer, and the host goes on."""
    host = SessionHost(_Recorder(), max_batch=8, listener=None)  # type: ignore[arg-type]
    good, bad = _Pipe(), _Pipe()
    rows = [np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 3, 3), np.float32)]
    pairs = zip([good, bad], rows, strict=True)
    batches = [_Batch(pipe, k, r, 0.0) for k, (pipe, r) in enumerate(pairs)]  # type: ignore[arg-type]
    assert host._guarded(batches, host.gather, batches, 2, host.buffers[0]) is None
    assert good.sent[0][:2] == ("error", 0)
    assert bad.sent[0][:2] == ("error", 1)
    assert "ValueError" in good.sent[0][2]


def test_a_failed_round_fails_every_batch_in_it():
    host = SessionHost(_Recorder(fail=True), max_batch=8, listener=None)  # type: ignore[arg-type]
    pipes = _queue(host, [1, 2])
    host.run_round(*host.next_round())
    assert [p.sent for p in pipes] == [
        [("error", 0, "RuntimeError: device lost")],
        [("error", 1, "RuntimeError: device lost")],
    ]


class _Busy:
    """A stand-in for the shared ``Value("d")`` the host marks its rounds in."""

    value = 0.0


def test_the_host_marks_the_round_it_runs_for_the_watcher():
    """While a round runs, ``busy`` holds when it started (time.monotonic()); 0 once it has
    ended, whether it succeeded or failed."""
    seen: list[float] = []

    class Watched(_Recorder):
        def run(self, batch: np.ndarray) -> BackendOutputs:
            seen.append(busy.value)
            return super().run(batch)

    for backend in (Watched(), Watched(fail=True)):
        busy = _Busy()
        host = SessionHost(backend, max_batch=8, listener=None, busy=busy)  # type: ignore[arg-type]
        _queue(host, [2])
        before = time.monotonic()
        host.run_round(*host.next_round())
        assert before <= seen[-1] <= time.monotonic()
        assert busy.value == 0.0


class _Supervisor:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


def _sleeper(seconds: float) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(seconds,))
    process.start()
    return process


def _handle(process: multiprocessing.process.BaseProcess, busy: object) -> HostHandle:
    folder = tempfile.TemporaryDirectory()
    pipe, _ = multiprocessing.Pipe()
    return HostHandle(
        address="", key=b"", process=process, providers=[], folder=folder, pipe=pipe, busy=busy
    )


def test_a_round_that_never_ends_gets_the_host_killed_and_the_server_stopped():
    """The CLI's watcher: a round running past ``hung_after`` is a hung host: it is killed,
    marked as died (the server then exits with status 1) and the workers are told to stop."""
    from service.cli import _watch_host

    busy = _Busy()
    handle = _handle(_sleeper(60), busy)
    supervisor = _Supervisor()
    watcher = threading.Thread(target=_watch_host, args=(handle, supervisor, 30.0), daemon=True)
    watcher.start()
    busy.value = time.monotonic()  # a round starts, and a short one is nothing to act on
    time.sleep(1.2)  # the watcher looks every second
    assert handle.process.is_alive()
    assert not supervisor.stopped.is_set()
    busy.value = time.monotonic() - 60  # a round that has run for a minute
    assert supervisor.stopped.wait(10)
    watcher.join(10)
    handle.process.join(10)
    assert not handle.process.is_alive()
    assert handle.died
    handle.folder.cleanup()


def test_the_watcher_stops_the_server_when_the_host_exits_and_not_on_stop():
    from service.cli import _watch_host

    supervisor = _Supervisor()
    handle = _handle(_sleeper(0.2), _Busy())
    _watch_host(handle, supervisor, 60.0)  # returns once the process has exited
    assert handle.died
    assert supervisor.stopped.is_set()
    quiet = _Supervisor()
    stopped = _handle(_sleeper(60), _Busy())
    stopped.stopping = True  # HostHandle.stop() was called: the server is stopping anyway
    _watch_host(stopped, quiet, 60.0)
    assert not stopped.died
    assert not quiet.stopped.is_set()
    for handle_ in (handle, stopped):
        handle_.process.kill()
        handle_.process.join(10)
        handle_.folder.cleanup()


def test_a_batch_larger_than_the_hosts_is_refused_in_the_worker(
    host: HostHandle, shipped_model: str
):
    hosted = HostedBackend(shipped_model, host.address, host.key)
    try:
        with pytest.raises(ValueError, match="larger than the host's 8"):
            hosted.run(images(9))
    finally:
        hosted.close()


@contextlib.contextmanager
def fake_host(
    shipped_model: str, answer: Callable[[Connection, int], None]
) -> Iterator[HostHandle]:
    """A host speaking the protocol in a thread (the hello, the attach) that answers each
    batch ``seq`` with ``answer(connection, seq)``; it accepts one connection only."""
    metadata = OnnxBackend(shipped_model, CPU).session.get_modelmeta().custom_metadata_map
    folder = tempfile.TemporaryDirectory()
    address, key = f"{folder.name}/socket", b"k" * 32
    listener = Listener(address, "AF_UNIX", authkey=key)

    def serve() -> None:
        with contextlib.suppress(OSError, EOFError):
            connection = listener.accept()
            connection.recv()  # "hello"
            hello = {"metadata": dict(metadata), "providers": ["Fake"], "max_batch": 8}
            connection.send({**hello, "outputs": ["logits", "embedding"]})
            connection.recv()  # the shared memory
            connection.send("attached")
            while True:
                seq, _ = connection.recv()
                answer(connection, seq)

    threading.Thread(target=serve, daemon=True).start()
    handle = HostHandle(
        address=address,
        key=key,
        process=None,  # type: ignore[arg-type]
        providers=["Fake"],
        folder=folder,
        pipe=None,  # type: ignore[arg-type]
    )
    try:
        yield handle
    finally:
        listener.close()
        folder.cleanup()


def test_a_failed_run_in_the_host_is_the_workers_error_with_the_hosts_reason(shipped_model):
    def fail(connection: Connection, seq: int) -> None:
        connection.send(("error", seq, "RuntimeError: device lost"))

    with fake_host(shipped_model, fail) as host:
        hosted = HostedBackend(shipped_model, host.address, host.key)
        try:
            with pytest.raises(RuntimeError, match=r"could not run the batch: .*device lost"):
                hosted.run(images(2))
        finally:
            hosted.close()


def test_answers_to_earlier_batches_are_not_taken_for_this_ones(shipped_model):
    """A round that failed part-way may answer a batch twice (its rows, then the error): the
    worker reads answers until the one numbered as its batch."""
    logits, embedding = np.ones((1, 10), np.float32), np.ones((1, 64), np.float32)

    def twice(connection: Connection, seq: int) -> None:
        connection.send(("error", seq - 1, "late, for the batch before"))
        outputs = BackendOutputs(logits=logits * seq, embedding=embedding)
        connection.send(("ok", seq, outputs, {"run": 0.001}, 1))

    with fake_host(shipped_model, twice) as host:
        hosted = HostedBackend(shipped_model, host.address, host.key)
        try:
            for seq in range(3):
                assert hosted.run(images(1)).logits[0, 0] == seq
        finally:
            hosted.close()


def test_a_host_that_does_not_answer_is_unavailable_not_a_hang(shipped_model):
    """A hung host: each call gives up after the timeout (the second one while reconnecting:
    a late answer on the first connection must never be taken for a later batch's)."""
    with fake_host(shipped_model, lambda connection, seq: None) as host:
        # connected with the default timeout (a busy machine may take a while to attach), then
        # each call allowed 0.5 s
        hosted = HostedBackend(shipped_model, host.address, host.key)
        hosted.timeout_s = 0.5
        try:
            with pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.5 s"):
                hosted.run(images(1))
            start = time.perf_counter()
            with pytest.raises(BackendUnavailableError, match="session host is gone"):
                hosted.run(images(1))  # the fake accepts one connection: no handshake
            assert time.perf_counter() - start < 5
        finally:
            hosted.close()


def test_a_host_that_cannot_load_the_model_says_why(tmp_path: Path):
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not onnx")
    with pytest.raises(ValueError, match="not a loadable ONNX model"):
        start_host(bogus, CPU, timeout_s=120)


def test_a_host_that_is_gone_is_an_error_not_a_hang(shipped_model: str):
    handle = start_host(shipped_model, CPU)
    hosted = HostedBackend(shipped_model, handle.address, handle.key)
    try:
        handle.stop()
        assert handle.process.exitcode == 0  # it exits when its pipe closes
        with pytest.raises(BackendUnavailableError, match="session host is gone"):
            hosted.run(images(1))
    finally:
        hosted.close()
        handle.stop()


def test_shared_session_serves_one_model_file_not_a_repository(tmp_path: Path, shipped_model):
    with pytest.raises(ValueError, match="shared_session serves one model file"):
        Settings(model_repository=tmp_path, shared_session=True)
    assert Settings(model_path=shipped_model, shared_session=True).shared_session


def test_nothing_is_left_in_shared_memory(host: HostHandle, shipped_model: str):
    hosted = HostedBackend(shipped_model, host.address, host.key, slots=2)
    name = hosted._memory.name
    hosted.run(images(2))
    hosted.close()
    assert not (Path("/dev/shm") / name.lstrip("/")).exists()


PARENT = """
import sys, time
from service.runtime.backend import BackendOptions
from service.runtime.host_process import start_host
if __name__ == "__main__":
    host = start_host(sys.argv[1], BackendOptions(providers="CPUExecutionProvider"))
    print(host.process.pid, flush=True)
    time.sleep(600)
"""


def test_a_host_whose_parent_is_killed_exits(shipped_model: str):
    """A parent killed outright (SIGKILL: no clean-up of its own) leaves no host holding the
    GPU: the host sees its pipe to the parent close, and exits."""
    root = str(Path(__file__).resolve().parents[3])
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, shipped_model],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert parent.stdout is not None  # stdout=PIPE
    try:
        host = int(parent.stdout.readline())
        assert process_running(host)
        parent.kill()
        parent.wait(timeout=30)
        assert wait_gone(host, 30), "the host outlived its killed parent"
    finally:
        parent.kill()
        parent.wait(timeout=30)
        parent.stdout.close()


def test_the_host_goes_on_after_a_round_that_failed(shipped_model: str):
    """The host's own loop (two threads, two buffers): a batch that cannot be gathered is
    answered its error, and the rounds after it (more than there are buffers) are served."""
    backend = _Recorder()
    host = SessionHost(backend, max_batch=8, listener=None)  # type: ignore[arg-type]
    threading.Thread(target=host.serve_forever, daemon=True).start()
    bad = _Pipe()
    host.waiting.put(_Batch(bad, 0, np.zeros((1, 1, 3, 3), np.float32), 0.0))  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not bad.sent:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert bad.sent[0][:2] == ("error", 0)
    for k in range(1, 6):
        good = _Pipe()
        host.waiting.put(_Batch(good, k, np.full((2, 1, 2, 2), k, np.float32), 0.0))  # type: ignore[arg-type]
        while not good.sent:
            assert time.monotonic() < deadline, f"round {k} was not served"
            time.sleep(0.01)
        assert good.sent[0][:2] == ("ok", k)
        np.testing.assert_array_equal(good.sent[0][2].logits, np.full((2, 1), k))


def test_a_gone_workers_memory_is_closed_only_once_its_batches_are_done():
    """A worker that exits with a batch still waiting: its memory stays mapped until that
    batch's round is over (closing it under the batch's view would crash the host)."""
    memory = SharedMemory(create=True, size=4 * 8 * 4)
    try:
        host = SessionHost(_Recorder(), max_batch=8, listener=None)  # type: ignore[arg-type]
        batch = shared_view(memory, 0, (8, 1, 2, 2))[:3]  # what a waiting batch holds
        host._let_go(memory)  # the reader thread's clean-up
        assert host._orphans == [memory]
        assert batch.sum() == 0  # still readable
        del batch
        host._close_orphans()
        assert host._orphans == []
    finally:
        memory.unlink()


def test_a_failed_handshake_does_not_stop_the_host_accepting(host: HostHandle, shipped_model):
    """A worker killed while connecting (or a wrong key) is logged; the next one is served."""
    with pytest.raises(multiprocessing.AuthenticationError):
        Client(host.address, "AF_UNIX", authkey=b"wrong" * 8)
    hosted = HostedBackend(shipped_model, host.address, host.key)
    try:
        assert hosted.run(images(1)).logits.shape == (1, 10)
    finally:
        hosted.close()


def test_a_connection_to_the_host_is_authenticated_and_bounded():
    """host_link.connect is Client's handshake with bounds: to a listener that accepts
    nothing it is an error after its timeout, not a hang; a wrong key is refused; the right
    one connects."""
    key = b"k" * 32
    with tempfile.TemporaryDirectory() as folder:
        # queued, never accepted: the handshake's first read meets the socket's receive timeout
        with Listener(f"{folder}/silent", "AF_UNIX", authkey=key), pytest.raises(BlockingIOError):
            connect(f"{folder}/silent", key, timeout_s=0.3)
        with Listener(f"{folder}/socket", "AF_UNIX", authkey=key) as listener:

            def accept_twice() -> None:
                with contextlib.suppress(multiprocessing.AuthenticationError):
                    listener.accept()  # the wrong key: refused
                listener.accept().send("welcome")

            threading.Thread(target=accept_twice, daemon=True).start()
            with pytest.raises(multiprocessing.AuthenticationError):
                connect(f"{folder}/socket", b"wrong" * 8, timeout_s=30)
            with connect(f"{folder}/socket", key, timeout_s=30) as connection:
                assert connection.recv() == "welcome"
