"""The head benchmark (bench/heads.py) end to end on a tiny setting, and bench/benchlib.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from bench import benchlib, heads

ROOT = Path(__file__).resolve().parent.parent

SIDE = 4  # n = 16: every head in well under a second
# (head, form, p, n) -> output dim; mpn at c = 256 gives c(c+1)/2, gap the c = 256 channels.
EXPECTED = {
    ("smso", "conv", 64, SIDE**2): 64,
    ("smso", "covariance", 64, SIDE**2): 64,
    ("smso", "conv", 2048, SIDE**2): 2048,
    ("smso", "covariance", 2048, SIDE**2): 2048,
    ("gap", "-", None, SIDE**2): 256,
    ("mpn", "-", None, SIDE**2): 32896,
}
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d \[\d+/\d+\] ")  # the script's progress lines


@dataclass(frozen=True)
class Run:
    stdout: str
    stderr: str
    report: dict[str, Any]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``python bench/heads.py`` as documented (a script, from the root), warnings as errors."""
    out = tmp_path_factory.mktemp("bench") / "heads.json"
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}  # benchlib's default
    args = ["--heads", "smso", "gap", "mpn", "--sides", str(SIDE), "--repeats", "1"]
    args += ["--budget", "0", "--quick", "--threads", "2", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-W", "error", "bench/heads.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # generous: a loaded CI machine must not turn slowness into failure
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return Run(proc.stdout, proc.stderr, json.loads(out.read_text()))


def key(row: dict[str, Any]) -> tuple[str, str, int | None, int]:
    return row["head"], row["form"], row["options"].get("dim"), row["positions"]


@pytest.mark.slow  # shares one ~4 s run of the script
def test_json_has_one_row_per_configuration(run: Run) -> None:
    rows = run.report["results"]
    assert sorted(map(key, rows), key=str) == sorted(EXPECTED, key=str)
    for row in rows:
        assert row["output_dim"] == EXPECTED[key(row)], key(row)
        assert row["channels"] == 256
        assert row["forward_ms"] > 0
        assert row["train_ms"] > 0
        assert row["forward_repeats"] == row["train_repeats"] == 1
        assert row["memory_mib"] >= 0
    assert run.report["settings"]["positions"] == [SIDE**2]
    assert run.report["machine"]["threads"] == 2
    assert run.report["checks"]["speedup"]["rows"]  # MPN vs SMSO p=64 (BP not measured)
    assert len(run.report["checks"]["forms"]["rows"]) == 2  # p = 64 and 2048


@pytest.mark.slow  # shares one ~4 s run of the script
def test_table_has_the_rows(run: Run) -> None:
    lines = run.stdout.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("| head")))
    table = lines[first : lines.index("", first)]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert re.fullmatch(r"\|(-+:?\|)+", table[1])
    rows = [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in table[2:]
    ]
    shown = {
        (r["head"], r["form"], r["p/d"], int(r["n"]), int(r["output dim"].replace(",", "")))
        for r in rows
    }
    expected = {
        (head, form, "-" if p is None else f"p={p}", n, dim)
        for (head, form, p, n), dim in EXPECTED.items()
    }
    assert len(rows) == len(expected)
    assert shown == expected
    assert "Check 1:" in run.stdout
    assert "Check 2:" in run.stdout


@pytest.mark.slow  # shares one ~4 s run of the script
def test_stderr_has_only_progress_lines(run: Run) -> None:
    """No warnings and no profiler chatter (benchlib sets KINETO_LOG_LEVEL before torch)."""
    noise = [line for line in run.stderr.splitlines() if line and not LOG_LINE.match(line)]
    assert noise == []


def test_importable_as_a_package() -> None:
    assert heads.benchlib is benchlib
    assert len(heads.configs(["smso", "gap", "mpn"], [SIDE])) == len(EXPECTED)


def test_markdown_table_pads_and_right_aligns_numbers() -> None:
    table = benchlib.markdown_table(["name", "ms"], [["a", "1.50"], ["long", "-"]])
    assert table.splitlines() == [
        "| name |   ms |",
        "|------|-----:|",
        "| a    | 1.50 |",
        "| long |    - |",
    ]


