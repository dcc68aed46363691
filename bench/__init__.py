"""Benchmarks: run each from the repository root as ``.venv/bin/python -m
bench.<name>``; the helpers they share are ``bench.common`` (see
bench/README.md)."""
