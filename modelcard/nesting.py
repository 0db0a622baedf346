"""How deeply a JSON text nests, counted before it is parsed.

Python's ``json`` recurses once per level of lists and objects: a card nested 200,000 deep would
exhaust the stack (or take the process's memory) before any schema could refuse it. The scan
below removes strings (whose brackets do not count) and everything that is not a bracket, and
counts, stopping one past the limit.
"""

from __future__ import annotations

import re

__all__ = ["MAX_DEPTH", "nesting_depth"]

#: The deepest nesting of lists and objects a card may hold: an exported card is 4 deep (the
#: typicality section's ``features.within.basis``); JSON nested far deeper than this could not
#: be parsed or served without running out of stack.
MAX_DEPTH = 32

#: A JSON string (its escapes included; one left open runs to the end of the text, matched once
#: rather than tried again from each of its quotes, which took time quadratic in its length),
#: and what is not a bracket.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deeply the lists and objects of the JSON ``text`` nest, counted without parsing it
    (brackets inside strings do not count), up to ``limit + 1``: a card nested 200,000 deep is
    refused before ``json`` recurses into it."""
    depth = deepest = 0
    for bracket in _NOT_BRACKET.sub("", _STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
        elif bracket in "]}":
            depth -= 1
    return deepest
