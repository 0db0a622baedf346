"""Sets the interpreter's thread switch interval from ``SMSO_BENCH_SWITCH_INTERVAL_MS`` at start-up.

``bench/serve_gpu.py`` puts this folder first on a server's ``PYTHONPATH`` for one variant, to
test whether a server's inference thread waits for the GIL: a thread that released it (for
onnxruntime's run, a copy, a sleep) waits up to the switch interval (5 ms by default) to get it
back from a busy event loop, once per release. Measurement only; the service does not set it.
"""

import os
import sys

_MS = os.environ.get("SMSO_BENCH_SWITCH_INTERVAL_MS")
if _MS:
    sys.setswitchinterval(float(_MS) / 1e3)
