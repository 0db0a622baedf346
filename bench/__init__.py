"""The benchmarks (speed, memory, cost), each a script run as ``python -m bench.NAME``; what they
share: ``bench.lib``. ``python -m bench.gpu`` runs the GPU ones in one command (``make
bench-gpu``). The soak and hostile-client runs are tests (``tests/soak``, ``make soak``); the
studies of what the served scores say are in ``experiments/``."""
