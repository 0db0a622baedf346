"""A growing training loss is warned about, a NaN one stops the run with one line naming the lr."""

from __future__ import annotations

import math

import pytest

from training.divergence import DivergenceError, LossWatch
from training.train import main as train_main


def test_a_loss_three_times_its_best_is_warned_about_with_the_lr():
    watch = LossWatch(lr=0.05)
    assert [watch.check(e, loss) for e, loss in enumerate([2.0, 1.0, 2.5], 1)] == [None] * 3
    warning = watch.check(4, 3.2)
    assert warning is not None
    assert "3x its best (1, epoch 2)" in warning
    assert "learning rate (0.05)" in warning
    assert "--lr" in warning


def test_small_losses_near_convergence_are_not_divergence():
    watch = LossWatch(lr=0.01)
    assert watch.check(1, 0.01) is None
    assert watch.check(2, 0.05) is None  # 5x, but under 3x the floor of 0.1


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_non_finite_loss_stops_naming_the_lr(loss):
    with pytest.raises(DivergenceError, match=r"epoch 3: .* learning rate \(0.05\) .* --lr"):
        LossWatch(lr=0.05).check(3, loss)


def test_smso_train_stops_on_nan_with_one_line_and_status_2(tiny_fashion_mnist, tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "--data-root",
        str(tiny_fashion_mnist),
        "--val-size",
        "40",
        "--head-options",
        '{"dim": 4}',
        "--reduce-dim",
        "8",
        "--epochs",
        "2",
        "--lr",
        "1e6",
        "--workers",
        "0",
        "--out",
        str(out),
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("smso-train: error: training diverged in epoch 1: the training loss")
    assert "learning rate (1e+06) is likely too high" in err
    assert "--lr" in err
    assert not (out / "last.pt").exists()  # the diverged epoch is not saved
