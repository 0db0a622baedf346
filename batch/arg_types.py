"""argparse ``type=`` converters shared by the batch commands: a wrong value is argparse's
one-line usage error naming the flag, never a traceback."""

from __future__ import annotations

import argparse


def positive(text: str) -> int:
    """A whole number >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a positive whole number")
    return value


def count(text: str) -> int:
    """A whole number >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: give 0 or a positive whole number")
    return value


def share(text: str) -> float:
    """A number > 0 (a Ray resource: CPUs or GPUs, fractions allowed)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number above 0")
    return value


def similarity(text: str) -> float:
    """A cosine similarity in [-1, 1]."""
    value = float(text)
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: give a similarity in [-1, 1]")
    return value
