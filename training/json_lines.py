"""Reading the JSON-lines files that runs write (``metrics.jsonl``, ``results.jsonl``).

A line that does not parse, is not an object or lacks a field a reader needs is an error that
names the file and the line, not a ``KeyError`` from wherever the field is used.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["holds_record", "read_json_lines", "read_json_record"]


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
    return [
        _record(line, f"{path}:{number}", required)
        for number, line in enumerate(_text(path).splitlines(), start=1)
        if line.strip()
    ]


def read_json_record(path: Path, required: Iterable[str] = ()) -> dict[str, Any]:
    """The one JSON object of ``path`` (such as a run's ``result.json``); errors as
    :func:`read_json_lines`', naming the file."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return _record(_text(path), str(path), list(required))


def holds_record(path: Path, required: Iterable[str]) -> bool:
    """Whether the regular file ``path`` holds one JSON object with every field of ``required``
    (an earlier report a tool may write over); a file that does not start with ``{`` (such as
    a checkpoint) is not read whole to find that out."""
    try:
        with path.open("rb") as file:
            if file.read(1) != b"{":
                return False
        read_json_record(path, required)
    except ValueError:
        return False
    return True


def _text(path: Path) -> str:
    """The file's text; ``ValueError`` naming it when it is not UTF-8 (a binary file)."""
    try:
        return path.read_text()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a text file (byte {error.start} is not UTF-8)") from None


def _record(text: str, where: str, required: list[str]) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: not a JSON object")
    missing = [key for key in required if key not in record]
    if missing:
        raise ValueError(f"{where}: the record has no {', '.join(missing)}")
    return record
