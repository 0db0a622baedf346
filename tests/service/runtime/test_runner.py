"""Batch-size buckets and the two runners, against the session's own ``run`` on the shipped
model; the IO-binding runner on the CPU here, and on CUDA where there is a GPU (``-m cuda``)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from service.runtime.backend import BackendOptions, OnnxBackend
from service.runtime.outputs import BackendOutputs
from service.runtime.providers import CPU, CUDA, has_nvidia_gpu, shaped_session
from service.runtime.runner import BoundRunner, PlainRunner, bucket_for, buckets, fill, stacked
from service.telemetry import stage_clock


@pytest.mark.parametrize(
    ("max_batch", "expected"),
    [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (16, [1, 2, 4, 8, 16]), (48, [1, 2, 4, 8, 16, 32, 48])],
)
def test_buckets_are_powers_of_two_then_the_largest_batch(max_batch, expected):
    assert buckets(max_batch) == expected


def test_bucket_for_is_the_smallest_bucket_that_holds_the_batch():
    sizes = buckets(48)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 16, 17, 33, 48)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        48,
        48,
    ]
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        bucket_for(49, sizes)
    with pytest.raises(ValueError, match=">= 1"):
        buckets(0)


@pytest.fixture(scope="module")
def session(shipped_model):
    return ort.InferenceSession(shipped_model, providers=["CPUExecutionProvider"])


def reference(session, images, names=("logits", "embedding")) -> BackendOutputs:
    """The session's own answer, by name."""
    arrays = session.run(list(names), {"image": images})
    return BackendOutputs.from_named(dict(zip(names, arrays, strict=True)))


def bound(session, sizes, **options) -> BoundRunner:
    """An IO-binding runner of the shipped model on the CPU."""
    shapes = {"logits": (10,), "embedding": (64,), **options.pop("extra", {})}
    return BoundRunner(
        session, input_shape=(1, 28, 28), outputs=shapes, sizes=sizes, device="cpu", **options
    )


def assert_close(got: BackendOutputs, want: BackendOutputs, tolerance: float = 1e-5) -> None:
    """The same outputs, of the same shapes, with values within ``tolerance``."""
    assert list(got.named()) == list(want.named())
    for name, array in want.named().items():
        assert got.named()[name].shape == array.shape, name
        np.testing.assert_allclose(got.named()[name], array, rtol=tolerance, atol=tolerance)


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 28, 28)).astype(np.float32)


def test_plain_runner_pads_to_buckets_without_changing_the_answers(session):
    runner = PlainRunner(session, sizes=buckets(8))
    for n in (1, 3, 5, 8):
        batch = images(n, seed=n)
        assert_close(runner(batch), reference(session, batch))


def test_the_runners_record_their_stages_on_the_calling_threads_clock(session):
    for runner, stages in (
        (PlainRunner(session, sizes=buckets(8)), {"stack", "run"}),
        (bound(session, buckets(8)), {"stack", "upload", "run", "download"}),
    ):
        stage_clock.take()
        start = time.perf_counter()
        runner(images(3))
        wall = time.perf_counter() - start
        times = stage_clock.take()
        assert set(times) == stages
        assert all(seconds >= 0 for seconds in times.values())
        assert sum(times.values()) <= wall
        assert times["run"] > 0
    stage_clock.take()
    assert PlainRunner(session).mode == "plain"
    PlainRunner(session)(list(images(3)))  # no buckets: stacked as they are
    assert set(stage_clock.take()) == {"stack", "run"}


def test_bound_runner_on_the_cpu_reuses_its_buffers_and_gives_the_same_answers(session):
    runner = bound(session, buckets(8), extra={"features": (128,), "typicality": ()})
    assert runner.mode == "io-binding"
    names = ("logits", "embedding", "typicality", "features")
    for n in (2, 7, 8, 1, 7):  # a bucket reused with other data must not leak old rows
        batch = images(n, seed=10 + n)
        assert_close(runner(batch), reference(session, batch, names))


