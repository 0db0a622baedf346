"""The one report writer: markdown tables for stdout, the JSON results file, the machine.

A benchmark prints its tables (:func:`markdown_table`, numbers through :func:`format_ms`,
:func:`format_ratio`, :func:`percent`) and saves everything it measured, with
:func:`machine`, as indented JSON (:func:`save`).
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def format_ms(value: float) -> str:
    """Milliseconds with three or more significant digits: ``1,234``, ``56.7``, ``8.90``."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_ratio(value: float | None) -> str:
    """A ratio as ``12.3x``, ``1.23x`` or ``0.012x``; ``-`` for None."""
    if value is None:
        return "-"
    if value >= 10:
        return f"{value:,.1f}x"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def percent(value: float | None) -> str:
    """A fraction as ``12 %``; ``-`` for None."""
    return "-" if value is None else f"{100 * value:.0f} %"


def format_value(value: Any) -> str:
    """A table cell: ``-`` for None, floats to one decimal, integers with thousands separators."""
    return "-" if value is None else f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table with padded columns (numbers right-aligned)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    numeric = [bool(rows) and all(_looks_numeric(r[i]) for r in rows) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|".join(
        "-" * (w + 1) + ":" if num else "-" * (w + 2)
        for w, num in zip(widths, numeric, strict=True)
    )
    return "\n".join([line(header), f"|{rule}|", *(line(r) for r in rows)])


def _looks_numeric(cell: str) -> bool:
    """A number as the formatters write it (``-1,234.5``, ``2.00x``, ``12 %``) or ``-``."""
    bare = cell.lstrip("-").replace(",", "").replace(".", "").removesuffix(" %").rstrip("x")
    return cell == "-" or bare.isdigit()


def write_json(path: Path, payload: Any) -> None:
    """Write ``payload`` as indented JSON to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def save(path: Path, payload: Any) -> None:
    """:func:`write_json`, and say where."""
    write_json(path, payload)
    print(f"Results written to {path}")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine(**versions: Any) -> dict[str, Any]:
    """Python, the platform, the CPU and its cores, and ``versions`` (name -> version)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": cpu_model(),
        "cpu_count": os.cpu_count(),
        **versions,
    }
