"""More real images from the training ones: each a Fashion-MNIST training image moved, turned,
mirrored and relit, to grow a gallery to a million items that look like a collection's (near
neighbours of real images, not random vectors).

Image ``i`` of :func:`augmented` is training image ``i mod N`` under a transform drawn from the
seed ``i``: a shift of up to 3 px, a rotation of up to 12 degrees, a horizontal mirror with
probability 1/2, a contrast of 0.75 to 1.25 and a brightness shift of up to 25 levels. The same
``i`` is always the same image.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["augmented"]


def _one(image: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picture = Image.fromarray(image)
    dx, dy = rng.integers(-3, 4, size=2)
    picture = picture.rotate(
        float(rng.uniform(-12, 12)), resample=Image.Resampling.BILINEAR, translate=(dx, dy)
    )
    if rng.random() < 0.5:
        picture = picture.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = np.asarray(picture, np.float32)
    x = (x - 128.0) * rng.uniform(0.75, 1.25) + 128.0 + rng.uniform(-25, 25)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def augmented(train: np.ndarray, start: int, count: int) -> np.ndarray:
    """Augmented images ``start .. start + count - 1`` of ``train`` ``(N, H, W)`` uint8:
    ``(count, H, W)`` uint8."""
    return np.stack([_one(train[i % len(train)], i) for i in range(start, start + count)])
