"""The micro-batcher on its own: batches, the wait for announced images, failures."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from service.batching.batcher import (
    BatchStats,
    MicroBatcher,
    NonFiniteOutputError,
    QueueFullError,
    finite_rows,
)
from service.batching.observer import NoBatchObserver
from service.runtime.outputs import BackendOutputs
from service.runtime.runner import Batch
from service.telemetry import access, stage_clock

LONG_WAIT_S = 30.0  # a test that waited this long would fail on its own 5 s timeout


def sums(images: Batch) -> BackendOutputs:
    """Each image's sum as its logit, its mean as its embedding."""
    flat = np.stack(list(images)).reshape(len(images), -1)
    return BackendOutputs(logits=flat.sum(1, keepdims=True), embedding=flat.mean(1, keepdims=True))


def recorder(batches: list[int]):
    def run(images: Batch) -> BackendOutputs:
        batches.append(len(images))
        return sums(images)

    return run


def batcher_of(run, max_batch: int, max_wait_s: float = 0.0, queue_size: int = 16, **options):
    return MicroBatcher(
        run, max_batch=max_batch, max_wait_s=max_wait_s, queue_size=queue_size, **options
    )


class Recorded(NoBatchObserver):
    """Keeps what it is told: the queue's depths and each batch's stats."""

    def __init__(self) -> None:
        self.depths: list[int] = []
        self.stats: list[BatchStats] = []

    def queue_changed(self, depth: int) -> None:
        self.depths.append(depth)

    def batch_answered(self, stats: BatchStats) -> None:
        self.stats.append(stats)


def image(value: float) -> np.ndarray:
    return np.full((1, 2, 2), value, np.float32)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 5))


def test_each_caller_gets_its_own_row_of_one_batch():
    async def main() -> list[int]:
        batches: list[int] = []
        batcher = batcher_of(recorder(batches), 8, LONG_WAIT_S)
        batcher.start()
        futures = [batcher.submit(image(v)) for v in range(8)]  # queued before the consumer runs
        outputs = await asyncio.gather(*futures)
        await batcher.stop()
        assert [o.logits.shape for o in outputs] == [(1, 1)] * 8  # one row each
        assert [float(o.logits[0, 0]) for o in outputs] == [4.0 * v for v in range(8)]
        return batches

    assert run(main()) == [8]


def test_an_image_whose_outputs_are_not_finite_fails_alone():
    def run_fn(images: Batch) -> BackendOutputs:
        values = np.array([float(im.flat[0]) for im in images], np.float32)
        logits = np.stack([values, values], axis=1)  # (N, 2)
        embedding = np.stack([values, values, values], axis=1)  # (N, 3)
        logits[values == 1, 1] = np.nan  # image 1: a NaN logit
        embedding[values == 2, 0] = np.inf  # image 2: an infinite embedding value
        return BackendOutputs(logits=logits, embedding=embedding)

    async def main() -> list[BackendOutputs | BaseException]:
        batcher = batcher_of(run_fn, 4, LONG_WAIT_S)
        batcher.start()
        futures = [batcher.submit(image(v)) for v in range(4)]  # one full batch
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop()
        return outcomes

    outcomes = run(main())
    assert [type(o) for o in outcomes[1:3]] == [NonFiniteOutputError] * 2
    for value in (0, 3):
        outputs = outcomes[value]
        assert isinstance(outputs, BackendOutputs)
        assert outputs.logits.tolist() == [[value, value]]
        assert outputs.embedding.tolist() == [[value] * 3]


def test_finite_rows_checks_every_output_row_by_row():
    logits = np.zeros((3, 4), np.float32)
    embedding = np.zeros((3, 2), np.float32)
    features = np.zeros((3, 2, 2), np.float32)
    logits[0, 3] = -np.inf
    features[2, 1, 0] = np.nan
    outputs = BackendOutputs(logits=logits, embedding=embedding, features=features)
    assert finite_rows(outputs).tolist() == [False, True, False]


def test_outputs_that_do_not_have_one_row_per_image_fail_the_batch():
    def short(images: Batch) -> BackendOutputs:
        return BackendOutputs(
            logits=np.zeros((len(images) - 1, 2)), embedding=np.zeros((len(images) - 1, 3))
        )

    def uneven(images: Batch) -> BackendOutputs:
        return BackendOutputs(
            logits=np.zeros((len(images), 2)), embedding=np.zeros((len(images) - 1, 3))
        )

    async def main(run_fn) -> list[BackendOutputs | BaseException]:
        batcher = batcher_of(run_fn, 3, LONG_WAIT_S)
        batcher.start()
        futures = [batcher.submit(image(v)) for v in range(3)]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        await batcher.stop()
        return outcomes

    for run_fn in (short, uneven):
        assert [type(o) for o in run(main(run_fn))] == [ValueError] * 3


