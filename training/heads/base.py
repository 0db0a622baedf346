"""What every pooling head shares: input checks, float32 compute, vectorising a symmetric matrix,
BP's normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.second_order import at_least_float32, check_feature_map

__all__ = ["VECTORIZATIONS", "Head", "SymmetricVectorizer", "signed_sqrt_l2"]

#: How a head turns a symmetric ``c x c`` matrix into a vector: every entry (``c^2``, BP's
#: 262,144-d at c = 512) or the upper triangle with the diagonal (``c(c+1)/2``, 32,896-d at
#: c = 256), which holds the same numbers once each.
VECTORIZATIONS: tuple[str, ...] = ("full", "triu")


class Head(nn.Module):
    """A pooling head: ``(B, c, h, w)`` feature map -> ``(B, output_dim)`` embedding.

    Subclasses implement ``pool``; ``forward`` checks the input and runs ``pool`` in float32 with
    autocast disabled, because second-order statistics lose their small terms in fp16/bf16 and sums
    of squares over hundreds of positions overflow fp16.

    What a caller needs to know about a head (whether it takes the number of classes and scores
    them itself, the loss it was designed for, its forms, ...) is declared in its registry entry,
    ``training.heads.HeadSpec``, not probed on the module.

    Attributes:
        in_channels: ``c``.
        output_dim: size of the embedding.
    """

    def __init__(self, in_channels: int, output_dim: int) -> None:
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"in_channels must be >= 1, got {in_channels}")
        self.in_channels = in_channels
        self.output_dim = output_dim

    def forward(self, x: Tensor) -> Tensor:
        """``(B, c, h, w)`` -> ``(B, output_dim)``, float32 (float64 for float64 input)."""
        check_feature_map(x, self.in_channels, type(self).__name__)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self.pool(at_least_float32(x))

    def pool(self, x: Tensor) -> Tensor:
        """The head's computation on a float32 (or float64) feature map ``(B, c, h, w)``."""
        raise NotImplementedError

    def input_statistics(self, x: Tensor) -> tuple[Tensor, int]:
        """Float64 sums over a batch of inputs ``(B, c, h, w)`` and the number of terms they add.

        ``set_input_statistics`` turns the sums over a whole dataset into the head's data-driven
        state (``training.head_statistics`` runs the pass). Only heads whose ``HeadSpec`` declares
        ``input_statistics`` implement the pair.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no statistics of its input")

    def set_input_statistics(self, sums: Tensor, count: int) -> None:
        """Set the head's data-driven state from ``input_statistics`` summed over a dataset."""
        raise NotImplementedError(f"{type(self).__name__} keeps no statistics of its input")


class SymmetricVectorizer(nn.Module):
    """``(B, c, c)`` symmetric -> ``(B, c^2)`` (``"full"``) or ``(B, c(c+1)/2)`` (``"triu"``,
    row by row, diagonal included). No state in the state dict: the index is rebuilt from ``c``.
    """

    index: Tensor | None  # buffer: the upper triangle's positions in the flattened matrix

    def __init__(self, channels: int, vectorize: str = "full") -> None:
        super().__init__()
        if vectorize not in VECTORIZATIONS:
            raise ValueError(
                f"unknown vectorize {vectorize!r}; valid values: {', '.join(VECTORIZATIONS)}"
            )
        self.vectorize = vectorize
        full = vectorize == "full"
        self.output_dim = channels * channels if full else channels * (channels + 1) // 2
        rows, cols = torch.triu_indices(channels, channels)
        index = None if full else rows * channels + cols
        self.register_buffer("index", index, persistent=False)

    def forward(self, y: Tensor) -> Tensor:
        flat = y.flatten(1)  # (B, c^2)
        return flat if self.index is None else flat[:, self.index]


def signed_sqrt_l2(z: Tensor, eps: float = 1e-8) -> Tensor:
    """BP's normalisation: ``y = sign(z) (sqrt(|z| + eps) - sqrt(eps))``, then ``y / ||y||_2``.

    ``(B, d)`` -> ``(B, d)``. Subtracting ``sqrt(eps)`` keeps the map continuous at 0, and ``eps``
    bounds its slope there by ``1 / (2 sqrt(eps))``, so a blank image has finite gradients.
    """
    y = torch.sign(z) * (torch.sqrt(z.abs() + eps) - eps**0.5)
    return F.normalize(y, dim=1, eps=1e-12)
