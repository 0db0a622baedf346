"""bench.embed's split of smso-embed's time into a fixed cost and a rate, and the collection size
from which the command reaches a target rate."""

import math

import pytest

from bench.embed import crossover, fixed_and_rate


def test_the_line_through_two_runs() -> None:
    # 2,000 images in 6 s and 10,000 in 10 s: 8,000 more images in 4 s more
    fit = fixed_and_rate((2_000, 6.0), (10_000, 10.0))
    assert fit["rate"] == pytest.approx(2_000.0)
    assert fit["fixed_s"] == pytest.approx(5.0)


def test_the_crossover_reaches_the_target_exactly() -> None:
    fixed_s, rate, target = 13.6, 2_180.0, 1_688.0
    images = crossover(fixed_s, rate, target)
    assert images / (fixed_s + images / rate) == pytest.approx(target)
    # one image in ten fewer falls short
    assert 0.9 * images / (fixed_s + 0.9 * images / rate) < target


def test_no_crossover_where_the_rate_does_not_exceed_the_target() -> None:
    assert math.isinf(crossover(5.0, 1_000.0, 1_000.0))
    assert math.isinf(crossover(5.0, 900.0, 1_000.0))


def test_a_larger_run_no_slower_gives_an_infinite_rate() -> None:
    fit = fixed_and_rate((2_000, 6.0), (10_000, 6.0))
    assert math.isinf(fit["rate"])
    assert fit["fixed_s"] == pytest.approx(6.0)
