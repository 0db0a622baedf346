"""The benchmarks, each a script run as ``python -m bench.NAME``; what they share: ``bench.lib``."""