def test_a_lone_image_is_not_held_when_nothing_else_is_announced():
    async def main() -> list[int]:
        batches: list[int] = []
        batcher = batcher_of(recorder(batches), 8, LONG_WAIT_S, wait_for_announced=True)
        batcher.start()
        await batcher.submit(image(1))  # would take LONG_WAIT_S if the batcher waited
        await batcher.stop()
        return batches

    assert run(main()) == [1]


def test_announced_images_are_waited_for_and_batched_with_the_first():
    async def main() -> list[int]:
        batches: list[int] = []
        batcher = batcher_of(recorder(batches), 8, LONG_WAIT_S, wait_for_announced=True)
        batcher.start()
        batcher.announce(3)
        first = batcher.submit(image(1))
        await asyncio.sleep(0.05)  # the consumer has the first image and waits for the others
        assert not first.done()
        rest = [batcher.submit(image(v)) for v in (2, 3)]
        batcher.withdraw(3)  # all three are in: nothing else is on its way
        await asyncio.gather(first, *rest)
        await batcher.stop()
        return batches

    assert run(main()) == [3]


def test_a_withdrawn_announcement_releases_the_waiting_batch():
    async def main() -> list[int]:
        batches: list[int] = []
        batcher = batcher_of(recorder(batches), 8, LONG_WAIT_S, wait_for_announced=True)
        batcher.start()
        batcher.announce(2)
        first = batcher.submit(image(1))
        await asyncio.sleep(0.05)
        batcher.withdraw(2)  # the other image failed to decode
        await first
        await batcher.stop()
        return batches

    assert run(main()) == [1]


def test_without_announcements_the_batcher_waits_up_to_max_wait():
    async def main() -> list[int]:
        batches: list[int] = []
        batcher = batcher_of(recorder(batches), 2, LONG_WAIT_S)
        batcher.start()
        first = batcher.submit(image(1))
        await asyncio.sleep(0.05)
        assert not first.done()  # waiting for a second image
        await asyncio.gather(first, batcher.submit(image(2)))
        await batcher.stop()
        return batches

    assert run(main()) == [2]


def test_a_full_queue_refuses_at_once_and_a_failing_batch_fails_every_caller():
    async def main() -> None:
        def fail(images: Batch) -> BackendOutputs:
            raise RuntimeError("boom")

        batcher = batcher_of(fail, 4, queue_size=2)
        futures = [batcher.submit(image(1)), batcher.submit(image(2))]
        with pytest.raises(QueueFullError, match="2 images are already waiting"):
            batcher.submit(image(3))
        batcher.start()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert [str(r) for r in results] == ["boom", "boom"]
        await batcher.stop()

    run(main())


def test_after_a_slow_batch_announced_images_are_waited_for_a_quarter_of_its_time():
    async def main() -> list[int]:
        batches: list[int] = []
        record = recorder(batches)

        def slow(images: Batch) -> BackendOutputs:
            import time

            time.sleep(0.4)  # patience after this batch: 0.25 * 0.4 s = 0.1 s
            return record(images)

        batcher = batcher_of(slow, 8, wait_for_announced=True)
        batcher.start()
        await batcher.submit(image(0))  # max_wait 0 and nothing announced: runs alone
        batcher.announce(2)
        first = batcher.submit(image(1))
        await asyncio.sleep(0.02)  # without patience the first would now run alone: [1, 1, 1]
        second = batcher.submit(image(2))
        batcher.withdraw(2)
        await asyncio.gather(first, second)
        await batcher.stop()
        return batches

    assert run(main()) == [1, 2]


class Failing(NoBatchObserver):
    """Every event raises, as a metrics backend that is down."""

    def queue_changed(self, depth: int) -> None:
        raise RuntimeError("metrics backend down")

    def batch_ran(self, images, start_ns: int, end_ns: int) -> None:
        raise RuntimeError("tracing backend down")

    def batch_answered(self, stats: BatchStats) -> None:
        raise RuntimeError("metrics backend down")


def test_a_failing_observer_does_not_stop_the_batcher(caplog):
    async def main() -> list[int]:
        batches: list[int] = []
        batcher = batcher_of(recorder(batches), 4, observer=Failing())
        batcher.start()
        await asyncio.gather(*batcher.submit_all([image(1)]))
        await batcher.submit(image(2))  # would hang if the consumer had died
        await batcher.stop()
        return batches

    assert run(main()) == [1, 1]
    for event in ("queue_changed", "batch_ran", "batch_answered"):
        assert f"the batch observer's {event} failed" in caplog.text