@pytest.mark.parametrize(
    ("one_call_s", "max_repeats", "budget_s", "expected"),
    [
        (0.01, 15, 1.5, 15),  # fast: as many as allowed
        (0.3, 15, 1.5, 5),  # fills the budget
        (0.9, 15, 1.5, 3),  # at least 3 when a call is not slow
        (2.0, 15, 1.5, 1),  # slow: the budget asks for 1
        (2.0, 15, 10.0, 3),  # slow: at most 3
        (0.01, 1, 0.0, 1),  # never above max_repeats
    ],
)
def test_repeat_count(one_call_s: float, max_repeats: int, budget_s: float, expected: int) -> None:
    policy = benchlib.TimingPolicy(max_repeats=max_repeats, budget_s=budget_s)
    assert benchlib.repeat_count(one_call_s, policy) == expected


def test_train_step_benchmark_runs_on_the_cpu(tmp_path: Path) -> None:
    """bench/train_step.py (a GPU benchmark) end to end on a tiny CPU setting."""
    out = tmp_path / "train_step.json"
    args = ["--device", "cpu", "--backbone", "resnet18", "--size", "64", "--batch", "2"]
    args += ["--steps", "1", "--rounds", "2", "--warmup", "0", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-W", "error", "bench/train_step.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert [r["head"] for r in report["results"]] == ["smso p=2048", "first-order"]
    assert all(r["images_per_second"] > 0 for r in report["results"])
    assert "the SMSO head costs" in proc.stdout


def test_resolve_device_auto_picks_cuda_only_where_there_is_one() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert benchlib.resolve_device("auto").type == expected
    with pytest.raises(SystemExit, match="cpu or cuda"):
        benchlib.resolve_device("meta")


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_export_benchmark_runs_on_the_shipped_model(tmp_path: Path) -> None:
    out = tmp_path / "export.json"
    proc = run_script(
        "bench/export.py", "--quick", "--budget", "0.05", "--repeats", "1", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert {r["batch"] for r in report["results"]} == {1, 32, 128, 512}
    assert all(r["torch_ms"] > 0 and r["onnxruntime_ms"] > 0 for r in report["results"])
    assert report["summary"][0]["best_speedup"] > 0
    assert "ORT speedup" in proc.stdout


@pytest.mark.slow
def test_serve_benchmark_drives_the_real_server(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    proc = run_script(
        "bench/serve.py", "--quick", "--requests", "24", "--clients", "3", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    service = report["cases"][0]["service"]
    assert service["failures"] == 0
    assert service["requests"] == 24
    assert set(service["split"]) >= {"decode_ms", "queue_ms", "inference_ms", "response_ms"}
    # the CPU: nothing to pad, no device copies; the shipped model's typicality score
    assert set(service["split"]["stage_ms"]) == {"stack", "run", "score"}
    assert report["ratios"]["shipped_rps_over_bare"] > 0
    assert "resident memory" in proc.stdout
    protocols = service["protocols"]
    assert len(protocols) == 4
    assert "/v2 infer, preprocessed binary FP32" in protocols
    assert "gRPC ModelInfer, preprocessed FP32" in protocols  # the same tensors over gRPC
    assert all(r["failures"] == 0 and r["requests_per_second"] > 0 for r in protocols.values())
    assert report["ratios"]["grpc_over_rest_fp32"] > 0
    assert "gRPC / REST, preprocessed FP32 tensors" in proc.stdout


@pytest.mark.slow
def test_gpu_serve_benchmark_runs_every_stage_on_the_cpu(tmp_path: Path) -> None:
    """bench/serve_gpu.py --smoke: the one-go GPU measurement, tiny, with the shipped model."""
    servers = ["cuda", "cuda-switch", "workers-graphs", "workers-shared-graphs"]
    proc = run_script(
        "bench/serve_gpu.py", "--smoke", "--out", str(tmp_path), "--servers", *servers
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "serve_gpu.json").read_text())
    assert report["skipped"] == []
    assert {"fp32-conv/plain", "fp32-conv/io-binding", "fp32-conv/cuda-graphs"} <= set(
        report["raw"]
    )
    assert all("by_batch" in run for run in report["raw"].values())
    assert all(
        "run" in row["stages_ms_p50"]
        for run in report["raw"].values()
        for row in run["by_batch"].values()
    )
    assert report["ort_profile"]["ms_per_run_by_op"]
    assert set(report["server"]) == set(servers)
    for variant in report["server"]:
        loads = report["server"][variant]["loads"]
        assert len(loads) == 4  # two routes at concurrency 1 and 4
        assert "error" not in report["server"][variant], report["server"][variant]["error"]
        assert all(load["failures"] == 0 and load["requests"] > 0 for load in loads)
        assert all(
            set(load["split"]) >= {"decode_ms", "queue_ms", "inference_ms", "round_trip_ms"}
            for load in loads
        )
        assert all({"stack", "run"} <= set(load["split"]["stage_ms"]) for load in loads)
        # the cores each load kept busy: the server's processes served it, on this machine
        assert all(0 < load["cpu"]["server_cores"] <= load["cpu"]["cores"] for load in loads)
    assert {row["kind"] for row in report["decoding"]["rows"]} == {"threads", "processes"}
    table = (tmp_path / "serve_gpu.md").read_text()
    assert "| route | clients | req/s |" in table
    assert "| route | clients | mean batch | stack | handoff | share | upload | run |" in table
    # the shared session's batches went through the host: its share of each batch is timed
    shared = report["server"]["workers-shared-graphs"]["loads"]
    assert all({"handoff", "share", "run"} <= set(load["split"]["stage_ms"]) for load in shared)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--raw", "fp32-conv"], "--raw fp32-conv: expected EXPORT/MODE"),
        (["--raw", "fp32-conv/turbo"], "MODE one of plain, io-binding, cuda-graphs"),
        (["--exports", "fp64-conv"], "invalid choice: 'fp64-conv'"),
        (["--servers", "tensorrt"], "invalid choice: 'tensorrt'"),
        (["--exports", "fp32-conv"], "leaves out fp16-conv, which --raw or --servers use"),
        (
            ["--exports", "fp16-conv", "--servers", "cuda", "--raw", "fp32-conv-448/plain"],
            "leaves out fp32-conv-448",
        ),
    ],
)
def test_gpu_serve_benchmark_refuses_bad_runs_before_it_starts(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    """A typo would otherwise abort a lent GPU machine's run part-way (or measure the wrong
    thing): it is refused at once, with what is accepted."""
    proc = run_script("bench/serve_gpu.py", "--out", str(tmp_path), *flags)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "serve_gpu.json").exists()


def run_lease(step: str, repo: Path, lease: Path) -> subprocess.CompletedProcess[str]:
    """``bash bench/gpu_lease.sh STEP`` in ``repo`` with what the calls leave in ``lease``; this
    interpreter first on ``PATH``, as if step 1 had installed the wheels (fastapi, uvicorn...)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_lease.sh"), step],
        cwd=repo,
        env=os.environ | {"LEASE_TMP": str(lease), "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("step", "stage", "message"),
    [
        ("4", {"part4": ["ort.part.03"]}, "missing ort.part.00 ort.part.01 ort.part.02"),
        ("5", {}, "STEP must be 1, 2, 3 or 4"),
    ],
)
def test_the_gpu_lease_says_what_did_not_arrive(
    step: str, stage: dict[str, list[str]], message: str, tmp_path: Path
) -> None:
    """Step 4 of bench/gpu_lease.sh checks what the earlier calls left before it spends the
    lease: a machine given back in between loses them."""
    repo = tmp_path / "repo"
    for part, files in stage.items():
        (repo / ".gpu-stage" / part).mkdir(parents=True)
        for name in files:
            (repo / ".gpu-stage" / part / name).write_bytes(b"zstd")
    repo.mkdir(exist_ok=True)
    proc = run_lease(step, repo, tmp_path / "lease")
    assert proc.returncode == 1
    assert message in proc.stderr


def test_the_gpu_lease_stops_when_step_1s_exports_failed(tmp_path: Path) -> None:
    """Step 4 does not spend the lease on exports that already failed once."""
    repo, lease = tmp_path / "repo", tmp_path / "lease"
    (repo / ".gpu-stage" / "part4").mkdir(parents=True)
    (lease / "ort-parts").mkdir(parents=True)
    for i in range(4):
        (lease / "ort-parts" / f"ort.part.0{i}").write_bytes(b"zstd")
    (lease / "serve-gpu-models").mkdir()
    (lease / "serve-gpu-models" / "status").write_text("1\n")
    (lease / "export.log").write_text("Traceback ...\nRuntimeError: out of memory\n")
    proc = run_lease("4", repo, lease)
    assert proc.returncode == 1, proc.stderr
    assert "the exports failed (status 1)" in proc.stderr
    assert "out of memory" in proc.stdout  # the log's end, shown
    assert (lease / "gpu-out" / "export.log").is_file()  # and kept with the results


def test_a_gpu_server_variant_can_shorten_the_switch_interval() -> None:
    """The variants that test whether the inference thread waits for the GIL really start the
    server's interpreter with a 0.5 ms switch interval; the others keep Python's 5 ms."""
    from bench import serve_gpu

    probe = [sys.executable, "-c", "import sys; print(sys.getswitchinterval())"]
    for variant, expected in (("workers-graphs-switch", "0.0005"), ("cuda", "0.005")):
        env = serve_gpu.server_env(serve_gpu.SERVER_VARIANTS[variant][1])
        proc = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=60)
        assert proc.stdout.strip() == expected, (variant, proc.stderr)


@pytest.mark.parametrize("client", ["stdlib", "httpx"])
def test_gpu_bench_clients_post_the_payloads_and_count_answers(client: str) -> None:
    """Both client libraries of bench/serve_gpu.py send each payload as the server expects it
    (a multipart JPEG, a binary tensor with its header) and count 200s and other answers."""
    import http.server
    import threading as threads

    from bench import serve_gpu

    seen: list[tuple[str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the service

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.headers["Content-Type"], body))
            status = 200 if self.path == "/ok" else 400
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threads.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    serve_gpu._PAYLOADS.update({"jpeg": [b"JPEGDATA"], "fp32": [(b"TENSOR" + b"{}", 6)]})
    try:
        # each load starts a second from now, as serve_gpu.py's own do: threads and clients are
        # set up before its window opens, however slow the machine
        start = time.time() + 1.0
        ok, failed = serve_gpu._client_process(f"{base}/ok", "jpeg", 2, start, 0.3, client)
        assert len(ok) > 0
        assert failed == 0
        kind, body = seen[-1]
        assert kind.startswith("multipart/form-data; boundary=")
        assert b'name="file"; filename="i.jpg"' in body
        assert b"\r\n\r\nJPEGDATA\r\n--" in body
        start = time.time() + 1.0
        ok, failed = serve_gpu._client_process(f"{base}/no", "fp32", 1, start, 0.2, client)
        assert ok == []
        assert failed > 0
        assert seen[-1] == ("application/octet-stream", b"TENSOR{}")
    finally:
        httpd.shutdown()
        httpd.server_close()
        serve_gpu._PAYLOADS.clear()


def test_the_mps_variant_starts_and_quits_a_daemon_or_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/serve_gpu.py's MPS variant: the control daemon is started with its pipe folder,
    the server gets that folder, and the daemon is told to quit afterwards; without the
    binary, a clear error (recorded as the variant's error)."""
    from bench import serve_gpu

    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(RuntimeError, match="not on PATH"), serve_gpu.mps(tmp_path / "m"):
        pass
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir()
    # shell builtins only: PATH holds this folder alone
    script = f'read -r line\necho "$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$line" >> {calls}\n'
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    with serve_gpu.mps(tmp_path / "m") as env:
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "m" / "pipe")
        assert Path(env["CUDA_MPS_PIPE_DIRECTORY"]).is_dir()
    started, quit_ = calls.read_text().splitlines()
    assert started.startswith(f"-d pipe={tmp_path / 'm' / 'pipe'}")
    assert quit_ == f" pipe={tmp_path / 'm' / 'pipe'} stdin=quit"


