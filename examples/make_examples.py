"""Write the example images the README and docs/ post to the server: three Fashion-MNIST test
images, 28x28 grey as in the dataset, at fixed indices, in the formats the examples use.

    python examples/make_examples.py [--root /usr/share/datasets/fashion-mnist]

Needs the dataset's idx files (`make data`: Debian's dataset-fashion-mnist) and Pillow.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

from training.datasets.fashion_mnist import CLASSES, DEFAULT_ROOT, read_idx

HERE = Path(__file__).resolve().parent

# file name -> (index in the test set, its label, Pillow's save options); the shipped model
# classifies each of them correctly (tests/test_docs_examples.py checks it through the server)
EXAMPLES = {
    "boot.png": (0, "Ankle boot", {}),
    "shirt.jpg": (7, "Shirt", {"quality": 95}),
    "bag.webp": (18, "Bag", {"lossless": True}),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the idx files' folder")
    args = parser.parse_args(argv)
    images = read_idx(args.root / "t10k-images-idx3-ubyte.gz")  # (10000, 28, 28) uint8
    labels = read_idx(args.root / "t10k-labels-idx1-ubyte.gz")  # (10000,)
    for name, (index, label, options) in EXAMPLES.items():
        if CLASSES[labels[index]] != label:
            raise ValueError(f"test image {index} is a {CLASSES[labels[index]]}, not a {label}")
        Image.fromarray(images[index]).save(HERE / name, **options)
        print(f"examples/{name}: test image {index}, {label}")


if __name__ == "__main__":
    main()
