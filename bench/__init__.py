"""Benchmarks (run as scripts: see bench/README.md)."""
