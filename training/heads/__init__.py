"""Pooling heads: SMSO and the baselines the paper compares it with.

``create_head(name, in_channels, **options)`` builds one; ``HEADS`` lists them.
"""

from training.heads.base import Head
from training.heads.registry import HEADS, HeadSpec, UnknownHeadError, create_head, head_spec

__all__ = ["HEADS", "Head", "HeadSpec", "UnknownHeadError", "create_head", "head_spec"]
