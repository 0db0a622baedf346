"""The session host (one process running every worker's batches) and the workers' backend."""

from __future__ import annotations

import contextlib
import multiprocessing
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from service import stage_clock
from service.backend import BackendOptions, OnnxBackend
from service.errors import BackendUnavailableError
from service.hosted_backend import HostedBackend
from service.session_host import HostHandle, _Batch, _Host, start_host
from service.settings import Settings

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
        for got, want in zip(hosted.run(batch), direct.run(batch), strict=True):
            np.testing.assert_array_equal(got, want)
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
            logits = backend.run(batch)[0]
            if not np.allclose(logits, direct.run(batch)[0], atol=1e-5):
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

    def run(self, batch: np.ndarray) -> tuple[np.ndarray, ...]:
        self.sizes.append(len(batch))
        if self.fail:
            raise RuntimeError("device lost")
        return (batch.reshape(len(batch), -1)[:, :1].copy(),)


class _Pipe:
    """A connection that keeps what it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []

    def send(self, message: tuple) -> None:
        self.sent.append(message)


def _queue(host: _Host, sizes: list[int]) -> list[_Pipe]:
    pipes = []
    for k, n in enumerate(sizes):
        pipe = _Pipe()
        rows = np.full((n, 1, 2, 2), float(k), np.float32)
        host.waiting.put(_Batch(pipe, rows, time.perf_counter()))  # type: ignore[arg-type]
        pipes.append(pipe)
    return pipes


def test_the_host_merges_waiting_batches_up_to_its_largest():
    """Batches of 3, 4 and 2 waiting with a largest batch of 8: one round of 7 (the first two),
    then the third alone; each batch gets its own rows back."""
    backend = _Recorder()
    host = _Host(backend, 8, listener=None)  # type: ignore[arg-type]
    pipes = _queue(host, [3, 4, 2])
    host.run_round(*host.next_round())
    host.run_round(*host.next_round())
    assert backend.sizes == [7, 2]
    for k, (pipe, n) in enumerate(zip(pipes, [3, 4, 2], strict=True)):
        ((status, outputs, stages, merged),) = pipe.sent
        assert status == "ok"
        np.testing.assert_array_equal(outputs[0], np.full((n, 1), float(k)))
        assert merged == (7 if k < 2 else 2)
        assert stages["share"] >= 0
    assert host.waiting.empty()


def test_the_host_pads_a_merged_batch_to_its_bucket_in_place():
    """On an accelerator the runner pads to a bucket: the host hands it a whole bucket of its
    buffer (no second copy), and each batch still gets only its own rows."""
    backend = _Recorder()
    backend.buckets = [1, 2, 4, 8]
    host = _Host(backend, 8, listener=None)  # type: ignore[arg-type]
    pipes = _queue(host, [2, 3])
    host.run_round(*host.next_round())
    assert backend.sizes == [8]
    assert [len(p.sent[0][1][0]) for p in pipes] == [2, 3]


def test_a_round_that_cannot_be_gathered_is_answered_the_error():
    """Whatever fails in a round (here the copy: rows of the wrong shape) is every batch's
    answer, and the host goes on."""
    host = _Host(_Recorder(), 8, listener=None)  # type: ignore[arg-type]
    good, bad = _Pipe(), _Pipe()
    rows = [np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 3, 3), np.float32)]
    batches = [_Batch(pipe, r, 0.0) for pipe, r in zip([good, bad], rows, strict=True)]  # type: ignore[arg-type]
    assert host._guarded(batches, host.gather, batches, 2, host.buffers[0]) is None
    assert good.sent[0][0] == bad.sent[0][0] == "error"
    assert "ValueError" in good.sent[0][1]


def test_a_failed_round_fails_every_batch_in_it():
    host = _Host(_Recorder(fail=True), 8, listener=None)  # type: ignore[arg-type]
    pipes = _queue(host, [1, 2])
    host.run_round(*host.next_round())
    assert [p.sent for p in pipes] == [[("error", "RuntimeError: device lost")]] * 2


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
def fake_host(shipped_model: str, answer: Callable[[Connection], None]) -> Iterator[HostHandle]:
    """A host speaking the protocol in a thread (the hello, the attach) that answers each batch
    with ``answer(connection)``."""
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
                connection.recv()
                answer(connection)

    threading.Thread(target=serve, daemon=True).start()
    handle = HostHandle(address, key, None, ["Fake"], folder, None)  # type: ignore[arg-type]
    try:
        yield handle
    finally:
        listener.close()
        folder.cleanup()


def test_a_failed_run_in_the_host_is_the_workers_error_with_the_hosts_reason(shipped_model):
    def fail(connection: Connection) -> None:
        connection.send(("error", "RuntimeError: device lost"))

    with fake_host(shipped_model, fail) as host:
        hosted = HostedBackend(shipped_model, host.address, host.key)
        try:
            with pytest.raises(RuntimeError, match=r"could not run the batch: .*device lost"):
                hosted.run(images(2))
        finally:
            hosted.close()


def test_a_host_that_does_not_answer_is_unavailable_not_a_hang(shipped_model):
    """A hung host: the call gives up after the timeout, and so do later calls at once (a
    late answer must never be taken for the next batch's)."""
    with fake_host(shipped_model, lambda connection: None) as host:
        hosted = HostedBackend(shipped_model, host.address, host.key, timeout_s=0.3)
        try:
            with pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.3 s"):
                hosted.run(images(1))
            start = time.perf_counter()
            with pytest.raises(BackendUnavailableError):
                hosted.run(images(1))
            assert time.perf_counter() - start < 0.1
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


def test_a_host_whose_parent_is_gone_exits(shipped_model: str):
    """The host exits when its parent's end of the pipe closes: a parent killed outright
    leaves no process holding the GPU."""
    handle = start_host(shipped_model, CPU)
    try:
        handle.pipe.close()  # what the kernel does when the parent dies
        handle.process.join(20)
        assert handle.process.exitcode == 0
    finally:
        handle.stop()


def test_a_failed_handshake_does_not_stop_the_host_accepting(host: HostHandle, shipped_model):
    """A worker killed while connecting (or a wrong key) is logged; the next one is served."""
    with pytest.raises(multiprocessing.AuthenticationError):
        Client(host.address, "AF_UNIX", authkey=b"wrong" * 8)
    hosted = HostedBackend(shipped_model, host.address, host.key)
    try:
        assert hosted.run(images(1))[0].shape == (1, 10)
    finally:
        hosted.close()
