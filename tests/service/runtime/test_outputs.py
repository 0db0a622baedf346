"""The named outputs of a batch: rows kept together, names checked, rows sliced and joined."""

from __future__ import annotations

import numpy as np
import pytest

from service.runtime.outputs import OUTPUT_NAMES, BackendOutputs


def outputs(n: int, start: int = 0, **more: np.ndarray) -> BackendOutputs:
    rows = np.arange(start, start + n, dtype=np.float32)
    return BackendOutputs(
        logits=np.stack([rows, -rows], axis=1), embedding=np.stack([rows] * 3, axis=1), **more
    )


def test_every_output_has_one_row_per_image():
    assert len(outputs(4)) == 4
    with pytest.raises(ValueError, match="different numbers of rows: logits 2, embedding 2, p_"):
        outputs(2, p_value=np.zeros(3))


def test_outputs_are_named_as_the_graph_names_them_and_no_other_name_is_taken():
    assert OUTPUT_NAMES == ("logits", "embedding", "typicality", "features", "p_value")
    plain = outputs(2)
    assert list(plain.named()) == ["logits", "embedding"]
    scored = BackendOutputs.from_named({**plain.named(), "typicality": np.zeros(2)})
    assert list(scored.named()) == ["logits", "embedding", "typicality"]
    with pytest.raises(ValueError, match=r"unknown outputs \['scores'\]"):
        BackendOutputs.from_named({**plain.named(), "scores": np.zeros(2)})


def test_rows_are_sliced_and_joined_back_in_order():
    whole = outputs(5, typicality=np.arange(5.0))
    parts = [whole.rows(0, 2), whole.rows(2, 3), whole.rows(3, 5)]
    assert [len(part) for part in parts] == [2, 1, 2]
    assert parts[1].typicality is not None
    assert parts[1].typicality.tolist() == [2.0]
    joined = BackendOutputs.concatenate(parts)
    for name, array in whole.named().items():
        np.testing.assert_array_equal(joined.named()[name], array)
    with pytest.raises(ValueError, match="cannot follow"):
        BackendOutputs.concatenate([outputs(1), whole.rows(0, 1)])
    with pytest.raises(ValueError, match="no outputs"):
        BackendOutputs.concatenate([])


def test_a_batch_splits_into_its_rows_as_slicing_gives_them():
    whole = outputs(4, typicality=np.arange(4.0), p_value=np.linspace(0, 1, 4))
    rows = whole.split()
    assert len(rows) == 4
    for n, row in enumerate(rows):
        want = whole.rows(n, n + 1)
        assert row.features is None
        assert list(row.named()) == list(want.named())
        for name, array in want.named().items():
            np.testing.assert_array_equal(row.named()[name], array)
    with pytest.raises(AttributeError):
        rows[0].logits = np.zeros((1, 2))  # type: ignore[misc]
    joined = BackendOutputs.concatenate(rows)
    for name, array in whole.named().items():
        np.testing.assert_array_equal(joined.named()[name], array)
