"""What the benchmarks under ``bench/`` share; each benchmark is a script, ``python -m bench.NAME``.

* :mod:`bench.lib.launch`: the one server launcher (``smso-serve``, the bare app, the stand-in);
* :mod:`bench.lib.load`: the one load driver (concurrent clients, rounds, percentiles);
* :mod:`bench.lib.report`: the one report writer (markdown tables, the JSON file, the machine);
* :mod:`bench.lib.payloads`: the images and request bodies the benchmarks send;
* :mod:`bench.lib.metrics`: the server's ``/metrics`` read before and after a load;
* :mod:`bench.lib.procfs`: a process's memory and CPU time, from ``/proc``;
* :mod:`bench.lib.session`: the service's onnxruntime backend alone, by batch size;
* :mod:`bench.lib.timing`: how many calls to time, and their median;
* :mod:`bench.lib.decoding`: image preprocessing in thread and process pools;
* :mod:`bench.lib.gpu`: NVML readings and CUDA MPS, where there is a GPU;
* :mod:`bench.lib.profiling`: py-spy on a server, onnxruntime's own profiler;
* :mod:`bench.lib.standin` and :mod:`bench.lib.bare`: a GPU-like backend, a bare endpoint;
* :mod:`bench.lib.resnet` and :mod:`bench.lib.torch_device`: for the benchmarks that need
  torch (only they import these two).

Nothing here imports torch when imported.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The model this repository ships (what ``make serve`` serves).
SHIPPED = ROOT / "models" / "fashion-mnist-smso" / "model.onnx"
#: Where a benchmark writes its JSON unless told (``--json``, ``--out``); not in git.
RESULTS = ROOT / "bench" / "results"
