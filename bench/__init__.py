"""Benchmark scripts (run as `python bench/NAME.py`); a package so tests can import them."""
