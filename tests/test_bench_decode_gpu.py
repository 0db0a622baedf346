"""bench/decode_gpu.py in its quick setting, on the CPU: both paths measured and compared."""

from __future__ import annotations

import json

from bench.decode_gpu import main


def test_quick_run_measures_pillow_and_torchvision_and_their_difference(tmp_path, capsys):
    out = tmp_path / "decode_gpu.json"
    assert main(["--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert "torchvision_error" not in report
    paths = [(row["path"], row["batch"]) for row in report["rows"]]
    assert paths == [
        ("cpu (Pillow), one thread", 1),
        ("cpu (Pillow), one thread", 4),
        ("torchvision on cpu", 1),
        ("torchvision on cpu", 4),
        ("cpu (Pillow), 2 threads", 4),
        ("torchvision on cpu, one image per call, 2 threads", 4),
    ]
    for row in report["rows"]:
        assert row["images_per_second"] > 0
        assert row["cpu_ms_per_image"] >= 0
    # torchvision's CPU decode and antialiased resize follow libjpeg-turbo and Pillow closely
    assert report["rows"][3]["max_grey_levels"] <= 2
    assert "torchvision on cpu" in capsys.readouterr().out