def test_scrape_sums_over_labels_and_keys_stages_and_decoders(monkeypatch) -> None:
    """bench/serve.py's /metrics reader: samples summed over their labels, histogram buckets
    skipped, and ``stage`` / ``decoder`` values kept apart as ``name[value]``."""
    from bench import serve

    page = "\n".join(
        [
            "# HELP smso_images_decoded_total ...",
            'smso_images_decoded_total{decoder="device"} 30.0',
            'smso_images_decoded_total{decoder="pillow"} 2.0',
            'smso_inference_stage_seconds_sum{model="m",stage="run"} 1.5',
            'smso_inference_stage_seconds_bucket{le="0.1",model="m",stage="run"} 4.0',
            'smso_images_total{model="a",route="/classify"} 5.0',
            'smso_images_total{model="b",route="/classify"} 7.0',
        ]
    )
    monkeypatch.setattr(serve.httpx, "get", lambda url, timeout: SimpleNamespace(text=page))
    values = serve.scrape("http://server/metrics")
    assert values["smso_images_decoded_total"] == 32.0
    assert values["smso_images_decoded_total[device]"] == 30.0
    assert values["smso_images_decoded_total[pillow]"] == 2.0
    assert values["smso_inference_stage_seconds_sum[run]"] == 1.5
    assert "smso_inference_stage_seconds_bucket" not in values
    assert values["smso_images_total"] == 12.0
