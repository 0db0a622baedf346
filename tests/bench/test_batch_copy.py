"""``python -m bench.batch_copy`` in its quick setting: both ways give the stacked images,
every row."""

from __future__ import annotations

import json
import re

import numpy as np

from bench.batch_copy import WAYS, main, stack_pad


def test_quick_run_reports_each_batch_with_its_bucket(tmp_path, capsys):
    out = tmp_path / "batch_copy.json"
    assert (
        main(
            [
                "--quick",
                "--size",
                "16",
                "--max-batch",
                "8",
                "--batches",
                "1",
                "3",
                "8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert [(row["images"], row["bucket"]) for row in report["rows"]] == [(1, 1), (3, 4), (8, 8)]
    for row in report["rows"]:
        assert set(row["ms"]) == set(WAYS)
        assert all(ms > 0 for ms in row["ms"].values())
        assert row["ratio"] > 0
    assert re.search(r"^\| +3 \| +4 \|", capsys.readouterr().out, re.MULTILINE)


def test_the_former_path_pads_with_zero_rows():
    images = [np.ones((1, 2, 2), np.float32)] * 3
    padded = stack_pad(images, 4)
    assert padded.shape == (4, 1, 2, 2)
    assert padded[:3].min() == 1
    assert padded[3].max() == 0
