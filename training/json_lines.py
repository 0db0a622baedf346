"""Reading the JSON-lines files that runs write (``metrics.jsonl``, ``results.jsonl``).

A line that does not parse, is not an object or lacks a field a reader needs is an error that
names the file and the line, not a ``KeyError`` from wherever the field is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["read_json_lines"]


def read_json_lines(path: Path, required: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The objects of ``path``, one per non-blank line, in order.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ValueError: a line is not a JSON object or lacks one of ``required``; the message gives
            ``path:line``.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    required = list(required)
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        missing = [key for key in required if key not in record]
        if missing:
            raise ValueError(f"{path}:{number}: the record has no {', '.join(missing)}")
        records.append(record)
    return records
