"""The training loop's bookkeeping: skipped fp16 steps, epoch sums."""

from __future__ import annotations

import torch
from torch import nn

from training.engine import make_criterion, train_one_epoch
from training.runtime import Runtime


class TwoOutputs(nn.Module):
    """A linear model with the (logits, embedding) outputs the loop expects."""

    def __init__(self, inputs: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(x)
        return logits, logits


def test_a_step_the_grad_scaler_skips_does_not_advance_the_schedule():
    torch.manual_seed(0)
    model = TwoOutputs(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    # a scale so large that the first scaled gradients overflow: the scaler skips that step
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127, enabled=True)
    loader = [
        (torch.randn(8, 4) * (100 if i == 0 else 0.1), torch.randint(3, (8,))) for i in range(4)
    ]
    runtime = Runtime(torch.device("cpu"), None, rank=0, world_size=1)
    stats = train_one_epoch(
        model, loader, make_criterion("cross_entropy"), optimizer, runtime, scaler, scheduler.step
    )  # with warnings as errors, torch's "scheduler before optimizer" warning would fail this
    assert scaler.get_scale() < 2.0**127  # at least one step was skipped ...
    assert scheduler.last_epoch == len(loader) - 1  # ... and the schedule waited for it
    assert stats.accuracy * 32 == round(stats.accuracy * 32)  # counts are whole images
