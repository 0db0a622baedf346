"""Pooling heads: SMSO and the baselines the paper compares it with.

``create_head(name, in_channels, **options)`` builds one; ``HEADS`` lists them, each with its
``HeadSpec`` (what callers need to know about the head). ``SMSOPooling`` is the SMSO layer.
"""

from training.heads.base import Head
from training.heads.registry import (
    HEADS,
    HeadOptionError,
    HeadSpec,
    UnknownHeadError,
    create_head,
    head_spec,
)
from training.heads.smso import SMSOPooling

__all__ = [
    "HEADS",
    "Head",
    "HeadOptionError",
    "HeadSpec",
    "SMSOPooling",
    "UnknownHeadError",
    "create_head",
    "head_spec",
]
