"""A validation split too small for a typicality reference is said plainly, before any work: no
reference at all (not a partial one), what it would take, and what the user can do."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from export.typicality import reference_section


class NotRun:
    def get_outputs(self) -> Any:
        raise AssertionError("the session was run for a reference that could not be fitted")


def test_forty_validation_images_for_a_64_dimensional_embedding_is_no_reference():
    splits = SimpleNamespace(val=[None] * 40)
    section, why = reference_section(NotRun(), splits, 64)  # type: ignore[arg-type]
    assert section is None
    assert why is not None
    assert "holds 40 images" in why
    assert "needs at least 128" in why
    assert "without typicality scores" in why
    assert "export again" in why
