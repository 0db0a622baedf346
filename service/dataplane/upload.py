"""What every door hands the data plane: one encoded image and the name it came with."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Upload"]


@dataclass(frozen=True)
class Upload:
    """One encoded image (``data``, not yet decoded) and the name it came with (``filename``,
    only echoed back in the results)."""

    filename: str
    data: bytes