def test_a_requests_images_are_queued_whole_or_not_at_all_and_the_depth_told_once():
    async def scenario() -> tuple[list[int], int]:
        observer = Recorded()
        batcher = batcher_of(recorder([]), 4, queue_size=3, observer=observer)
        batcher.submit_all([image(1), image(2)])  # not started: they wait
        with pytest.raises(QueueFullError):
            batcher.submit_all([image(3), image(4)])  # only one more fits
        return observer.depths, batcher.depth

    depths, depth = asyncio.run(scenario())
    assert depths == [2]  # once per request, not per image; nothing for the refused one
    assert depth == 3  # the refused request's first image is queued but cancelled


def test_with_two_in_flight_the_next_batch_is_dispatched_while_one_runs():
    """in_flight=2: a second batch is taken and handed to the inference thread while the first
    still runs there (the thread runs them one after the other), and every caller is answered;
    each batch's stats give the thread's time and the longer round trip."""
    import threading

    release = threading.Event()
    started: list[int] = []
    observer = Recorded()

    def slow(images: Batch) -> BackendOutputs:
        started.append(len(images))
        if len(started) == 1:
            release.wait(5)  # the first batch holds the thread until the second is queued
        return sums(images)

    async def main() -> None:
        batcher = batcher_of(slow, 2, observer=observer, in_flight=2)
        batcher.start()
        first = [batcher.submit(image(v)) for v in range(2)]
        while not started:
            await asyncio.sleep(0.001)
        second = [batcher.submit(image(v)) for v in (5, 6)]
        while batcher.depth:  # taken off the queue while the first batch still runs
            await asyncio.sleep(0.001)
        assert started == [2]
        await asyncio.sleep(0.05)  # the second batch waits at the thread for at least this
        release.set()
        outputs = await asyncio.gather(*first, *second)
        await batcher.stop()
        assert [float(o.logits[0, 0]) for o in outputs] == [0.0, 4.0, 20.0, 24.0]

    run(main())
    stats = observer.stats
    assert [s.size for s in stats] == [2, 2]
    assert all(s.round_trip_s >= s.inference_s > 0 for s in stats)
    # the second batch waited at the thread for the first: the sleep is in its round trip
    assert stats[1].round_trip_s - stats[1].inference_s >= 0.05


def test_in_flight_must_be_at_least_one():
    with pytest.raises(ValueError, match="in_flight"):
        batcher_of(recorder([]), 2, queue_size=4, in_flight=0)


def test_a_requests_queue_and_inference_times_span_all_its_batches():
    """A request's access line: queue from its first image queued to its first batch's start,
    inference from there to the end of its last batch (here three images, batches of two)."""

    async def main() -> access.RequestRecord:
        batches: list[int] = []
        slow = recorder(batches)

        def run_slowly(images: Batch) -> BackendOutputs:
            time.sleep(0.02)
            return slow(images)

        batcher = batcher_of(run_slowly, 2)
        record = access.begin(None)
        queued = time.perf_counter()
        futures = batcher.submit_all([image(v) for v in range(3)])
        await asyncio.sleep(0.03)  # queued before the consumer starts
        batcher.start()
        await asyncio.gather(*futures)
        await batcher.stop()
        assert batches == [2, 1]
        assert record.queued is not None
        assert record.queued >= queued
        return record

    record = run(main())
    assert record.queue_s >= 0.03
    assert record.inference_s >= 0.04  # both batches, one after the other


def test_each_batch_reports_the_stages_its_run_function_recorded():
    observer = Recorded()
    stats = observer.stats

    def timed(images: Batch) -> BackendOutputs:
        start = stage_clock.record("stack", time.perf_counter())
        time.sleep(0.02)
        stage_clock.record("run", start)
        return sums(images)

    async def main(fn) -> None:
        batcher = batcher_of(fn, 4, observer=observer)
        batcher.start()
        await batcher.run_direct(np.stack([image(1.0)]))  # warm-up's stages are not a batch's
        await asyncio.gather(*batcher.submit_all(list(np.stack([image(v) for v in range(3)]))))
        await batcher.stop()

    run(main(timed))
    (first,) = stats
    assert set(first.stages) == {"stack", "run"}
    assert first.stages["run"] >= 0.02
    assert sum(first.stages.values()) <= first.inference_s
    run(main(sums))
    assert stats[1].stages == {}