def test_a_session_per_bucket_with_its_shape_fixed_answers_as_one_dynamic_session(
    shipped_model, session
):
    """What the backend builds on CUDA, here on the CPU: each bucket's session has every
    dimension fixed (no shape arithmetic left to run), and a batch goes to its bucket's."""
    sizes = buckets(8)
    per_bucket = {
        size: shaped_session(
            Path(shipped_model),
            [CPU],
            threads=1,
            spinning=False,
            accelerator=None,
            free_dims={"batch": size, "height": 28, "width": 28},
        )
        for size in sizes
    }
    assert [per_bucket[size].get_inputs()[0].shape for size in sizes] == [
        [size, 1, 28, 28] for size in sizes
    ]
    runner = PlainRunner(per_bucket, sizes=sizes)
    assert runner.mode == "buckets"
    for n in (3, 1, 8, 5):
        batch = images(n, seed=30 + n)
        assert_close(runner(batch), reference(session, batch))
    with pytest.raises(ValueError, match="no session for the buckets"):
        PlainRunner({1: per_bucket[1]}, sizes=sizes)


def test_cpu_backend_runs_exact_batches_and_warms_up_each_bucket(shipped_model):
    backend = OnnxBackend(
        shipped_model, BackendOptions(providers="CPUExecutionProvider", max_batch=16)
    )
    assert backend.providers == ["CPUExecutionProvider"]
    assert backend.mode == "plain"
    assert backend.warmup_batches == [1, 2, 4, 8, 16]
    assert backend.buckets is None
    assert backend.outputs == ["logits", "embedding", "typicality"]  # the file scores itself
    outputs = backend.run(images(5))
    assert outputs.logits.shape == (5, 10)
    assert outputs.embedding.shape == (5, 64)
    assert outputs.typicality is not None
    assert outputs.typicality.shape == (5,)
    assert outputs.features is None
    assert outputs.p_value is None  # scored by the service, not the file


cuda = pytest.mark.skipif(
    not (has_nvidia_gpu() and CUDA in ort.get_available_providers()),
    reason="needs onnxruntime's CUDA provider and an NVIDIA GPU",
)


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("mode", ["buckets", "io-binding", "cuda-graphs"])
def test_cuda_runners_agree_with_the_cpu(shipped_model, session, mode):
    options = BackendOptions(
        providers=f"{CUDA},CPUExecutionProvider",
        max_batch=8,
        io_binding=mode == "io-binding",
        cuda_graphs=mode == "cuda-graphs",
    )
    backend = OnnxBackend(shipped_model, options)
    assert backend.providers[0] == CUDA
    assert backend.mode == mode
    runner = backend._runner
    assert isinstance(runner, (PlainRunner, BoundRunner))
    sessions = runner.sessions  # one per bucket, each with its shape fixed
    assert len({id(s) for s in sessions.values()}) == len(sessions) == 4
    assert sessions[8].get_inputs()[0].shape == [8, 1, 28, 28]
    for size in backend.warmup_batches:
        backend.run(images(size))
    for n in (1, 3, 8, 3):
        batch = images(n, seed=20 + n)
        outputs, want = backend.run(batch), reference(session, batch)
        # CUDA's convolutions use TF32 (10-bit mantissa) by default: 1.2e-3 seen on an H100
        np.testing.assert_allclose(outputs.logits, want.logits, rtol=5e-3, atol=5e-3)
        np.testing.assert_allclose(outputs.embedding, want.embedding, rtol=5e-3, atol=5e-3)


def test_fill_copies_a_list_or_an_array_into_the_first_rows_and_refuses_an_overflow():
    out = np.full((4, 1, 2, 2), 7.0, np.float32)
    batch = [np.full((1, 2, 2), v, np.float32) for v in (1.0, 2.0)]
    assert fill(out, batch) == 2
    assert out[:, 0, 0, 0].tolist() == [1.0, 2.0, 7.0, 7.0]  # the rows after: as they were
    assert fill(out, np.stack(batch) * 3) == 2
    assert out[:, 0, 0, 0].tolist() == [3.0, 6.0, 7.0, 7.0]
    assert fill(out, []) == 0
    with pytest.raises(ValueError, match="a batch of 5 does not fit in 4 rows"):
        fill(out, np.zeros((5, 1, 2, 2), np.float32))
    array = np.zeros((2, 1, 2, 2), np.float32)
    assert stacked(array) is array
    np.testing.assert_array_equal(stacked(batch), np.stack(batch))


@pytest.mark.parametrize("kind", ["plain", "bound"])
def test_the_runners_answer_a_list_of_images_as_the_same_batch_as_an_array(session, kind):
    sizes = buckets(8)
    runner = PlainRunner(session, sizes=sizes) if kind == "plain" else bound(session, sizes)
    for n in (3, 4, 8):  # padded, and exactly a bucket (an array of it is used as it is)
        batch = images(n, seed=20 + n)
        from_array = runner(batch)
        assert_close(runner(list(batch)), from_array, 0.0)
        assert_close(from_array, reference(session, batch))
