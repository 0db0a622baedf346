"""``python -m bench.decode_gpu`` in its quick setting, on the CPU: both paths measured and
compared."""

from __future__ import annotations

import json

from bench.decode_gpu import main


def test_quick_run_measures_every_path_and_its_difference(tmp_path, capsys):
    """On the CPU: Pillow, torchvision's CPU decoder, nvImageCodec's CPU decoder and the
    service's gpu_jpeg path (nvImageCodec's CPU decoder, the graph on the CPU provider)."""
    out = tmp_path / "decode_gpu.json"
    assert main(["--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["errors"] == {}
    rows = {(row["path"], row["batch"]): row for row in report["rows"]}
    assert list(rows) == [
        ("cpu (Pillow), one thread", 1),
        ("cpu (Pillow), one thread", 4),
        ("torchvision on cpu", 1),
        ("torchvision on cpu", 4),
        ("nvimgcodec on cpu", 1),
        ("nvimgcodec on cpu", 4),
        ("service (gpu_jpeg), one image per call on cpu", 1),
        ("service (gpu_jpeg), one image per call on cpu", 4),
        ("service (gpu_jpeg, read on the device), one image per call on cpu", 1),
        ("service (gpu_jpeg, read on the device), one image per call on cpu", 4),
        ("cpu (Pillow), one image per call, 2 threads", 4),
        ("torchvision on cpu, one image per call, 2 threads", 4),
        ("nvimgcodec on cpu, one image per call, 2 threads", 4),
        ("service on cpu, one image per call, 2 threads", 4),
        ("service-device on cpu, one image per call, 2 threads", 4),
    ]
    for row in report["rows"]:
        assert row["images_per_second"] > 0
        assert row["cpu_ms_per_image"] >= 0
    # torchvision's CPU decode and antialiased resize follow libjpeg-turbo and Pillow closely;
    # nvImageCodec's CPU decoder is libjpeg-turbo: Pillow's pixels exactly
    assert rows[("torchvision on cpu", 4)]["max_grey_levels"] <= 2
    assert rows[("nvimgcodec on cpu", 4)]["max_grey_levels"] == 0
    assert rows[("service (gpu_jpeg), one image per call on cpu", 4)]["max_grey_levels"] <= 2
    assert "service (gpu_jpeg)" in capsys.readouterr().out


def test_a_path_that_cannot_run_is_reported_not_fatal(tmp_path, monkeypatch):
    import bench.decode_gpu as decode_gpu

    def missing(device):
        raise ImportError("no nvImageCodec here")

    monkeypatch.setattr(decode_gpu, "nvimgcodec_decode", missing)
    out = tmp_path / "decode_gpu.json"
    assert main(["--quick", "--paths", "pillow", "nvimgcodec", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["errors"] == {"nvimgcodec": "ImportError: no nvImageCodec here"}
    assert {row["path"] for row in report["rows"]} == {
        "cpu (Pillow), one thread",
        "cpu (Pillow), one image per call, 2 threads",
    }
